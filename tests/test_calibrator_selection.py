"""Choosing a calibrator by k-fold cross-validation (the calibrator that can fit the miscalibration wins; an
over-parameterised one loses on few samples), the stratified folds and the fold table; conformal sets with their own
temperature fitted for set size."""
import pytest
import torch

from test_conformal_selective import exchangeable
from timm_csm.calibration import (ConformalClassifier, TemperatureScaling, auto_candidates, fold_table_markdown,
                                  select_calibrator)
from timm_csm.calibration.selection import fold_assignment


def drawn(n, c, seed, spread=2.0):
    """Logits z and labels drawn from softmax(z): z is calibrated."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, c, generator=g) * spread
    return z, torch.multinomial(torch.softmax(z, 1), 1, generator=g).squeeze(1)


def test_cross_validation_picks_the_calibrator_that_fits_the_miscalibration():
    z, y = drawn(1500, 6, seed=0)
    shifted = z + torch.linspace(-2, 2, 6)  # a per-class bias: vector scaling undoes it, one temperature cannot
    name, table = select_calibrator(shifted, y, ["temperature_scaling", "vector_scaling"], folds=5, seed=1)
    assert name == table["chosen"] == "vector_scaling"
    assert table["mean"]["vector_scaling"] < table["mean"]["temperature_scaling"] - 0.1
    for scores in table["scores"].values():
        assert len(scores) == 5
    assert table["mean"]["vector_scaling"] == pytest.approx(sum(table["scores"]["vector_scaling"]) / 5)
    assert table["fold_sizes"] == [300] * 5 and table["by"] == "nll" and not table["errors"]
    text = fold_table_markdown(table)
    assert "| vector_scaling (chosen) |" in text and "mean NLL" in text
    # a pure temperature on few samples: matrix scaling's 110 parameters over-fit, by ECE too
    z, y = drawn(300, 10, seed=2, spread=1.0)
    name, table = select_calibrator(3 * z, y, ["matrix_scaling", "temperature_scaling_nll"], by="ece")
    assert name == "temperature_scaling_nll" and "mean ECE" in fold_table_markdown(table)


def test_folds_are_stratified_and_seeded():
    y = torch.tensor([0] * 50 + [1] * 30 + [2] * 20)
    folds = fold_assignment(y, 5, seed=3)
    for k in range(5):
        assert torch.bincount(y[folds == k], minlength=3).tolist() == [10, 6, 4]
    assert torch.equal(folds, fold_assignment(y, 5, seed=3)) and not torch.equal(folds, fold_assignment(y, 5, seed=4))
    with pytest.raises(ValueError, match="folds must be an integer from 2"):
        fold_assignment(y, 1)


def test_auto_candidates_leave_out_what_cannot_apply():
    names, left_out = auto_candidates(num_classes=10, n_samples=100, folds=5)
    assert {"temperature_scaling", "vector_scaling", "isotonic"} <= set(names)
    assert set(left_out) == {"platt", "beta", "matrix_scaling", "dirichlet"}
    names, left_out = auto_candidates(num_classes=2, n_samples=1000)
    assert {"platt", "beta", "dirichlet"} <= set(names) and not left_out
    with pytest.raises(ValueError, match="select the calibrator by one of"):
        select_calibrator(*drawn(50, 3, 0), ["temperature_scaling"], by="brier")


def test_conformal_sets_with_their_own_temperature_keep_coverage_and_are_smaller():
    z, y = exchangeable(9000, seed=5)  # over-confident logits: temperature scaling finds T near 2.5
    ts = TemperatureScaling(method="nll").fit(z[:3000], y[:3000])
    cal, test = (z[3000:6000], y[3000:6000]), (z[6000:], y[6000:])
    with_ts = ConformalClassifier("aps", alpha=0.1).fit(ts.transform(cal[0]), cal[1]).evaluate(ts.transform(test[0]),
                                                                                               test[1])
    own = ConformalClassifier("aps", alpha=0.1, temperature="set_size").fit(*cal)
    result = own.evaluate(*test, bootstrap=200)
    assert ts.temperature > 2 and own.temperature != pytest.approx(ts.temperature, abs=0.5)
    assert result["temperature"] == own.temperature
    assert result["mean_set_size"] < with_ts["mean_set_size"]
    assert abs(result["coverage"] - 0.9) < 0.03
    iv = result["intervals"]
    assert iv["coverage"]["low"] < result["coverage"] < iv["coverage"]["high"]
    assert iv["mean_set_size"]["low"] < result["mean_set_size"] < iv["mean_set_size"]["high"]
    with pytest.raises(ValueError, match="not both"):
        ConformalClassifier(calibrator="temperature_scaling", temperature="set_size")
    with pytest.raises(ValueError, match="temperature must be None, a positive number or 'set_size'"):
        ConformalClassifier(temperature="nll")
