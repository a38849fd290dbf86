"""Post-hoc calibrators: the paper's ECE grid rule (exact decimal grid, ties to the smaller T), Guo's NLL fit
against scipy, vector scaling, refusal cases and safetensors save/load."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from timm_csm.metrics import ece
from timm_csm.calibration import (PostHocCalibrator, TemperatureScaling, VectorScaling, create_calibrator,
                                  list_calibrators, load_calibrator, temperature_grid)


def reference_ece(probs, targets, n_bins=15):
    """The gpleiss / MbLS bin loop: (lo, hi] bins, empty bins skipped (a confidence of 0 joins the first bin)."""
    conf, pred = probs.max(dim=1)
    acc = pred.eq(targets).double()
    total = 0.0
    for b in range(n_bins):
        lo, hi = b / n_bins, (b + 1) / n_bins
        in_bin = (conf > lo) & (conf <= hi)
        if b == 0:
            in_bin |= conf == 0
        if in_bin.any():
            total += in_bin.double().mean().item() * abs(conf[in_bin].mean().item() - acc[in_bin].mean().item())
    return total


def overconfident_logits(n=600, c=5, seed=0, scale=4.0):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, c, (n,), generator=g)
    z = torch.randn(n, c, generator=g, dtype=torch.float64)
    z[torch.arange(n), y] += 1.0
    return z * scale, y


def test_grid_is_exact_decimals():
    grid = temperature_grid()
    assert len(grid) == 100
    assert grid[0] == 0.1 and grid[2] == 0.3 and grid[-1] == 10.0
    assert all(v == float(f"{(i + 1) / 10:.1f}") for i, v in enumerate(grid))
    assert temperature_grid(0.5, 1.0, 0.25) == (0.5, 0.75, 1.0)
    with pytest.raises(ValueError):
        temperature_grid(1.0, 0.5, 0.1)


def test_grid_ece_picks_the_reference_argmin():
    z, y = overconfident_logits()
    ts = TemperatureScaling().fit(z, y)
    reference = [reference_ece(torch.softmax(z / temp, 1), y) for temp in temperature_grid()]
    assert np.allclose(ts.scores.numpy(), reference, atol=1e-12)
    reported = [ece(z / temp, y, 15, input_type="logits") for temp in temperature_grid()]
    assert np.allclose(ts.scores.numpy(), reported, atol=1e-12)  # the fit minimises the reported metric
    best = min(range(len(reference)), key=lambda i: (reference[i], i))
    assert ts.temperature == temperature_grid()[best]
    assert ts.temperature > 1.0  # the scaled logits are over-confident
    after = reference_ece(torch.softmax(ts.transform(z), 1), y)
    assert after == pytest.approx(min(reference)) and after < reference_ece(torch.softmax(z, 1), y)


def test_grid_ties_go_to_the_smaller_temperature():
    # confidence 1/2 at every T (equal logits) and half of the argmax predictions right: ECE 0 for all T
    z = torch.zeros(10, 2, dtype=torch.float64)
    y = torch.tensor([0, 1] * 5)
    ts = TemperatureScaling().fit(z, y)
    assert torch.all(ts.scores == ts.scores[0]) and ts.temperature == 0.1
    # confidence exactly 1 at every T on the grid: ECE = error rate for all T
    z = torch.tensor([[0.0, 1e4], [1e4, 0.0], [0.0, 1e4]], dtype=torch.float64)
    assert TemperatureScaling().fit(z, torch.tensor([1, 0, 0])).temperature == 0.1


def test_nll_method_matches_scipy():
    optimize = pytest.importorskip("scipy.optimize")
    z, y = overconfident_logits(seed=1)

    def nll(log_t):
        return F.cross_entropy(z / math.exp(log_t), y).item()

    best = optimize.minimize_scalar(nll, bounds=(-4, 4), method="bounded", options={"xatol": 1e-10})
    ts = create_calibrator("temperature_scaling_nll").fit(z, y)
    assert ts.method == "nll"
    assert ts.temperature == pytest.approx(math.exp(best.x), rel=1e-5)
    assert F.cross_entropy(ts.transform(z), y).item() <= F.cross_entropy(z, y).item()


def test_vector_scaling_reaches_the_nll_optimum():
    optimize = pytest.importorskip("scipy.optimize")
    z, y = overconfident_logits(seed=2, c=4)
    vs = VectorScaling().fit(z, y)
    fitted = F.cross_entropy(vs.transform(z), y).item()

    def objective(params):
        p = torch.tensor(params, dtype=torch.float64, requires_grad=True)
        value = F.cross_entropy(z * p[:4] + p[4:], y)
        value.backward()
        return value.item(), p.grad.numpy()

    best = optimize.minimize(objective, np.r_[np.ones(4), np.zeros(4)], jac=True, method="L-BFGS-B",
                             options={"ftol": 1e-14, "gtol": 1e-10, "maxiter": 1000})
    assert fitted == pytest.approx(best.fun, abs=1e-7)
    ts_nll = F.cross_entropy(TemperatureScaling(method="nll").fit(z, y).transform(z), y).item()
    assert fitted <= ts_nll + 1e-9  # vector scaling contains temperature scaling


def test_transform_keeps_predictions_dtype_and_probabilities():
    z, y = overconfident_logits(seed=3)
    ts = TemperatureScaling().fit(z, y)
    z32 = z.float()
    out = ts.transform(z32)
    assert out.dtype == torch.float32 and torch.equal(out.argmax(1), z32.argmax(1))
    assert torch.allclose(out, z32 / ts.temperature)
    probs = ts.predict_proba(z32)
    assert torch.allclose(probs.sum(1), torch.ones(len(z32)))
    assert torch.allclose(ts(z.numpy()), z / ts.temperature)


@pytest.mark.parametrize("make", [TemperatureScaling, lambda: TemperatureScaling(method="nll"), VectorScaling])
def test_refusals(make):
    z, y = overconfident_logits(n=30, c=5)
    with pytest.raises(ValueError, match="3 samples for 5 classes"):
        make().fit(z[:3], y[:3])
    with pytest.raises(ValueError, match="single class"):
        make().fit(z, torch.full((30,), 2))
    with pytest.raises(ValueError, match="not fitted"):
        make().transform(z)
    with pytest.raises(ValueError, match="out of range"):
        make().fit(z, torch.full((30,), 7))
    with pytest.raises(ValueError, match="NaN"):
        make().fit(torch.full((30, 5), float("nan")), y)
    with pytest.raises(ValueError, match="shape"):
        make().fit(z, y[:-1])


def test_save_and_load(tmp_path):
    z, y = overconfident_logits(seed=4)
    ts = TemperatureScaling(n_bins=10).fit(z, y)
    path = tmp_path / "sub" / "ts.safetensors"
    ts.save(path)
    loaded = TemperatureScaling.load(path)
    assert loaded.temperature == ts.temperature and loaded.n_bins == 10 and loaded.method == "grid_ece"
    assert torch.equal(loaded.transform(z), ts.transform(z))
    vs = VectorScaling().fit(z, y)
    vs.save(tmp_path / "vs.safetensors")
    restored = load_calibrator(tmp_path / "vs.safetensors")
    assert isinstance(restored, VectorScaling) and torch.equal(restored.transform(z), vs.transform(z))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sub", "vs.safetensors"]  # no temp files left
    with pytest.raises(ValueError, match="not a TemperatureScaling"):
        TemperatureScaling.load(tmp_path / "vs.safetensors")
    from safetensors.torch import save_file
    save_file({"x": torch.zeros(1)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(ValueError, match="not a saved calibrator"):
        PostHocCalibrator.load(tmp_path / "other.safetensors")
    with pytest.raises(ValueError, match="not fitted"):
        TemperatureScaling().save(tmp_path / "unfitted.safetensors")


@pytest.mark.parametrize("kind", ["vector_scaling", "temperature_scaling"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_load_refuses_non_finite_parameters_naming_the_file(tmp_path, kind, bad):
    from safetensors.torch import load_file, save_file
    from safetensors import safe_open

    z, y = overconfident_logits(seed=5)
    path = tmp_path / f"{kind}.safetensors"
    create_calibrator(kind).fit(z, y).save(path)
    with safe_open(str(path), framework="pt") as f:
        metadata = f.metadata()
    tensors = load_file(str(path))
    name = sorted(tensors)[-1]  # "weight" of vector scaling, "temperature"
    tensors[name].view(-1)[0] = bad
    save_file(tensors, str(path), metadata=metadata)
    for load in (load_calibrator, PostHocCalibrator.load, type(create_calibrator(kind)).load):
        with pytest.raises(ValueError, match=rf"{kind}\.safetensors: parameter '{name}' contains NaN or infinite"):
            load(path)
    if kind == "vector_scaling":  # the in-memory route refuses the same state
        with pytest.raises(ValueError, match="'weight' contains NaN or infinite"):
            VectorScaling().load_state_dict(tensors)


def test_create_calibrator():
    assert {"temperature_scaling", "temperature_scaling_nll", "vector_scaling"} <= set(list_calibrators())
    assert create_calibrator("temperature_scaling").method == "grid_ece"
    assert isinstance(create_calibrator("vector_scaling"), VectorScaling)
    with pytest.raises(ValueError, match="temperature_scaling"):
        create_calibrator("platt_scaling")
    with pytest.raises(ValueError, match="method"):
        TemperatureScaling(method="lbfgs")


def test_bootstrap_temperatures_refit_each_resample_and_nll_moves_less_than_the_grid_on_few_images():
    from timm_csm.calibration import bootstrap_temperatures
    from timm_csm.metrics import percentile_interval, resample_indices

    z, y = overconfident_logits(n=250, c=10, seed=4)
    temps = bootstrap_temperatures(z, y, "grid_ece", resamples=30, seed=2)
    idx = resample_indices(250, 30, 2)
    assert temps.tolist() == [TemperatureScaling("grid_ece").fit(z[i], y[i]).temperature for i in idx]
    # 250 validation images (an own folder's 10%): the NLL temperature's interval is narrower than the grid's
    spread = {m: percentile_interval(bootstrap_temperatures(z, y, m, resamples=200)) for m in ("grid_ece", "nll")}
    width = {m: (hi - lo) / TemperatureScaling(m).fit(z, y).temperature for m, (lo, hi) in spread.items()}
    assert width["nll"] < width["grid_ece"], width


def test_a_small_validation_split_reports_how_far_the_after_ts_numbers_move():
    from timm_csm.metrics import nll
    from timm_csm.calibration.temperature import SMALL_VALIDATION
    from timm_csm.evaluation import evaluate_calibration

    z, y = overconfident_logits(n=2250, c=10, seed=5)
    val, test = (z[:250], y[:250]), (z[250:], y[250:])
    scores = evaluate_calibration(val, test, options={"ts_method": "nll"}, bootstrap=100).metrics
    interval, spread = scores["temperature_interval"], scores["post_ts_spread"]
    assert interval["resamples"] == 100 and interval["low"] < scores["temperature"] < interval["high"]
    assert spread["n_val"] == 250 < SMALL_VALIDATION
    # the NLL after TS at the interval's ends lies within the reported spread's reach
    at_ends = [nll(test[0] / interval[k], test[1]) for k in ("low", "high")]
    assert spread["nll"]["low"] <= scores["test"]["post_ts"]["nll"] <= spread["nll"]["high"]
    assert spread["nll"]["high"] == pytest.approx(max(at_ends), rel=0.05)
    large = evaluate_calibration((z[:1200], y[:1200]), (z[1200:], y[1200:]), options={"ts_method": "nll"},
                                 bootstrap=20).metrics
    assert "temperature_interval" in large and "post_ts_spread" not in large  # 1 200 validation images: no line
    assert "temperature_interval" not in evaluate_calibration(val, test, bootstrap=0).metrics
