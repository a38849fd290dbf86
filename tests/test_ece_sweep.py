"""ECE-sweep against a reference written here from Roelofs et al.'s definition (AISTATS 2022, Section 4): sort by
confidence, split into b bins of equal count (``numpy.array_split``), keep the largest b, swept upwards, whose bin
accuracies are monotone; then the binned error over those bins."""
import numpy as np
import pytest
import torch

from timm_csm.metrics import ece_sweep, reliability_table_from_points
from timm_csm.metrics.sweep import sweep_from_points


def reference_sweep(conf: np.ndarray, acc: np.ndarray, p: int = 1):
    order = np.argsort(conf, kind="stable")
    conf, acc = conf[order], acc[order]
    best = 1
    for b in range(2, len(conf) + 1):
        accs = [part.mean() for part in np.array_split(acc, b)]
        if any(later < earlier for earlier, later in zip(accs, accs[1:])):
            break
        best = b
    parts = zip(np.array_split(conf, best), np.array_split(acc, best))
    total = sum(len(c) / len(conf) * abs(a.mean() - c.mean()) ** p for c, a in parts)
    return total ** (1.0 / p), best


def _calibrated(n: int, seed: int):
    """Top-label pairs of a perfectly calibrated model: each accuracy drawn with its confidence's probability."""
    g = np.random.default_rng(seed)
    conf = g.beta(5.0, 1.0, n)
    return conf, (g.random(n) < conf).astype(np.float64)


@pytest.mark.parametrize("p,norm", [(1, "l1"), (2, "l2")])
@pytest.mark.parametrize("seed", range(4))
def test_sweep_matches_the_reference(seed, p, norm):
    conf, acc = _calibrated(300 + 37 * seed, seed)
    want, want_bins = reference_sweep(conf, acc, p)
    got = sweep_from_points(torch.from_numpy(conf), torch.from_numpy(acc), norm)
    assert got.n_bins == want_bins
    assert got.error == pytest.approx(want, rel=1e-12, abs=1e-15)


def test_accuracies_sorted_by_confidence_sweep_to_one_bin_per_sample():
    conf = np.linspace(0.5, 1.0, 40)
    acc = (conf > 0.8).astype(np.float64)
    got = sweep_from_points(torch.from_numpy(conf), torch.from_numpy(acc))
    assert got.n_bins == 40
    assert got.error == pytest.approx(reference_sweep(conf, acc)[0], rel=1e-12)


def test_the_functional_form_reads_the_top_label_of_logits():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(500, 10, generator=g, dtype=torch.float64) * 3
    labels = torch.randint(0, 10, (500,), generator=g)
    probs = logits.softmax(-1)
    conf, pred = probs.max(-1)
    want, _ = reference_sweep(conf.numpy(), (pred == labels).double().numpy())
    assert ece_sweep(logits, labels) == pytest.approx(want, rel=1e-12)


def test_less_biased_than_binned_ece_on_a_calibrated_model():
    """The paper's finding (its Figure 1): on a perfectly calibrated model the 15-bin ECE is biased upwards, and
    ECE-sweep much less (the true error is 0)."""
    draws = [_calibrated(400, 100 + i) for i in range(40)]
    binned = np.mean([reliability_table_from_points(torch.from_numpy(c), torch.from_numpy(a), 15).ece
                      for c, a in draws])
    sweep = np.mean([sweep_from_points(torch.from_numpy(c), torch.from_numpy(a)).error for c, a in draws])
    assert sweep < 0.75 * binned


@pytest.mark.parametrize("conf,acc,match", [
    (torch.zeros(0), torch.zeros(0), "empty"),
    (torch.rand(5), torch.rand(4), "one value per sample"),
])
def test_bad_input_is_one_line(conf, acc, match):
    with pytest.raises(ValueError, match=match):
        sweep_from_points(conf, acc)


def test_unknown_norm_is_refused():
    with pytest.raises(ValueError, match="norm must be one of"):
        sweep_from_points(torch.rand(5), torch.rand(5), norm="max")
