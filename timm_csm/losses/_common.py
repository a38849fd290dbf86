"""Shared plumbing for the calibration losses: input checks, dense flattening, ignore masks, reductions.

Every multiclass loss accepts

* logits ``(N, C)`` with hard targets ``(N,)`` (integer class indices) or soft targets ``(N, C)`` (rows on the
  simplex), and
* dense logits ``(N, C, *S)`` (e.g. ``(N, C, H, W)`` for segmentation) with hard targets ``(N, *S)`` or soft targets
  ``(N, C, *S)``.

Dense inputs are flattened to ``(N * prod(S), C)`` rows. Hard targets equal to ``ignore_index`` are masked with a
0/1 row weight instead of being removed, so no host synchronisation is needed; a batch whose rows are all ignored
gives a loss of 0 rather than NaN.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["FlatBatch", "flatten_batch", "flatten_binary", "reduce_rows", "LossBase", "check_reduction"]

_REDUCTIONS = ("mean", "sum", "none")
_SUM_TOL = 1e-3  # soft-target rows must sum to 1 within this tolerance


def check_reduction(reduction: str) -> str:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    return reduction


@dataclass
class FlatBatch:
    """A batch flattened to rows: ``logits`` (M, C); exactly one of ``hard`` (M,) / ``soft`` (M, C) is set.

    ``weight`` is a (M,) 0/1 float mask of non-ignored rows (None when every row counts, as for soft targets);
    ignored rows carry class 0 in ``hard`` so that per-row values stay finite. ``shape`` is the target shape
    ``(N, *S)`` used to un-flatten ``reduction="none"`` results.
    """

    logits: torch.Tensor
    hard: Optional[torch.Tensor]
    soft: Optional[torch.Tensor]
    weight: Optional[torch.Tensor]
    shape: Tuple[int, ...]

    @property
    def num_classes(self) -> int:
        return self.logits.shape[1]

    @property
    def num_rows(self) -> int:
        return self.logits.shape[0]

    def target_probs(self) -> torch.Tensor:
        """The target as a (M, C) distribution (one-hot for hard targets)."""
        if self.soft is not None:
            return self.soft
        return F.one_hot(self.hard, self.num_classes).to(self.logits.dtype)

    def count(self) -> torch.Tensor:
        """Number of counted rows as a tensor (at least 1, so means of empty batches are 0, not NaN)."""
        if self.weight is None:
            return self.logits.new_tensor(float(max(self.num_rows, 1)))
        return self.weight.sum().clamp_min(1.0)

    def row_weight(self) -> torch.Tensor:
        if self.weight is None:
            return self.logits.new_ones(self.num_rows)
        return self.weight

    def target_dominant(self) -> torch.Tensor:
        """(M,) class index of the target: the hard label, or the argmax of a soft target."""
        return self.hard if self.hard is not None else self.soft.argmax(dim=1)


def _is_int(t: torch.Tensor) -> bool:
    return not (t.is_floating_point() or t.is_complex()) and t.dtype != torch.bool


def flatten_batch(
    logits: torch.Tensor,
    target: torch.Tensor,
    ignore_index: int = -100,
    validate: bool = True,
    name: str = "loss",
) -> FlatBatch:
    """Check ``(logits, target)`` and flatten dense inputs to rows (see the module docstring)."""
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
        raise ValueError(f"{name}: logits must be a floating-point tensor, got {type(logits).__name__}"
                         + (f" of dtype {logits.dtype}" if isinstance(logits, torch.Tensor) else ""))
    if not isinstance(target, torch.Tensor):
        raise ValueError(f"{name}: target must be a tensor, got {type(target).__name__}")
    if logits.ndim < 2:
        raise ValueError(f"{name}: logits must have shape (N, C) or (N, C, *spatial), got {tuple(logits.shape)}")
    num_classes = logits.shape[1]
    if num_classes < 2:
        raise ValueError(f"{name}: a softmax over {num_classes} class is constant; use a binary (sigmoid) loss")
    hard_shape = (logits.shape[0], *logits.shape[2:])
    if _is_int(target) and tuple(target.shape) == hard_shape:
        is_soft = False
    elif target.is_floating_point() and target.shape == logits.shape:
        is_soft = True
    else:
        raise ValueError(
            f"{name}: target of shape {tuple(target.shape)} and dtype {target.dtype} does not match logits "
            f"{tuple(logits.shape)}; expected integer class indices of shape {hard_shape} or floating soft "
            f"targets of shape {tuple(logits.shape)}"
        )

    if logits.ndim > 2:
        flat_logits = logits.movedim(1, -1).reshape(-1, num_classes)
        flat_target = target.movedim(1, -1).reshape(-1, num_classes) if is_soft else target.reshape(-1)
    else:
        flat_logits, flat_target = logits, target

    if validate:
        if not bool(torch.isfinite(flat_logits).all()):
            raise ValueError(f"{name}: logits contain NaN or infinite values")
        if is_soft:
            if not bool(torch.isfinite(flat_target).all()):
                raise ValueError(f"{name}: soft target contains NaN or infinite values")
            if flat_target.numel() and bool((flat_target < -_SUM_TOL).any()):
                raise ValueError(f"{name}: soft target has negative entries")
            if flat_target.numel():
                worst = (flat_target.sum(dim=1, dtype=torch.float64) - 1.0).abs().max()
                if float(worst) > _SUM_TOL:
                    raise ValueError(f"{name}: soft target rows must sum to 1 (largest deviation {float(worst):.3g})")
        else:
            valid = flat_target != ignore_index
            bad = valid & ((flat_target < 0) | (flat_target >= num_classes))
            if bool(bad.any()):
                value = int(flat_target[bad][0])
                raise ValueError(
                    f"{name}: label {value} out of range for {num_classes} classes (ignore_index={ignore_index})"
                )

    if is_soft:
        return FlatBatch(flat_logits, None, flat_target.to(flat_logits.dtype), None, tuple(target.shape[:1])
                         + tuple(target.shape[2:]))
    valid = flat_target != ignore_index
    hard = flat_target.masked_fill(~valid, 0).long()
    return FlatBatch(flat_logits, hard, None, valid.to(flat_logits.dtype), tuple(target.shape))


def reduce_rows(values: torch.Tensor, batch: FlatBatch, reduction: str = "mean") -> torch.Tensor:
    """Reduce per-row values (M,) honouring the ignore mask: masked mean, masked sum, or (N, *S) with zeros."""
    if batch.weight is not None:
        values = values * batch.weight
    if reduction == "mean":
        if batch.weight is None:
            return values.sum() / max(values.shape[0], 1)
        return values.sum() / batch.weight.sum().clamp_min(1.0)
    if reduction == "sum":
        return values.sum()
    return values.reshape(batch.shape)


def row_nll(log_probs: torch.Tensor, batch: FlatBatch) -> torch.Tensor:
    """Per-row cross-entropy -sum_k y_k log p_k (a gather for hard targets)."""
    if batch.hard is not None:
        return -log_probs.gather(1, batch.hard.unsqueeze(1)).squeeze(1)
    return -(batch.soft * log_probs).sum(dim=1)


def ce_rows(logits: torch.Tensor, batch: FlatBatch) -> torch.Tensor:
    """Per-row cross-entropy from logits (fused kernel for hard targets)."""
    if batch.hard is not None:
        return F.cross_entropy(logits, batch.hard, reduction="none")
    return -(batch.soft * F.log_softmax(logits, dim=1)).sum(dim=1)


@dataclass
class BinaryBatch:
    """Flattened binary (sigmoid) batch: ``logits`` and float ``target`` of shape (M,), 0/1 ``weight`` (M,)
    for non-ignored entries, ``group`` (M,) the sample (image) each entry belongs to, ``shape`` the input shape."""

    logits: torch.Tensor
    target: torch.Tensor
    weight: torch.Tensor
    group: torch.Tensor
    num_groups: int
    shape: Tuple[int, ...]

    def count(self) -> torch.Tensor:
        return self.weight.sum().clamp_min(1.0)


def flatten_binary(
    logits: torch.Tensor,
    target: torch.Tensor,
    ignore_index: int = -100,
    validate: bool = True,
    name: str = "loss",
) -> BinaryBatch:
    """Check a binary (sigmoid) batch: ``logits`` of any shape (N, ...) with a target of the same shape (floats in
    [0, 1] or integers 0/1), or logits (N, 1, *S) with a target (N, *S). Entries equal to ``ignore_index`` are
    masked out."""
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
        raise ValueError(f"{name}: logits must be a floating-point tensor")
    if not isinstance(target, torch.Tensor):
        raise ValueError(f"{name}: target must be a tensor, got {type(target).__name__}")
    if logits.ndim < 1:
        raise ValueError(f"{name}: logits must have a batch dimension, got shape {tuple(logits.shape)}")
    if target.shape != logits.shape:
        if logits.ndim >= 2 and logits.shape[1] == 1 and target.shape == logits.shape[:1] + logits.shape[2:]:
            logits = logits.squeeze(1)
        else:
            raise ValueError(
                f"{name}: binary target of shape {tuple(target.shape)} does not match logits {tuple(logits.shape)}"
            )
    if target.dtype == torch.bool:
        target = target.to(logits.dtype)
    flat_logits = logits.reshape(-1)
    flat_target = target.reshape(-1)
    valid = flat_target != ignore_index
    if validate:
        if not bool(torch.isfinite(flat_logits).all()):
            raise ValueError(f"{name}: logits contain NaN or infinite values")
        kept = flat_target[valid]
        if kept.numel() and (not bool(torch.isfinite(kept.double()).all()) or bool((kept < 0).any())
                             or bool((kept > 1).any())):
            raise ValueError(f"{name}: binary targets must lie in [0, 1] (or equal ignore_index={ignore_index})")
    target_f = flat_target.to(flat_logits.dtype).masked_fill(~valid, 0.0)
    num_groups = logits.shape[0] if logits.ndim >= 1 else 1
    per_group = flat_logits.shape[0] // max(num_groups, 1)
    group = torch.arange(num_groups, device=flat_logits.device).repeat_interleave(per_group)
    return BinaryBatch(flat_logits, target_f, valid.to(flat_logits.dtype), group, num_groups, tuple(logits.shape))


def reduce_binary(values: torch.Tensor, batch: BinaryBatch, reduction: str = "mean") -> torch.Tensor:
    values = values * batch.weight
    if reduction == "mean":
        return values.sum() / batch.count()
    if reduction == "sum":
        return values.sum()
    return values.reshape(batch.shape)


def modulating_factor(probs: torch.Tensor, gamma) -> torch.Tensor:
    """Focal modulating factor: (1 - p)^gamma for gamma >= 0, and the inverse-focal (1 + p)^|gamma| for gamma < 0
    (AdaFocal). ``gamma`` is a float or a tensor broadcastable to ``probs``.

    1 - p is clamped at the smallest normal float so the factor stays differentiable (finite gradient) for
    0 < gamma < 1 when p rounds to 1, which happens for logits of magnitude 1e4. Both branches use |gamma| so that
    the branch not taken never produces an infinite gradient.
    """
    tiny = torch.finfo(probs.dtype).tiny
    if not isinstance(gamma, torch.Tensor):
        if gamma >= 0:
            return (1.0 - probs).clamp_min(tiny).pow(gamma)
        return (1.0 + probs).pow(-gamma)
    magnitude = gamma.abs()
    focal = (1.0 - probs).clamp_min(tiny).pow(magnitude)
    inverse = (1.0 + probs).pow(magnitude)
    return torch.where(gamma >= 0, focal, inverse)


class LossBase(nn.Module):
    """Common base of the registered losses.

    Class attributes read by training loops:

    * ``needs_index``: ``forward(logits, target, index=...)`` takes the dataset index of each sample;
    * ``needs_mixed``: ``forward(logits, target, logits_mixed, target_mixed)`` takes a mixed batch (RankMixup);
    * ``is_csm``: ``forward(logits_real, y_real, logits_gen, q_gen)`` takes the real and the generated batch.

    Stateful losses also define ``on_epoch_end(val_logits, val_targets)``; their state lives in buffers, so
    ``state_dict()`` / ``load_state_dict()`` save and restore it (lazily sized buffers are resized on load).

    After each call, ``terms`` holds the detached components of the loss (e.g. ``{"ce": ..., "reg": ...}``)
    for logging.
    """

    needs_index: bool = False
    needs_mixed: bool = False
    is_csm: bool = False

    def __init__(self, ignore_index: int = -100, validate: bool = True):
        super().__init__()
        self.ignore_index = int(ignore_index)
        self.validate = bool(validate)
        self.terms: dict = {}

    def _flat(self, logits, target) -> FlatBatch:
        return flatten_batch(logits, target, self.ignore_index, self.validate, type(self).__name__)

    def _record(self, **terms):
        self.terms = {k: v.detach() for k, v in terms.items()}

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


def check_finite_number(name: str, value, low: float = -math.inf, high: float = math.inf,
                        low_open: bool = False) -> float:
    value = float(value)
    if not math.isfinite(value) or value < low or (low_open and value == low) or value > high:
        bound = f"({low}, {high}]" if low_open else f"[{low}, {high}]"
        raise ValueError(f"{name} must be a finite number in {bound}, got {value}")
    return value
