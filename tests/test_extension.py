"""Adding a pluggable part is one file: each kind below (a loss with a new call convention and its training task, a
calibrator, a conformal method, a corruption, a metric, an encoder with a flag of its own, a generator) is
registered here and nowhere else, and every command and listing of its kind shows it: the calibrator and the metric
reach ``timm-csm-calibrate``'s checks, fit and report, the one pass, the accumulator, the bootstrap and the
documentation's tables. Each registry is restored afterwards (:meth:`timm_csm.registry.Registry.restored`)."""
import contextlib
import sys
from pathlib import Path

import pytest
import torch

from calibrate_fixtures import calibrate_pattern_model, pattern_model_files
from timm_csm.annotation import ENCODERS, ImageEncoder, ImagePreprocessor, list_encoders, register_encoder
from timm_csm.annotation.factory import EncoderFlag
from timm_csm.calibration import (CALIBRATORS, CONFORMAL_METHODS, ConformalClassifier, PostHocCalibrator,
                                  auto_candidates, check_calibration_samples, create_calibrator, list_calibrators,
                                  list_conformal_methods, load_calibrator, register_calibrator,
                                  register_conformal_method)
from timm_csm.data.corruptions import CORRUPTIONS, create_corruption, list_corruptions, register_corruption
from timm_csm.generation.registry import GENERATORS, accepted_generators, list_generators, register_generator
from timm_csm.losses import LOSS_INPUTS, LOSSES, list_losses, register_loss, register_loss_inputs
from timm_csm.metrics import (METRICS, CalibrationAccumulator, bootstrap_distribution, calibration_metrics,
                              list_metrics, metric_spec, register_metric)
from timm_csm.registry import Registry
from timm_csm.training.tasks import TRAINING_TASKS, ClassificationTask, register_training_task, select_task

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "docs"))
import build_hooks  # noqa: E402  the site's own hooks

REGISTRIES = (LOSSES, LOSS_INPUTS, TRAINING_TASKS, CALIBRATORS, CONFORMAL_METHODS, CORRUPTIONS, METRICS, ENCODERS,
              GENERATORS)


@pytest.fixture(scope="module")
def user_files(tmp_path_factory):
    return pattern_model_files(tmp_path_factory.mktemp("user"))


@pytest.fixture(scope="module")
def extended():
    """Every kind of this file registered, in the block of each registry's ``restored``."""
    with contextlib.ExitStack() as stack:
        for registry in REGISTRIES:
            stack.enter_context(registry.restored())
        _register_all()
        yield
    assert "paired_ce" not in list_losses() and "top_rank" not in list_conformal_methods()


class PairedTask(ClassificationTask):
    """Trains a loss of the ``paired`` convention: ``loss(logits, target, logits_flipped)``."""

    def forward(self, batch):
        x = batch["pixel_values"]
        logits = self.forward_module(x)
        return self._result(self.criterion(logits, batch["labels"], self.forward_module(x.flip(-1))), logits)


class PairedCE(torch.nn.Module):
    """Cross-entropy plus the squared gap to the logits of the mirrored images."""

    loss_inputs = "paired"

    def forward(self, logits, target, logits_flipped):
        return torch.nn.functional.cross_entropy(logits, target) + (logits - logits_flipped).pow(2).mean()


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


class MeanColour(ImageEncoder):
    """The mean of each channel, ``gain`` times."""

    def __init__(self, gain: float = 1.0, device="cpu"):
        self.gain = float(gain)
        super().__init__(torch.nn.Identity(), ImagePreprocessor(size=None, mean=[0.0] * 3, std=[1.0] * 3),
                         f"mean_colour:{gain}", device)

    def forward_features(self, pixels):
        return pixels.mean((2, 3)) * self.gain


def _register_all():
    register_loss_inputs("paired", "loss(logits, target, logits_flipped)")
    register_training_task("paired", PairedTask)
    register_loss("paired_ce", PairedCE)
    register_calibrator("class_bias", ClassBias, summary="one bias per class: the gap between the log class "
                        "frequencies and the log mean predicted probabilities",
                        min_samples=lambda num_classes: 10 * num_classes)
    # the class's rank by probability: sets of the top classes, one size for every sample
    register_conformal_method("top_rank", lambda probs, u, penalty, k_reg: (
        probs.argsort(1, descending=True).argsort(1).double()))
    register_corruption("invert", lambda x, level, rand: level * (1 - x) + (1 - level) * x, family="digital",
                        levels=(0.2, 0.4, 0.6, 0.8, 1.0), source="hand-written", definition="share of the inverse")
    register_metric("gap", "Confidence - accuracy", scale=100, description="over-confidence gap",
                    from_state=lambda st: (float(st.confidence) - float(st.correct)) / float(st.n))
    register_encoder("mean_colour", MeanColour, flags=(EncoderFlag("gain", "--gain", "mean_colour: feature gain",
                                                                   {"type": float}),))
    register_generator("board", lambda path, mixing, class_names, anchors, device: None,
                       matches=lambda path: path.name.startswith("board-"), check=lambda mixing: None,
                       digest=lambda path: "board", is_file=True, accepts="a board file (board-*)")


def test_a_loss_with_a_new_call_convention(extended):
    from timm_csm.training.args import parse_args

    assert "paired_ce" in list_losses() and "paired" in LOSS_INPUTS
    args = parse_args(["--loss", "paired_ce"])
    assert select_task(args, LOSSES.get_spec("paired_ce")) is PairedTask
    assert "paired_ce" in list_losses(inputs="paired") and list_losses(inputs="paired") == ["paired_ce"]


def test_a_calibrator_and_a_conformal_method(extended):
    from timm_csm.commands.calibrate import build_parser

    assert isinstance(create_calibrator("class_bias"), ClassBias) and ClassBias.kind == "class_bias"
    assert "class_bias" in list_calibrators() and "class_bias" in list_calibrators(num_classes=3)
    assert "class_bias" not in list_calibrators(default=True) + list_calibrators(binary_only=True)
    names, left_out = auto_candidates(num_classes=3, n_samples=20)  # 16 samples per training fold, 30 needed
    assert "class_bias" not in names and left_out["class_bias"].startswith("needs at least 30 samples")
    assert "class_bias" in auto_candidates(num_classes=3, n_samples=200)[0]
    with pytest.raises(ValueError, match="'class_bias' needs at least 30 samples for 3 classes"):
        check_calibration_samples(["class_bias"], 20, 3, 3)
    assert "| `class_bias` | one bias per class" in build_hooks.calibrator_table()
    assert "top_rank" in list_conformal_methods()
    assert "top_rank" in build_parser().parse_args(["--model", "m", "--output", "o"]).conformal
    logits, targets = torch.randn(400, 5, generator=torch.Generator().manual_seed(0)), torch.arange(400) % 5
    logits[torch.arange(400), targets] += 1.5
    sets = ConformalClassifier("top_rank", calibrator="class_bias").fit(logits, targets).predict_sets(logits)
    assert sets.sum(1).unique().tolist() in ([2], [3])
    assert sets[torch.arange(400), targets].double().mean() >= 0.85


def test_a_corruption_and_a_metric(extended):
    assert "invert" in list_corruptions(family="digital") and "`invert`" in build_hooks.corruption_table()
    image = torch.zeros(1, 4, 4, dtype=torch.uint8)
    assert create_corruption("invert", severity=5)(image).eq(255).all()
    assert "gap" in list_metrics("calibration", headline=True) and metric_spec("gap").heading == \
        "Confidence - accuracy (%)"
    assert "| over-confidence gap | `gap` |" in build_hooks.metric_table()
    logits, targets = 3 * torch.randn(300, 5, generator=torch.Generator().manual_seed(0)), torch.arange(300) % 5
    scores = calibration_metrics(logits, targets)
    assert scores["gap"] == pytest.approx(scores["confidence"] - scores["accuracy"], abs=1e-12)
    acc = CalibrationAccumulator(5)
    for rows in torch.arange(300).split(70):
        acc.update(logits[rows], targets[rows])
    assert acc.compute()["gap"] == pytest.approx(scores["gap"], abs=1e-12)
    resampled = bootstrap_distribution(logits, targets, resamples=12, seed=3)
    assert torch.allclose(resampled["gap"], resampled["confidence"] - resampled["accuracy"], atol=1e-12)


def test_the_calibrator_and_the_metric_run_in_calibrate_and_its_report(extended, user_files, tmp_path):
    out = tmp_path / "calibrated"
    report = calibrate_pattern_model(user_files, out, conformal=[], calibrators=["temperature_scaling", "class_bias"],
                                     export="class_bias", bootstrap=20)
    row = report["calibrators"]["class_bias"]["test"]
    assert report["calibrated_model"]["kind"] == "class_bias"
    saved = load_calibrator(out / "calibrator.safetensors")
    assert isinstance(saved, ClassBias)
    from safetensors.torch import load_file
    test = load_file(str(out / "test_predictions.safetensors"))
    assert row["nll"] == pytest.approx(calibration_metrics(saved.transform(test["logits"]), test["targets"])["nll"],
                                       abs=1e-9)
    text = (out / "report.md").read_text()
    assert "| class_bias | " in text
    header = next(line for line in text.splitlines() if line.startswith("| calibrator"))
    assert header.endswith("| augrc | gap |")
    before = report["uncalibrated"]
    assert before["test"]["gap"] == pytest.approx(before["test"]["confidence"] - before["test"]["accuracy"],
                                                  abs=1e-12)
    interval = before["intervals"]["test"]["gap"]
    assert interval["low"] <= interval["high"]
    assert "gap" in report["calibrators"]["temperature_scaling"]["intervals"]["calibration_split"]


def test_an_encoder_with_its_own_flag_and_a_generator(extended, tmp_path):
    from timm_csm.commands.annotate import _encoder, build_parser

    assert "mean_colour" in list_encoders()
    args = build_parser().parse_args(["--generated", "g", "--encoder", "mean_colour", "--gain", "3"])
    encoder = _encoder(args, "digits", "csm-digits-aug", holdout=False)
    assert isinstance(encoder, MeanColour) and encoder.gain == 3.0
    assert "board" in list_generators() and "a board file (board-*)" in accepted_generators()


def test_the_registry_refuses_a_name_twice_and_lists_close_matches():
    animals = Registry("animal", sort=False)
    animals.register("cat", str)
    with pytest.raises(ValueError, match="a animal named 'cat' is already registered"):
        animals.register("cat", int)
    assert animals.register("cat", int, overwrite=True) is int and animals.create("cat", "7") == 7
    with pytest.raises(ValueError, match="unknown animal 'cta'; known animals: cat; did you mean 'cat'?"):
        animals.get("cta")
    with animals.restored():
        animals.register("dog", float)
        assert animals.list("d*") == ["dog"] and list(animals) == ["cat", "dog"]
    assert "dog" not in animals and len(animals) == 1
