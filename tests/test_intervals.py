"""Intervals: the vectorised bootstrap against a loop over the same resamples (every metric, ties, soft targets,
several blocks), its determinism per seed, percentile intervals that cover the point value; the paired t-interval
against scipy and the benchmark's committed numbers; Holm's correction against a hand-worked example."""
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from timm_csm.metrics import (bootstrap_columns, bootstrap_distribution, bootstrap_metrics, calibration_metrics, holm,
                              interval_text, mean_std, paired_outcome, paired_t_interval, percentile_interval, piece,
                              resample_indices)
from timm_csm.metrics import intervals
from timm_csm.metrics.selective import selective_metrics_from_points
from timm_csm.metrics.state import accumulate
from timm_csm.metrics.inputs import prepare_inputs

ROOT = Path(__file__).resolve().parents[1]


def over_confident(n, c=10, seed=0, scale=3.0):
    """Logits whose labels come from a softmax 3x flatter than the logits': an ECE far above sampling noise."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, c, generator=g) * 1.5
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g).squeeze(1)
    return z * scale, y


def loop_metrics(preds, target, idx, prox=None, input_type="logits"):
    """Every metric of one resample, by the metric functions themselves."""
    p, t = preds[idx], target[idx]
    out = calibration_metrics(p, t, n_bins=15, input_type=input_type)
    conf, acc = accumulate(prepare_inputs(p, t, input_type=input_type), 15, binned=False, classwise=False, nll=False,
                           brier=False, points=True).points()
    out.update(selective_metrics_from_points(conf, acc))
    if prox is not None:
        out["piece"] = piece(p, t, None, prox=prox[idx], input_type=input_type)
    return out


@pytest.mark.parametrize("case", ["hard labels, ties, several blocks", "no tied confidences",
                                  "probabilities, soft targets"])
def test_the_vectorised_bootstrap_equals_a_loop_over_the_same_resamples(case, monkeypatch):
    n, resamples = 240, 12
    logits, labels = over_confident(n, c=6, seed=1)
    if case == "no tied confidences":
        logits = logits.double()
        assert torch.softmax(logits, 1).amax(1).unique().numel() == n
    else:
        logits[:60] = logits[:60].round()  # tied confidences across samples of both outcomes
    prox = torch.rand(n, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    preds, target, input_type = logits, labels, "logits"
    if case.startswith("probabilities"):
        preds, input_type = torch.softmax(logits.double(), 1), "probs"
        target = torch.softmax(torch.randn(n, 6, generator=torch.Generator().manual_seed(3), dtype=torch.float64), 1)
    elif case.startswith("hard"):
        monkeypatch.setattr(intervals, "_BLOCK", 5 * n)  # blocks of 5 resamples: the last one shorter
    dist = bootstrap_distribution(preds, target, 15, resamples=resamples, seed=7, input_type=input_type,
                                  selective=True, prox=prox)
    idx = resample_indices(n, resamples, seed=7)
    assert idx.shape == (resamples, n) and len({tuple(r.tolist()) for r in idx}) == resamples
    for r in range(resamples):
        expected = loop_metrics(preds, target, idx[r], prox, input_type)
        assert set(expected) == set(dist)
        for key, value in expected.items():
            assert float(dist[key][r]) == pytest.approx(value, rel=1e-9, abs=1e-12), (r, key)


def test_the_bootstrap_is_seeded():
    logits, labels = over_confident(500, seed=4)
    a = bootstrap_distribution(logits, labels, resamples=50, seed=11)
    b = bootstrap_distribution(logits, labels, resamples=50, seed=11)
    c = bootstrap_distribution(logits, labels, resamples=50, seed=12)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["ece"], c["ece"])
    assert torch.equal(resample_indices(500, 50, 11), resample_indices(500, 50, 11))


def test_the_blocks_draw_the_indices_of_one_draw(monkeypatch):
    whole = torch.randint(0, 300, (40, 300), generator=torch.Generator().manual_seed(5))
    monkeypatch.setattr(intervals, "_BLOCK", 7 * 300)
    assert torch.equal(resample_indices(300, 40, 5), whole)


def test_percentile_intervals_cover_the_point_values():
    logits, labels = over_confident(3000, seed=5)
    point = calibration_metrics(logits, labels)
    distribution = bootstrap_distribution(logits, labels, resamples=300, seed=0, selective=True)
    iv = {k: dict(zip(("low", "high"), percentile_interval(v))) for k, v in distribution.items()}
    assert point["ece"] > 0.1  # far from calibrated: the binned errors' bootstrap bias is small beside it
    for key in ("accuracy", "confidence", "ece", "aece", "cece", "oe", "nll", "brier"):
        assert iv[key]["low"] < point[key] < iv[key]["high"], key
    assert iv["ece"]["high"] - iv["ece"]["low"] < 0.05
    defaults = bootstrap_metrics(logits, labels, resamples=300, seed=0, selective=True)  # each metric's own method
    assert all(d["low"] <= point[k] <= d["high"] for k, d in defaults.items() if k in point)
    values = torch.randn(101, dtype=torch.float64)
    assert percentile_interval(values, 0.9) == pytest.approx(tuple(np.quantile(values.numpy(), [0.05, 0.95])))


def test_bootstrap_columns_equal_a_loop():
    sizes = torch.randint(0, 5, (80,), generator=torch.Generator().manual_seed(0)).double()
    covered = (torch.rand(80, generator=torch.Generator().manual_seed(1)) < 0.9).double()
    got = bootstrap_columns({"size": sizes, "median": sizes, "covered": covered}, medians=["median"], resamples=40,
                            seed=3, level=0.8)
    idx = resample_indices(80, 40, 3)
    loops = {"size": [sizes[i].mean() for i in idx], "median": [sizes[i].median() for i in idx],
             "covered": [covered[i].mean() for i in idx]}
    for key, values in loops.items():
        low, high = percentile_interval(torch.stack(values), 0.8)
        assert got[key] == pytest.approx({"low": low, "high": high}, abs=1e-12), key


def test_bad_bootstrap_input_is_one_line():
    logits, labels = over_confident(20)
    with pytest.raises(ValueError, match="resamples must be an integer >= 1"):
        bootstrap_metrics(logits, labels, resamples=0)
    with pytest.raises(ValueError, match="level must lie in"):
        bootstrap_metrics(logits, labels, level=1.5)
    with pytest.raises(ValueError, match="one finite proximity per sample"):
        bootstrap_metrics(logits, labels, prox=torch.ones(3))


def test_holm_on_a_hand_worked_family():
    # sorted: 0.005 (x4 = 0.02), 0.01 (x3 = 0.03), 0.03 (x2 = 0.06), 0.04 (x1 = 0.04 -> 0.06, monotone)
    adjusted, reject = holm([0.01, 0.04, 0.03, 0.005], alpha=0.05)
    assert adjusted == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert reject == [True, False, False, True]  # step-down: 0.03 > 0.05 / 2 stops
    adjusted, reject = holm([0.5, 0.3], alpha=0.05)
    assert adjusted == pytest.approx([0.6, 0.6]) and reject == [False, False]
    assert holm([0.9, 0.8, 0.7])[0] == [1.0, 1.0, 1.0]  # capped at 1
    with pytest.raises(ValueError, match="p-values must lie in"):
        holm([1.2])


def test_paired_t_interval_against_scipy():
    from scipy import stats

    a = {0: 1.0, 1: 2.0, 2: 4.0, 3: 3.0, 4: 0.5}
    b = {4: 1.5, 3: 5.0, 2: 4.0, 1: 2.5, 0: 2.0, 9: 7.0}  # matched by seed, the unmatched one left out
    iv = paired_t_interval(a, b)
    diffs = np.array([a[s] - b[s] for s in range(5)])
    test = stats.ttest_rel([a[s] for s in range(5)], [b[s] for s in range(5)])
    low, high = test.confidence_interval(0.95)
    assert iv.n == 5 and iv.mean == pytest.approx(diffs.mean())
    assert (iv.low, iv.high) == pytest.approx((low, high)) and iv.p_value == pytest.approx(test.pvalue)
    assert iv.sd == pytest.approx(diffs.std(ddof=1))
    assert paired_t_interval({0: 1.0}, {0: 2.0}) is None
    same = paired_t_interval({0: 1.0, 1: 2.0}, {0: 0.0, 1: 1.0})
    assert (same.low, same.high, same.p_value) == (1.0, 1.0, 0.0)  # a constant difference


def test_seed_summaries_read_and_print_an_interval():
    assert mean_std([1.0, 2.0, 6.0]) == pytest.approx((3.0, (7.0) ** 0.5)) and mean_std([2.5]) == (2.5, None)
    with pytest.raises(ValueError, match="no values"):
        mean_std([])
    below = paired_t_interval({0: 1.0, 1: 1.1, 2: 0.9}, {0: 2.0, 1: 2.2, 2: 2.1})
    assert paired_outcome(below) == "lower" and paired_outcome((3, 0.1, -0.2, 0.4)) == "none"
    assert paired_outcome((3, 1.0, 0.5, 1.5)) == "higher"
    assert interval_text((5, -3.5412, -3.861, -3.2199)) == "-3.54 [-3.86, -3.22] (n=5)" and interval_text(None) == "-"


def committed_pairs(setting="matched"):
    """The committed page's paired intervals of the setting's decision row minus each method: {label: [cells]}."""
    text = (ROOT / "benchmarks" / "calibration.md").read_text()
    section = text.split(f"## `{setting}`", 1)[1].split("### Paired differences", 1)[1].split("###", 1)[0]
    rows = [line.strip("|").split(" | ") for line in section.splitlines() if line.startswith("| ") and "(n=" in line]
    return {r[0].strip(): [c.strip() for c in r[1:]] for r in rows}


def test_paired_t_interval_gives_the_benchmarks_committed_numbers():
    rows = {r["method"]: {p["seed"]: p for p in r["per_seed"]}
            for r in json.loads((ROOT / "benchmarks" / "calibration.json").read_text()) if r["recipe"] == "matched"}
    committed = committed_pairs("matched")
    for method, label in (("ce", "CE"), ("regmixup", "RegMixup (alpha 20)"), ("ls", "Label smoothing (eps 0.05)")):
        cells = []
        for key, digits in (("ece_pre_ts", 2), ("ece_post_ts", 2), ("acc_pre_ts", 2), ("nll_pre_ts", 4)):
            a = {s: r[key] for s, r in rows["csm"].items()}
            b = {s: r[key] for s, r in rows[method].items()}
            cells.append(interval_text(paired_t_interval(a, b), digits))
        assert cells == committed[label], method
    assert re.match(r"-3\.54 \[-3\.86, -3\.22\] \(n=5\)", committed["CE"][0])


def test_the_detectable_difference_is_rejected_with_the_asked_power():
    from scipy.stats import t as student_t

    from timm_csm.metrics import detectable_difference

    # the planning numbers of PROTOCOL.md amendment 2 (sd 0.56 and 0.73 ECE points, 15 and 5 seeds, alpha 0.05 and
    # Holm's strictest 0.0125)
    cases = ((0.56, 15, 0.05), (0.56, 5, 0.05), (0.73, 15, 0.05), (0.73, 15, 0.0125))
    assert [round(detectable_difference(*c), 2) for c in cases] == [0.44, 0.94, 0.57, 0.71]
    sd, n = 0.7, 15
    delta = detectable_difference(sd, n)
    assert detectable_difference(sd, n, power=0.9) > delta > detectable_difference(sd, n, power=0.5)
    # simulated paired t-tests at that true difference reject at 80% (4 000 trials: +-0.02 at 3 sd)
    d = np.random.default_rng(0).normal(delta, sd, size=(4000, n))
    t = d.mean(1) / (d.std(1, ddof=1) / np.sqrt(n))
    assert abs(np.mean(np.abs(t) > student_t.ppf(0.975, n - 1)) - 0.8) < 0.02
    with pytest.raises(ValueError, match="need n >= 2"):
        detectable_difference(0.5, 1)
