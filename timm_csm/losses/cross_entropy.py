"""Cross-entropy and label smoothing (multiclass, softmax).

Binary (sigmoid) forms live in :mod:`timm_csm.losses.binary`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import LossBase
from .batch import (check_finite_number, check_reduction, ce_rows, masked_mean, mean_ce, mean_nll, reduce_rows,
                         row_nll)
from .registry import register_loss

__all__ = ["CrossEntropyLoss", "LabelSmoothingLoss"]


@register_loss("ce")
class CrossEntropyLoss(LossBase):
    """Cross-entropy ``L = -(1/N) sum_i sum_k y_ik log softmax(z_i)_k`` with hard (N,) or soft (N, C) targets.

    With soft targets this is timm's ``SoftTargetCrossEntropy``, which is all Mixup and RegMixup need (they only
    change the batch and its targets). Reduction ``"mean"`` (MbLS/CALS/ACLS/RankMixup/CSM) or ``"sum"``
    (focal_calibration / AdaFocal recipes). Its label-smoothing form is "ls".
    """

    label_smoothing_loss = "ls"

    def __init__(self, reduction: str = "mean", ignore_index: int = -100, validate: bool = True):
        super().__init__(ignore_index, validate)
        self.reduction = check_reduction(reduction)

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        batch = self._flat(logits, target)
        if self.reduction == "mean":
            return mean_ce(batch)
        return reduce_rows(ce_rows(batch.logits, batch), batch, self.reduction)


@register_loss("ls")
class LabelSmoothingLoss(LossBase):
    """Label smoothing with a uniform prior that includes the true class (MbLS/CALS/ACLS/RankMixup convention):

        y' = (1 - eps) * y + eps / K,   L = (1 - eps) * CE(z, y) + eps * mean_k(-log p_k).

    ``smoothing`` eps defaults to 0.05, the MbLS/CALS/ACLS configs (the MDCA scripts use 0.1, RankMixup's
    ``ls.yaml`` 0.2). timm's ``LabelSmoothingCrossEntropy`` uses the same target; the MDCA repository instead puts
    eps/(K-1) on the non-targets only. Soft targets are smoothed the same way. Reference: Szegedy et al., CVPR 2016.
    """

    label_smoothing_loss = "ls"

    def __init__(self, smoothing: float = 0.05, reduction: str = "mean", ignore_index: int = -100,
                 validate: bool = True):
        super().__init__(ignore_index, validate)
        self.smoothing = check_finite_number("smoothing", smoothing, 0.0, 1.0)
        self.reduction = check_reduction(reduction)

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        batch = self._flat(logits, target)
        log_probs = F.log_softmax(batch.logits, dim=1)
        if self.reduction == "mean":
            return (1.0 - self.smoothing) * mean_nll(log_probs, batch) - self.smoothing * masked_mean(log_probs, batch)
        rows = (1.0 - self.smoothing) * row_nll(log_probs, batch) - self.smoothing * log_probs.mean(dim=1)
        return reduce_rows(rows, batch, self.reduction)
