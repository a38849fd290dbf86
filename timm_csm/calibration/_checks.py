"""Input checks shared by the calibrators, done once per call (never per block)."""
from __future__ import annotations

import math

import numpy as np
import torch

__all__ = ["as_logits", "as_targets", "check_fit_inputs", "all_finite", "compute_dtype", "non_finite_output_error"]


def all_finite(x: torch.Tensor) -> bool:
    """Whether every value of ``x`` is finite, in one reduction without a temporary: a sum is NaN or infinite
    whenever a value is (NaN and +-inf propagate, inf - inf is NaN); only a sum that overflows from finite values
    sends the check to the element-wise test."""
    if math.isfinite(float(x.sum())):
        return True
    return bool(torch.isfinite(x).all())


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The precision of the per-sample arithmetic: float64 logits stay float64, every other floating type is
    computed in float32 (the precision the logits carry); sums over samples are float64 in either case."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def as_logits(logits, name: str = "logits", check_finite: bool = True) -> torch.Tensor:
    """``logits`` as an (N, C) floating-point tensor (a NumPy array shares its memory); ``check_finite=False`` leaves
    the finiteness to the caller (an apply that checks its output instead, see :func:`non_finite_output_error`)."""
    if isinstance(logits, np.ndarray):
        logits = torch.from_numpy(logits)
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor or array")
    if logits.ndim != 2:
        raise ValueError(f"{name} must have shape (N, C), got {tuple(logits.shape)}")
    if logits.shape[1] < 2:
        raise ValueError(f"{name} must have at least 2 classes, got {logits.shape[1]}")
    if check_finite and not all_finite(logits):
        raise ValueError(f"{name} contain NaN or infinite values")
    return logits.detach() if logits.requires_grad else logits


def non_finite_output_error(calibrator: str, logits: torch.Tensor, out: torch.Tensor) -> ValueError:
    """The error of an apply whose output ``out`` is not finite: the logits' NaN or infinity (an apply with finite
    parameters carries a non-finite input value into its output, so only then is the input read), or else an
    overflow of the output's type by finite logits."""
    if not all_finite(logits):
        return ValueError("logits contain NaN or infinite values")
    top = float(logits.abs().max())
    return ValueError(f"{calibrator}: the calibrated logits overflow {str(out.dtype).replace('torch.', '')} for "
                      f"finite logits (largest |logit| {top:.3g}); pass float64 logits")


def as_targets(targets, n: int, num_classes: int) -> torch.Tensor:
    if isinstance(targets, np.ndarray):
        targets = torch.from_numpy(targets)
    if not isinstance(targets, torch.Tensor) or targets.is_floating_point() or targets.dtype == torch.bool:
        raise ValueError("targets must be an integer tensor or array of class indices")
    if targets.shape != (n,):
        raise ValueError(f"targets must have shape ({n},), got {tuple(targets.shape)}")
    targets = targets.long()
    if n:
        lo, hi = torch.aminmax(targets)
        if int(lo) < 0 or int(hi) >= num_classes:
            bad = int(targets[(targets < 0) | (targets >= num_classes)][0])
            raise ValueError(f"label {bad} out of range for {num_classes} classes")
    return targets


def check_fit_inputs(logits, targets, name: str):
    """Validated logits (N, C) in their compute precision (:func:`compute_dtype`; float32 and float64 tensors are
    not copied) and int64 targets (N,); refuses fits that cannot identify a calibrator."""
    logits = as_logits(logits)
    n, num_classes = logits.shape
    targets = as_targets(targets, n, num_classes)
    if n < num_classes:
        raise ValueError(f"{name}: cannot fit on {n} samples for {num_classes} classes; use a validation set with at "
                         f"least as many samples as classes")
    first = targets[0]
    if bool((targets == first).all()):
        raise ValueError(f"{name}: every validation target is class {int(first)}; fitting on a single class "
                         f"only teaches the calibrator to predict that class. Use a validation set with several "
                         f"classes")
    return logits.to(compute_dtype(logits.dtype)), targets.to(logits.device)
