"""The generator registry: :func:`register_generator` adds a kind of generator, :func:`create_generator` builds the
semantic-mixing pipeline of one (its model with the soft-conditioning adapter, and its sampler) from a
:class:`~timm_csm.generation.MixingConfig` (timm's ``register_model`` / ``create_model``). Which kind a generator is
(:func:`generator_kind`) is decided here and nowhere else.

The kinds here:

* ``edm``: an NVlabs EDM network pickle (``*.pkl``, read without running code from it), sampled from pure noise with
  EDM's Heun sampler and no guidance (the paper), its classes named in label order
  (:meth:`~timm_csm.generation.EDMSemanticMixingPipeline.from_edm_pickle`);
* ``diffusers``: a generator folder (``model_index.json``, ``unet/``, ``scheduler/``):
  :class:`~timm_csm.generation.SemanticMixingPipeline` with the configuration's scheduler and its time steps, steps,
  guidance, precision and real-anchored start. It takes any generator no other kind claims.

Whether a path holds a generator of its kind (:func:`find_generator`) is decided here too, so that every front end
that takes a generator (the pipeline's ``--generator``, ``timm-csm-generate``, ``timm-csm-evaluate-generator``)
accepts the same things and names them (:func:`accepted_generators`) when given something else.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from ..registry import Registry
from .config import MixingConfig

__all__ = ["GeneratorKind", "GENERATORS", "register_generator", "list_generators", "generator_spec", "generator_kind",
           "find_generator",
           "accepted_generators", "still_training", "create_generator", "GENERATOR_INDEX"]


@dataclass(frozen=True)
class GeneratorKind:
    """A kind of generator.

    Args:
        name: the kind's name.
        matches: whether a generator (a path) is of this kind; the last kind registered with None takes the rest.
        create: ``(path, mixing, class_names, anchors, device) -> pipeline``.
        check: raises ValueError naming the options of a :class:`MixingConfig` that do not apply to the kind.
        digest: the digest of the weights a generation of it is keyed on.
        is_file: the generator is one file, which must exist (a folder kind may name a shipped generator).
        names_classes: it takes the class names in label order (its weights carry none).
        holds: whether a path holds a usable generator of this kind (default: the file exists, for a file kind;
            the path exists, for a folder kind).
        accepts: what the kind accepts, in words, for the line that lists the accepted generators.
        records: what a generator of the kind records of itself (``class_names``, ``dataset``, ``name``,
            ``num_train_images``: those it has; default none).
    """

    name: str
    matches: Optional[Callable[[Path], bool]]
    create: Callable
    check: Callable[[MixingConfig], None]
    digest: Callable[[Path], str]
    is_file: bool = False
    names_classes: bool = False
    holds: Optional[Callable[[Path], bool]] = None
    accepts: str = ""
    records: Optional[Callable[[Path], Dict]] = None

    def holds_generator(self, path: Path) -> bool:
        """Whether ``path`` holds a usable generator of this kind."""
        if self.holds is not None:
            return self.holds(path)
        return path.is_file() if self.is_file else path.exists()

    def record(self, path: Path) -> Dict:
        """What the generator at ``path`` records of itself (empty when the kind records nothing)."""
        return self.records(path) if self.records is not None else {}


def _check_kind(name: str, create, kind: GeneratorKind) -> None:
    if kind.matches is None and any(k.matches is None for n, k in GENERATORS.items() if n != name):
        raise ValueError(f"generator kind {name!r}: another kind already takes the generators none matches")


#: the registered generator kinds, in registration order (the order :func:`generator_kind` tries them in):
#: name -> ``create``, with its :class:`GeneratorKind`
GENERATORS = Registry("generator kind", sort=False, check=_check_kind)


def register_generator(name: str, create: Optional[Callable] = None, *, overwrite: bool = False,
                       matches: Optional[Callable[[Path], bool]], check: Callable[[MixingConfig], None],
                       digest: Callable[[Path], str], **fields) -> Callable:
    """Register the generator kind ``name`` whose ``create(path, mixing, class_names, anchors, device)`` builds its
    pipeline (without ``create``, a decorator), with the other fields of its :class:`GeneratorKind` (``matches``,
    ``check``, ``digest``, ``is_file``, ...). A name is registered once; one kind takes the generators no other
    matches."""
    def add(fn):
        return GENERATORS.register(name, fn, overwrite=overwrite,
                                   spec=GeneratorKind(name, matches, fn, check, digest, **fields))

    return add if create is None else add(create)


def list_generators(filter: str = "") -> List[str]:
    """The registered generator kinds, in registration order."""
    return GENERATORS.list(filter)


def generator_spec(name: str) -> GeneratorKind:
    """The :class:`GeneratorKind` registered as ``name``; unknown names: one line listing the known ones."""
    return GENERATORS.get_spec(name)


def generator_kind(generator) -> GeneratorKind:
    """The kind of ``generator`` (a path or a name): the first registered kind that matches it, else the one that
    takes the rest."""
    path = Path(str(generator))
    kinds = [kind for _, kind in GENERATORS.items()]
    for kind in kinds:
        if kind.matches is not None and kind.matches(path):
            return kind
    return next(k for k in kinds if k.matches is None)


def find_generator(generator) -> Optional[GeneratorKind]:
    """The kind of ``generator`` when the path holds a usable generator of that kind, else None."""
    path = Path(str(generator))
    kind = generator_kind(path)
    return kind if kind.holds_generator(path) else None


def accepted_generators() -> List[str]:
    """What the registered kinds accept, in words, one entry a kind (in registration order)."""
    return [kind.accepts or f"a {name} generator" for name, kind in GENERATORS.items()]


def create_generator(generator, mixing: MixingConfig = MixingConfig(), class_names: Optional[Sequence[str]] = None,
                     anchors=None, device="cpu"):
    """The semantic-mixing pipeline of ``generator`` (a path) sampled as ``mixing`` says, on ``device``;
    ``class_names`` for a kind that takes them, ``anchors`` (an :class:`~timm_csm.generation.anchors.AnchorPool`)
    for the real-anchored start. ValueError when an option does not apply to the kind."""
    kind = generator_kind(generator)
    kind.check(mixing)
    return kind.create(Path(generator), mixing, class_names, anchors, device)


def _edm_check(mixing: MixingConfig) -> None:
    if mixing.strength < 1.0:
        raise ValueError("an EDM pickle samples from pure noise only; a strength below 1 needs a generator folder")
    default = MixingConfig()
    if mixing.timestep_spacing is not None:
        raise ValueError(f"an EDM network pickle is sampled at EDM's noise levels: timestep_spacing "
                         f"{mixing.timestep_spacing!r} applies to a generator folder only; leave it at None")
    if mixing.precision != default.precision:
        raise ValueError(f"an EDM network pickle is sampled in float64 as the reference sampler: precision "
                         f"{mixing.precision!r} applies to a generator folder only; leave it at {default.precision!r}")
    if mixing.guidance_scale not in (None, 1.0) or mixing.scheduler != default.scheduler:
        raise ValueError("an EDM network pickle is sampled with EDM's Heun sampler without guidance (the paper): "
                         f"guidance_scale {mixing.guidance_scale} and scheduler {mixing.scheduler!r} do not apply; "
                         f"leave them at None and {default.scheduler!r}")


def _edm_create(path: Path, mixing: MixingConfig, class_names, anchors, device):
    from .pipeline import EDMSemanticMixingPipeline

    names = list(class_names) if class_names is not None else None
    return EDMSemanticMixingPipeline.from_edm_pickle(path, mixing.steps, device=device, class_names=names)


def _folder_create(path: Path, mixing: MixingConfig, class_names, anchors, device):
    from .pipeline import SemanticMixingPipeline, create_scheduler

    steps = {} if mixing.steps is None else {"num_inference_steps": mixing.steps}
    pipe = SemanticMixingPipeline.from_pretrained(path, guidance_scale=mixing.guidance_scale, anchors=anchors,
                                                  strength=mixing.strength, precision=mixing.precision, **steps)
    config = dict(pipe.scheduler.config)
    if mixing.timestep_spacing is not None:
        config["timestep_spacing"] = mixing.timestep_spacing
    pipe.scheduler = create_scheduler(mixing.scheduler, config)
    return pipe.to(device)


def _file_digest(path: Path) -> str:
    from .models import file_digest

    return file_digest(path)


def _weights_digest(path: Path) -> str:
    from .models import weights_digest

    return weights_digest(path)


#: the file whose presence makes a folder a finished generator (a folder with only ``last.safetensors`` is still
#: training)
GENERATOR_INDEX = "model_index.json"


def still_training(generator) -> bool:
    """Whether ``generator`` is a generator folder whose training has not finished: a checkpoint, no
    :data:`GENERATOR_INDEX` yet."""
    from ..io import CHECKPOINT_LAST

    path = Path(str(generator))
    return (path / CHECKPOINT_LAST).is_file() and not (path / GENERATOR_INDEX).is_file()


def _is_generator_folder(path: Path) -> bool:
    return (path / GENERATOR_INDEX).is_file() and (path / "unet" / "config.json").is_file()


def _folder_records(path: Path) -> Dict:
    index = json.loads((path / GENERATOR_INDEX).read_text())
    meta = index.get("metadata") or {}
    record = {k: meta[k] for k in ("dataset", "name", "num_train_images") if meta.get(k) is not None}
    if index.get("class_names"):
        record["class_names"] = [str(c) for c in index["class_names"]]
    return record


register_generator("edm", _edm_create, matches=lambda path: path.suffix.lower() == ".pkl", check=_edm_check,
                   digest=_file_digest, is_file=True, names_classes=True,
                   accepts="an NVlabs EDM network pickle (an existing .pkl file)")
register_generator("diffusers", _folder_create, matches=None, check=lambda mixing: None, digest=_weights_digest,
                   holds=_is_generator_folder, records=_folder_records,
                   accepts=f"a generator folder ({GENERATOR_INDEX}, unet/, scheduler/: written by "
                           "timm-csm-train-generator or timm-csm-pipeline)")
