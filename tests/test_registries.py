"""The encoder and generator registries: a kind is added in one place (here, in this file) and every front end takes
it; which kind a generator is, is decided in the registry only (no ``.pkl`` suffix test elsewhere), and the package
adds nothing to diffusers' namespace."""
import re
from pathlib import Path

import pytest
import torch

import timm_csm
from timm_csm.annotation import (ImageEncoder, ImagePreprocessor, create_encoder, list_encoders, parse_encoder_spec,
                                 register_encoder)
from timm_csm.annotation import factory
from timm_csm.generation import MixingConfig, plan_groups
from timm_csm.generation import registry
from timm_csm.generation.registry import (accepted_generators, create_generator, find_generator,
                                         generator_kind, register_generator)

PACKAGE = Path(timm_csm.__file__).parent


class _MeanColour(ImageEncoder):
    """A toy encoder: the mean of each channel of the [0, 1] pixels, ``scale`` times."""

    kind = "mean_colour"

    def __init__(self, scale: str = "1", device="cpu"):
        self.scale = float(scale)
        super().__init__(torch.nn.Identity(), ImagePreprocessor(size=None, mean=[0.0] * 3, std=[1.0] * 3),
                         f"mean_colour:{scale}", device)

    def forward_features(self, pixels):
        return pixels.mean((2, 3)) * self.scale


@pytest.fixture
def mean_colour():
    with factory.ENCODERS.restored():
        register_encoder("mean_colour", spec_fields=("scale",))(_MeanColour)
        yield


def test_an_encoder_registered_in_one_place_is_built_from_its_spec(mean_colour):
    assert "mean_colour" in list_encoders() and {"open_clip", "timm", "reference"} <= set(list_encoders())
    encoder = create_encoder("mean_colour:2")
    assert encoder.scale == 2.0 and create_encoder("mean_colour", scale="3").scale == 3.0
    images = torch.full((2, 3, 4, 4), 255, dtype=torch.uint8)
    assert torch.allclose(encoder.encode(images), torch.full((2, 3), 2.0))
    with pytest.raises(ValueError, match="scale given both"):
        create_encoder("mean_colour:2", scale="3")
    with pytest.raises(ValueError, match=r"unknown kind 'clip'.*open_clip\[:<model_name>\[:<pretrained>\]\]"):
        create_encoder("clip:ViT-B-32")
    with pytest.raises(ValueError, match="expected"):
        parse_encoder_spec("timm::w.safetensors")  # an empty field


def test_the_spec_of_the_command_and_of_the_recipe_is_one():
    from timm_csm.recipes import stages

    spec = "open_clip:ViT-B-32-quickgelu:/weights/a:b.safetensors"  # the last field keeps its colons
    assert parse_encoder_spec(spec) == ("open_clip", {"model_name": "ViT-B-32-quickgelu",
                                                      "pretrained": "/weights/a:b.safetensors"})
    assert stages.recipe_encoder(spec) == parse_encoder_spec(spec)
    assert parse_encoder_spec("reference") == ("reference", {})
    assert parse_encoder_spec("timm:resnet18") == ("timm", {"model": "resnet18"})


class _Checkerboard:
    """A toy generator: every image a checkerboard whose contrast is the group's lambda."""

    def __init__(self, path, steps):
        self.num_classes, self.class_names, self.steps = 2, ["a", "b"], steps
        self.provenance = {"name": Path(path).stem, "steps": steps}

    def __call__(self, groups, lambdas, **kwargs):
        board = (torch.arange(16).reshape(4, 4) % 2).to(torch.uint8) * 255
        images = torch.stack([(board * lam).to(torch.uint8)[None] for _ in groups for lam in lambdas])
        return images, [(g, lam) for g in groups for lam in lambdas]


def _no_guidance(mixing):
    if mixing.guidance_scale not in (None, 1.0):
        raise ValueError("a checkerboard takes no guidance")


@pytest.fixture
def checkerboard():
    with registry.GENERATORS.restored():
        register_generator("checkerboard", lambda path, mixing, class_names, anchors, device: _Checkerboard(
            path, mixing.steps), matches=lambda path: path.name.startswith("board-"), check=_no_guidance,
            digest=lambda path: "board", is_file=True)
        yield registry.generator_spec("checkerboard")


def test_a_generator_registered_in_one_place_is_created_from_a_mixing_config(checkerboard, tmp_path):
    assert "checkerboard" in registry.list_generators()
    assert generator_kind(tmp_path / "board-1") is checkerboard
    assert generator_kind(tmp_path / "net.pkl").name == "edm" and generator_kind(tmp_path).name == "diffusers"
    # a path holds a generator when its kind says so: a file kind's file exists, a folder has model_index.json
    assert find_generator(tmp_path / "board-1") is None and find_generator(tmp_path) is None
    (tmp_path / "board-1").write_bytes(b"")
    assert find_generator(tmp_path / "board-1") is checkerboard
    assert accepted_generators()[-1] == "a checkerboard generator"  # what it accepts, in the refusal's list
    pipe = create_generator(tmp_path / "board-1", MixingConfig(steps=3))
    images, members = pipe(plan_groups(2, 1), [0.0, 1.0])
    assert pipe.steps == 3 and images.shape == (2, 1, 4, 4) and images[1].max() == 255 and images[0].max() == 0
    with pytest.raises(ValueError, match="takes no guidance"):
        create_generator(tmp_path / "board-1", MixingConfig(guidance_scale=2.0))
    with pytest.raises(ValueError, match="already registered"):
        register_generator("checkerboard", checkerboard.create, matches=checkerboard.matches,
                           check=checkerboard.check, digest=checkerboard.digest)


def test_only_the_generator_registry_looks_at_a_pkl_suffix():
    suffix_test = re.compile(r"""(suffix|endswith)\W.*\.pkl|\.pkl["'].*(suffix|endswith)""")
    found = [f"{path.relative_to(PACKAGE)}:{n}" for path in PACKAGE.rglob("*.py")
             for n, line in enumerate(path.read_text().splitlines(), 1) if suffix_test.search(line)]
    assert found == ["generation/registry.py:" + str(next(
        n for n, line in enumerate((PACKAGE / "generation" / "registry.py").read_text().splitlines(), 1)
        if suffix_test.search(line)))]
    assert not any("is_edm_pickle" in p.read_text() for p in PACKAGE.rglob("*.py"))


def test_the_package_adds_nothing_to_diffusers():
    import diffusers

    import timm_csm.generation.pipeline  # noqa: F401

    assert not hasattr(diffusers, "SemanticMixingPipeline")
    assert not any(p.read_text().count("setattr(diffusers") for p in PACKAGE.rglob("*.py"))
