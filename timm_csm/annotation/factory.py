"""The encoder registry: :func:`register_encoder` adds a kind, :func:`create_encoder` builds one from its spec string
(timm's ``register_model`` / ``create_model``), which ``timm-csm-annotate --encoder`` and the recipe's ``--encoder``
share.

A spec is ``<kind>[:<field>[:<field>...]]``: the kind's fields in the order it registered them, the last one keeping
any further ``:`` (a path). The kinds here:

* ``open_clip[:<model>[:<tag or weights file>]]``: :class:`~timm_csm.annotation.OpenClipEncoder`
  (``open_clip:ViT-B-32-quickgelu:openai``);
* ``timm[:<model>[:<checkpoint>]]``: :class:`~timm_csm.annotation.TimmEncoder`;
* ``reference[:<folder>]``: a reference encoder folder (:func:`~timm_csm.annotation.load_reference_encoder`).
"""
from __future__ import annotations

from typing import Callable, Dict, List, Sequence, Tuple

from .encoders import ImageEncoder, OpenClipEncoder, TimmEncoder
from .reference import load_reference_encoder

__all__ = ["register_encoder", "list_encoders", "parse_encoder_spec", "create_encoder"]

# kind -> (factory, the keyword arguments a spec's fields fill, in order)
_ENCODERS: Dict[str, Tuple[Callable[..., ImageEncoder], Tuple[str, ...]]] = {}


def register_encoder(kind: str, spec_fields: Sequence[str] = ()):
    """Decorate a factory ``(**kwargs) -> ImageEncoder`` as the encoder ``kind``; ``spec_fields``: the keyword
    arguments the fields of a spec ``<kind>:<field>:...`` fill, in order. A kind is registered once."""
    def decorate(factory: Callable[..., ImageEncoder]):
        if kind in _ENCODERS or ":" in kind:
            raise ValueError(f"encoder kind {kind!r} is registered already or holds ':'; choose another name")
        _ENCODERS[kind] = (factory, tuple(spec_fields))
        return factory

    return decorate


def list_encoders() -> List[str]:
    """The registered encoder kinds, sorted."""
    return sorted(_ENCODERS)


def _spec_forms() -> str:
    return ", ".join(kind + "".join(f"[:<{f}>" for f in fields) + "]" * len(fields)
                     for kind, (_, fields) in sorted(_ENCODERS.items()))


def parse_encoder_spec(spec: str) -> Tuple[str, Dict[str, str]]:
    """``(kind, {field: value})`` of an encoder spec (``open_clip:ViT-B-32:openai`` ->
    ``("open_clip", {"model_name": "ViT-B-32", "pretrained": "openai"})``); ValueError naming the forms."""
    kind, _, rest = str(spec).partition(":")
    if kind not in _ENCODERS:
        raise ValueError(f"encoder {spec!r}: unknown kind {kind!r}; give one of {_spec_forms()}")
    fields = _ENCODERS[kind][1]
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
    return _ENCODERS[kind][0](**fields, **kwargs)


register_encoder("open_clip", ("model_name", "pretrained"))(OpenClipEncoder)
register_encoder("timm", ("model", "checkpoint_path"))(TimmEncoder)
register_encoder("reference", ("path",))(load_reference_encoder)
