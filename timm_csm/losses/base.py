"""The base class of the registered losses: call-convention attributes, no-op hooks, logged terms, state loading."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from .batch import FlatBatch, flatten_batch

__all__ = ["LossBase"]


class LossBase(nn.Module):
    """Common base of the registered losses.

    Class attributes, read into the registry's :class:`~timm_csm.losses.registry.LossSpec`:

    * ``needs_index``: ``forward(logits, target, index=...)`` takes the dataset index of each sample;
    * ``needs_mixed``: ``forward(logits, target, logits_mixed, target_mixed)`` takes a mixed batch (RankMixup),
      ``num_mixed`` copies per sample by default;
    * ``is_csm``: ``forward(logits_real, y_real, logits_gen, q_gen)`` takes the real and the generated batch;
    * ``needs_teacher``: ``forward(logits, target, teacher_logits)`` takes a teacher's logits on the same batch;
    * ``label_smoothing_loss``: the registered loss that adds label smoothing (``smoothing=``) to this one.

    Hooks, no-ops here: ``on_epoch_end(val_logits, val_targets)``, called once per epoch with the validation logits
    (stateful losses update their state there), and ``sync(accelerator)``, which merges state written by each
    process (per-sample tables). The state lives in buffers, so ``state_dict()`` / ``load_state_dict()`` save and
    restore it (lazily sized buffers are resized on load).

    After each call, ``terms`` holds the detached components of the loss (e.g. ``{"ce": ..., "reg": ...}``)
    for logging.
    """

    needs_index: bool = False
    needs_mixed: bool = False
    is_csm: bool = False
    needs_teacher: bool = False
    num_mixed: int = 0
    label_smoothing_loss: Optional[str] = None

    def __init__(self, ignore_index: int = -100, validate: bool = True):
        super().__init__()
        self.ignore_index = int(ignore_index)
        self.validate = bool(validate)
        self.terms: dict = {}

    def _flat(self, logits, target) -> FlatBatch:
        return flatten_batch(logits, target, self.ignore_index, self.validate, type(self).__name__)

    def _record(self, **terms):
        self.terms = {k: v.detach() for k, v in terms.items()}

    def on_epoch_end(self, val_logits: torch.Tensor, val_targets: Optional[torch.Tensor] = None) -> None:
        """Update loss state from the epoch's validation logits (stateless losses: nothing)."""

    def sync(self, accelerator) -> None:
        """Merge the state the processes of an ``accelerate.Accelerator`` wrote (stateless losses: nothing)."""

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        # state buffers that are sized lazily (per class, per sample) take the size of the saved state
        for name, buf in list(self._buffers.items()):
            key = prefix + name
            if buf is not None and key in state_dict and state_dict[key].shape != buf.shape:
                self._buffers[name] = torch.empty_like(state_dict[key], device=buf.device, dtype=buf.dtype)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def extra_repr(self) -> str:
        skip = {"training", "ignore_index", "validate", "terms"}
        parts = [f"{k}={v!r}" for k, v in vars(self).items()
                 if not k.startswith("_") and k not in skip and isinstance(v, (int, float, str, bool, tuple))]
        return ", ".join(parts)
