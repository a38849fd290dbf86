"""Input checks shared by the calibrators."""
from __future__ import annotations

import numpy as np
import torch

__all__ = ["as_logits", "as_targets", "check_fit_inputs"]


def as_logits(logits, name: str = "logits") -> torch.Tensor:
    if isinstance(logits, np.ndarray):
        logits = torch.from_numpy(logits)
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor or array")
    if logits.ndim != 2:
        raise ValueError(f"{name} must have shape (N, C), got {tuple(logits.shape)}")
    if logits.shape[1] < 2:
        raise ValueError(f"{name} must have at least 2 classes, got {logits.shape[1]}")
    if not bool(torch.isfinite(logits).all()):
        raise ValueError(f"{name} contain NaN or infinite values")
    return logits


def as_targets(targets, n: int, num_classes: int) -> torch.Tensor:
    if isinstance(targets, np.ndarray):
        targets = torch.from_numpy(targets)
    if not isinstance(targets, torch.Tensor) or targets.is_floating_point() or targets.dtype == torch.bool:
        raise ValueError("targets must be an integer tensor or array of class indices")
    if targets.shape != (n,):
        raise ValueError(f"targets must have shape ({n},), got {tuple(targets.shape)}")
    targets = targets.long()
    if n and (int(targets.min()) < 0 or int(targets.max()) >= num_classes):
        bad = int(targets[(targets < 0) | (targets >= num_classes)][0])
        raise ValueError(f"label {bad} out of range for {num_classes} classes")
    return targets


def check_fit_inputs(logits, targets, name: str):
    """Validated float64 logits (N, C) and int64 targets (N,); refuses fits that cannot identify a calibrator."""
    logits = as_logits(logits)
    n, num_classes = logits.shape
    targets = as_targets(targets, n, num_classes)
    if n < num_classes:
        raise ValueError(f"{name}: cannot fit on {n} samples for {num_classes} classes; use a validation set with at "
                         f"least as many samples as classes")
    present = torch.unique(targets)
    if present.numel() < 2:
        raise ValueError(f"{name}: every validation target is class {int(present[0])}; fitting on a single class "
                         f"only teaches the calibrator to predict that class. Use a validation set with several "
                         f"classes")
    return logits.detach().to(torch.float64), targets.to(logits.device)
