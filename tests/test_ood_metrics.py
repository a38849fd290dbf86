"""OOD detection metrics: a small case computed by hand (ties included), scikit-learn's ROC AUC, average precision and
ROC curve on random scores with ties, the four scores' definitions, and one-line refusals."""
import math

import numpy as np
import pytest
import torch

from timm_csm.metrics import fpr_at_tpr, ood_aupr, ood_auroc, ood_metrics, ood_score


def test_a_small_case_by_hand():
    s_in, s_out = [3.0, 2.0, 2.0, 0.0], [2.0, 1.0, 0.0]
    # 12 pairs: in 3 beats all 3; each in 2 beats 1 and 0 and ties 2 (2.5); in 0 ties 0 (0.5)
    assert ood_auroc(s_in, s_out) == pytest.approx(8.5 / 12, abs=1e-15)
    # thresholds 3, 2, 1, 0: (precision, recall) = (1, 1/4), (3/4, 3/4), (3/5, 3/4), (4/7, 1)
    assert ood_aupr(s_in, s_out, "in") == pytest.approx(0.25 + 0.5 * 0.75 + 0.25 * 4 / 7, abs=1e-15)
    # OOD positive, scores negated: thresholds 0, -1, -2, -3: (1/2, 1/3), (2/3, 2/3), (1/2, 1), (3/7, 1)
    assert ood_aupr(s_in, s_out, "out") == pytest.approx((0.5 + 2 / 3 + 0.5) / 3, abs=1e-15)
    assert fpr_at_tpr(s_in, s_out, 0.95) == 1.0  # only the lowest threshold accepts 95 % of the in-distribution
    assert fpr_at_tpr(s_in, s_out, 0.75) == pytest.approx(1 / 3)  # threshold 2 accepts 3 of 4 and one of 3
    assert ood_auroc([1.0, 1.0], [0.0]) == 1.0 and ood_auroc([0.0], [1.0, 2.0]) == 0.0


def test_against_scikit_learn_with_ties():
    metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(0)
    for _ in range(10):
        s_in, s_out = np.round(rng.normal(1, 1, 300), 1), np.round(rng.normal(0, 1, 200), 1)
        y, s = np.r_[np.ones(300), np.zeros(200)], np.r_[s_in, s_out]
        fpr, tpr, _ = metrics.roc_curve(y, s, drop_intermediate=False)
        got = ood_metrics(torch.from_numpy(s_in), s_out)
        assert got["auroc"] == pytest.approx(metrics.roc_auc_score(y, s), abs=1e-12)
        assert got["aupr_in"] == pytest.approx(metrics.average_precision_score(y, s), abs=1e-12)
        assert got["aupr_out"] == pytest.approx(metrics.average_precision_score(1 - y, -s), abs=1e-12)
        assert got["fpr95"] == pytest.approx(fpr[np.argmax(tpr >= 0.95)], abs=1e-12)


def test_the_four_scores():
    logits = torch.tensor([[0.0, math.log(3.0)], [2.0, 2.0]])  # probabilities (1/4, 3/4) and (1/2, 1/2)
    assert ood_score(logits, "msp").tolist() == pytest.approx([0.75, 0.5])
    assert ood_score(logits, "max_logit").tolist() == pytest.approx([math.log(3.0), 2.0])
    assert ood_score(logits, "energy").tolist() == pytest.approx([math.log(4.0), 2.0 + math.log(2.0)])
    assert ood_score(logits, "entropy").tolist() == pytest.approx(
        [0.25 * math.log(0.25) + 0.75 * math.log(0.75), math.log(0.5)])
    assert ood_score(logits, "energy").dtype == torch.float64


@pytest.mark.parametrize("call, match", [
    (lambda: ood_score(torch.zeros(2, 3), "odin"), "unknown OOD score 'odin'; known: msp, max_logit"),
    (lambda: ood_score(torch.tensor([[0.0, float("nan")]]), "msp"), "finite"),
    (lambda: ood_auroc([], [1.0]), "got 0 and 1"),
    (lambda: ood_aupr([1.0], [0.0], "both"), "positive must be 'in' or 'out'"),
    (lambda: fpr_at_tpr([1.0], [0.0], 0.0), r"tpr must lie in \(0, 1\]"),
])
def test_bad_input_is_one_line(call, match):
    with pytest.raises(ValueError, match=match) as e:
        call()
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("decimals", [1, 4])  # many ties, and almost none
def test_each_bootstrap_resample_equals_the_metrics_of_the_resampled_scores(decimals):
    from timm_csm.metrics import resample_indices
    from timm_csm.metrics.ood import bootstrap_ood_distribution, bootstrap_ood_metrics

    g = torch.Generator().manual_seed(decimals)
    s_in = (torch.randn(300, generator=g, dtype=torch.float64) + 1).round(decimals=decimals)
    s_out = torch.randn(200, generator=g, dtype=torch.float64).round(decimals=decimals)
    dist = bootstrap_ood_distribution(s_in, s_out, resamples=40, seed=3)
    rows_in, rows_out = resample_indices(300, 40, 3), resample_indices(200, 40, 4)  # out: seed + 1
    scores = torch.cat([s_in, s_out])
    unique = (scores[:, None] == scores[None, :]).sum(1) == 1  # a score no other sample of the data has
    gap = torch.diff(scores.unique()).min()

    def copies_apart(s, rows, offset):
        """The resampled scores, the copies of a sample with a score of its own moved apart by less than any gap
        of the data (distinct scores, as the data's), those of tied samples left tied."""
        copy = torch.zeros(len(rows), dtype=torch.float64)
        for i in range(len(rows)):
            copy[i] = (rows[:i] == rows[i]).sum()
        return s[rows] + torch.where(unique[rows + offset], copy * gap / (2 * len(rows)), torch.zeros_like(copy))

    for r in range(40):
        expected = ood_metrics(s_in[rows_in[r]], s_out[rows_out[r]])
        apart = ood_metrics(copies_apart(s_in, rows_in[r], 0), copies_apart(s_out, rows_out[r], 300))
        assert apart["auroc"] == pytest.approx(expected["auroc"], abs=1e-12)  # copies of one sample: no in-out tie
        assert apart["fpr95"] == expected["fpr95"]
        assert {k: dist[k][r].item() for k in apart} == pytest.approx(apart, abs=1e-12)
    iv = bootstrap_ood_metrics(s_in, s_out, resamples=40, seed=3)
    assert iv["auroc"]["low"] == pytest.approx(float(np.quantile(dist["auroc"].numpy(), 0.025)), abs=1e-12)
    with pytest.raises(ValueError, match="OOD scores must be finite"):
        bootstrap_ood_distribution(torch.tensor([0.1, float("nan")]), s_out)


def test_the_aupr_interval_holds_its_estimate_when_the_ood_images_score_higher():
    """Every OOD image scored above every test image (an AUROC near 0): a resample's copies counted as one tie gave
    an AUPR-out interval above its estimate (0.0885, [0.08855, 0.08857]); counted as distinct scores, it holds it."""
    from timm_csm.metrics.ood import bootstrap_ood_metrics

    g = torch.Generator().manual_seed(0)
    s_in = torch.rand(5000, generator=g, dtype=torch.float64) * 0.5
    s_out = 0.5 + torch.rand(1000, generator=g, dtype=torch.float64) * 0.5
    s_out[0] = 0.1  # one OOD image among the test images: the AUPRs vary from resample to resample
    estimate = ood_metrics(s_in, s_out)
    assert 0 < estimate["auroc"] < 0.001
    intervals = bootstrap_ood_metrics(s_in, s_out, resamples=200, seed=0)
    for key in ("aupr_in", "aupr_out"):
        assert intervals[key]["low"] < estimate[key] < intervals[key]["high"], key


def test_the_ood_reading_names_the_best_score_and_says_what_an_auroc_below_half_means():
    from timm_csm.calibration import TemperatureScaling
    from timm_csm.evaluation.shift import evaluate_ood
    from timm_csm.evaluation.shift_report import ood_markdown, ood_reading

    g = torch.Generator().manual_seed(0)
    test = torch.randn(400, 5, generator=g, dtype=torch.float64)
    # sharper on the OOD images (their softmax is surer) but with lower logits (their energy is lower)
    foreign = torch.randn(100, 5, generator=g, dtype=torch.float64) * 6 - 30
    scaler = TemperatureScaling(method="nll").fit(test, test.argmax(1))
    ood = dict(evaluate_ood(test, foreign, {"temperature_scaling": scaler}), source="foreign", split="test",
               n_in=400, n_out=100)
    aurocs = {(method, kind): m["auroc"] for method, scores in ood["methods"].items() for kind, m in scores.items()}
    best = max(aurocs, key=aurocs.get)
    lowest = min(aurocs, key=aurocs.get)
    assert aurocs[lowest] < 0.5 < aurocs[best] and best[1] in ("max_logit", "energy")
    assert aurocs[("uncalibrated", "msp")] < 0.5
    labels = {"msp": "max softmax", "max_logit": "max logit", "energy": "energy", "entropy": "neg. entropy"}
    below = sum(a < 0.5 for a in aurocs.values())
    assert ood_reading(ood) == [
        f"OOD foreign: 100 images, best AUROC {aurocs[best]:.4f} ({labels[best[1]]}, {best[0]}).",
        f"AUROC below 0.5 for {below} of 8 scores (lowest {aurocs[lowest]:.4f}, {labels[lowest[1]]}, {lowest[0]}): "
        "the model is more confident on the OOD images than on its own test images, so these scores take the OOD "
        "images for the known ones."]
    assert ood_markdown(ood).endswith("\n".join(ood_reading(ood)) + "\n")
    ood["methods"] = {"uncalibrated": {"msp": {"auroc": 0.7}}}
    assert len(ood_reading(ood)) == 1  # no score below 0.5: no such line
