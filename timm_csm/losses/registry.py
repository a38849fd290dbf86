"""A loss registry in the style of timm's model registry (timm has none for losses).

    @register_loss("focal")
    class FocalLoss(LossBase): ...

    register_loss("csm_soft_ce", functools.partial(CSMLoss, kind="soft_ce"))

    loss = create_loss("focal", gamma=2.0)
    list_losses("csm*")  # ['csm', 'csm_soft_ce', 'csm_soft_focal']
"""
from __future__ import annotations

import fnmatch
from typing import Callable, Dict, List, Optional

import torch.nn as nn

__all__ = ["register_loss", "create_loss", "list_losses", "is_loss", "get_loss_entrypoint"]

_LOSS_ENTRYPOINTS: Dict[str, Callable[..., nn.Module]] = {}


def register_loss(name: str, fn: Optional[Callable[..., nn.Module]] = None, *, overwrite: bool = False):
    """Register a loss class or factory under ``name``.

    Use as a decorator (``@register_loss("name")``) or call directly (``register_loss("name", factory)``).
    Registering an existing name raises ``ValueError`` unless ``overwrite=True``.
    """
    if not isinstance(name, str) or not name or name != name.strip():
        raise ValueError(f"loss name must be a non-empty string without surrounding spaces, got {name!r}")

    def _register(entry):
        if not callable(entry):
            raise ValueError(f"register_loss({name!r}): expected a class or factory, got {type(entry).__name__}")
        if name in _LOSS_ENTRYPOINTS and not overwrite and _LOSS_ENTRYPOINTS[name] is not entry:
            raise ValueError(f"a loss named {name!r} is already registered (pass overwrite=True to replace it)")
        _LOSS_ENTRYPOINTS[name] = entry
        return entry

    return _register(fn) if fn is not None else _register


def get_loss_entrypoint(name: str) -> Callable[..., nn.Module]:
    """The class or factory registered as ``name``; unknown names raise ``ValueError`` listing the known ones."""
    try:
        return _LOSS_ENTRYPOINTS[name]
    except (KeyError, TypeError):
        known = ", ".join(sorted(_LOSS_ENTRYPOINTS))
        raise ValueError(f"unknown loss {name!r}; known losses: {known}") from None


def create_loss(name: str, **kwargs) -> nn.Module:
    """Instantiate the loss registered as ``name`` with ``kwargs`` (e.g. ``create_loss("mbls", margin=6)``)."""
    entry = get_loss_entrypoint(name)
    try:
        return entry(**kwargs)
    except TypeError as e:
        raise TypeError(f"create_loss({name!r}, ...): {e}") from e


def list_losses(filter: str = "") -> List[str]:
    """Sorted registered names, optionally filtered by a shell-style wildcard (``"csm*"``)."""
    names = sorted(_LOSS_ENTRYPOINTS)
    if filter:
        names = [n for n in names if fnmatch.fnmatchcase(n, filter)]
    return names


def is_loss(name: str) -> bool:
    return name in _LOSS_ENTRYPOINTS
