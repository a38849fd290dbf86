"""A loss registry in the style of timm's model registry (timm has none for losses).

    @register_loss("focal")
    class FocalLoss(LossBase): ...

    register_loss("csm_soft_ce", functools.partial(CSMLoss, kind="soft_ce"))

    loss = create_loss("focal", gamma=2.0)
    list_losses("csm*")  # ['csm', 'csm_soft_ce', 'csm_soft_focal']
    loss_spec("mndcg")   # LossSpec(inputs='mixed', num_mixed=3, smoothed=None)

Each entry carries a :class:`LossSpec`: what the loss's ``forward`` takes besides ``(logits, target)`` and the
defaults a training loop needs to build its batches, so that training code reads the registry instead of testing
loss names. A class's spec is read from its class attributes (see :class:`~timm_csm.losses.LossBase`); a factory
function passes ``spec=`` (e.g. ``LossSpec.of(CSMLoss)``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional

import torch.nn as nn

from ..registry import Registry

__all__ = ["register_loss", "create_loss", "list_losses", "is_loss", "get_loss_entrypoint", "loss_spec", "LossSpec",
           "LOSS_INPUTS", "register_loss_inputs", "LOSSES"]

#: the call conventions of registered losses (see :class:`LossSpec`): name -> the call, in words; a training task
#: for a new one is registered with :func:`timm_csm.training.tasks.register_training_task`
LOSS_INPUTS = Registry("loss call convention", sort=False)


def register_loss_inputs(name: str, call: Optional[str] = None, *, overwrite: bool = False):
    """Register the call convention ``name`` of a loss's ``forward`` (``call``: the call, in words)."""
    return LOSS_INPUTS.register(name, call, overwrite=overwrite)


for _name, _call in (("plain", "loss(logits, target)"), ("index", "loss(logits, target, index=...)"),
                     ("mixed", "loss(logits, target, logits_mixed, target_mixed)"),
                     ("generated", "loss(logits_real, y_real, logits_gen, q_gen)"),
                     ("teacher", "loss(logits, target, teacher_logits)")):
    register_loss_inputs(_name, _call)


@dataclass(frozen=True)
class LossSpec:
    """What a registered loss needs from the training batch.

    * ``inputs``: ``"plain"`` ``loss(logits, target)``; ``"index"`` ``loss(logits, target, index=...)`` (per-sample
      state); ``"mixed"`` ``loss(logits, target, logits_mixed, target_mixed)`` with mixed copies of the batch
      (RankMixup); ``"generated"`` ``loss(logits_real, y_real, logits_gen, q_gen)`` with a generated batch (CSM);
      ``"teacher"`` ``loss(logits, target, teacher_logits)`` with a teacher's logits on the same batch (distillation).
    * ``num_mixed``: the default number of mixed copies per sample of a ``"mixed"`` loss (MRL 1, M-NDCG 3, as
      in RankMixup's released configurations); 0 for the others.
    * ``smoothed``: the registered loss that is this one with label smoothing ``smoothing=`` (``"ls"`` for
      ``"ce"`` and ``"ls"``); None when the loss has no label-smoothing form.
    """

    inputs: str = "plain"
    num_mixed: int = 0
    smoothed: Optional[str] = None

    def __post_init__(self):
        if self.inputs not in LOSS_INPUTS:
            raise ValueError(f"LossSpec.inputs must be one of {tuple(LOSS_INPUTS)}, got {self.inputs!r}")
        if self.num_mixed < (1 if self.inputs == "mixed" else 0):
            raise ValueError(f"LossSpec.num_mixed must be >= 1 for mixed losses (0 allowed otherwise), "
                             f"got {self.num_mixed}")

    @property
    def needs_index(self) -> bool:
        return self.inputs == "index"

    @property
    def needs_generated(self) -> bool:
        """It trains on a generated (CSM) dataset beside the real batch."""
        return self.inputs == "generated"

    @classmethod
    def of(cls, entry) -> "LossSpec":
        """The spec declared by a loss class's attributes ``loss_inputs`` (a registered call convention) or
        ``is_csm``, ``needs_mixed``, ``needs_index``, ``needs_teacher``, with ``num_mixed`` and
        ``label_smoothing_loss`` (absent attributes: a plain loss)."""
        inputs = ("generated" if getattr(entry, "is_csm", False) else "mixed" if getattr(entry, "needs_mixed", False)
                  else "index" if getattr(entry, "needs_index", False)
                  else "teacher" if getattr(entry, "needs_teacher", False) else "plain")
        inputs = getattr(entry, "loss_inputs", None) or inputs
        return cls(inputs, int(getattr(entry, "num_mixed", 0)), getattr(entry, "label_smoothing_loss", None))


def _check_loss(name: str, entry, spec) -> None:
    if not callable(entry):
        raise ValueError(f"register_loss({name!r}): expected a class or factory, got {type(entry).__name__}")
    if not isinstance(spec, LossSpec):
        raise ValueError(f"register_loss({name!r}): spec must be a LossSpec, got {type(spec).__name__}")


def _create_loss(name: str, entry, spec, **kwargs) -> nn.Module:
    try:
        return entry(**kwargs)
    except TypeError as e:
        raise TypeError(f"create_loss({name!r}, ...): {e}") from e


#: the registered losses: name -> class or factory, with its :class:`LossSpec`
LOSSES = Registry("loss", plural="losses", spec_of=LossSpec.of, create=_create_loss, check=_check_loss)


def register_loss(name: str, fn: Optional[Callable[..., nn.Module]] = None, *, overwrite: bool = False,
                  spec: Optional[LossSpec] = None):
    """Register a loss class or factory under ``name``, with its :class:`LossSpec` (``spec``; default: read from
    the entry's class attributes, :meth:`LossSpec.of`).

    Use as a decorator (``@register_loss("name")``) or call directly (``register_loss("name", factory)``).
    Registering an existing name raises ``ValueError`` unless ``overwrite=True``.
    """
    return LOSSES.register(name, overwrite=overwrite, spec=spec) if fn is None else \
        LOSSES.register(name, fn, overwrite=overwrite, spec=spec)


def get_loss_entrypoint(name: str) -> Callable[..., nn.Module]:
    """The class or factory registered as ``name``; unknown names raise ``ValueError`` listing the known ones."""
    return LOSSES.get(name)


def loss_spec(name: str) -> LossSpec:
    """The :class:`LossSpec` of the loss registered as ``name`` (unknown names: ``ValueError``, as
    :func:`get_loss_entrypoint`)."""
    return LOSSES.get_spec(name)


def create_loss(name: str, **kwargs) -> nn.Module:
    """Instantiate the loss registered as ``name`` with ``kwargs`` (e.g. ``create_loss("mbls", margin=6)``)."""
    return LOSSES.create(name, **kwargs)


def list_losses(filter: str = "", **where) -> List[str]:
    """Sorted registered names, optionally filtered by a shell-style wildcard (``"csm*"``) and spec values
    (``inputs="mixed"``)."""
    return LOSSES.list(filter, **where)


def is_loss(name: str) -> bool:
    return name in LOSSES
