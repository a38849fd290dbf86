"""The method's steps, one function each, with explicit parameters: a generator trained on the real images, the
mixing pipeline of a generator, the generated groups, the annotated CSM dataset under its one name.

    generate_groups("fmnist", "runs/gen", num_groups=900, mixing=MixingConfig(num_lambdas=8))  # shipped, folder, .pkl
    folder, result = annotate_generated_folder("runs/gen", "runs/hub", encoder, dataset="fashion_mnist", install=True)

The commands (``timm-csm-generate``, ``timm-csm-annotate``: the flags of a
:class:`~timm_csm.generation.MixingConfig` or an :class:`~timm_csm.annotation.AnnotationConfig` plus the call) and
the recipe (:mod:`timm_csm.recipes.stages`: a cache key around the call with the profile's configurations) are two
front ends over these functions, so that the same inputs give the same bytes through either.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Callable, Dict, Optional, Sequence, Tuple

from .. import __version__
from ..annotation.config import AnnotationConfig
from ..generation.config import MixingConfig
from ..hub import csm_dataset_name, dataset_short_name

__all__ = ["default_device", "generator_name", "train_generator_folder", "shipped_generator",
           "resolve_generator", "unknown_generator", "check_mixing_options", "load_mixing_pipeline", "generate_groups",
           "generated_dataset", "PoorGeneratorError", "check_generator", "judge_generator",
           "JUDGE_SEED_OFFSET", "annotate_generated_folder", "csm_dataset_name"]

_ASSETS = Path(__file__).resolve().parents[1] / "assets"


def generator_name(dataset: str) -> str:
    """The name of a generator trained on ``dataset``: ``timm-csm-<short name>-ddpm`` (``fashion_mnist`` ->
    ``timm-csm-fmnist-ddpm``, a folder ``data/mnist-digits`` -> ``timm-csm-mnist-digits-ddpm``)."""
    return f"timm-csm-{dataset_short_name(dataset)}-ddpm"


def train_generator_folder(real, output, profile: str = "fmnist", *, steps: Optional[int] = None,
                           batch_size: Optional[int] = None, seed: Optional[int] = None,
                           checkpoint_every: Optional[int] = None, checkpoint_minutes: Optional[float] = None,
                           meta: Optional[Dict] = None, accelerator=None, log: Callable[[str], None] = print):
    """Train (or resume training) a class-conditional generator on ``real`` (an
    :class:`~timm_csm.data.ImageArrays`) into the generator folder ``output`` with the generator-training profile
    ``profile`` (:data:`~timm_csm.generation.GENERATOR_PROFILES`), at the real images' size and channels;
    ``steps``, ``batch_size``, ``seed`` and ``checkpoint_every`` replace the profile's where given,
    ``checkpoint_minutes`` also checkpoints after that much time (default
    :data:`~timm_csm.generation.training.CHECKPOINT_MINUTES`), ``meta`` goes into the folder's metadata, with the
    number of training images and the generator's name (:func:`generator_name` of ``meta["dataset"]``, else of the
    images' source) unless it gives them. Returns ``(unet, scheduler)``
    (:func:`~timm_csm.generation.training.train_generator`)."""
    from ..generation import GENERATOR_PROFILES
    from ..generation.training import CHECKPOINT_MINUTES, train_generator

    overrides = {k: v for k, v in (("steps", steps), ("batch_size", batch_size), ("seed", seed),
                                   ("checkpoint_every", checkpoint_every)) if v is not None}
    config = dataclasses.replace(GENERATOR_PROFILES[profile], **overrides)
    channels, size = real.images.shape[1:3]
    if (config.in_channels, config.sample_size) != (channels, size):
        config = dataclasses.replace(config, sample_size=size, in_channels=channels)
    meta = dict(meta or {})
    meta.setdefault("num_train_images", len(real))
    source = meta.get("dataset") or getattr(real, "source", "")
    if source and "name" not in meta:
        meta["name"] = generator_name(str(source))
    minutes = CHECKPOINT_MINUTES if checkpoint_minutes is None else checkpoint_minutes
    return train_generator(real.images, real.labels, real.class_names, output, config, meta=meta,
                           accelerator=accelerator, checkpoint_minutes=minutes, log=log)


def shipped_generator(dataset: str) -> Optional[Path]:
    """The generator folder shipped in the package for ``dataset`` (``fashion_mnist`` or its short name ``fmnist``:
    ``timm_csm/assets/generator-fmnist``), or None."""
    folder = _ASSETS / f"generator-{dataset_short_name(dataset)}"
    return folder if (folder / "unet" / "config.json").exists() else None


def resolve_generator(generator) -> Path:
    """The path of ``generator``: a path that holds a generator of a registered kind (a generator folder written by
    ``timm-csm-train-generator`` or the pipeline, an EDM pickle:
    :func:`~timm_csm.generation.registry.find_generator`), else the name of a shipped generator (``fmnist``);
    FileNotFoundError otherwise, in one line (:func:`unknown_generator`)."""
    from ..generation.registry import find_generator

    path = Path(str(generator))
    if find_generator(path) is not None:
        return path
    shipped = None if path.exists() else shipped_generator(str(generator))
    if shipped is None:
        raise FileNotFoundError(unknown_generator(generator))
    return shipped


def unknown_generator(generator, also: Sequence[str] = ()) -> str:
    """The line that refuses ``generator``: a generator folder still training says how to finish it; anything else
    lists what is accepted (``also``: what the caller accepts besides the registered kinds and the shipped
    generators, first)."""
    from ..generation.registry import GENERATOR_INDEX, accepted_generators, still_training

    path = Path(str(generator))
    if still_training(path):
        return (f"generator {str(generator)!r} has not finished training (a checkpoint, no {GENERATOR_INDEX}): the "
                "same timm-csm-train-generator command resumes and finishes it")
    names = sorted(p.name[len("generator-"):] for p in _ASSETS.glob("generator-*"))
    accepted = [*also, *accepted_generators(), f"the name of a shipped generator ({', '.join(names)})"]
    state = "holds no generator" if path.exists() else "does not exist"
    return f"generator {str(generator)!r} {state}; give {'; or '.join(accepted)}"


def check_mixing_options(generator, mixing: MixingConfig = MixingConfig()) -> None:
    """ValueError when the sampling options of ``mixing`` do not apply to ``generator``'s kind
    (:func:`~timm_csm.generation.registry.generator_kind`): an EDM pickle is sampled from pure noise with EDM's Heun
    sampler and no guidance (the paper)."""
    from ..generation.registry import generator_kind

    generator_kind(generator).check(mixing)


def default_device() -> str:
    """The GPU when there is one, else the CPU: where the steps run unless told."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def load_mixing_pipeline(generator, mixing: MixingConfig = MixingConfig(),
                         class_names: Optional[Sequence[str]] = None, anchors=None, device=None):
    """The semantic-mixing pipeline of ``generator`` (see :func:`resolve_generator`) with the sampler of ``mixing``,
    on ``device`` (default: the GPU when there is one): :func:`~timm_csm.generation.registry.create_generator`.

    * an EDM pickle: :meth:`~timm_csm.generation.EDMSemanticMixingPipeline.from_edm_pickle`, Heun with
      ``mixing.steps`` (default the paper's 20 / 25), ``class_names`` in label order (default CIFAR-10's
      or CIFAR-100's by the label dimension);
    * a generator folder: :class:`~timm_csm.generation.SemanticMixingPipeline` with ``mixing.scheduler`` and
      ``mixing.steps`` (default the pipeline's, 50), ``mixing.guidance_scale`` (default the generator's
      recommendation), and the real-anchored start (``anchors``, an
      :class:`~timm_csm.generation.anchors.AnchorPool`, at ``mixing.strength`` < 1); its own class names.
    """
    from ..generation.registry import create_generator

    return create_generator(resolve_generator(generator), mixing, class_names, anchors, device or default_device())


def generate_groups(generator, output, num_groups: int, mixing: MixingConfig = MixingConfig(), *,
                    class_names: Optional[Sequence[str]] = None, anchors=None, accelerator=None,
                    progress: bool = True, log: Callable[[str], None] = print, extend_from=None) -> Path:
    """Generate ``num_groups`` groups x ``mixing.num_lambdas`` ratios (``linspace(0, 1, num_lambdas)``) of
    ``generator`` into ``output``, sharded (``mixing.groups_per_shard``) and resumable: :func:`load_mixing_pipeline`,
    the group plan (:func:`~timm_csm.generation.make_plan`, which records the generator's provenance and the
    anchors), then :func:`~timm_csm.generation.generate_to_folder` (``mixing.batch_groups`` groups a forward pass;
    ``accelerator`` splits the shards across processes and sets the device). ``extend_from``: a finished output of
    the same command with fewer groups, whose groups are copied rather than generated again."""
    from ..generation import generate_to_folder, lambda_grid, make_plan

    device = accelerator.device if accelerator is not None else None
    pipe = load_mixing_pipeline(generator, mixing, class_names, anchors, device)
    anchored = anchors is not None and mixing.strength < 1.0
    plan_anchors = {**anchors.describe(), "strength": mixing.strength} if anchored else None
    plan = make_plan(pipe.num_classes, num_groups, lambda_grid(mixing.num_lambdas), pipe.class_names,
                     mixing.groups_per_shard, mixing.seed_offset, generator=pipe.provenance, anchors=plan_anchors)
    return generate_to_folder(pipe, output, plan, mixing.batch_groups, accelerator, progress=progress, log=log,
                              extend_from=extend_from)


def generated_dataset(generated) -> str:
    """The real dataset a generated folder's generator was trained on, as its plan records it (``fashion_mnist``
    when it records none: the shipped generator's)."""
    from ..generation.writer import PLAN_FILE

    plan = json.loads((Path(generated) / PLAN_FILE).read_text())
    return (plan.get("generator") or {}).get("dataset") or "fashion_mnist"


class PoorGeneratorError(ValueError):
    """The annotation checks found the generator poor (:func:`~timm_csm.annotation.checks.generator_problems`);
    nothing was saved."""


def check_generator(report: Dict, accept: bool = False, log: Callable[[str], None] = print) -> None:
    """The generator check of an annotation ``report``: :class:`PoorGeneratorError` naming the problems, or with
    ``accept`` a loud warning (a banner through ``log``) and the run goes on."""
    from ..annotation.checks import generator_problems

    problems = generator_problems(report)
    if not problems:
        return
    what = "the generator is poor: " + "; ".join(problems)
    if not accept:
        raise PoorGeneratorError(f"{what}. No CSM dataset was built: train the generator longer "
                                 "(timm-csm-train-generator --steps N resumes it) or pass --accept-poor-generator")
    banner = "!" * 100
    log(f"{banner}\nWARNING: {what}.\nWARNING: building the CSM dataset anyway (--accept-poor-generator): its soft "
        "labels contradict its images, and a classifier trained on it can be worse calibrated than with "
        f"cross-entropy alone.\n{banner}")


#: the seed of the first group a generator is judged on: apart from any generated set's seeds (they start at 0)
JUDGE_SEED_OFFSET = 10_000_000


def judge_generator(pipe, real, encoder, annotation: AnnotationConfig = AnnotationConfig(), *, dataset: str,
                    num_groups: int, mixing: MixingConfig = MixingConfig(), unseen=None, cache_dir=None,
                    log: Callable[[str], None] = print) -> Dict:
    """The annotation's generator check (:func:`check_generator`), before any generation is spent: ``num_groups``
    groups of ``mixing``'s lambda grid sampled from the mixing pipeline ``pipe`` (seeds from
    :data:`JUDGE_SEED_OFFSET`, apart from the groups a generation makes) into a temporary folder and annotated as
    :func:`annotate_generated_folder` annotates (``encoder``, the prototypes of the real training split ``real``,
    ``annotation``'s s and checks), so that the gate reads the same numbers with the same recogniser and thresholds.
    Returns the annotation report with ``verdict`` (:func:`~timm_csm.annotation.checks.generator_verdict`),
    ``poor``, and ``real_recognition``: the same recogniser on ``unseen``, real images the encoder never learned
    from (:func:`~timm_csm.annotation.label_groups.real_recognition`; None without them)."""
    import tempfile

    from ..annotation import annotate_generated
    from ..annotation.checks import generator_problems, generator_verdict
    from ..annotation.label_groups import real_recognition
    from ..generation import generate_to_folder, lambda_grid, load_generated, make_plan

    plan = make_plan(pipe.num_classes, num_groups, lambda_grid(mixing.num_lambdas), pipe.class_names,
                     mixing.groups_per_shard, JUDGE_SEED_OFFSET, generator=pipe.provenance)
    with tempfile.TemporaryDirectory(prefix="timm-csm-judge-") as folder:
        generate_to_folder(pipe, folder, plan, mixing.batch_groups, progress=False, log=log)
        images, plan = load_generated(folder)
        annotation = annotation.resolved(dataset)
        result = annotate_generated(images, plan, real, encoder, annotation.s,
                                    holdout=annotation.holds_out(dataset), cache_dir=cache_dir, progress=False,
                                    log=log, **annotation.annotate_kwargs())
    yardstick = None if unseen is None else real_recognition(result.encoder, result.prototypes, unseen)
    return dict(result.report, verdict=generator_verdict(result.report), poor=bool(generator_problems(result.report)),
                real_recognition=yardstick)


def annotate_generated_folder(generated, output, encoder, annotation: AnnotationConfig = AnnotationConfig(), *,
                              dataset: Optional[str] = None, real=None, name: Optional[str] = None, cache_dir=None,
                              install: bool = False, image_column: Optional[str] = None,
                              label_column: Optional[str] = None, progress: bool = True,
                              log: Callable[[str], None] = print) -> Tuple[Path, "AnnotatedSet"]:
    """Annotate the generated folder ``generated`` as ``annotation`` says and save it as the Hub-layout CSM dataset
    ``<output>/<name>`` (``name`` default :func:`csm_dataset_name` of ``dataset``), installed for bare-name
    ``load_dataset`` when ``install``. Returns the folder and the :class:`~timm_csm.annotation.AnnotatedSet`.

    ``dataset``: the real dataset (default :func:`generated_dataset`); ``real``: its training split when loaded
    already (default: read with ``image_column`` / ``label_column``). s: :meth:`AnnotationConfig.resolved
    <timm_csm.annotation.AnnotationConfig.resolved>`; the reference encoder learns without the held-out share when
    :meth:`~timm_csm.annotation.AnnotationConfig.holds_out`. ``encoder`` and the rest:
    :func:`~timm_csm.annotation.annotate_generated`. The dataset card records the real dataset, the generation plan
    (generator, sampler, lambda grid), the annotation and the package. Before anything is saved,
    :func:`check_generator` stops a poor generator (:class:`PoorGeneratorError`) unless
    ``annotation.accept_poor_generator``.
    """
    from ..annotation import annotate_generated
    from ..data import load_image_arrays
    from ..generation import load_generated
    from ..hub import install_dataset, provenance_from_plan, save_csm_dataset

    dataset = dataset or generated_dataset(generated)
    images, plan = load_generated(generated)
    real = load_image_arrays(dataset, "train", image_column, label_column) if real is None else real
    annotation = annotation.resolved(dataset)
    result = annotate_generated(images, plan, real, encoder, annotation.s,
                                holdout=annotation.holds_out(dataset), cache_dir=cache_dir, progress=progress,
                                log=log, **annotation.annotate_kwargs())
    check_generator(result.report, annotation.accept_poor_generator, log)
    provenance = {"dataset": dataset, **provenance_from_plan(plan), **result.provenance(),
                  "package": f"timm-csm {__version__}"}
    folder = save_csm_dataset(result.dataset, Path(output) / (name or csm_dataset_name(dataset)),
                              {k: v for k, v in provenance.items() if v}, class_names=real.class_names,
                              lambdas=plan["lambdas"])
    log(f"saved {len(result.dataset)} images to {folder}")
    if install:
        install_dataset(folder)
        log(f"installed: datasets.load_dataset({folder.name!r}) now works offline from any directory")
    return folder, result
