"""timm-csm-train --calibrators: any registered calibrator, fitted on the validation split by the evaluation that
timm-csm-calibrate uses, reported beside temperature scaling in results.json, results.md and the shift table."""
import json

import pytest
import torch

from timm_csm.calibration import create_calibrator
from timm_csm.commands.train import main
from timm_csm.evaluation import evaluate_calibration
from timm_csm.metrics import calibration_metrics
from timm_csm.training import run


def _logits(n, k=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, k, (n,), generator=g)
    logits = 3 * torch.randn(n, k, generator=g)
    logits[torch.arange(n), labels] += 2.0  # a model that is right more often than not, over-confident
    return logits, labels


def test_each_calibrator_is_fitted_on_validation_and_scored_as_an_independent_fit():
    val, test = _logits(400, seed=1), _logits(300, seed=2)
    both = evaluate_calibration(val, test, calibrators=["dirichlet", "temperature_scaling"],
                                options={"ts_method": "nll"}, bootstrap=0)
    alone = evaluate_calibration(val, test, calibrators=["temperature_scaling"], options={"ts_method": "nll"},
                                 bootstrap=0)
    assert both.metrics["test"] == alone.metrics["test"] and "calibrators" not in alone.metrics
    dirichlet = create_calibrator("dirichlet").fit(*val)
    expected = {k: float(v) for k, v in calibration_metrics(dirichlet.transform(test[0]), test[1]).items()}
    assert both.metrics["calibrators"]["dirichlet"]["test"] == pytest.approx(expected, abs=1e-6)
    assert set(both.calibrators) == {"temperature_scaling", "dirichlet"}
    with pytest.warns(UserWarning, match="calibrator dirichlet skipped: it needs at least 20 samples"):
        few = evaluate_calibration(_logits(12, seed=3), test, calibrators=["dirichlet"], bootstrap=0)
    assert few.metrics["calibrators"] == {} and few.calibrators == {}
    assert few.metrics["calibrators_skipped"]["dirichlet"].startswith("it needs at least 20 samples")
    assert "calibrators_skipped" not in both.metrics
    only = evaluate_calibration(val, test, calibrators=["dirichlet"], bootstrap=0)
    assert only.metrics["test"]["post_ts"] is None and only.scaler is None and set(only.calibrators) == {"dirichlet"}


def test_train_reports_dirichlet_beside_temperature_scaling(tmp_path):
    argv = ["--dataset", "digits", "--model", "small_cnn", "--epochs", "1", "--batch-size", "32", "--lr", "0.05",
            "--hflip", "0", "--max-train-samples", "240", "--max-test-samples", "120", "--val-fraction", "0.5",
            "--decay-milestones", "1", "--bootstrap", "20", "--no-progress", "--no-reliability-diagrams",
            "--output", str(tmp_path), "--experiment", "run", "--calibrators", "dirichlet,temperature_scaling", "--eval-shift", "contrast",
            "--shift-severities", "1"]
    main(argv)
    res = json.loads((tmp_path / "run" / "results.json").read_text())
    row = res["calibrators"]["dirichlet"]
    assert set(row["test"]) == set(res["test"]["pre_ts"]) and set(row["intervals"]["test"]) == set(row["test"])
    assert res["n_val"] >= 110 and res["temperature"] is not None  # Dirichlet needs C (C + 1) samples
    assert res["shift"]["methods"] == ["uncalibrated", "temperature_scaling", "dirichlet"]
    text = (tmp_path / "run" / "results.md").read_text()
    assert "| metric | before TS | after TS | after dirichlet |" in text
    assert f"| ECE (%) | {res['test']['pre_ts']['ece'] * 100:.2f} [" in text
    assert "ECE dirichlet (%)" in text  # the shift table's column


def test_an_unknown_calibrator_is_one_line_before_training(tmp_path):
    with pytest.raises(ValueError, match="unknown calibrator 'dirichlett'; known calibrators: .*dirichlet"):
        run(dict(dataset="digits", model="small_cnn", epochs=1, output=str(tmp_path), experiment="x",
                 calibrators="dirichlett,temperature_scaling", progress=False))
    assert not (tmp_path / "x").exists()


def test_results_md_says_which_calibrator_was_not_fitted_and_why():
    from timm_csm.training.reporting import results_markdown

    val, test = _logits(12, seed=3), _logits(300, seed=2)
    with pytest.warns(UserWarning, match="calibrator dirichlet skipped"):
        scored = evaluate_calibration(val, test, calibrators=["temperature_scaling", "dirichlet"],
                                      options={"ts_method": "nll"}, bootstrap=0)
    results = {"model": "m", "dataset": "d", "loss": "ce", "n_bins": 15, "n_test": 300, "n_val": 12,
               "ts_method": "nll", "run_id": "r", **scored.metrics}
    text = results_markdown(results)
    assert "Not fitted, so not in the table: dirichlet (it needs at least 20 samples" in text
    assert "after dirichlet" not in text
