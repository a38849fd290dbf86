"""Typed configurations whose fields are their command-line flags: :func:`option` declares a field with its default
and, as metadata, its flag's help and argparse settings; :func:`add_options` adds a configuration's fields to an
argument parser (the shape of Hugging Face's ``HfArgumentParser`` over ``TrainingArguments``).

One mechanism for every configuration of the package (:class:`~timm_csm.training.config.TrainConfig`,
:class:`~timm_csm.annotation.AnnotationConfig`, :class:`~timm_csm.generation.MixingConfig`): a default is written
once, on its field, beside the code that gives it meaning, and the command line, the Python API and the recipes all
read it from there.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import typing
from dataclasses import field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

__all__ = ["option", "option_fields", "option_types", "add_options", "options_from_namespace", "comma_separated",
           "key_value"]


def option(default=None, group: Optional[str] = None, *, help: str, short: Optional[str] = None,
           flag: Optional[str] = None, factory: Optional[Callable[[], Any]] = None, **argparse_kwargs):
    """A configuration field: its ``default`` (a list is copied per instance; ``factory``: a function that gives it
    when an instance or a parser is made, for a default read from a registry) and, as metadata, its flag:
    ``flag`` (default ``--<name-with-dashes>``) and ``short``, its ``--help`` ``group`` and text, and the
    ``add_argument`` settings its type does not imply (``nargs``, ``choices``, ``metavar``, ...)."""
    metadata = dict(group=group, help=help, short=short, flag=flag, argparse=argparse_kwargs)
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    if isinstance(default, list):
        return field(default_factory=functools.partial(list, default), metadata=metadata)
    return field(default=default, metadata=metadata)


def comma_separated(text) -> List[str]:
    """``"a,b"`` -> ``["a", "b"]`` (``""``: none; a list stays a list): the ``type`` of a list option given as one
    comma-separated flag value (``--calibrators dirichlet,isotonic``)."""
    parts = text if isinstance(text, (list, tuple)) else str(text).split(",")
    return [str(part).strip() for part in parts if str(part).strip()]


def key_value(text: str) -> Tuple[str, Any]:
    """The argparse type of a ``KEY=VALUE`` item (an option of keyword arguments): ``(key, value)``, the value read
    as YAML (numbers, booleans, lists), else kept as a string."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    key, value = text.split("=", 1)
    import yaml

    try:
        parsed = yaml.safe_load(value)
    except yaml.YAMLError:
        parsed = value
    return key.strip(), parsed


def option_fields(cls) -> Tuple[dataclasses.Field, ...]:
    """The fields of configuration class ``cls`` declared with :func:`option`, in declaration order."""
    return tuple(f for f in dataclasses.fields(cls) if "help" in f.metadata)


@functools.lru_cache(maxsize=None)
def option_types(cls) -> Dict[str, Tuple[type, bool]]:
    """``{field: (value type, whether a list of them)}`` from ``cls``'s annotations: ``Optional[List[float]]`` is
    ``(float, True)``, ``Union[None, str, float]`` is ``(str, False)`` (the first type besides None), a list of
    ``(key, value)`` pairs is ``(tuple, True)``."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in option_fields(cls):
        hint, many = hints[f.name], False
        if typing.get_origin(hint) is typing.Union:
            hint = next(a for a in typing.get_args(hint) if a is not type(None))
        if typing.get_origin(hint) in (list, List):
            hint, many = typing.get_args(hint)[0], True
        out[f.name] = (typing.get_origin(hint) or hint, many)
    return out


def _default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def _add_option(parser, f: dataclasses.Field, kind: type, many: bool) -> None:
    """The flag of field ``f``: its name with ``-`` (or its ``flag``), its default, and the argparse type and
    ``nargs`` its annotation implies (a bool: a switch; a list: ``nargs="+"``) unless its metadata says otherwise."""
    meta = f.metadata
    kwargs = dict(meta["argparse"], dest=f.name, default=_default(f))
    if kind is bool:
        kwargs.setdefault("action", "store_true")
    elif kind in (int, float):
        kwargs.setdefault("type", kind)
    if many:
        kwargs.setdefault("nargs", "+")
    if kwargs.get("type") is comma_separated and isinstance(kwargs["default"], list):  # --help shows "a,b"
        kwargs["default"] = ",".join(map(str, kwargs["default"]))  # argparse gives a string default its type
    if meta["flag"] and kind is not bool:  # the flag's name in --help, not the field's
        kwargs.setdefault("metavar", meta["flag"].lstrip("-").replace("-", "_").upper())
    flags = [meta["short"]] if meta["short"] else []
    parser.add_argument(*flags, meta["flag"] or "--" + f.name.replace("_", "-"), help=meta["help"], **kwargs)


def add_options(parser: argparse.ArgumentParser, cls, skip: Sequence[str] = ()) -> argparse.ArgumentParser:
    """Add the flags of configuration class ``cls`` (its :func:`option` fields but ``skip``) to ``parser``, each in
    the argument group its metadata names (created once, reused when the parser has it already)."""
    groups = {g.title: g for g in parser._action_groups}
    types = option_types(cls)
    for f in option_fields(cls):
        if f.name in skip:
            continue
        group = f.metadata["group"]
        if group is not None and group not in groups:
            groups[group] = parser.add_argument_group(group)
        _add_option(groups[group] if group is not None else parser, f, *types[f.name])
    return parser


def options_from_namespace(cls, namespace: argparse.Namespace, **overrides):
    """The configuration ``cls`` of the flags :func:`add_options` parsed into ``namespace`` (fields it lacks at
    their defaults), with ``overrides`` replacing any."""
    values = {f.name: getattr(namespace, f.name) for f in option_fields(cls) if hasattr(namespace, f.name)}
    return cls(**{**values, **overrides})
