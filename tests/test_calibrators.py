"""The post-hoc calibrators against references: scikit-learn's logistic regression (matrix scaling, Dirichlet
calibration, Platt and beta calibration) and isotonic regression, netcal's one-vs-all isotonic regression and
histogram binning, and re-derivations (the ODIR objective minimised by SciPy, histogram binning as a loop); plus
save / load, refusals and the held-out effect."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy import optimize
from sklearn.isotonic import IsotonicRegression as SkIsotonic
from sklearn.linear_model import LogisticRegression

from timm_csm.calibration import (BetaCalibration, DirichletCalibration, HistogramBinning, IsotonicCalibration,
                                  MatrixScaling, PlattScaling, PostHocCalibrator, create_calibrator,
                                  list_calibrators, load_calibrator)
from timm_csm.calibration.one_vs_rest import PROBABILITY_FLOOR


def noisy_logits(n=800, c=4, seed=0, scale=3.0, shift=1.2):
    """Over-confident logits whose classes overlap (so unpenalised fits have a finite optimum)."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, c, (n,), generator=g)
    z = torch.randn(n, c, generator=g, dtype=torch.float64)
    z[torch.arange(n), y] += shift
    return z * scale, y


def sklearn_unpenalised(features, y):
    return LogisticRegression(C=np.inf, tol=1e-12, max_iter=10000).fit(features, y)


def renormalised(q):
    q = np.maximum(q, PROBABILITY_FLOOR)
    return q / q.sum(1, keepdims=True)


@pytest.mark.parametrize("cls,features", [(MatrixScaling, lambda z: z),
                                          (DirichletCalibration, lambda z: torch.log_softmax(z, 1))])
def test_unpenalised_affine_fits_equal_sklearn_multinomial_regression(cls, features):
    z, y = noisy_logits()
    reference = sklearn_unpenalised(features(z).numpy(), y.numpy())
    test_z, _ = noisy_logits(n=300, seed=1)
    cal = cls().fit(z, y)
    reference_nll = F.nll_loss(torch.from_numpy(reference.predict_proba(features(z).numpy())).log(), y).item()
    assert cal.loss == pytest.approx(reference_nll, abs=1e-10)
    ours = cal.predict_proba(test_z).numpy()
    assert np.allclose(ours, reference.predict_proba(features(test_z).numpy()), atol=1e-6)


def test_l2_dirichlet_equals_sklearn_with_the_matching_strength():
    # ours: mean NLL + lam / (C (C - 1)) sum W^2; sklearn: mean NLL + ||W||^2 / (2 C_sk N)
    z, y = noisy_logits(seed=2)
    n, c, lam = len(y), 4, 0.3
    x = torch.log_softmax(z, 1).numpy()
    reference = LogisticRegression(C=c * (c - 1) / (2 * lam * n), tol=1e-12, max_iter=10000).fit(x, y.numpy())
    cal = DirichletCalibration(reg_lambda=lam, reg="l2").fit(z, y)
    assert np.allclose(cal.weight.numpy(), reference.coef_, atol=1e-6)
    assert np.allclose(cal.predict_proba(z).numpy(), reference.predict_proba(x), atol=1e-7)


def odir_objective(params, x, y, lam, mu):
    """Kull et al.'s ODIR objective written out in NumPy: mean NLL + lam/(C(C-1)) sum_{j!=k} W_jk^2 + mu/C |b|^2."""
    c = x.shape[1]
    w, b = params[:c * c].reshape(c, c), params[c * c:]
    s = x @ w.T + b
    s = s - s.max(1, keepdims=True)
    nll = -(s[np.arange(len(y)), y] - np.log(np.exp(s).sum(1))).mean()
    off = (w ** 2).sum() - (np.diag(w) ** 2).sum()
    return nll + lam * off / (c * (c - 1)) + mu * (b ** 2).sum() / c


@pytest.mark.parametrize("cls", [DirichletCalibration, MatrixScaling])
def test_odir_reaches_the_optimum_of_the_written_objective(cls):
    z, y = noisy_logits(seed=3, n=400)
    lam, mu = 0.5, 0.2
    x = (torch.log_softmax(z, 1) if cls is DirichletCalibration else z).numpy()
    start = np.r_[np.eye(4).ravel(), np.zeros(4)]
    best = optimize.minimize(odir_objective, start, args=(x, y.numpy(), lam, mu), method="BFGS",
                             options={"gtol": 1e-10, "maxiter": 5000})
    cal = cls(reg_lambda=lam, reg_mu=mu).fit(z, y)
    ours = odir_objective(np.r_[cal.weight.numpy().ravel(), cal.bias.numpy()], x, y.numpy(), lam, mu)
    assert cal.loss == pytest.approx(ours, abs=1e-12)
    assert ours == pytest.approx(best.fun, abs=1e-8)
    assert np.allclose(cal.weight.numpy().ravel(), best.x[:16], atol=1e-4)
    # the penalty shrinks the off-diagonal weights and the biases compared with the free fit
    free = cls().fit(z, y)
    off = ~torch.eye(4, dtype=torch.bool)
    assert cal.weight[off].abs().sum() < free.weight[off].abs().sum()
    assert cal.bias.abs().sum() < free.bias.abs().sum()


def test_isotonic_equals_sklearn_per_class_and_netcal():
    z, y = noisy_logits(n=600, c=4, seed=4)
    z[:50] = z[:50].round()  # tied scores: sklearn merges them into their mean label
    probs = torch.softmax(z, 1).numpy()
    test_z, _ = noisy_logits(n=400, c=4, seed=5)
    test_probs = torch.softmax(test_z, 1).numpy()
    per_class = np.stack([SkIsotonic(y_min=0, y_max=1, out_of_bounds="clip")
                          .fit(probs[:, k], (y.numpy() == k).astype(float)).predict(test_probs[:, k])
                          for k in range(4)], axis=1)
    cal = IsotonicCalibration().fit(z, y)
    ours = cal.predict_proba(test_z).numpy()
    assert np.allclose(ours, renormalised(per_class), atol=1e-12)
    from netcal.binning import IsotonicRegression as NetcalIsotonic
    netcal = NetcalIsotonic().fit(probs, y.numpy()).transform(test_probs)
    assert np.allclose(ours, netcal, atol=1e-9)
    assert cal.num_knots.max() < 600  # constant runs are stored by their two ends


def test_histogram_binning_equals_a_loop_and_netcal():
    z, y = noisy_logits(n=700, c=5, seed=6)
    probs, labels = torch.softmax(z, 1).numpy(), y.numpy()
    test_z, _ = noisy_logits(n=300, c=5, seed=7)
    test_probs = torch.softmax(test_z, 1).numpy()
    bins = 15
    edges = np.linspace(0, 1, bins + 1)

    def bin_of(p):  # (lo, hi], 0 in the first bin
        return max(0, min(bins - 1, int(np.searchsorted(edges, p, side="left")) - 1))

    expected = np.zeros_like(test_probs)
    for k in range(5):
        value = [(edges[b] + edges[b + 1]) / 2 for b in range(bins)]
        members = {}
        for p, label in zip(probs[:, k], labels):
            members.setdefault(bin_of(p), []).append(label == k)
        for b, hits in members.items():
            value[b] = np.mean(hits)
        expected[:, k] = [value[bin_of(p)] for p in test_probs[:, k]]
    cal = HistogramBinning(n_bins=bins).fit(z, y)
    ours = cal.predict_proba(test_z).numpy()
    assert np.allclose(ours, renormalised(expected), atol=1e-12)
    assert cal.bin_counts.sum(1).eq(700).all()
    from netcal.binning import HistogramBinning as NetcalHistogram
    netcal = NetcalHistogram(bins=bins).fit(probs, labels).transform(test_probs)
    assert np.allclose(ours, renormalised(netcal), atol=1e-9)


def test_binning_edges_follow_the_metrics_rule():
    # p_0 = 0.5 exactly lies on an edge of 2 bins: (0, 0.5] is bin 0 as in timm_csm.metrics
    z = torch.zeros(4, 2, dtype=torch.float64)
    z[2:, 0] = 10.0
    cal = HistogramBinning(n_bins=2).fit(z, torch.tensor([0, 1, 0, 0]))
    assert cal.bin_counts[0].tolist() == [2.0, 2.0] and cal.bin_values[0].tolist() == [0.5, 1.0]


def test_platt_equals_sklearn_logistic_regression():
    z, y = noisy_logits(n=500, c=2, seed=8)
    s = (z[:, 1] - z[:, 0]).numpy()[:, None]
    reference = sklearn_unpenalised(s, y.numpy())
    cal = PlattScaling().fit(z, y)
    assert cal.params.numpy() == pytest.approx([reference.coef_[0, 0], reference.intercept_[0]], abs=1e-6)
    test_z, _ = noisy_logits(n=200, c=2, seed=9)
    test_s = (test_z[:, 1] - test_z[:, 0]).numpy()[:, None]
    assert np.allclose(cal.predict_proba(test_z).numpy(), reference.predict_proba(test_s), atol=1e-8)


def beta_features(z):
    p = torch.softmax(z, 1)[:, 1].numpy()
    return np.stack([np.log(p), -np.log1p(-p)], axis=1)


def test_beta_calibration_equals_sklearn_on_the_beta_features():
    z, y = noisy_logits(n=500, c=2, seed=10, scale=1.0)
    z[:, 1] = z[:, 1] ** 3 / 4  # a non-logistic distortion that beta calibration maps back
    reference = sklearn_unpenalised(beta_features(z), y.numpy())
    assert (reference.coef_ > 0).all()
    cal = BetaCalibration().fit(z, y)
    assert cal.params.numpy() == pytest.approx([*reference.coef_[0], reference.intercept_[0]], abs=1e-6)
    assert F.cross_entropy(cal.transform(z), y) <= F.cross_entropy(PlattScaling().fit(z, y).transform(z), y)


def test_beta_calibration_drops_a_feature_whose_coefficient_goes_negative():
    # scores that fall as p rises: the free fit gives a < 0, betacal's rule refits on -ln(1 - p) alone
    z, y = noisy_logits(n=500, c=2, seed=11, scale=1.0)
    z = z.flip(1)
    x = beta_features(z)
    assert sklearn_unpenalised(x, y.numpy()).coef_[0, 0] < 0
    reference = sklearn_unpenalised(x[:, 1:], y.numpy())
    cal = BetaCalibration().fit(z, y)
    # as betacal, the refit is not checked again (here b < 0 too: the scores are anti-correlated with the label)
    assert cal.params.numpy() == pytest.approx([0.0, reference.coef_[0, 0], reference.intercept_[0]], abs=1e-6)


@pytest.mark.parametrize("name", ["platt", "beta"])
def test_binary_calibrators_refuse_more_classes(name):
    z, y = noisy_logits(c=3)
    with pytest.raises(ValueError, match="two-class models, got 3 classes"):
        create_calibrator(name).fit(z, y)


MULTICLASS = [n for n in list_calibrators() if n not in ("platt", "beta")]


@pytest.mark.parametrize("name", list_calibrators())
def test_save_load_round_trip_and_refusals(tmp_path, name):
    c = 2 if name in ("platt", "beta") else 4
    z, y = noisy_logits(c=c, seed=12)
    cal = create_calibrator(name).fit(z, y)
    path = tmp_path / f"{name}.safetensors"
    cal.save(path)
    restored = load_calibrator(path)
    assert type(restored) is type(cal) and restored.config() == cal.config()
    assert torch.equal(restored.transform(z), cal.transform(z))
    assert torch.allclose(restored.predict_proba(z.float()).sum(1), torch.ones(len(z)))
    with pytest.raises(ValueError, match="not fitted"):
        create_calibrator(name).transform(z)
    with pytest.raises(ValueError, match="samples for"):
        create_calibrator(name).fit(z[:1], y[:1])
    if name not in ("platt", "beta", "temperature_scaling", "temperature_scaling_nll"):  # T fits any C
        with pytest.raises(ValueError, match=f"fitted for {c} classes, got 3|shape"):
            cal.transform(z[:, :3])


@pytest.mark.parametrize("name", MULTICLASS)
def test_every_multiclass_calibrator_lowers_held_out_nll_and_ece(name):
    from timm_csm.metrics import ece
    z, y = noisy_logits(n=3000, c=5, seed=13, scale=4.0)
    test_z, test_y = noisy_logits(n=3000, c=5, seed=14, scale=4.0)
    cal = create_calibrator(name).fit(z, y)
    out = cal.transform(test_z)
    assert torch.isfinite(out).all()
    assert F.cross_entropy(out, test_y) < F.cross_entropy(test_z, test_y)
    assert ece(out, test_y) < 0.5 * ece(test_z, test_y)


def test_registry_lists_every_calibrator():
    assert list_calibrators() == ["beta", "dirichlet", "histogram_binning", "isotonic", "matrix_scaling", "platt",
                                  "temperature_scaling", "temperature_scaling_nll", "vector_scaling"]
    assert isinstance(create_calibrator("dirichlet", reg_lambda=1e-3), PostHocCalibrator)
    with pytest.raises(ValueError, match="reg must be"):
        MatrixScaling(reg="l1")


# ------------------------------------------------------------------ the fused float32 fits and applies

FIT_RTOL = 1e-6  # an objective "at least as good" as the reference optimum: ours <= reference + 1e-6 |reference|


def float32_logits(n=2000, c=6, seed=20):
    z, y = noisy_logits(n=n, c=c, seed=seed, scale=2.5)
    return z.float(), y


def nll64(logits, y):
    return F.cross_entropy(logits.double(), y).item()


def test_temperature_newton_on_float32_reaches_the_float64_optimum():
    z, y = float32_logits()
    x = z.double().numpy()

    def objective(log_t):
        return nll64(torch.from_numpy(x / np.exp(log_t)), y)

    best = optimize.minimize_scalar(objective, bounds=(-3, 3), method="bounded", options={"xatol": 1e-12})
    ts = create_calibrator("temperature_scaling_nll").fit(z, y)
    assert ts.fit_info["iterations"] <= 10  # Newton on one parameter, one fused pass per iteration
    assert objective(np.log(ts.temperature)) <= best.fun * (1 + FIT_RTOL)
    assert ts.temperature == pytest.approx(np.exp(best.x), rel=1e-4)


def affine_reference(x, y, diagonal, penalty=None):
    """SciPy's L-BFGS-B on the float64 objective mean NLL(W x + b) (+ penalty), from the identity."""
    n, c = x.shape
    xt = torch.from_numpy(x)

    def objective(params):
        p = torch.tensor(params, dtype=torch.float64, requires_grad=True)
        w = p[:c] if diagonal else p[:c * c].view(c, c)
        b = p[-c:]
        z = xt * w + b if diagonal else xt @ w.T + b
        value = F.cross_entropy(z, y) + (penalty(w, b) if penalty else 0.0)
        value.backward()
        return value.item(), p.grad.numpy()

    start = np.r_[np.ones(c) if diagonal else np.eye(c).ravel(), np.zeros(c)]
    return optimize.minimize(objective, start, jac=True, method="L-BFGS-B",
                             options={"ftol": 1e-15, "gtol": 1e-11, "maxiter": 5000}).fun


@pytest.mark.parametrize("name", ["vector_scaling", "matrix_scaling", "dirichlet"])
def test_affine_fits_on_float32_blocks_reach_the_float64_optimum(name):
    z, y = float32_logits()
    kwargs = {"reg_lambda": 0.05, "reg_mu": 0.02} if name == "dirichlet" else {}
    cal = create_calibrator(name, **kwargs).fit(z, y)
    features = torch.log_softmax(z.double(), 1) if name == "dirichlet" else z.double()
    penalty = cal.penalty if name == "dirichlet" else None
    reference = affine_reference(features.numpy(), y, name == "vector_scaling", penalty)
    ours = nll64(cal.transform(z).double(), y) if name != "dirichlet" else \
        nll64(torch.addmm(cal.bias, features, cal.weight.T), y) + float(cal.penalty(cal.weight, cal.bias))
    assert ours <= reference * (1 + FIT_RTOL)
    info = cal.fit_info
    assert info["warm_start_iterations"] <= 10 and 0 < info["iterations"] < cal.max_iter  # stopped on the objective
    assert info["objective"] == pytest.approx(ours, rel=1e-6)  # float32 blocks, float64 sums
    seconds, values = zip(*info["trace"])  # one point per evaluation, in CPU seconds since the fit began
    assert len(values) >= info["evaluations"] - 1 and list(seconds) == sorted(seconds)
    assert min(values) == pytest.approx(info["objective"], rel=1e-12) and values[0] > info["objective"]


@pytest.mark.parametrize("name", MULTICLASS)
def test_float32_applies_equal_float64_to_the_reported_digits(name):
    z, y = float32_logits(c=5, seed=21)
    cal = create_calibrator(name).fit(z.double(), y)
    test_z = float32_logits(n=700, c=5, seed=22)[0]
    single, double = cal.predict_proba(test_z), cal.predict_proba(test_z.double())
    assert single.dtype == torch.float32 and double.dtype == torch.float64
    assert torch.allclose(single.double(), double, rtol=1e-5, atol=1e-6)


def test_validation_once_per_call_catches_every_non_finite_value():
    from timm_csm.calibration._checks import all_finite

    z = torch.full((4, 3), 3e38)  # finite, though their sum overflows float32
    assert all_finite(z)
    for bad in (float("nan"), float("inf"), -float("inf")):
        z2 = z.clone()
        z2[2, 1] = bad
        assert not all_finite(z2)
    ts = create_calibrator("temperature_scaling_nll").fit(*float32_logits(n=200, c=3))
    with pytest.raises(ValueError, match="NaN or infinite"):
        ts.transform(torch.tensor([[0.0, float("-inf"), 1.0]]))


@pytest.mark.parametrize("name", ["temperature_scaling_nll", "vector_scaling", "matrix_scaling", "dirichlet",
                                  "isotonic", "platt", "beta"])
def test_every_apply_refuses_each_non_finite_logit(name):
    c = 2 if name in ("platt", "beta") else 4
    cal = create_calibrator(name).fit(*float32_logits(n=300, c=c))
    if name in ("matrix_scaling", "dirichlet"):  # the output's first column must see logit 1 through a 0 weight
        cal.weight[:, 1] = 0.0
    z = float32_logits(n=50, c=c, seed=3)[0]
    assert torch.isfinite(cal.transform(z)).all()
    for bad in (float("nan"), float("inf"), -float("inf")):
        for dtype in (torch.float32, torch.float64):
            z2 = z.to(dtype)
            z2[17, 1] = bad
            with pytest.raises(ValueError, match="^logits contain NaN or infinite values$"):
                cal.transform(z2)


def test_an_apply_tells_an_overflow_of_finite_logits_from_bad_logits():
    ts = create_calibrator("temperature_scaling_nll").load_state_dict({"temperature": torch.tensor([0.01])})
    with pytest.raises(ValueError, match=r"overflow float32 for finite logits \(largest \|logit\| 1e\+37\)"):
        ts.transform(torch.tensor([[1e37, 0.0, 1.0]]))
    assert torch.isfinite(ts.transform(torch.tensor([[1e37, 0.0, 1.0]], dtype=torch.float64))).all()


def test_the_vectorised_softplus_is_within_an_ulp_of_one_of_the_exact_value():
    from timm_csm.calibration.binary import softplus

    s = torch.cat([torch.linspace(-120, 120, 20001), torch.tensor([0.0, -1e-30, 1e-30])])  # float32 values
    exact = torch.logaddexp(s.double(), torch.zeros((), dtype=torch.float64))  # F.softplus returns s above 20
    assert torch.allclose(softplus(s.double()), exact, rtol=1e-15, atol=2.3e-16)
    assert torch.allclose(softplus(s).double(), exact, rtol=1.2e-7, atol=1.2e-7)


def test_the_apply_kernels_equal_their_plain_formulas():
    from timm_csm.calibration._kernels import affine_rows, log_softmax_rows, row_tiling, scale_shift, softmax_rows

    g = torch.Generator().manual_seed(0)
    for n, c in ((1001, 7), (60, 40), (3, 10)):
        x, w, b, m = (torch.randn(n, c, generator=g), torch.randn(c, generator=g), torch.randn(c, generator=g),
                      torch.randn(c, c, generator=g))
        k = row_tiling(c)
        assert torch.allclose(scale_shift(x, w.repeat(k), b.repeat(k)), x * w + b, atol=1e-6)
        assert torch.allclose(scale_shift(x.T.contiguous().T, w.repeat(k), b.repeat(k)), x * w + b, atol=1e-6)
        assert torch.allclose(affine_rows(x, m, b), x @ m.T + b, atol=1e-5) and affine_rows(x, m, b).is_contiguous()
        assert torch.allclose(softmax_rows(x), torch.softmax(x, 1), atol=1e-7)
        assert torch.allclose(log_softmax_rows(x), torch.log_softmax(x, 1), atol=1e-6)


def test_histogram_binning_bins_float32_exactly_as_the_metrics_rule():
    from timm_csm.metrics import bin_edges, bin_index

    cal = HistogramBinning(n_bins=15)
    edges = bin_edges(15)
    probs = torch.cat([edges.float(), torch.nextafter(edges.float(), torch.tensor(2.0)),
                       torch.nextafter(edges.float(), torch.tensor(-1.0)).clamp(min=0), torch.rand(1000)])
    assert torch.equal(cal._bins(probs), bin_index(probs.double(), edges))
