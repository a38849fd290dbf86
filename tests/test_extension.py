"""Adding a pluggable part is one file: each kind below (a loss with a new call convention and its training task, a
calibrator, a conformal method, a corruption, a metric, an encoder with a flag of its own, a generator) is
registered here and nowhere else, and every command and listing of its kind shows it. Each registry is restored
afterwards (:meth:`timm_csm.registry.Registry.restored`)."""
import contextlib
import sys
from pathlib import Path

import pytest
import torch

from timm_csm.annotation import ENCODERS, ImageEncoder, ImagePreprocessor, list_encoders, register_encoder
from timm_csm.annotation.factory import EncoderFlag
from timm_csm.calibration import (CALIBRATORS, CONFORMAL_METHODS, ConformalClassifier, PostHocCalibrator,
                                  create_calibrator, list_calibrators, list_conformal_methods, register_calibrator,
                                  register_conformal_method)
from timm_csm.data.corruptions import CORRUPTIONS, create_corruption, list_corruptions, register_corruption
from timm_csm.generation.registry import GENERATORS, accepted_generators, list_generators, register_generator
from timm_csm.losses import LOSS_INPUTS, LOSSES, list_losses, register_loss, register_loss_inputs
from timm_csm.metrics import METRICS, calibration_metrics, list_metrics, register_metric
from timm_csm.registry import Registry
from timm_csm.training.tasks import TRAINING_TASKS, ClassificationTask, register_training_task, select_task

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "docs"))
import build_hooks  # noqa: E402  the site's own hooks

REGISTRIES = (LOSSES, LOSS_INPUTS, TRAINING_TASKS, CALIBRATORS, CONFORMAL_METHODS, CORRUPTIONS, METRICS, ENCODERS,
              GENERATORS)


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


class ClassPrior(PostHocCalibrator):
    """One bias per class: the log class shares."""

    def __init__(self):
        self.bias = None

    def fit(self, logits, targets):
        share = torch.bincount(torch.as_tensor(targets), minlength=logits.shape[1]).double() / len(targets)
        self.bias = share.clamp_min(1e-6).log()
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
    register_calibrator("class_prior", ClassPrior)
    # the class's rank by probability: sets of the top classes, one size for every sample
    register_conformal_method("top_rank", lambda probs, u, penalty, k_reg: (
        probs.argsort(1, descending=True).argsort(1).double()))
    register_corruption("invert", lambda x, level, rand: level * (1 - x) + (1 - level) * x, family="digital",
                        levels=(0.2, 0.4, 0.6, 0.8, 1.0), source="hand-written", definition="share of the inverse")
    register_metric("top_confidence", "Mean confidence", scale=100, description="mean top-label confidence",
                    from_state=lambda st: float(st.confidence) / float(st.n))
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

    assert "class_prior" in list_calibrators(num_classes=10) and ClassPrior.kind == "class_prior"
    assert "| `class_prior` | One bias per class" in build_hooks.calibrator_table()
    assert "top_rank" in list_conformal_methods()
    assert "top_rank" in build_parser().parse_args(["--model", "m", "--output", "o"]).conformal
    logits, targets = torch.randn(400, 5, generator=torch.Generator().manual_seed(0)), torch.arange(400) % 5
    logits[torch.arange(400), targets] += 1.5
    sets = ConformalClassifier("top_rank", calibrator="class_prior").fit(logits, targets).predict_sets(logits)
    assert isinstance(create_calibrator("class_prior"), ClassPrior) and sets.sum(1).unique().tolist() in ([2], [3])
    assert sets[torch.arange(400), targets].double().mean() >= 0.85


def test_a_corruption_and_a_metric(extended):
    assert "invert" in list_corruptions(family="digital") and "`invert`" in build_hooks.corruption_table()
    image = torch.zeros(1, 4, 4, dtype=torch.uint8)
    assert create_corruption("invert", severity=5)(image).eq(255).all()
    assert "top_confidence" in list_metrics("calibration") and "`top_confidence`" in build_hooks.metric_table()
    logits, targets = torch.randn(50, 3, generator=torch.Generator().manual_seed(1)), torch.arange(50) % 3
    scores = calibration_metrics(logits, targets)
    assert scores["top_confidence"] == pytest.approx(scores["confidence"], abs=1e-12)


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
