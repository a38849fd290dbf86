"""Recipe profiles: the main job's settings as data, in a registry read with :func:`get_profile` /
:func:`list_profiles` (timm's ``list_models`` / ``create_model`` style: callers ask by name, never by prefix).

* ``demo``: real Fashion-MNIST (Debian's package, which must be installed), the shipped generator, a reference
  encoder trained here in place of CLIP, then the same small classifier trained with CE and with CSM;
* ``smoke``: the same stages at toy size (CI runs it);
* ``full``: the GPU recipe of the paper (Luo et al., ICML 2025: CIFAR-100, the conditional EDM network of Wang et
  al. (2023) sampled with 25 Heun steps, open_clip ViT-B-32 with OpenAI's weights, ResNet-50 for 200 epochs, SGD 0.1
  with steps at epochs 80 and 120).

:func:`rehearsal_profile` turns a profile into its rehearsal: every field kept but the sizes (groups, sampler
steps, epochs, image counts), so that all of its code paths run end to end in minutes before the long run.
"""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

from ..annotation import paper_s
from ..annotation.config import AnnotationConfig
from ..generation.config import MixingConfig
from ..generation.quality import QUALITY_SAMPLER_STEPS
from ..registry import Registry
from ..training.config import PAPER_TEMPERATURE_METHOD

__all__ = ["RecipeProfile", "PROFILES", "register_profile", "get_profile", "list_profiles", "training_options",
           "paper_protocol", "resolve_dataset", "with_epochs", "rehearsal_profile", "REHEARSAL_SIZES",
           "REHEARSAL_VAL_FRACTION", "FULL_EDM_PICKLE_URL", "RECIPE_SHARDS", "RECIPE_MIXING"]


#: the recipe's shards: 32 groups a file and a forward pass (its sets are small; the command's are
#: :class:`~timm_csm.generation.MixingConfig`'s)
RECIPE_SHARDS = {"groups_per_shard": 32, "batch_groups": 32}
#: the recipe's sampling by default: the generation's lambda grid, sampler and guidance (None: the generator's
#: recommended scale), with the sampler steps of the generator's quality measurement (fewer than a generator
#: folder's default, 50), in the recipe's shards
RECIPE_MIXING = MixingConfig(steps=QUALITY_SAMPLER_STEPS, **RECIPE_SHARDS)


@dataclass(frozen=True)
class RecipeProfile:
    """One run of the main job: the dataset, the generator, the semantic-mixing grid, the re-annotation encoder
    and the classifier recipe shared by the CE and the CSM run (``train_extra`` holds further training options).
    The generation and annotation settings are a :class:`~timm_csm.generation.MixingConfig` (:data:`RECIPE_MIXING`
    by default; always in the recipe's shards, :data:`RECIPE_SHARDS`) and an
    :class:`~timm_csm.annotation.AnnotationConfig` (its s, None by default: the paper's value where it published
    one, else chosen on held-out real data; its checks), whose seed is the profile's: the profile sets both on
    construction, so that a profile replaced with another seed carries it into its annotation too."""

    dataset: str = "fashion_mnist"
    # generator: "shipped" (package weights for the dataset), a generator-training profile name, the path of a
    # generator folder (timm-csm-train-generator's, used as it is), or the path of an
    # NVlabs EDM network pickle (*.pkl: EDM's Heun sampler, no guidance; scheduler does not apply)
    generator: str = "shipped"
    generator_steps: Optional[int] = None
    num_groups: int = 225  # 5 per class pair for 10 classes: 1 800 images
    # the lambda grid, the sampler ("ddim", "dpm" or "unipc") and its time steps, its steps (also those of the quality
    # measurement), guidance, the network's precision
    mixing: MixingConfig = RECIPE_MIXING
    # re-annotation
    encoder: str = "reference"  # "reference" or "open_clip:<model>:<pretrained tag or weights file>"
    encoder_epochs: int = 4
    encoder_max_steps: Optional[int] = None
    # s and the annotation checks: drop the groups they flag (drop_flagged); a generator they find poor
    # (annotation.checks.generator_problems) stops the run before the CSM dataset is built, unless accepted
    # (accept_poor_generator: then a loud warning)
    annotation: AnnotationConfig = AnnotationConfig()
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
    # a dataset with no test split (a flat <class>/<image> folder): the seeded share every stage holds out as its test
    test_fraction: float = 0.1
    train_extra: Dict = field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.mixing, MixingConfig) or not isinstance(self.annotation, AnnotationConfig):
            raise ValueError("a recipe profile's mixing is a MixingConfig and its annotation an AnnotationConfig")
        object.__setattr__(self, "mixing", dataclasses.replace(self.mixing, **RECIPE_SHARDS))
        object.__setattr__(self, "annotation", dataclasses.replace(self.annotation, seed=self.seed))


#: the registered recipe profiles: name -> :class:`RecipeProfile` (created as a copy)
PROFILES = Registry("recipe profile", plural="profiles", create=lambda name, profile, spec: copy.deepcopy(profile))


def register_profile(name: str, profile: Optional[RecipeProfile] = None, *, overwrite: bool = False):
    """Add ``profile`` to the registry under ``name``; a name is registered once unless ``overwrite``."""
    return PROFILES.register(name, profile, overwrite=overwrite) if profile is not None else \
        PROFILES.register(name, overwrite=overwrite)


def list_profiles(filter: str = "") -> List[str]:
    """The registered profile names, sorted; ``filter`` is a shell-style pattern (``"s*"``), as in timm."""
    return PROFILES.list(filter)


def get_profile(name: str) -> RecipeProfile:
    """A copy of the profile registered as ``name`` (changing it leaves the registry as it is)."""
    return PROFILES.create(name)


def paper_protocol(options: Dict) -> Dict:
    """:func:`timm_csm.training.run` ``options`` as the recipes and the benchmark cells run them: the temperature fitted
    by the paper's grid-ECE rule (``PAPER_TEMPERATURE_METHOD``) unless they name a rule.
    Applied when a run starts, not stored in the options: the cells and stages recorded before training runs
    defaulted to NLL keep their keys and their numbers."""
    return dict(options, ts_method=options.get("ts_method", PAPER_TEMPERATURE_METHOD))


def training_options(profile: RecipeProfile) -> Dict:
    """The classifier recipe of ``profile`` as :func:`timm_csm.training.run` options (shared by its CE and CSM runs
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
# `make demo` fits in 10 minutes on 2 cores, set-up included (benchmarks/demo.md). The paper's training ingredients
# (crops + flips, weight decay 5e-4, step decay, best validation accuracy) on 2 500 real images to convergence (60
# epochs: CE is over-confident, ECE 4.59 +- 0.38% before temperature scaling at 3 seeds); 75 groups per class pair x 4
# lambdas (13 500 images, 6 per real training image; the benchmark has 150 per pair) from DDIM with 4 trailing steps
# and no guidance: 0.48x the CPU time of the 8 leading steps the sampler study chose (benchmarks/sampler_study.md),
# with more pure-class images recognised, fewer groups flagged, and its CSM classifier's validation ECE not worse by
# the pre-set margin (benchmarks/generation.md, benchmarks/sampler_downstream.md); s chosen on held-out real images
# the encoder never saw; the groups the annotation checks flag dropped.
register_profile("demo", RecipeProfile(
    num_groups=3375, mixing=dataclasses.replace(RECIPE_MIXING, num_lambdas=4, steps=4,
                                                timestep_spacing="trailing", guidance_scale=1.0),
    annotation=AnnotationConfig(drop_flagged=True), epochs=60, lr=0.1, weight_decay=5e-4, sched="multistep",
    max_train_samples=2500,
    train_extra={**_WIDE, "crop_pad": 2, "hflip": 0.5, "decay_milestones": [30, 45]}))
# noaug: over-confident by over-fitting the 10k subset without augmentation or weight decay (15 epochs): CE
# accuracy 89.1/88.4%, ECE 6.5/7.2% before temperature scaling at seeds 0/1, about 95 s of one CPU core; the
# benchmark's second table (benchmarks/calibration_demo.md).
register_profile("noaug", RecipeProfile(train_extra={**_WIDE, "crop_pad": 0, "hflip": 0.0}))
# smoke: a 4-step generator makes noise, which the annotation checks find poor: accepted (with the warning), since
# the profile runs every code path, not the method
register_profile("smoke", RecipeProfile(generator="smoke", num_groups=24,
                                        mixing=dataclasses.replace(RECIPE_MIXING, steps=4), encoder_epochs=1,
                                        encoder_max_steps=20, annotation=AnnotationConfig(s=4.0,
                                                                                          accept_poor_generator=True),
                                        epochs=1, batch_size=64, max_train_samples=512, max_test_samples=512))
# full: the paper's CIFAR-100 setting. The generator is the class-conditional EDM network that Wang et al. trained
# for "Better diffusion models further improve adversarial training" (ICML 2023, github.com/wzekai99/DM-Improves-AT),
# the one the CSM authors sample (their gen_edm-mix/README.md); the user downloads it (FULL_EDM_PICKLE_URL) into the
# working directory or names their copy with --generator. The reader follows NVlabs' published pickle format; it has
# not yet been run on the released file. 25 Heun steps, no guidance, one noise per group, in float64 (the sampler
# levers of benchmarks/generation.md apply to a generator folder, not to an EDM network). Volume:
# the released gen_edm-mix/run_mix.sh samples seeds 0-19799 for CIFAR-100: 19 800 groups x 8 lambdas = 158 400
# images; 159 840 (19 980 groups x 8) is the volume of its CIFAR-10 run. CLIP: open_clip's "openai" tag, which
# open_clip downloads when online; OpenAI's weights run with QuickGELU, which the -quickgelu config builds (offline:
# --encoder open_clip:ViT-B-32-quickgelu:/path/to/weights.safetensors). s: the paper's CIFAR-100 value, pinned so that
# a copy of CIFAR-100 under another name (--dataset a folder) keeps it.
FULL_EDM_PICKLE_URL = ("https://huggingface.co/wzekai99/DM-Improves-AT/resolve/main/others/"
                       "edm-cifar100-cond-32x32-cond-vp.pkl")
register_profile("full", RecipeProfile(dataset="cifar100", generator=FULL_EDM_PICKLE_URL.rsplit("/", 1)[1],
                                       num_groups=19800, mixing=dataclasses.replace(RECIPE_MIXING, steps=25),
                                       encoder="open_clip:ViT-B-32-quickgelu:openai",
                                       annotation=AnnotationConfig(s=paper_s("cifar100")), model="resnet50_cifar",
                                       epochs=200, batch_size=128, lr=0.1, weight_decay=5e-4, sched="multistep",
                                       max_train_samples=None,
                                       train_extra={"decay_milestones": [80, 120], "clip_grad": 2.0}))

#: the sizes a rehearsal sets: 100 groups (every class of CIFAR-100 in at least one), 2 sampler steps (the mixing's
#: ``steps``), 1 epoch, 112 real training images in batches of 4, 10 test images, 2 steps of a trained generator or
#: reference encoder
REHEARSAL_SIZES = {"generator_steps": 2, "num_groups": 100, "sampler_steps": 2, "epochs": 1, "batch_size": 4,
                   "max_train_samples": 112, "max_test_samples": 10, "encoder_epochs": 1, "encoder_max_steps": 2}
#: the rehearsal's validation share: 101 of its 112 images, as many as temperature scaling needs for 100 classes
REHEARSAL_VAL_FRACTION = 0.9


def with_epochs(profile: RecipeProfile, epochs: int) -> RecipeProfile:
    """``profile`` training its classifier for ``epochs`` epochs, the milestones of ``train_extra["decay_milestones"]``
    keeping their share of the run (:func:`~timm_csm.training.optim.scale_milestones`: 30 and 45 of 60 are 10 and
    15 of 20), so that a shorter run still decays its learning rate."""
    from ..training.optim import scale_milestones

    extra = copy.deepcopy(profile.train_extra)
    if "decay_milestones" in extra:
        extra["decay_milestones"] = scale_milestones(extra["decay_milestones"], profile.epochs, epochs)
    return dataclasses.replace(profile, epochs=epochs, train_extra=extra)


def rehearsal_profile(profile: RecipeProfile, **sizes) -> RecipeProfile:
    """``profile`` at toy size: :data:`REHEARSAL_SIZES` (``sizes`` replaces any of them) and the validation share
    :data:`REHEARSAL_VAL_FRACTION`, every other field kept, so that each stage runs the same code path in minutes;
    its generator of 2 steps is poor by design, so the generator check warns instead of stopping the run.
    The epoch milestones keep their share of the run (:func:`with_epochs`: 80 and 120 of 200 are epochs 1 and 2 of 2,
    and both epoch 1 of 1)."""
    unknown = sorted(set(sizes) - set(REHEARSAL_SIZES))
    if unknown:
        raise ValueError(f"a rehearsal changes only the sizes {sorted(REHEARSAL_SIZES)}; got {unknown}")
    sizes = {**REHEARSAL_SIZES, **sizes}
    profile = with_epochs(profile, sizes["epochs"])
    extra = dict(profile.train_extra, val_fraction=REHEARSAL_VAL_FRACTION)
    mixing = dataclasses.replace(profile.mixing, steps=sizes.pop("sampler_steps"))
    annotation = dataclasses.replace(profile.annotation, accept_poor_generator=True)
    return dataclasses.replace(profile, train_extra=extra, mixing=mixing, annotation=annotation, **sizes)


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
