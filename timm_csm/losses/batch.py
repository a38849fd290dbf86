"""The batch every calibration loss takes, in plain functions: input checks, flattening into rows, ignore masks,
per-row losses and reductions.

Every multiclass loss accepts

* logits ``(N, C)`` with hard targets ``(N,)`` (integer class indices) or soft targets ``(N, C)`` (rows on the
  simplex), and
* dense logits ``(N, C, *S)`` (e.g. ``(N, C, H, W)`` for segmentation) with hard targets ``(N, *S)`` or soft targets
  ``(N, C, *S)``.

Dense inputs are flattened to ``(N * prod(S), C)`` rows (:func:`flatten_batch`, :class:`FlatBatch`; binary sigmoid
inputs: :func:`flatten_binary`, :class:`BinaryBatch`). Hard targets equal to ``ignore_index`` are masked with a
0/1 row weight instead of being removed, so no host synchronisation is needed; a batch whose rows are all ignored
gives a loss of 0 rather than NaN.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from ..metrics.inputs import ROW_SUM_ATOL

__all__ = ["FlatBatch", "BinaryBatch", "flatten_batch", "flatten_binary", "reduce_rows", "reduce_binary", "row_nll",
           "ce_rows", "mean_nll", "mean_ce", "masked_mean", "modulating_factor", "check_reduction",
           "check_finite_number"]

_REDUCTIONS = ("mean", "sum", "none")


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

    def unmasked(self) -> "FlatBatch":
        """The same rows with the ignore mask dropped: every row counts, ignored ones included (for label-free
        regularisers that the released code applies to every pixel)."""
        return replace(self, weight=None)


def _is_int(t: torch.Tensor) -> bool:
    return not (t.is_floating_point() or t.is_complex()) and t.dtype != torch.bool


def _total(x: torch.Tensor) -> torch.Tensor:
    """The sum of every entry as a 0-d tensor: finite iff every entry is (a NaN or inf makes it NaN/inf). Half types
    are summed in float32 so that large but finite logits cannot overflow."""
    if x.dtype in (torch.float16, torch.bfloat16):
        return x.sum(dtype=torch.float32)
    return x.sum()


def _row_sums(target: torch.Tensor) -> torch.Tensor:
    # native precision is enough for a 1e-3 tolerance; half types are summed in float32
    if target.dtype in (torch.float16, torch.bfloat16):
        return target.sum(dim=1, dtype=torch.float32)
    return target.sum(dim=1)


def _host_values(*values: torch.Tensor) -> list:
    """0-d tensors as Python numbers, with one host synchronisation: stacked on an accelerator (in float64, exact for
    integer labels, where the device has it: MPS has no float64); read one by one on the CPU, where a read waits for
    nothing and the stack would cost kernels."""
    if all(v.is_cpu for v in values):
        return [v.item() for v in values]
    return _stacked_values(values)


def _stacked_values(values) -> list:
    dtype = torch.float32 if values[0].device.type == "mps" else torch.float64
    return torch.stack([v.to(dtype) for v in values]).tolist()


def _check_soft(name: str, logits: torch.Tensor, target: torch.Tensor) -> None:
    """Finite logits, and target rows on the simplex, in one host synchronisation.

    The fast path reads four numbers (the logits' total, the target's minimum, the smallest and largest row sum):
    a NaN or inf anywhere in the target makes a row sum NaN/inf and fails the row-sum test, so finiteness needs no
    pass of its own. Only a failing batch pays for the finer checks that name the problem.
    """
    if not target.numel():
        _target_range(name, logits, target)
        return
    low_sum, high_sum = torch.aminmax(_row_sums(target))
    total, low, low_sum, high_sum = _host_values(_total(logits), target.min(), low_sum, high_sum)
    # bfloat16 rounds each entry by up to 2^-8 of its value, so a rounded simplex row can miss 1 by more than 1e-3
    tol = max(ROW_SUM_ATOL, torch.finfo(target.dtype).eps)
    sums_ok = abs(low_sum - 1.0) <= tol and abs(high_sum - 1.0) <= tol  # False for NaN
    if math.isfinite(total) and low >= -ROW_SUM_ATOL and sums_ok:
        return
    if not math.isfinite(total):
        raise ValueError(f"{name}: logits contain NaN or infinite values")
    if not bool(torch.isfinite(target).all()):
        raise ValueError(f"{name}: soft target contains NaN or infinite values")
    if low < -ROW_SUM_ATOL:
        raise ValueError(f"{name}: soft target has negative entries (smallest {low:.3g})")
    worst = max(abs(low_sum - 1.0), abs(high_sum - 1.0))
    raise ValueError(f"{name}: soft target rows must sum to 1 (largest deviation {worst:.3g})")


def _target_range(name: str, logits: torch.Tensor, target: torch.Tensor) -> Optional[Tuple[float, float]]:
    """Raise if the logits are not finite; return the target's (min, max), or None when it is empty. One host
    synchronisation."""
    values = _host_values(_total(logits), *torch.aminmax(target)) if target.numel() else [float(_total(logits))]
    if not math.isfinite(values[0]):
        raise ValueError(f"{name}: logits contain NaN or infinite values")
    return None if len(values) == 1 else (values[1], values[2])


def flatten_batch(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100, validate: bool = True,
                  name: str = "loss") -> FlatBatch:
    """Check ``(logits, target)`` and flatten dense inputs to rows (see the module docstring).

    With ``validate=True`` the value checks cost one host synchronisation; when every hard label is a valid class
    the batch carries no ignore mask (``weight=None``), which keeps the common classification path short.
    """
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
    spatial_shape = hard_shape

    if is_soft:
        if validate:
            _check_soft(name, flat_logits, flat_target)
        return FlatBatch(flat_logits, None, flat_target.to(flat_logits.dtype), None, spatial_shape)

    if validate:
        bounds = _target_range(name, flat_logits, flat_target)
        if bounds is None or (bounds[0] >= 0 and bounds[1] < num_classes):  # every label is a class: nothing to ignore
            return FlatBatch(flat_logits, flat_target.long(), None, None, spatial_shape)
        valid = flat_target != ignore_index
        bad = valid & ((flat_target < 0) | (flat_target >= num_classes))
        if bool(bad.any()):
            value = int(flat_target[bad][0])
            raise ValueError(
                f"{name}: label {value} out of range for {num_classes} classes (ignore_index={ignore_index})"
            )
    else:
        valid = flat_target != ignore_index
    hard = flat_target.masked_fill(~valid, 0).long()
    return FlatBatch(flat_logits, hard, None, valid.to(flat_logits.dtype), spatial_shape)


def reduce_rows(values: torch.Tensor, batch: FlatBatch, reduction: str = "mean") -> torch.Tensor:
    """Reduce per-row values (M,) honouring the ignore mask: masked mean, masked sum, or (N, *S) with zeros."""
    if reduction == "none":
        return (values if batch.weight is None else values * batch.weight).reshape(batch.shape)
    if batch.weight is None:
        total = values.sum()
        return total / max(values.shape[0], 1) if reduction == "mean" else total
    total = values.dot(batch.weight)  # the masked sum as one kernel
    return total / batch.weight.sum().clamp_min(1.0) if reduction == "mean" else total


def row_nll(log_probs: torch.Tensor, batch: FlatBatch) -> torch.Tensor:
    """Per-row cross-entropy -sum_k y_k log p_k (a gather for hard targets)."""
    if batch.hard is not None:
        return -log_probs.gather(1, batch.hard.unsqueeze(1)).squeeze(1)
    return -(batch.soft * log_probs).sum(dim=1)


def mean_nll(log_probs: torch.Tensor, batch: FlatBatch) -> torch.Tensor:
    """Masked mean cross-entropy from log-probabilities (the fused ``nll_loss`` mean when nothing is ignored)."""
    if batch.hard is not None and batch.weight is None:
        if batch.num_rows == 0:
            return log_probs.sum() * 0.0
        return F.nll_loss(log_probs, batch.hard)
    return reduce_rows(row_nll(log_probs, batch), batch)


def masked_mean(values: torch.Tensor, batch: FlatBatch) -> torch.Tensor:
    """Mean of a (M, ...) tensor over its non-ignored rows (and all trailing entries)."""
    if batch.weight is None:
        # sum / n rather than mean(): the backward is then a broadcast, not a division over the whole tensor
        return values.sum() / max(values.numel(), 1)
    per_row = values.reshape(values.shape[0], -1).mean(dim=1) if values.ndim > 1 else values
    return (per_row * batch.weight).sum() / batch.weight.sum().clamp_min(1.0)


def mean_ce(batch: FlatBatch) -> torch.Tensor:
    """Masked mean cross-entropy from the batch logits (the fused kernel when nothing is ignored)."""
    if batch.hard is not None and batch.weight is None:
        if batch.num_rows == 0:
            return batch.logits.sum() * 0.0
        return F.cross_entropy(batch.logits, batch.hard)
    return reduce_rows(ce_rows(batch.logits, batch), batch)


def ce_rows(logits: torch.Tensor, batch: FlatBatch) -> torch.Tensor:
    """Per-row cross-entropy from logits (fused kernel for hard targets)."""
    if batch.hard is not None:
        return F.cross_entropy(logits, batch.hard, reduction="none")
    return -(batch.soft * F.log_softmax(logits, dim=1)).sum(dim=1)


@dataclass
class BinaryBatch:
    """Flattened binary (sigmoid) batch: ``logits`` and float ``target`` of shape (M,), ``weight`` a (M,) 0/1 mask of
    non-ignored entries (None when nothing is ignored), ``num_groups`` samples (images) of equal size, ``shape``
    the input shape."""

    logits: torch.Tensor
    target: torch.Tensor
    weight: Optional[torch.Tensor]
    num_groups: int
    shape: Tuple[int, ...]

    def count(self) -> torch.Tensor:
        if self.weight is None:
            return self.logits.new_tensor(float(max(self.logits.shape[0], 1)))
        return self.weight.sum().clamp_min(1.0)

    def entry_weight(self) -> torch.Tensor:
        return self.logits.new_ones(self.logits.shape[0]) if self.weight is None else self.weight

    @property
    def group(self) -> torch.Tensor:
        """(M,) the sample each entry belongs to."""
        per_group = self.logits.shape[0] // max(self.num_groups, 1)
        return torch.arange(self.num_groups, device=self.logits.device).repeat_interleave(per_group)


def flatten_binary(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100, validate: bool = True,
                   name: str = "loss") -> BinaryBatch:
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
    if validate:
        bounds = _target_range(name, flat_logits, flat_target)
        if bounds is None or (bounds[0] >= 0 and bounds[1] <= 1):  # every entry is a probability: nothing to ignore
            return BinaryBatch(flat_logits, flat_target.to(flat_logits.dtype), None, logits.shape[0],
                               tuple(logits.shape))
        valid = flat_target != ignore_index
        bad = valid & ~((flat_target >= 0) & (flat_target <= 1))
        if bool(bad.any()):
            raise ValueError(f"{name}: binary targets must lie in [0, 1] (or equal ignore_index={ignore_index})")
    else:
        valid = flat_target != ignore_index
    target_f = flat_target.to(flat_logits.dtype).masked_fill(~valid, 0.0)
    return BinaryBatch(flat_logits, target_f, valid.to(flat_logits.dtype), logits.shape[0], tuple(logits.shape))


def reduce_binary(values: torch.Tensor, batch: BinaryBatch, reduction: str = "mean") -> torch.Tensor:
    if batch.weight is not None:
        values = values * batch.weight
    if reduction == "mean":
        if batch.weight is None:
            return values.sum() / max(values.numel(), 1)
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


def check_finite_number(name: str, value, low: float = -math.inf, high: float = math.inf,
                        low_open: bool = False) -> float:
    value = float(value)
    if not math.isfinite(value) or value < low or (low_open and value == low) or value > high:
        bound = f"({low}, {high}]" if low_open else f"[{low}, {high}]"
        raise ValueError(f"{name} must be a finite number in {bound}, got {value}")
    return value
