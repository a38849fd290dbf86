"""The encoder registry: :func:`register_encoder` adds a kind, :func:`create_encoder` builds one from its spec string
(timm's ``register_model`` / ``create_model``), which ``timm-csm-annotate --encoder`` and the recipe's ``--encoder``
share.

A spec is ``<kind>[:<field>[:<field>...]]``: the kind's fields in the order it registered them, the last one keeping
any further ``:`` (a path). The kinds here:

* ``open_clip[:<model>[:<tag or weights file>]]``: :class:`~timm_csm.annotation.OpenClipEncoder`
  (``open_clip:ViT-B-32-quickgelu:openai``);
* ``timm[:<model>[:<checkpoint>]]``: :class:`~timm_csm.annotation.TimmEncoder`;
* ``reference[:<folder>]``: a reference encoder folder (:func:`~timm_csm.annotation.load_reference_encoder`); the
  bare ``reference`` is trained by the front end (:attr:`EncoderSpec.trains`).

What a kind needs from a front end is in its :class:`EncoderSpec`: the command-line flags that give the fields a spec
leaves out and its other options (``--model``, ``--checkpoint``, ...), the fields it cannot do without, whether the
front end trains one, and the check of its weights before a long run. A front end reads the spec; none switches on a
kind's name.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..registry import Registry
from .encoders import ImageEncoder, OpenClipEncoder, TimmEncoder
from .reference import load_reference_encoder, train_reference_encoder

__all__ = ["EncoderFlag", "EncoderSpec", "ENCODERS", "register_encoder", "list_encoders", "encoder_spec",
           "parse_encoder_spec", "create_encoder", "encoder_from_options", "create_encoder_checked"]


@dataclass(frozen=True)
class EncoderFlag:
    """A command-line flag of an encoder kind: ``flag`` (``--checkpoint``) gives the factory's keyword ``argument``
    (when the spec leaves it out); ``help`` and ``argparse`` (``add_argument`` settings) declare it where a front end
    has no such flag yet."""

    argument: str
    flag: str
    help: str = ""
    argparse: Mapping[str, Any] = None

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


@dataclass(frozen=True)
class EncoderSpec:
    """A registered encoder kind.

    * ``factory``: ``(**kwargs) -> ImageEncoder``; ``fields``: the keyword arguments a spec's fields fill, in order.
    * ``flags``: its :class:`EncoderFlag` s; ``required``: the arguments a spec or a flag must give.
    * ``trains``: for a kind that a front end trains when its spec names no field (``reference``), the training
      function (``(train_images, folder, **options) -> ...``); the trained folder is its first field.
    * ``build_checked``: ``(spec, fields, build) -> encoder``: ``build()`` with its weights checked, an error naming
      the ways to get them when they cannot be had (before any long stage); None: ``build()`` as it is.
    """

    kind: str
    factory: Callable[..., ImageEncoder]
    fields: Tuple[str, ...] = ()
    flags: Tuple[EncoderFlag, ...] = ()
    required: Tuple[str, ...] = ()
    trains: Optional[Callable] = None
    build_checked: Optional[Callable[[str, Dict[str, str], Callable[[], ImageEncoder]], ImageEncoder]] = None

    def trained_here(self, fields: Mapping[str, str]) -> bool:
        """Whether a spec of these ``fields`` is trained by the front end (a trainable kind, no field given)."""
        return self.trains is not None and not fields

    def forms(self) -> str:
        return self.kind + "".join(f"[:<{f}>" for f in self.fields) + "]" * len(self.fields)


def _check_kind(kind: str, factory, spec: EncoderSpec) -> None:
    if not callable(factory):
        raise ValueError(f"register_encoder({kind!r}): expected a factory, got {type(factory).__name__} (the spec's "
                         "fields go in spec_fields=)")
    if ":" in kind:
        raise ValueError(f"encoder kind {kind!r} holds ':'; choose another name")


#: the registered encoder kinds: kind -> factory, with its :class:`EncoderSpec`
ENCODERS = Registry("encoder kind", check=_check_kind)


def register_encoder(kind: str, factory: Optional[Callable[..., ImageEncoder]] = None, *, overwrite: bool = False,
                     spec_fields: Sequence[str] = (), flags: Sequence[EncoderFlag] = (), required: Sequence[str] = (),
                     trains: Optional[Callable] = None, build_checked: Optional[Callable] = None):
    """Register a factory ``(**kwargs) -> ImageEncoder`` as the encoder ``kind`` (without ``factory``, a decorator)
    with its :class:`EncoderSpec` fields: ``spec_fields``, the keyword arguments the fields of a spec
    ``<kind>:<field>:...`` fill, in order; ``flags``, ``required``, ``trains``, ``build_checked``."""
    def add(fn):
        return ENCODERS.register(kind, fn, overwrite=overwrite, spec=EncoderSpec(
            kind, fn, tuple(spec_fields), tuple(flags), tuple(required), trains, build_checked))

    return add if factory is None else add(factory)


def list_encoders(filter: str = "") -> List[str]:
    """The registered encoder kinds, sorted."""
    return ENCODERS.list(filter)


def encoder_spec(kind: str) -> EncoderSpec:
    """The :class:`EncoderSpec` of ``kind``; unknown kinds: one line listing the known ones."""
    return ENCODERS.get_spec(kind)


def _spec_forms() -> str:
    return ", ".join(spec.forms() for _, spec in ENCODERS.items())


def parse_encoder_spec(spec: str) -> Tuple[str, Dict[str, str]]:
    """``(kind, {field: value})`` of an encoder spec (``open_clip:ViT-B-32:openai`` ->
    ``("open_clip", {"model_name": "ViT-B-32", "pretrained": "openai"})``); ValueError naming the forms."""
    kind, _, rest = str(spec).partition(":")
    if kind not in ENCODERS:
        raise ValueError(f"encoder {spec!r}: unknown kind {kind!r}; give one of {_spec_forms()}")
    fields = encoder_spec(kind).fields
    values = rest.split(":", max(len(fields) - 1, 0)) if rest else []
    if len(values) > len(fields) or any(not v for v in values):
        raise ValueError(f"encoder {spec!r}: expected {_spec_forms()}")
    return kind, dict(zip(fields, values))


def create_encoder(spec: str, **kwargs) -> ImageEncoder:
    """The encoder of ``spec`` (see the module docstring) with ``kwargs`` for its factory:
    ``create_encoder("open_clip:ViT-B-32:openai", device="cuda")``, ``create_encoder("timm", model="resnet18",
    checkpoint_path="w.safetensors")`` or ``create_encoder("reference", path="runs/reference-fmnist")``. A field
    given by both the spec and ``kwargs`` is a ValueError."""
    kind, fields = parse_encoder_spec(spec)
    twice = sorted(set(fields) & set(kwargs))
    if twice:
        raise ValueError(f"encoder {spec!r}: {', '.join(twice)} given both in the spec and as an argument")
    return ENCODERS.create(kind, **fields, **kwargs)


def encoder_from_options(spec: str, options: Mapping[str, Any], **kwargs) -> ImageEncoder:
    """The encoder of ``spec`` with the arguments its kind's flags give in ``options`` (``{dest: value}``, a
    command's parsed flags; a flag left at None or False gives nothing) for the fields the spec leaves out; a
    required argument given by neither is one line naming its flag."""
    kind, fields = parse_encoder_spec(spec)
    kind_spec = encoder_spec(kind)
    given = {f.argument: options.get(f.dest) for f in kind_spec.flags
             if f.argument not in fields and options.get(f.dest) not in (None, False)}
    for argument in kind_spec.required:
        if argument not in fields and argument not in given:
            flags = [f.flag for f in kind_spec.flags if f.argument == argument]
            usual = [f.flag for f in kind_spec.flags if f.argument in kind_spec.fields
                     and f.argument not in kind_spec.required]
            raise ValueError(f"--encoder {kind} needs {' or '.join(flags) or argument}"
                             + (f" (and usually {', '.join(usual)})" if usual else ""))
    return create_encoder(spec, **given, **kwargs)


def create_encoder_checked(spec: str, **kwargs) -> ImageEncoder:
    """:func:`create_encoder` of ``spec`` through its kind's ``build_checked``: weights that cannot be had stop at
    once with one line naming the ways to get them."""
    kind, fields = parse_encoder_spec(spec)
    check = encoder_spec(kind).build_checked
    build = lambda: create_encoder(spec, **kwargs)  # noqa: E731
    return build() if check is None else check(spec, fields, build)


def _open_clip_checked(spec: str, fields: Dict[str, str], build: Callable[[], ImageEncoder]) -> ImageEncoder:
    """``build()`` of an open_clip spec; a weights file that does not exist, or a tag whose weights are neither in
    the cache nor downloadable (offline), is an error naming both ways: a local file, or the tag with network
    access."""
    import open_clip

    model, pretrained = fields.get("model_name", "ViT-B-32"), fields.get("pretrained", "")
    tags = open_clip.list_pretrained_tags_by_model(model)
    ways = (f"give a local weights file (--encoder open_clip:{model}:/path/to/weights.safetensors), or an open_clip "
            f"tag and network access, where open_clip downloads the weights once into the Hugging Face cache "
            f"(--encoder open_clip:{model}:{tags[0] if tags else '<tag>'}; HF_HUB_OFFLINE unset)")
    if pretrained not in tags and not Path(pretrained).is_file():
        raise FileNotFoundError(f"--encoder {spec}: {pretrained!r} is neither an existing file nor an open_clip tag "
                                f"of {model} (its tags: {', '.join(tags) or 'none'}); {ways}")
    try:
        return build()
    except RuntimeError as e:
        if pretrained not in tags:
            raise
        raise RuntimeError(f"--encoder {spec}: the weights of tag {pretrained!r} are not in the cache and could not "
                           f"be downloaded; {ways}. ({str(e)[:300]})") from e


_MODEL_FLAG = ("--model", "open_clip config (default ViT-B-32) or timm model name")
register_encoder("open_clip", OpenClipEncoder, spec_fields=("model_name", "pretrained"),
                 build_checked=_open_clip_checked,
                 flags=(EncoderFlag("model_name", *_MODEL_FLAG),
                        EncoderFlag("pretrained", "--pretrained", "open_clip tag, weights file, or omit for local-dir: "
                                    "models"),
                        EncoderFlag("force_quick_gelu", "--force-quick-gelu", "open_clip: QuickGELU (OpenAI weights)",
                                    {"action": "store_true"}),
                        EncoderFlag("normalize", "--normalize", "unit-normalise features (the paper does not)",
                                    {"action": "store_true"})))
register_encoder("timm", TimmEncoder, spec_fields=("model", "checkpoint_path"), required=("model",),
                 flags=(EncoderFlag("model", *_MODEL_FLAG), EncoderFlag("checkpoint_path", "--checkpoint",
                                                                        "timm: local weights"),
                        EncoderFlag("input_size", "--input-size", "timm: input size fed to the model (default: its "
                                    "pretrained config)", {"type": int, "nargs": 3, "metavar": ("C", "H", "W")})))
register_encoder("reference", load_reference_encoder, spec_fields=("path",), trains=train_reference_encoder)
