"""Split-conformal sets (coverage on exchangeable synthetic data within the bound the theory gives, scores against a
loop) and the selective-prediction metrics (against a brute force over the orders of tied samples)."""
import itertools
import math

import numpy as np
import pytest
import torch

from timm_csm.calibration import ConformalClassifier, TemperatureScaling, list_calibrators
from timm_csm.calibration.conformal import conformal_quantile, conformal_scores
from timm_csm.metrics import augrc, aurc, eaurc, risk_coverage_curve
from timm_csm.metrics.selective import risk_coverage_from_points, selective_metrics_from_points


def exchangeable(n, c=10, seed=0, scale=1.5):
    """Logits and labels drawn i.i.d.: labels from the softmax of the same logits, over-confidently scaled."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, c, generator=g, dtype=torch.float64) * scale
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g).squeeze(1)
    return z * 2.5, y


@pytest.mark.parametrize("method", ["lac", "aps", "raps"])
def test_coverage_is_one_minus_alpha_within_the_bound(method):
    alpha, n_cal, n_test, trials = 0.1, 499, 1000, 60
    coverages, sizes = [], []
    for t in range(trials):
        z, y = exchangeable(n_cal + n_test, seed=t)
        cp = ConformalClassifier(method, alpha=alpha, seed=t).fit(z[:n_cal], y[:n_cal])
        result = cp.evaluate(z[n_cal:], y[n_cal:])
        coverages.append(result["coverage"])
        sizes.append(result["mean_set_size"])
    # given the calibration split, coverage ~ Beta(n + 1 - l, l), l = floor((n + 1) alpha) (exact for continuous
    # randomised scores); the test split adds binomial noise; the mean over trials has a known mean and variance
    l = math.floor((n_cal + 1) * alpha)
    a, b = n_cal + 1 - l, l
    mean = a / (a + b)
    variance = a * b / ((a + b) ** 2 * (a + b + 1)) + mean * (1 - mean) / n_test
    assert abs(np.mean(coverages) - mean) < 4 * math.sqrt(variance / trials)
    assert 1 < np.mean(sizes) < 10


def test_coverage_range_holds_nine_splits_in_ten():
    """The expected 5-95% range of one split's coverage: its beta-binomial quantiles agree with draws of the law,
    and about 90% of real conformal splits land inside it (the report's "expected range")."""
    from timm_csm.calibration.conformal import coverage_range

    n_cal, n_test, alpha = 200, 300, 0.1
    lo, hi = coverage_range(n_cal, n_test, alpha)
    l = math.floor((n_cal + 1) * alpha)
    g = torch.Generator().manual_seed(0)
    c = torch.distributions.Beta(float(n_cal + 1 - l), float(l)).sample((20000,))
    draws = torch.binomial(torch.full_like(c, float(n_test)), c, generator=g) / n_test
    assert abs(float(draws.quantile(0.05)) - lo) <= 2 / n_test and abs(float(draws.quantile(0.95)) - hi) <= 2 / n_test
    inside = []
    for t in range(300):
        z, y = exchangeable(n_cal + n_test, seed=1000 + t)
        result = ConformalClassifier("aps", alpha=alpha, seed=t).fit(z[:n_cal], y[:n_cal]).evaluate(z[n_cal:],
                                                                                                 y[n_cal:])
        assert result["coverage_range"] == [lo, hi] and result["n_calibration"] == n_cal
        inside.append(lo <= result["coverage"] <= hi)
    assert 0.84 <= np.mean(inside) <= 0.96
    assert coverage_range(8, 50, 0.1) == (1.0, 1.0)  # floor(9 * 0.1) = 0: every set holds every class


def test_default_raps_is_tuned_as_the_paper_and_differs_from_aps():
    from timm_csm.calibration.conformal import RAPS_PENALTY_GRID

    z, y = exchangeable(3000, c=10, seed=7, scale=1.0)
    aps = ConformalClassifier("aps", alpha=0.1, seed=3).fit(z[:1000], y[:1000])
    raps = ConformalClassifier("raps", alpha=0.1, seed=3).fit(z[:1000], y[:1000])
    assert raps.n_tuning == 300 and raps.n_calibration == 700 and raps.penalty in RAPS_PENALTY_GRID
    # k_reg: the (1 - alpha) quantile ("higher") of the true class's 1-based rank on the seeded 30% tuning part
    tune = torch.randperm(1000, generator=torch.Generator().manual_seed(3))[:300]
    probs = torch.softmax(z[tune], 1)
    ranks = (probs > probs.gather(1, y[tune, None])).sum(1) + 1  # classes more probable than the true one, + 1
    assert raps.k_reg == int(np.quantile(ranks.numpy(), 0.9, method="higher")) >= 1
    sets_aps, sets_raps = aps.predict_sets(z[1000:]), raps.predict_sets(z[1000:])
    assert (sets_aps != sets_raps).any(dim=1).double().mean() > 0.05
    result = raps.evaluate(z[1000:], y[1000:])
    assert result["penalty"] == raps.penalty and result["k_reg"] == raps.k_reg
    assert abs(result["coverage"] - 0.9) < 0.03
    fixed = ConformalClassifier("raps", alpha=0.1, penalty=0.0, k_reg=0, seed=3).fit(z[:1000], y[:1000])
    assert fixed.n_tuning == 0 and fixed.penalty == 0.0  # given values are used as they are: RAPS = APS here
    with pytest.raises(ValueError, match="both penalty and k_reg"):
        ConformalClassifier("raps", penalty=0.1)


def test_scores_equal_a_loop():
    z, _ = exchangeable(30, c=6, seed=3)
    probs = torch.softmax(z, 1)
    u = torch.rand(30, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    aps = conformal_scores(probs, "aps", u)
    raps = conformal_scores(probs, "raps", u, penalty=0.2, k_reg=2)
    for i in range(30):
        ranked = sorted(range(6), key=lambda k: -probs[i, k].item())
        for rank, k in enumerate(ranked):
            above = sum(probs[i, j].item() for j in ranked[:rank])
            assert aps[i, k].item() == pytest.approx(above + u[i].item() * probs[i, k].item(), abs=1e-12)
            assert raps[i, k].item() == pytest.approx(above + u[i].item() * probs[i, k].item()
                                                      + 0.2 * max(0, rank + 1 - 2), abs=1e-12)
    assert torch.allclose(conformal_scores(probs, "lac", u), 1 - probs)


def test_quantile_rule_and_sets():
    scores = torch.arange(1, 10, dtype=torch.float64) / 10  # n = 9
    assert conformal_quantile(scores, 0.1) == 0.9  # ceil(10 * 0.9) = 9th smallest
    assert conformal_quantile(scores, 0.2) == 0.8
    assert conformal_quantile(scores, 0.05) == math.inf  # ceil(9.5) = 10 > n: every class
    z, y = exchangeable(9, c=4, seed=1)
    sets = ConformalClassifier("lac", alpha=0.05).fit(z, y).predict_sets(z)
    assert sets.all()
    # non-randomised APS sets are the shortest prefixes of the ranking that reach the quantile
    z, y = exchangeable(2000, c=8, seed=2)
    cp = ConformalClassifier("aps", alpha=0.2, randomized=False).fit(z[:1000], y[:1000])
    sets = cp.predict_sets(z[1000:])
    probs = torch.softmax(z[1000:], 1)
    order = probs.argsort(1, descending=True)
    size = sets.sum(1)
    assert torch.equal(sets.gather(1, order), torch.arange(8)[None, :] < size[:, None])  # nested prefixes
    with pytest.raises(ValueError, match="not fitted"):
        ConformalClassifier().predict_sets(z)
    with pytest.raises(ValueError, match="alpha"):
        ConformalClassifier(alpha=1.5)


def test_conformal_on_top_of_a_calibrator_keeps_coverage():
    z, y = exchangeable(6000, seed=5)
    raw = ConformalClassifier("aps", alpha=0.1).fit(z[2000:4000], y[2000:4000]).evaluate(z[4000:], y[4000:])
    calibrated = ConformalClassifier("aps", alpha=0.1, calibrator="temperature_scaling_nll").fit(z[:4000], y[:4000])
    result = calibrated.evaluate(z[4000:], y[4000:])
    assert abs(result["coverage"] - 0.9) < 0.03 and abs(raw["coverage"] - 0.9) < 0.03
    assert result["n_calibrator"] == 2000 and result["n_calibration"] == 2000 and result["n_tuning"] == 0
    # the calibrator is fitted on a seeded half and applied before the scores; the quantile comes from the other
    # half: the same as conformal sets on the calibrated logits of that half
    part = torch.randperm(4000, generator=torch.Generator().manual_seed(0))
    ts = TemperatureScaling(method="nll").fit(z[part[:2000]], y[part[:2000]])
    assert ts.temperature == calibrated.calibrator.temperature
    direct = ConformalClassifier("aps", alpha=0.1).fit(ts.transform(z[part[2000:]]), y[part[2000:]])
    assert direct.quantile == calibrated.quantile != raw["quantile"] is not None
    assert direct.evaluate(ts.transform(z[4000:]), y[4000:]) == dict(result, n_calibrator=0)
    with pytest.raises(ValueError, match="fits its calibrator itself"):
        ConformalClassifier("aps", calibrator=ts)  # fitted: the quantile could see the images it was fitted on
    unfitted = ts.unfitted()
    assert not unfitted.is_fitted and unfitted.config() == ts.config()
    with pytest.raises(ValueError, match="calibrator_fraction"):
        ConformalClassifier("aps", calibrator=unfitted, calibrator_fraction=1.0)


def _exchangeable_splits(splits, n, c, seed):
    """``splits`` independent draws of :func:`exchangeable` at once: logits (splits, n, c) and labels."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(splits, n, c, generator=g, dtype=torch.float64) * 1.5
    y = torch.multinomial(torch.softmax(z, -1).view(-1, c), 1, generator=g).view(splits, n)
    return z * 2.5, y


def _coverages(name, splits, n_cal, n_test, alpha, apart=True):
    """LAC and APS coverage on the test part of each split, on top of calibrator ``name``: fitted by the sets
    themselves (``apart``), or fitted on the very images the quantile is computed on (what breaks the guarantee)."""
    from timm_csm.calibration import calibrator_spec, create_calibrator, fit_conformal_sets
    from timm_csm.calibration.conformal import CALIBRATOR_FRACTION

    c = 2 if calibrator_spec(name).binary_only else 4
    z, y = _exchangeable_splits(splits, n_cal + n_test, c, seed=11)
    out = {"lac": [], "aps": []}
    for s in range(splits):
        cal, test = (z[s, :n_cal], y[s, :n_cal]), (z[s, n_cal:], y[s, n_cal:])
        if not apart:  # the calibrator fitted on the same images as the quantile (as many as the quantile's part)
            n = round((1 - CALIBRATOR_FRACTION) * n_cal)
            fitted = create_calibrator(name).fit(cal[0][:n], cal[1][:n])
            cal, test = (fitted.transform(cal[0][:n]), cal[1][:n]), (fitted.transform(test[0]), test[1])
        sets = fit_conformal_sets(("lac", "aps"), *cal, calibrator=name if apart else None, alpha=alpha, seed=s)
        for method, cp in sets.items():
            out[method].append(cp.evaluate(*test))
    return out


@pytest.mark.parametrize("name", list_calibrators())
def test_coverage_on_top_of_every_calibrator_within_the_expected_range_over_200_splits(name):
    """Sets on top of each registered calibrator (refitted on half the calibration images, the quantile on the
    other half) over 200 random splits: the mean coverage is the beta law's, and about nine splits in ten lie
    inside the report's expected range, few below it."""
    splits, n_cal, n_test, alpha = 200, 600, 1000, 0.1
    for method, results in _coverages(name, splits, n_cal, n_test, alpha).items():
        coverage = np.array([r["coverage"] for r in results])
        lo, hi = results[0]["coverage_range"]
        n = results[0]["n_calibration"]
        assert n == n_cal - round(0.5 * n_cal) and results[0]["n_calibrator"] == n_cal - n
        l = math.floor((n + 1) * alpha)
        a, b = n + 1 - l, l
        mean = a / (a + b)
        sd = math.sqrt(a * b / ((a + b) ** 2 * (a + b + 1)) + mean * (1 - mean) / n_test)
        assert abs(coverage.mean() - mean) < 4 * sd / math.sqrt(splits), (method, coverage.mean(), mean)
        inside, below = ((coverage >= lo) & (coverage <= hi)).mean(), (coverage < lo).mean()
        three_sd = 3 * math.sqrt(0.9 * 0.1 / splits)  # a share of splits, 0.9 inside on average
        assert inside >= 0.9 - three_sd and below <= 0.05 + three_sd, (method, inside, below)


def test_a_calibrator_fitted_on_the_quantiles_images_breaks_coverage():
    """The control of the test above: isotonic regression fitted on the images the quantile is computed on puts
    most splits below their expected range (what the calibrator part prevents)."""
    splits, n_cal, n_test, alpha = 200, 600, 1000, 0.1
    for method, results in _coverages("isotonic", splits, n_cal, n_test, alpha, apart=False).items():
        coverage = np.array([r["coverage"] for r in results])
        lo = results[0]["coverage_range"][0]
        assert coverage.mean() < 0.88 and (coverage < lo).mean() > 0.4, (method, coverage.mean())
def brute_force_selective(conf, acc):
    """Average of the curve over every order of tied samples (the definition the ties rule implements)."""
    n = len(conf)
    groups = [sorted(i for i in range(n) if conf[i] == v) for v in sorted(set(conf), reverse=True)]
    curves = []
    for perms in itertools.product(*(itertools.permutations(g) for g in groups)):
        order = [i for p in perms for i in p]
        errors = np.cumsum([1 - acc[i] for i in order])
        curves.append(errors)
    e = np.mean(curves, axis=0)
    k = np.arange(1, n + 1)
    ideal = np.maximum(0, k - (n - e[-1])) / k
    return e / k, {"aurc": np.mean(e / k), "eaurc": np.mean(e / k) - np.mean(ideal), "augrc": np.mean(e / n)}


def test_selective_metrics_equal_a_brute_force_over_tie_orders():
    conf = [0.9, 0.9, 0.8, 0.7, 0.7, 0.7, 0.6, 0.5]
    acc = [1, 0, 1, 0, 1, 1, 0, 1]
    risk, expected = brute_force_selective(conf, acc)
    curve = risk_coverage_from_points(torch.tensor(conf), torch.tensor(acc))
    assert np.allclose(curve.risk.numpy(), risk, atol=1e-12)
    got = selective_metrics_from_points(torch.tensor(conf), torch.tensor(acc, dtype=torch.float64))
    assert got == pytest.approx(expected, abs=1e-12)
    # the input order does not matter
    perm = [7, 3, 0, 5, 1, 6, 2, 4]
    again = selective_metrics_from_points(torch.tensor(conf)[perm], torch.tensor(acc, dtype=torch.float64)[perm])
    assert again == pytest.approx(got, abs=1e-15)


def test_selective_metrics_of_perfect_and_inverted_rankings():
    conf = torch.linspace(0.99, 0.5, 10)
    acc = torch.tensor([1.0] * 7 + [0.0] * 3)
    perfect = selective_metrics_from_points(conf, acc)
    assert perfect["eaurc"] == pytest.approx(0.0, abs=1e-15)
    assert perfect["augrc"] == pytest.approx((1 + 2 + 3) / 10 / 10)  # errors only in the last 3 coverages
    inverted = selective_metrics_from_points(conf, acc.flip(0))
    assert inverted["aurc"] > perfect["aurc"] and inverted["eaurc"] > 0.3


def test_functional_metrics_read_logits():
    z, y = exchangeable(500, seed=6)
    conf, pred = torch.softmax(z, 1).max(1)
    expected = selective_metrics_from_points(conf, (pred == y).double())
    assert aurc(z, y) == pytest.approx(expected["aurc"], abs=1e-12)
    assert eaurc(z, y) == pytest.approx(expected["eaurc"], abs=1e-12)
    assert augrc(torch.softmax(z, 1), y, input_type="probs") == pytest.approx(expected["augrc"], abs=1e-12)
    curve = risk_coverage_curve(z, y)
    assert curve.coverage[-1] == 1.0 and curve.risk[-1].item() == pytest.approx(1 - (pred == y).double().mean())
    points = curve.to_dict(max_points=50)
    assert len(points["coverage"]) == 50 and points["coverage"][-1] == 1.0


def test_a_coverage_outside_its_expected_range_is_a_warning_in_the_report():
    from timm_csm.evaluation.report import _conformal_lines
    from timm_csm.calibration.conformal import coverage_outside_range

    z, y = exchangeable(4000, seed=8)
    cp = ConformalClassifier("lac", alpha=0.1, calibrator="temperature_scaling_nll").fit(z[:2000], y[:2000])
    same = cp.evaluate(z[2000:], y[2000:])
    sharper = cp.evaluate(z[2000:] * 3, y[2000:])  # test images the model is more confident on: not exchangeable
    lo = sharper["coverage_range"][0]
    assert sharper["coverage"] < lo and coverage_outside_range(same) is None
    warning = coverage_outside_range(sharper)
    assert warning == (f"lac coverage {sharper['coverage']:.4f} lies below its expected range {lo:.3f}-"
                       f"{sharper['coverage_range'][1]:.3f} (quantile on 1000 images)")
    lines = _conformal_lines({"alpha": 0.1, "conformal": {"none": {"lac": same},
                                                          "temperature_scaling_nll": {"lac": sharper}}})
    assert f"**Warning** (temperature_scaling_nll): {warning}." in lines
    row = next(line for line in lines if line.startswith("| temperature_scaling_nll | lac |"))
    assert "| 1000 / - / 1000 |" in row and "(outside)" in row
    assert not any(line.startswith("**Warning** (none)") for line in lines)


def test_no_sets_on_a_calibrator_its_part_of_the_split_is_too_small_for():
    from timm_csm.evaluation.calibrators import conformal_on_each

    z, y = exchangeable(220, c=3, seed=9)
    logged = []
    sets, left_out = conformal_on_each(["dirichlet", "temperature_scaling"], (z[:20], y[:20]), (z[20:], y[20:]), 0.1,
                                       ["lac"], 0, logged.append, {}, 0)
    # Dirichlet calibration of 3 classes needs 12 samples; its half of 20 calibration images holds 10
    assert left_out == {"dirichlet": "needs at least 12 samples for 3 classes, its part of the calibration split "
                                     "has 10"}
    assert set(sets) == {"none", "temperature_scaling", "set_size_temperature"}
    assert sets["temperature_scaling"]["lac"]["n_calibrator"] == 10
    assert logged[0] == f"no conformal sets on dirichlet: it {left_out['dirichlet']}"
