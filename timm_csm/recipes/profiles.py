"""Recipe profiles: the main job's settings as data, in a registry read with :func:`get_profile` /
:func:`list_profiles` (timm's ``list_models`` / ``create_model`` style: callers ask by name, never by prefix).

* ``demo``: real Fashion-MNIST (Debian's package, which must be installed), the shipped generator, a reference
  encoder trained here in place of CLIP, then the same small classifier trained with CE and with CSM;
* ``smoke``: the same stages at toy size (CI runs it);
* ``full``: the GPU recipe of the paper (Luo et al., ICML 2025: CIFAR-100, a CIFAR generator, open_clip ViT-B-32
  from a local weights file, ResNet-50 for 200 epochs, SGD 0.1 with steps at epochs 80 and 120).
"""
from __future__ import annotations

import copy
import dataclasses
import fnmatch
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

__all__ = ["RecipeProfile", "register_profile", "get_profile", "list_profiles", "training_options",
           "resolve_dataset"]


@dataclass(frozen=True)
class RecipeProfile:
    """One run of the main job: the dataset, the generator, the semantic-mixing grid, the re-annotation encoder
    and the classifier recipe shared by the CE and the CSM run (``train_extra`` holds further training options)."""

    dataset: str = "fashion_mnist"
    # generator: "shipped" (package weights for the dataset) or a generator-training profile name
    generator: str = "shipped"
    generator_steps: Optional[int] = None
    num_groups: int = 225  # 5 per class pair for 10 classes: 1 800 images
    num_lambdas: int = 8
    scheduler: str = "ddim"  # "ddim" (eta 0) or "dpm" (DPM-Solver++)
    sampler_steps: int = 20
    guidance_scale: Optional[float] = None  # None: the generator's recommended scale
    # re-annotation
    encoder: str = "reference"  # "reference" or "open_clip:<model>:<weights file>"
    encoder_epochs: int = 4
    encoder_max_steps: Optional[int] = None
    soft_label_scale: Optional[float] = None  # None: chosen on held-out real data (annotation.select_scale)
    drop_flagged: bool = False  # drop the groups the annotation checks flag (annotation.checks.flag_groups)
    # classifier training (the same for CE and CSM)
    model: str = "small_cnn"
    epochs: int = 15
    batch_size: int = 128
    lr: float = 0.05
    weight_decay: float = 0.0
    sched: str = "cosine"
    max_train_samples: Optional[int] = 10000
    max_test_samples: Optional[int] = None
    n_aug: int = 1
    seed: int = 0
    train_extra: Dict = field(default_factory=dict)


_PROFILES: Dict[str, RecipeProfile] = {}


def register_profile(name: str, profile: RecipeProfile) -> RecipeProfile:
    """Add ``profile`` to the registry under ``name``; a name is registered once."""
    if name in _PROFILES:
        raise ValueError(f"recipe profile {name!r} is registered already; choose another name")
    _PROFILES[name] = profile
    return profile


def list_profiles(filter: str = "") -> List[str]:
    """The registered profile names, sorted; ``filter`` is a shell-style pattern (``"s*"``), as in timm."""
    return sorted(n for n in _PROFILES if not filter or fnmatch.fnmatch(n, filter))


def get_profile(name: str) -> RecipeProfile:
    """A copy of the profile registered as ``name`` (changing it leaves the registry as it is)."""
    if name not in _PROFILES:
        raise ValueError(f"unknown recipe profile {name!r}; known profiles: {', '.join(list_profiles())}")
    return copy.deepcopy(_PROFILES[name])


def training_options(profile: RecipeProfile) -> Dict:
    """The classifier recipe of ``profile`` as :func:`timm_csm.train.run` options (shared by its CE and CSM runs
    and by the calibration benchmark's recipes): data, model, optimisation, then ``train_extra``."""
    options = {"dataset": profile.dataset, "model": profile.model, "epochs": profile.epochs,
               "batch_size": profile.batch_size, "lr": profile.lr, "weight_decay": profile.weight_decay,
               "sched": profile.sched, "max_train_samples": profile.max_train_samples,
               "max_test_samples": profile.max_test_samples, "n_aug": profile.n_aug}
    options.update(copy.deepcopy(profile.train_extra))
    return options


# Both Fashion-MNIST profiles train a 5-stage small_cnn (395 k parameters; the 5 stages need images of at least
# 16 px, not digits), chosen so that the CE baseline is over-confident (benchmarks/calibration.md).
_WIDE = {"model_kwargs": {"widths": [16, 32, 64, 128, 256]}}
# demo: the calibration benchmark's main setting (benchmarks/calibration.md) at half its generated volume, so that
# `make demo` fits in 30 minutes on 2 cores, set-up included. The paper's training ingredients (crops + flips, weight
# decay 5e-4, step decay, best validation accuracy) on 2 500 real images to convergence (60 epochs: CE is
# over-confident, ECE 4.59 +- 0.38% before temperature scaling at 3 seeds); 75 groups per class pair x 4 lambdas
# (13 500 images, 6 per real training image; the benchmark has 150 per pair) from the sampler that makes the most
# recognisable pure-class images per CPU-second (DDIM, 8 steps, no guidance: benchmarks/sampler_study.md); s chosen
# on held-out real images the encoder never saw; the groups the annotation checks flag dropped.
register_profile("demo", RecipeProfile(
    num_groups=3375, num_lambdas=4, sampler_steps=8, guidance_scale=1.0, drop_flagged=True, epochs=60, lr=0.1,
    weight_decay=5e-4, sched="multistep", max_train_samples=2500,
    train_extra={**_WIDE, "crop_pad": 2, "hflip": 0.5, "decay_milestones": [30, 45]}))
# noaug: over-confident by over-fitting the 10k subset without augmentation or weight decay (15 epochs): CE
# accuracy 89.1/88.4%, ECE 6.5/7.2% before temperature scaling at seeds 0/1, about 95 s of one CPU core; the
# benchmark's second table (benchmarks/calibration_demo.md).
register_profile("noaug", RecipeProfile(train_extra={**_WIDE, "crop_pad": 0, "hflip": 0.0}))
register_profile("smoke", RecipeProfile(generator="smoke", num_groups=24, sampler_steps=4, encoder_epochs=1,
                                        encoder_max_steps=20, soft_label_scale=4.0, epochs=1, batch_size=64,
                                        max_train_samples=512, max_test_samples=512))
register_profile("full", RecipeProfile(dataset="cifar100", generator="cifar100", num_groups=19800, sampler_steps=50,
                                       # OpenAI's CLIP weights run with QuickGELU: the -quickgelu config builds
                                       # it (open_clip only switches it on by itself for the "openai" tag)
                                       encoder="open_clip:ViT-B-32-quickgelu:open_clip_vit_b32.safetensors",
                                       soft_label_scale=2.3, model="resnet50_cifar", epochs=200, batch_size=128,
                                       lr=0.1, weight_decay=5e-4, sched="multistep", max_train_samples=None,
                                       train_extra={"decay_milestones": [80, 120], "clip_grad": 2.0}))


def resolve_dataset(profile: RecipeProfile, log: Callable[[str], None]) -> RecipeProfile:
    """The profile as run. The dataset is never switched on the run's own: without Debian's Fashion-MNIST the run
    stops with the command that installs it. scikit-learn's digits is an explicit choice (``--dataset digits``); its
    8x8 images have no shipped generator (the digits generator-training profile replaces ``shipped``) and are too
    small for the demo's 5-stage network (``model_kwargs`` is dropped: the default 3-stage ``small_cnn``)."""
    from ..data.embedded import FASHION_MNIST_INSTALL, fashion_mnist_root

    if profile.dataset == "fashion_mnist" and fashion_mnist_root() is None:
        raise FileNotFoundError(
            f"Fashion-MNIST is not installed: run `sudo sh -c '{FASHION_MNIST_INSTALL}'` (Debian's "
            "dataset-fashion-mnist; `make demo` runs it when it has root), or set TIMM_CSM_FASHION_MNIST to a folder "
            "holding the IDX files; scikit-learn's digits runs with --dataset digits")
    if profile.dataset != "digits":
        return profile
    extra = {k: v for k, v in profile.train_extra.items() if k != "model_kwargs"}
    generator = "digits" if profile.generator == "shipped" else profile.generator
    log(f"[dataset] digits (8x8): generator {generator!r}, the default small_cnn")
    return dataclasses.replace(profile, generator=generator, train_extra=extra)
