"""Functional calibration metrics against float64 NumPy references written here, and against peers (torchmetrics,
netcal, relplot) where their semantics agree with ours; ProCal's proximity-informed ECE (PIECE)."""
import math

import numpy as np
import pytest
import torch

from timm_csm.metrics import (METRIC_KEYS, adaptive_ece, bin_edges, bin_index, brier_score, calibration_metrics,
                              classwise_ece, debiased_ce, ece, mce, nll, overconfidence_error, piece, proximity,
                              reliability_table, smooth_ece, underconfidence_error)
from timm_csm.metrics.binning import bin_sums, calibration_error_from_bins, debiased_error_from_bins
from timm_csm.metrics.inputs import prepare_inputs
from timm_csm.metrics.state import accumulate

# ----------------------------------------------------------------------------------------------------------------
# float64 NumPy references (explicit loops over bins, written from the definitions)
# ----------------------------------------------------------------------------------------------------------------


def ref_softmax(z):
    z = np.asarray(z, dtype=np.float64)
    e = np.exp(z - z.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def ref_onehot(y, C):
    return np.eye(C)[np.asarray(y)]


def ref_top(p, t):
    """conf, accuracy (t: (N, C) one-hot or soft)."""
    pred = p.argmax(1)
    return p.max(1), t[np.arange(len(p)), pred]


def ref_members(conf, edges, b):
    """(lo, hi] membership; 0 (and below) in the first bin, 1.0 (and above) in the last."""
    B = len(edges) - 1
    lo = conf > edges[b] if b > 0 else np.ones_like(conf, bool)
    hi = conf <= edges[b + 1] if b < B - 1 else np.ones_like(conf, bool)
    return lo & hi


def ref_bins(conf, acc, edges):
    rows = []
    for b in range(len(edges) - 1):
        m = ref_members(conf, edges, b)
        if m.any():
            rows.append((m.sum() / len(conf), conf[m].mean(), acc[m].mean()))
    return rows


def ref_ece(conf, acc, n_bins=15, norm="l1"):
    rows = ref_bins(conf, acc, np.linspace(0, 1, n_bins + 1))
    if norm == "l1":
        return sum(w * abs(a - c) for w, c, a in rows)
    if norm == "l2":
        return math.sqrt(sum(w * (a - c) ** 2 for w, c, a in rows))
    return max(abs(a - c) for w, c, a in rows)


def ref_oe_ue(conf, acc, n_bins=15):
    rows = ref_bins(conf, acc, np.linspace(0, 1, n_bins + 1))
    oe = sum(w * c * max(c - a, 0) for w, c, a in rows)
    ue = sum(w * c * max(a - c, 0) for w, c, a in rows)
    return oe, ue


def ref_aece(conf, acc, n_bins=15):
    n = len(conf)
    edges = np.interp(np.linspace(0, n, n_bins + 1), np.arange(n), np.sort(conf))
    rows = ref_bins(conf, acc, edges)
    return sum(w * abs(a - c) for w, c, a in rows)


def ref_cece(p, t, n_bins=15):
    return np.mean([ref_ece(p[:, k], t[:, k], n_bins) for k in range(p.shape[1])])


def ref_debiased_ce(conf, acc, n_bins=15):
    """Kumar, Liang & Ma (2019), Section 5: sqrt(max(sum_b p_b [(acc_b - conf_b)^2 - acc_b (1 - acc_b) / (n_b - 1)],
    0)) over the bins of n_b >= 2 samples, p_b = n_b / n, for correctness in {0, 1}; for soft accuracies the
    variance of the bin mean is the sample variance over n_b."""
    edges, n, total = np.linspace(0, 1, n_bins + 1), len(conf), 0.0
    for b in range(n_bins):
        m = ref_members(conf, edges, b)
        n_b = int(m.sum())
        if n_b < 2:
            continue
        a, c = acc[m].mean(), conf[m].mean()
        hard = np.all((acc[m] == 0) | (acc[m] == 1))
        variance = a * (1 - a) / (n_b - 1) if hard else acc[m].var(ddof=1) / n_b
        total += n_b / n * ((a - c) ** 2 - variance)
    return math.sqrt(max(total, 0.0))


def ref_nll(p, t):
    return float(-(t * np.log(np.maximum(p, 1e-12))).sum(1).mean())


def ref_brier(p, t):
    return float(((p - t) ** 2).sum(1).mean())


def ref_all(p, t, n_bins=15):
    conf, acc = ref_top(p, t)
    oe, ue = ref_oe_ue(conf, acc, n_bins)
    return {"accuracy": acc.mean(), "confidence": conf.mean(), "ece": ref_ece(conf, acc, n_bins),
            "aece": ref_aece(conf, acc, n_bins), "cece": ref_cece(p, t, n_bins),
            "mce": ref_ece(conf, acc, n_bins, "max"), "oe": oe, "ue": ue,
            "debiased_ce": ref_debiased_ce(conf, acc, n_bins), "nll": ref_nll(p, t),
            "brier": ref_brier(p, t)}


def make_logits(n, c, seed=0, scale=2.0, boost=2.0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    z = scale * torch.randn(n, c, generator=g, dtype=torch.float64)
    y = torch.randint(0, c, (n,), generator=g)
    z[torch.arange(n), y] += boost
    return z.to(dtype), y


def assert_metrics_close(got, want, tol):
    assert set(want) <= set(got)
    for k, v in want.items():
        assert got[k] == pytest.approx(v, abs=tol), k


# ----------------------------------------------------------------------------------------------------------------
# agreement with the references
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("input_type", ["logits", "probs", "log_probs"])
def test_all_metrics_match_numpy_reference(input_type):
    z, y = make_logits(3000, 7, seed=1)
    p = ref_softmax(z.numpy())
    preds = {"logits": z, "probs": torch.from_numpy(p), "log_probs": torch.from_numpy(np.log(p))}[input_type]
    got = calibration_metrics(preds, y, n_bins=15, input_type=input_type)
    assert set(got) == set(METRIC_KEYS)
    assert_metrics_close(got, ref_all(p, ref_onehot(y, 7)), 1e-12)
    # the single-metric functions agree with the one-pass dict
    assert ece(preds, y, input_type=input_type) == pytest.approx(got["ece"], abs=1e-15)
    assert mce(preds, y, input_type=input_type) == pytest.approx(got["mce"], abs=1e-15)
    assert adaptive_ece(preds, y, input_type=input_type) == pytest.approx(got["aece"], abs=1e-15)
    assert classwise_ece(preds, y, input_type=input_type) == pytest.approx(got["cece"], abs=1e-15)
    assert overconfidence_error(preds, y, input_type=input_type) == pytest.approx(got["oe"], abs=1e-15)
    assert underconfidence_error(preds, y, input_type=input_type) == pytest.approx(got["ue"], abs=1e-15)
    assert debiased_ce(preds, y, input_type=input_type) == pytest.approx(got["debiased_ce"], abs=1e-15)
    assert nll(preds, y, input_type=input_type) == pytest.approx(got["nll"], abs=1e-12)
    assert brier_score(preds, y, input_type=input_type) == pytest.approx(got["brier"], abs=1e-12)


def test_norms_and_bin_counts_against_reference():
    z, y = make_logits(2000, 5, seed=2)
    p = ref_softmax(z.numpy())
    conf, acc = ref_top(p, ref_onehot(y, 5))
    for n_bins in (1, 2, 10, 15, 40):
        for norm in ("l1", "l2", "max"):
            assert ece(z, y, n_bins, norm=norm) == pytest.approx(ref_ece(conf, acc, n_bins, norm), abs=1e-12)
    # n_bins = 1: |mean accuracy - mean confidence|
    assert ece(z, y, 1) == pytest.approx(abs(acc.mean() - conf.mean()), abs=1e-12)


def test_underconfident_model_has_ue_and_no_oe():
    # soft, underconfident predictions: temperature 20 on well-separated logits
    z, y = make_logits(2000, 4, seed=3, scale=1.0, boost=8.0)
    oe, ue = overconfidence_error(z / 20, y), underconfidence_error(z / 20, y)
    assert oe == 0.0 and ue > 0.05
    p = ref_softmax(z.numpy() / 20)
    assert ue == pytest.approx(ref_oe_ue(*ref_top(p, ref_onehot(y, 4)))[1], abs=1e-12)


def test_float32_inputs_are_close_to_float64_reference():
    z64, y = make_logits(5000, 20, seed=4)
    z32 = z64.float()
    p = ref_softmax(z32.double().numpy())  # reference on the exact float32 values, in float64
    got = calibration_metrics(z32, y)
    assert_metrics_close(got, ref_all(p, ref_onehot(y, 20)), 2e-6)


def test_soft_targets_use_expected_accuracy():
    g = torch.Generator().manual_seed(5)
    z, _ = make_logits(1500, 6, seed=5)
    t = torch.softmax(3 * torch.randn(1500, 6, generator=g, dtype=torch.float64), 1)
    p = ref_softmax(z.numpy())
    got = calibration_metrics(z, t)
    assert_metrics_close(got, ref_all(p, t.numpy()), 1e-12)
    # a one-hot soft target is the same as the class index
    y = torch.randint(0, 6, (1500,), generator=g)
    assert_metrics_close(calibration_metrics(z, torch.nn.functional.one_hot(y, 6).double()),
                         calibration_metrics(z, y), 1e-12)


def test_nll_matches_torch_cross_entropy():
    z, y = make_logits(1000, 9, seed=6, scale=5.0)
    assert nll(z, y) == pytest.approx(torch.nn.functional.cross_entropy(z, y).item(), abs=1e-12)
    t = torch.softmax(torch.randn(1000, 9, dtype=torch.float64), 1)
    assert nll(z, t) == pytest.approx(torch.nn.functional.cross_entropy(z, t).item(), abs=1e-12)


def test_results_do_not_depend_on_block_size():
    z, y = make_logits(211, 13, seed=7)
    inputs = prepare_inputs(z, y)
    flags = dict(binned=True, classwise=True, nll=True, brier=True, points=True)
    ref = accumulate(inputs, 15, max_elements=1 << 18, **flags)
    for max_elements in (1, 100, 1000):
        st = accumulate(inputs, 15, max_elements=max_elements, **flags)
        for a, b in zip(st.sum_tensors(), ref.sum_tensors()):
            torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-9)


# ----------------------------------------------------------------------------------------------------------------
# edge cases from spec/peers.md
# ----------------------------------------------------------------------------------------------------------------


def test_bin_rule_zero_first_one_last_and_right_closed_edges():
    edges = bin_edges(15)
    vals = torch.cat([torch.tensor([0.0, 1.0]), edges[1:-1]])
    idx = bin_index(vals, edges)
    assert idx[0] == 0 and idx[1] == 14  # 0 -> first bin, 1.0 -> last bin (no hidden 16th bin)
    assert torch.equal(idx[2:], torch.arange(14))  # an edge belongs to the bin it closes: (lo, hi]
    above = torch.nextafter(edges[1:-1], torch.ones(14, dtype=torch.float64))
    assert torch.equal(bin_index(above, edges), torch.arange(1, 15))


@pytest.mark.parametrize("n_bins", [1, 2, 3, 7, 15, 100])
def test_arithmetic_binning_equals_the_interval_rule(n_bins):
    edges = bin_edges(n_bins)
    up, down = torch.full_like(edges, 2.0), torch.full_like(edges, -1.0)
    vals = torch.cat([edges, torch.nextafter(edges, up), torch.nextafter(edges, down),
                      torch.rand(20000, generator=torch.Generator().manual_seed(n_bins), dtype=torch.float64)])
    vals = vals.clamp(0, 1)
    for v in (vals, vals.float().double()):  # float32 values sit next to the float64 edges differently
        fast = bin_index(v, edges)
        assert torch.equal(fast, bin_index(v, edges, equal_width=False))
        e = edges.numpy()
        for b in range(n_bins):
            assert np.array_equal((fast == b).numpy(), ref_members(v.numpy(), e, b))


def test_confidence_one_is_counted_in_the_last_bin():
    # peers.md 2.2: preds [0.95, 1.0], target [1, 0], 10 bins; one bin (0.9, 1] with mean conf 0.975, accuracy 0.5
    preds, target = torch.tensor([0.95, 1.0], dtype=torch.float64), torch.tensor([1, 0])
    assert ece(preds, target, 10, input_type="probs", task="binary") == pytest.approx(0.475, abs=1e-12)
    table = reliability_table(preds, target, 10, input_type="probs", task="binary")
    assert table.count.tolist() == [0.0] * 9 + [2.0]
    # torchmetrics' binary ECE measures P(y=1) and puts 1.0 into a hidden extra bin (torchmetrics#3510): 0.525
    from torchmetrics.functional.classification import binary_calibration_error

    assert binary_calibration_error(preds.float(), target, n_bins=10).item() == pytest.approx(0.525, abs=1e-6)


def test_one_hot_probabilities_all_correct_and_all_wrong():
    y = torch.tensor([0, 1, 2, 1, 0])
    p = torch.nn.functional.one_hot(y, 3).double()  # confidences exactly 1.0, classwise p_k exactly 0 and 1
    right = calibration_metrics(p, y, input_type="probs")
    assert right["ece"] == 0.0 and right["cece"] == 0.0 and right["brier"] == 0.0 and right["nll"] == 0.0
    assert right["accuracy"] == 1.0 and right["confidence"] == 1.0
    assert reliability_table(p, y, input_type="probs").count[-1] == 5
    wrong = calibration_metrics(p, (y + 1) % 3, input_type="probs")
    assert wrong["ece"] == 1.0 and wrong["mce"] == 1.0 and wrong["oe"] == 1.0 and wrong["brier"] == 2.0
    assert wrong["nll"] == pytest.approx(-math.log(1e-12))  # floored, finite
    assert wrong["cece"] == pytest.approx(2 / 3)  # per class: bin 0 and bin 14 each off by the wrong share


def test_single_sample():
    z = torch.tensor([[2.0, 0.0, -1.0]], dtype=torch.float64)
    p = ref_softmax(z.numpy())[0]
    for label, correct in ((0, 1.0), (2, 0.0)):
        got = calibration_metrics(z, torch.tensor([label]))
        assert got["ece"] == pytest.approx(abs(correct - p.max()), abs=1e-15)
        assert got["aece"] == got["ece"] == got["mce"]
        assert got["nll"] == pytest.approx(-math.log(p[label]), abs=1e-14)


def test_absent_classes_count_in_classwise_mean():
    z, _ = make_logits(400, 6, seed=8)
    y = torch.randint(0, 3, (400,), generator=torch.Generator().manual_seed(8))  # classes 3..5 never occur
    p = ref_softmax(z.numpy())
    assert classwise_ece(z, y, num_classes=6) == pytest.approx(ref_cece(p, ref_onehot(y, 6)), abs=1e-12)


def test_two_label_slice_of_multiclass_data_stays_multiclass():
    # netcal 1.4 switches to binary mode when labels take two values and rejects (N, 5) inputs; we do not guess
    z, _ = make_logits(300, 5, seed=9)
    y = torch.randint(0, 2, (300,), generator=torch.Generator().manual_seed(9))
    p = ref_softmax(z.numpy())
    assert_metrics_close(calibration_metrics(z, y), ref_all(p, ref_onehot(y, 5)), 1e-12)


def test_ties_resolve_to_the_lowest_class_index():
    z = torch.zeros(4, 3, dtype=torch.float64)  # uniform: argmax is class 0
    z[3] = torch.tensor([1.0, 5.0, 5.0])  # tie between 1 and 2: argmax is 1
    y = torch.tensor([0, 1, 2, 2])
    got = calibration_metrics(z, y)
    assert got["accuracy"] == pytest.approx(0.25)  # only sample 0 is correct, as with torch.argmax
    probs = torch.softmax(z, 1)
    assert calibration_metrics(probs, y, input_type="probs")["accuracy"] == pytest.approx(0.25)
    assert calibration_metrics(probs.float(), y, input_type="probs")["accuracy"] == pytest.approx(0.25)
    assert calibration_metrics(z.float(), y)["accuracy"] == pytest.approx(0.25)


@pytest.mark.parametrize("classes", [5, 40])  # the column layout (fewer than 32 classes) and the row layout
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_one_pass_equals_the_reference_with_tied_maxima_in_every_precision(classes, dtype):
    z, y = make_logits(600, classes, seed=40, dtype=torch.float32)
    z[:150] = z[:150].round()  # many tied maxima, on the label and beside it
    z[150:200, :3] = z[150:200, :3].amax(1, keepdim=True) + 1.0  # three-way ties at the first classes
    y[150:175] = 2  # the label on the third of three tied maxima: a miss
    z = z.to(dtype)
    exact = z.double()  # the values the metrics see, then in float64
    p = ref_softmax(exact.numpy())
    got = calibration_metrics(z, y)
    assert got["accuracy"] == float((exact.argmax(1) == y).double().mean())  # ties to the lowest class index
    assert_metrics_close(got, ref_all(p, ref_onehot(y, classes)), 2e-6)
    assert classwise_ece(z, y) == pytest.approx(got["cece"], abs=1e-15)


@pytest.mark.parametrize("classes", [5, 40])  # the column layout and the row layout
def test_a_few_tied_maxima_among_many_samples_resolve_to_the_lowest_class_index(classes):
    # a sum of squares of at least 2 marks the rows that may hold a tie: with 5 classes they are few, and only their
    # rows are read; with 40 many rows reach 2, and the whole block's maxima are counted
    z, y = make_logits(2000, classes, seed=41, dtype=torch.float32)
    z[:12, 1] = z[:12].amax(1)  # class 1 ties the maximum of twelve rows
    y[:6], y[6:12] = 1, z[6:12].argmax(1)  # the label on the second of the tied maxima (a miss), then on the first
    got = calibration_metrics(z, y)
    assert got["accuracy"] == float((z.argmax(1) == y).double().mean())
    assert brier_score(z, y) == pytest.approx(got["brier"], abs=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("classes", [5, 40])
@pytest.mark.parametrize("scale", [1e-4, 1.0, 60.0])  # nearly uniform, ordinary and saturated (p_y within 1e-26 of 1)
def test_brier_from_the_exponentials_equals_the_brier_of_the_probabilities(dtype, classes, scale):
    z, y = make_logits(500, classes, seed=42, scale=2.0 * scale, boost=2.0 * scale)
    z[:5, 0] = -math.inf  # masked classes: probability 0
    p = ref_softmax(z.to(dtype).double().numpy())
    want = ref_brier(p, ref_onehot(y, classes))
    tol = 1e-12 if dtype == torch.float64 else 2e-7  # the float32 exponentials' rounding, not a cancellation
    assert brier_score(z.to(dtype), y) == pytest.approx(want, abs=tol)


def test_dense_predictions_with_ignore_index():
    g = torch.Generator().manual_seed(10)
    logits = torch.randn(3, 4, 5, 6, generator=g, dtype=torch.float64)
    target = torch.randint(0, 4, (3, 5, 6), generator=g)
    target[0, :2] = 255
    flat_z = logits.movedim(1, -1).reshape(-1, 4)
    flat_y = target.reshape(-1)
    keep = flat_y != 255
    want = calibration_metrics(flat_z[keep], flat_y[keep])
    assert_metrics_close(calibration_metrics(logits, target, ignore_index=255), want, 1e-12)
    # soft dense targets (N, C, H, W)
    soft = torch.softmax(torch.randn(3, 4, 5, 6, generator=g, dtype=torch.float64), 1)
    assert_metrics_close(calibration_metrics(logits, soft),
                         calibration_metrics(flat_z, soft.movedim(1, -1).reshape(-1, 4)), 1e-12)


def test_binary_task_equals_two_class_multiclass():
    g = torch.Generator().manual_seed(11)
    z = 3 * torch.randn(800, generator=g, dtype=torch.float64)
    y = torch.randint(0, 2, (800,), generator=g)
    p = torch.sigmoid(z)
    two = torch.stack([1 - p, p], 1)
    want = calibration_metrics(two, y, input_type="probs")
    assert_metrics_close(calibration_metrics(z, y, task="binary"), want, 1e-12)
    assert_metrics_close(calibration_metrics(p, y, input_type="probs", task="binary"), want, 1e-12)
    assert_metrics_close(calibration_metrics(torch.nn.functional.logsigmoid(z), y, input_type="log_probs",
                                             task="binary"), want, 1e-10)
    # soft binary targets: probability of the positive class
    q = torch.rand(800, generator=g, dtype=torch.float64)
    assert_metrics_close(calibration_metrics(z, q, task="binary"),
                         calibration_metrics(two, torch.stack([1 - q, q], 1), input_type="probs"), 1e-12)
    # dense binary (N, H, W) with ignore_index
    zz, yy = z.view(8, 10, 10), y.view(8, 10, 10).clone()
    yy[0] = 255
    assert ece(zz, yy, task="binary", ignore_index=255) == pytest.approx(ece(z[100:], y[100:], task="binary"))


def test_minus_inf_logits_are_masked_classes():
    # like torch.softmax / cross_entropy: a -inf logit is a class with probability 0
    z = torch.tensor([[2.0, -float("inf"), 0.0], [-float("inf"), 1.0, 1.5]], dtype=torch.float64)
    y = torch.tensor([0, 2])
    p = torch.softmax(z, 1)
    assert_metrics_close(calibration_metrics(z, y), calibration_metrics(p, y, input_type="probs"), 1e-12)
    assert nll(z, y) == pytest.approx(torch.nn.functional.cross_entropy(z, y).item(), abs=1e-12)
    t = torch.tensor([[0.5, 0.0, 0.5], [0.0, 0.3, 0.7]], dtype=torch.float64)
    terms = torch.where(t > 0, t * torch.log_softmax(z, 1), torch.zeros(()))  # 0 log 0 = 0
    assert nll(z, t) == pytest.approx(-terms.sum(1).mean().item(), abs=1e-12)


def test_numpy_inputs_and_lists():
    z, y = make_logits(200, 4, seed=12)
    want = calibration_metrics(z, y)
    assert_metrics_close(calibration_metrics(z.numpy(), y.numpy()), want, 1e-15)
    assert_metrics_close(calibration_metrics(z.tolist(), y.tolist()), want, 1e-15)


# ----------------------------------------------------------------------------------------------------------------
# peers: torchmetrics 1.9, netcal 1.4, relplot 1.0.3
# ----------------------------------------------------------------------------------------------------------------


def test_ece_agrees_with_torchmetrics_away_from_bin_edges():
    # same values when no confidence sits exactly on an edge or at 1.0 ([lo, hi) vs our (lo, hi]); torchmetrics
    # still rounds through float32 somewhere on float64 inputs, hence the 1e-6 tolerance
    from torchmetrics.functional.classification import multiclass_calibration_error

    z, y = make_logits(4000, 10, seed=13)
    for norm in ("l1", "l2", "max"):
        theirs = multiclass_calibration_error(z, y, num_classes=10, n_bins=15, norm=norm).item()
        assert ece(z, y, 15, norm=norm) == pytest.approx(theirs, abs=1e-6)


def test_ece_and_mce_agree_with_netcal():
    from netcal.metrics import ECE, MCE

    z, y = make_logits(4000, 10, seed=14)
    p = torch.softmax(z, 1).numpy()
    assert ece(p, y, 15, input_type="probs") == pytest.approx(ECE(bins=15).measure(p, y.numpy()), abs=1e-9)
    assert mce(p, y, 15, input_type="probs") == pytest.approx(MCE(bins=15).measure(p, y.numpy()), abs=1e-9)


def test_smooth_ece_matches_relplot():
    import relplot

    for seed, (n, c) in enumerate([(3000, 10), (500, 3), (20000, 50)]):
        z, y = make_logits(n, c, seed=20 + seed, boost=3.0)
        conf, acc = relplot.multiclass_logits_to_confidences(z.numpy(), y.numpy())
        value, sigma = smooth_ece(z, y, return_sigma=True)
        want, width = relplot.smECE(conf, acc, return_width=True)
        assert value == pytest.approx(want, abs=1e-9)
        assert sigma == width
        assert smooth_ece(z, y, sigma=0.05) == pytest.approx(relplot.smECE_sigma(conf, acc, 0.05), abs=1e-9)
    # perfectly calibrated in expectation -> small; all wrong at confidence 1 -> large
    y = torch.tensor([0, 1, 2, 1, 0])
    assert smooth_ece(torch.nn.functional.one_hot(y, 3).double(), (y + 1) % 3, input_type="probs") > 0.9


# ----------------------------------------------------------------------------------------------------------------
# validation
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("call, message", [
    (lambda: ece(torch.tensor([[0.0, float("nan")]]), torch.tensor([0])), "NaN or \\+inf"),
    (lambda: ece(torch.tensor([[0.0, float("inf")]]), torch.tensor([0])), "NaN or \\+inf"),
    (lambda: ece(torch.tensor([[-float("inf"), -float("inf")]]), torch.tensor([0])), "-inf everywhere"),
    (lambda: ece(torch.tensor([[0.5, float("nan")]]), torch.tensor([0]), input_type="probs"), "NaN or inf"),
    (lambda: ece(torch.tensor([[0.0, float("nan")]]), torch.tensor([0]), input_type="log_probs"), "NaN"),
    (lambda: ece(torch.randn(5), torch.zeros(5, dtype=torch.long)), "task='binary'"),
    (lambda: ece(torch.randn(5, 3), torch.zeros(4, dtype=torch.long)), "mismatched N"),
    (lambda: ece(torch.randn(5, 3), torch.zeros(5, 2)), "does not fit"),
    (lambda: ece(torch.randn(5, 3), torch.tensor([0, 1, 2, 3, 0])), "label out of range"),
    (lambda: ece(torch.randn(5, 3), torch.tensor([0, 1, 2, -1, 0])), "label out of range"),
    (lambda: ece(torch.full((2, 3), 0.5), torch.tensor([0, 1]), input_type="probs"), "do not sum to 1"),
    (lambda: ece(torch.tensor([[1.5, -0.5]]), torch.tensor([0]), input_type="probs"), "negative"),
    (lambda: ece(torch.randn(2, 3), torch.full((2, 3), 0.5)), "soft target rows do not sum to 1"),
    (lambda: ece(torch.randn(2, 3), torch.tensor([0.5, 1.0])), "non-integer"),
    (lambda: ece(torch.zeros(0, 3), torch.zeros(0, dtype=torch.long)), "empty input"),
    (lambda: ece(torch.randn(4, 3), torch.zeros(4, dtype=torch.long), n_bins=0), "n_bins"),
    (lambda: ece(torch.randn(4, 3), torch.zeros(4, dtype=torch.long), n_bins=2.5), "n_bins"),
    (lambda: ece(torch.randn(4, 3), torch.zeros(4, dtype=torch.long), input_type="prob"), "input_type"),
    (lambda: ece(torch.randn(4, 3), torch.zeros(4, dtype=torch.long), num_classes=5), "num_classes=5"),
    (lambda: ece(torch.randn(4, 3), torch.zeros(4, dtype=torch.long), norm="l3"), "norm"),
    (lambda: ece(torch.randn(4, 3), torch.full((4, 3), 1 / 3), ignore_index=0), "ignore_index"),
    (lambda: ece(torch.randint(0, 3, (4, 3)), torch.zeros(4, dtype=torch.long)), "floating point"),
    (lambda: ece(torch.randn(4, 3), torch.full((4,), 255), ignore_index=255), "no samples"),
    (lambda: ece(torch.rand(4), torch.tensor([0.0, 0.5, 1.5, 1.0]), input_type="probs", task="binary"), "[0, 1]"),
    (lambda: ece(torch.rand(4), torch.tensor([0, 1, 2, 1]), input_type="probs", task="binary"), "out of range"),
])
def test_bad_input_raises_a_named_value_error(call, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(")):
        call()


# ----------------------------------------------------------------------------------------------------------------
# reliability table and diagrams
# ----------------------------------------------------------------------------------------------------------------


def test_reliability_table_matches_reference_bins():
    z, y = make_logits(1000, 5, seed=30)
    p = ref_softmax(z.numpy())
    conf, acc = ref_top(p, ref_onehot(y, 5))
    table = reliability_table(z, y, 10)
    edges = np.linspace(0, 1, 11)
    for b in range(10):
        m = ref_members(conf, edges, b)
        assert table.count[b] == m.sum()
        if m.any():
            assert table.confidence[b].item() == pytest.approx(conf[m].mean(), abs=1e-12)
            assert table.accuracy[b].item() == pytest.approx(acc[m].mean(), abs=1e-12)
            assert table.gap[b].item() == pytest.approx(acc[m].mean() - conf[m].mean(), abs=1e-12)
        else:
            assert math.isnan(table.accuracy[b].item())
    assert table.ece == ece(z, y, 10)
    d = table.to_dict()
    assert d["count"] == [int(c) for c in table.count.tolist()] and len(d["lower"]) == 10
    assert table.to_markdown().count("\n") == 11


def test_reliability_diagram_png_shows_the_computed_ece(tmp_path):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from timm_csm.metrics.plots import ece_label, plot_reliability, reliability_diagram, reliability_diagrams

    z, y = make_logits(500, 4, seed=31)
    path = tmp_path / "sub" / "rel.png"
    value = reliability_diagram(z, y, path, n_bins=10, title="model")
    assert value == ece(z, y, 10)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [f for f in path.parent.iterdir() if f.name != "rel.png"]  # no temp file left
    fig = Figure()
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    label = plot_reliability(reliability_table(z, y, 10), ax)
    assert label == ece_label(value) and label in [t.get_text() for t in ax.texts]
    both = reliability_diagrams({"raw": (z, y), "T=2": (z / 2, y)}, tmp_path / "both.png", n_bins=10)
    assert both == {"raw": value, "T=2": ece(z / 2, y, 10)}
    assert (tmp_path / "both.png").stat().st_size > 0


def test_many_reliability_diagrams_wrap_into_rows_of_four(tmp_path):
    """Eight panels (uncalibrated and seven calibrators) were one row 3,840 px wide: now two rows of four."""
    from PIL import Image

    from timm_csm.metrics.plots import PANELS_PER_ROW, reliability_diagrams

    z, y = make_logits(200, 4, seed=32)
    sizes = {}
    for panels in (1, 4, 8, 9):
        path = tmp_path / f"{panels}.png"
        reliability_diagrams({f"T={t + 1}": (z / (t + 1), y) for t in range(panels)}, path, n_bins=10)
        sizes[panels] = Image.open(path).size
    assert PANELS_PER_ROW == 4
    assert sizes[4][0] == sizes[8][0] == sizes[9][0] <= 1920 and sizes[1][0] < sizes[4][0]
    assert sizes[4][1] == sizes[1][1] and sizes[8][1] == 2 * sizes[4][1] and sizes[9][1] == 3 * sizes[4][1]


def test_functional_brier_binary_task_is_the_binary_score():
    """Binary task: mean (p - y)^2 of the positive class, as scikit-learn (evaluate's brier_score example: 0.3375)."""
    from sklearn.metrics import brier_score_loss

    p1 = torch.tensor([0.1, 0.9, 0.8, 0.3], dtype=torch.float64)
    y = torch.tensor([0, 0, 1, 1])
    got = brier_score(p1, y, input_type="probs", task="binary")
    assert got == pytest.approx(brier_score_loss(y.numpy(), p1.numpy()), abs=1e-12) and got == pytest.approx(0.3375)
    two = torch.stack([1 - p1, p1], 1)
    assert brier_score(two, y, input_type="probs") == pytest.approx(2 * got, abs=1e-12)


# ----------------------------------------------------------------------------------------------------------------
# PIECE (ProCal) and proximity
# ----------------------------------------------------------------------------------------------------------------


def ref_piece(conf, acc, prox, n_conf_bins=15, n_prox_bins=10):
    """Σ over the quantile proximity bins P ((lo, hi]) of |P|/N times the ECE inside P."""
    edges = np.quantile(prox, np.linspace(0, 1, n_prox_bins + 1))
    n = len(prox)
    total = 0.0
    for p in range(n_prox_bins):
        m = ref_members(prox, edges, p)
        if m.any():
            total += m.sum() / n * ref_ece(conf[m], acc[m], n_conf_bins)
    return total


def test_proximity_hand_worked():
    angles = torch.tensor([0.0, 60.0, 180.0]) * math.pi / 180
    feats = torch.stack([angles.cos(), angles.sin()], 1) * 3.0  # scaled: features are L2-normalised first
    # squared distances on the unit circle: d(0, 60) = 1, d(0, 180) = 4, d(60, 180) = 3
    e = math.exp
    assert torch.allclose(proximity(feats, n_neighbors=1), torch.tensor([e(-1), e(-1), e(-3)], dtype=torch.float64))
    two = torch.tensor([(e(-1) + e(-4)) / 2, (e(-1) + e(-3)) / 2, (e(-4) + e(-3)) / 2], dtype=torch.float64)
    assert torch.allclose(proximity(feats, n_neighbors=2, chunk_size=2), two)
    # against a separate reference set the point itself counts
    assert torch.allclose(proximity(feats[:1], feats, n_neighbors=2), torch.tensor([(1 + e(-1)) / 2],
                                                                                   dtype=torch.float64))
    with pytest.raises(ValueError, match="n_neighbors"):
        proximity(feats, n_neighbors=3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_piece_matches_reference_and_reduces_to_the_reported_ece(dtype):
    z, y = make_logits(400, 5, seed=5, dtype=dtype)
    feats = torch.randn(400, 8, generator=torch.Generator().manual_seed(5))
    prox = proximity(feats)
    conf, acc = ref_top(ref_softmax(z.double()), ref_onehot(y, 5))
    assert piece(z, y, feats) == pytest.approx(ref_piece(conf, acc, prox.numpy()), abs=1e-6 if dtype == torch.float32
                                               else 1e-12)
    # the confidences and bins of ece(), float32 logits included: one proximity bin gives the reported ECE
    assert piece(z, y, feats, n_prox_bins=1) == pytest.approx(ece(z, y), abs=1e-14)
    assert piece(z, y, feats) >= ece(z, y) - 1e-14
    assert piece(z, y, None, prox=prox) == piece(z, y, feats)
    assert piece(torch.softmax(z.double(), 1), y, feats, input_type="probs") == pytest.approx(piece(z, y, feats),
                                                                                              abs=1e-6)


def test_piece_hand_worked():
    # two proximity groups, one over-confident and one under-confident: ECE cancels within the confidence bin,
    # PIECE does not
    probs = torch.tensor([[0.9, 0.1]] * 4, dtype=torch.float64)
    y = torch.tensor([0, 1, 0, 0])  # first pair: accuracy 1/2 at confidence 0.9; second pair: accuracy 1
    prox = torch.tensor([0.1, 0.1, 0.9, 0.9])
    assert ece(probs, y, input_type="probs") == pytest.approx(abs(0.75 - 0.9))
    expected = 0.5 * abs(0.5 - 0.9) + 0.5 * abs(1.0 - 0.9)
    assert piece(probs, y, None, prox=prox, n_prox_bins=2, input_type="probs") == pytest.approx(expected)


def test_piece_bad_input_names_the_problem():
    z, y = make_logits(20, 3)
    feats = torch.randn(20, 4, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="rows for 20 samples"):
        piece(z, y, feats[:15])
    with pytest.raises(ValueError, match=r"prox must have shape \(20,\)"):
        piece(z, y, None, prox=torch.rand(19))
    with pytest.raises(ValueError, match="features is missing"):
        piece(z, y, None)
    with pytest.raises(ValueError, match="n_bins"):
        piece(z, y, feats, n_prox_bins=0)
    with pytest.raises(ValueError, match=r"shape \(N, C\)"):
        piece(z.view(20, 3, 1), y.view(20, 1), feats)


def test_the_debiased_ce_removes_the_binned_estimates_bias():
    """Labels drawn from the confidences themselves (a calibrated model): over many draws the binned squared l2
    error stays above 0 (the bins' noise), the debiased estimate averages 0; a miscalibrated model's squared error
    (known in closed form here) is recovered without the upward bias."""
    g = torch.Generator().manual_seed(0)
    draws, n = 400, 300
    conf = 0.5 + 0.5 * torch.rand(draws, n, generator=g, dtype=torch.float64)
    for shift in (0.0, 0.1):  # accuracy = confidence - shift
        correct = (torch.rand(draws, n, generator=g, dtype=torch.float64) < conf - shift).double()
        sums = [bin_sums(bin_index(conf[d], bin_edges(15)), 15, conf[d], correct[d], correct[d]) for d in range(draws)]
        plug_in = torch.tensor([calibration_error_from_bins(*s[:3], "l2") ** 2 for s in sums])
        debiased = torch.tensor([float(debiased_error_from_bins(*s, squared=True)) for s in sums], dtype=torch.float64)
        sd_mean = float(debiased.std()) / math.sqrt(draws)
        assert abs(float(debiased.mean()) - shift ** 2) < 4 * sd_mean
        assert float(plug_in.mean()) - shift ** 2 > 10 * sd_mean  # the bias the estimator removes
        # the same on a batch of bins (the bootstrap's resamples), and the one-pass function on the confidences
        assert torch.allclose(debiased_error_from_bins(*map(torch.stack, zip(*sums)), squared=True), debiased,
                              atol=1e-15)
    probs = torch.stack([conf[0], 1 - conf[0]], 1)  # two classes: the confidence is the first class's probability
    assert debiased_ce(probs, 1 - correct[0].long(), input_type="probs") == pytest.approx(
        ref_debiased_ce(conf[0].numpy(), correct[0].numpy()), abs=1e-12)


def test_classwise_first_bins_clear_rounding_only():
    """A first bin's sum (column total less the other bins) below 0 by rounding is cleared; a deficit beyond
    rounding is a fault of the sums and raised, not cleared."""
    from types import SimpleNamespace

    from timm_csm.metrics.classwise import ClasswiseSums

    def finalize(deficit):
        sums = ClasswiseSums(num_classes=2, n_bins=3, device="cpu", soft=True)
        sums.n = 10
        sums.prob[1] = sums.label[1] = 4.0  # class 0, second bin
        sums.prob_total[0] = sums.label_total[0] = 4.0 - deficit
        state = SimpleNamespace(**{k: torch.zeros(2, 3, dtype=torch.float64)
                                   for k in ("cw_count", "cw_prob_sum", "cw_label_sum")})
        sums.finalize(state)
        return state

    state = finalize(1e-13)
    assert float(state.cw_prob_sum[0, 0]) == 0.0 and float(state.cw_label_sum[0, 0]) == 0.0
    assert float(state.cw_prob_sum[0, 1]) == 4.0
    with pytest.raises(RuntimeError, match="below 0 by more than rounding"):
        finalize(0.5)
