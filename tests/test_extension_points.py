"""Adding a calibrator or a metric touches one file: the calibrator below (a class with ``@register_calibrator``) and
the metric below (one entry of the metric table), defined here and nowhere else, reach the factory, the listings,
``timm-csm-calibrate``'s checks, fit and report, the bootstrap and the documentation's tables."""
import sys
from pathlib import Path

import pytest
import torch

from calibrate_fixtures import calibrate_pattern_model, pattern_model_files
from timm_csm.calibration import (PostHocCalibrator, auto_candidates, check_calibration_samples, create_calibrator,
                                  list_calibrators, load_calibrator, register_calibrator, registry)
from timm_csm.metrics import (CalibrationAccumulator, MetricSpec, bootstrap_distribution, calibration_metrics,
                              list_metrics, metric_spec, register_metric, table)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "docs"))
import build_hooks  # noqa: E402  the site's own hooks


@pytest.fixture(scope="module")
def user_files(tmp_path_factory):
    return pattern_model_files(tmp_path_factory.mktemp("user"))


def run_calibrate(user_files, output, **options):
    return calibrate_pattern_model(user_files, output, conformal=[], **options)


@pytest.fixture
def class_bias():
    """A calibrator of this file only (the registry is restored afterwards)."""
    with registry.CALIBRATORS.restored():
        yield _class_bias()


def _class_bias():
    @register_calibrator("class_bias", summary="one bias per class: the gap between the log class frequencies "
                         "and the log mean predicted probabilities", min_samples=lambda num_classes: 10 * num_classes)
    class ClassBias(PostHocCalibrator):
        """``z' = z + b`` with ``b_k = log(share of class k) - log(mean predicted probability of class k)``."""

        def __init__(self):
            self.bias = None

        def fit(self, logits, targets):
            logits, targets = torch.as_tensor(logits).double(), torch.as_tensor(targets)
            share = torch.bincount(targets, minlength=logits.shape[1]).double() / len(targets)
            self.bias = share.clamp_min(1e-6).log() - torch.softmax(logits, 1).mean(0).log()
            return self

        def _apply(self, logits):
            return logits + self._derived("bias", self.bias, logits)

        def config(self):
            return {}

        def state_dict(self):
            return {} if self.bias is None else {"bias": self.bias}

        def load_state_dict(self, state):
            self.bias = state["bias"]
            return self

    return ClassBias


@pytest.fixture
def gap():
    """A metric of this file only, one table entry (the table is restored afterwards): mean confidence minus
    accuracy, from the statistics of the one pass."""
    with table.METRICS.restored():
        yield register_metric(MetricSpec(
            "gap", "Confidence - accuracy", scale=100, description="over-confidence gap",
            from_state=lambda st: (float(st.confidence) - float(st.correct)) / float(st.n)))


def test_a_calibrator_of_one_file_is_created_listed_checked_and_documented(class_bias):
    assert isinstance(create_calibrator("class_bias"), class_bias) and class_bias.kind == "class_bias"
    assert "class_bias" in list_calibrators() and "class_bias" in list_calibrators(num_classes=3)
    assert "class_bias" not in list_calibrators(default=True) + list_calibrators(binary_only=True)
    names, left_out = auto_candidates(num_classes=3, n_samples=20)  # 16 samples per training fold, 30 needed
    assert "class_bias" not in names and left_out["class_bias"].startswith("needs at least 30 samples")
    assert "class_bias" in auto_candidates(num_classes=3, n_samples=200)[0]
    with pytest.raises(ValueError, match="'class_bias' needs at least 30 samples for 3 classes"):
        check_calibration_samples(["class_bias"], 20, 3, 3)
    assert "| `class_bias` | one bias per class" in build_hooks.calibrator_table()


def test_a_calibrator_of_one_file_runs_in_calibrate_and_its_report(class_bias, user_files, tmp_path):
    out = tmp_path / "calibrated"
    report = run_calibrate(user_files, out, calibrators=["temperature_scaling", "class_bias"], export="class_bias",
                           bootstrap=0)
    row = report["calibrators"]["class_bias"]["test"]
    assert report["calibrated_model"]["kind"] == "class_bias"
    saved = load_calibrator(out / "calibrator.safetensors")
    assert isinstance(saved, class_bias)
    from safetensors.torch import load_file
    test = load_file(str(out / "test_predictions.safetensors"))
    assert row["nll"] == pytest.approx(calibration_metrics(saved.transform(test["logits"]), test["targets"])["nll"],
                                       abs=1e-9)
    assert "| class_bias | " in (out / "report.md").read_text()


def test_a_metric_of_one_table_entry_reaches_the_pass_the_accumulator_the_bootstrap_and_the_docs(gap):
    assert "gap" in list_metrics() and "gap" in list_metrics("calibration", headline=True)
    assert metric_spec("gap").heading == "Confidence - accuracy (%)"
    logits, targets = 3 * torch.randn(300, 5, generator=torch.Generator().manual_seed(0)), torch.arange(300) % 5
    scores = calibration_metrics(logits, targets)
    assert scores["gap"] == pytest.approx(scores["confidence"] - scores["accuracy"], abs=1e-12)
    acc = CalibrationAccumulator(5)
    for rows in torch.arange(300).split(70):
        acc.update(logits[rows], targets[rows])
    assert acc.compute()["gap"] == pytest.approx(scores["gap"], abs=1e-12)
    resampled = bootstrap_distribution(logits, targets, resamples=12, seed=3)
    assert torch.allclose(resampled["gap"], resampled["confidence"] - resampled["accuracy"], atol=1e-12)
    assert "| over-confidence gap | `gap` |" in build_hooks.metric_table()


def test_a_metric_of_one_table_entry_is_in_the_calibrate_report(gap, user_files, tmp_path):
    out = tmp_path / "calibrated"
    report = run_calibrate(user_files, out, bootstrap=20)
    before = report["uncalibrated"]
    assert before["test"]["gap"] == pytest.approx(before["test"]["confidence"] - before["test"]["accuracy"],
                                                  abs=1e-12)
    interval = before["intervals"]["test"]["gap"]
    assert interval["low"] <= interval["high"]
    assert "gap" in report["calibrators"]["temperature_scaling"]["intervals"]["calibration_split"]
    header = next(line for line in (out / "report.md").read_text().splitlines() if line.startswith("| calibrator"))
    assert header.endswith("| augrc | gap |")
