"""Brier-score loss (multiclass)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ._common import LossBase, check_reduction, reduce_rows
from .registry import register_loss

__all__ = ["BrierLoss", "brier_rows"]


def brier_rows(logits: torch.Tensor, target_probs: torch.Tensor) -> torch.Tensor:
    """Per-row squared error between softmax and target, summed over classes: sum_k (p_k - y_k)^2."""
    return (F.softmax(logits, dim=1) - target_probs).pow(2).sum(dim=1)


@register_loss("brier")
class BrierLoss(LossBase):
    """Brier score ``L = (1/N) sum_i sum_k (p_ik - y_ik)^2`` (Brier 1950; as a training loss in Mukhoti et al.,
    NeurIPS 2020). Proper, and takes soft targets natively; the CSM loss applies the same term to generated
    samples. The sum runs over classes (not divided by K)."""

    def __init__(self, reduction: str = "mean", ignore_index: int = -100, validate: bool = True):
        super().__init__(ignore_index, validate)
        self.reduction = check_reduction(reduction)

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        batch = self._flat(logits, target)
        return reduce_rows(brier_rows(batch.logits, batch.target_probs()), batch, self.reduction)
