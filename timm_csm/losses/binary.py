"""Binary (sigmoid) forms for dense binary prediction and multi-label heads: BCE, label-smoothed BCE and
sigmoid focal loss.

Logits of any shape (N, ...) with a target of the same shape (floats in [0, 1] or integers 0/1), or logits
(N, 1, *S) with a target (N, *S); target entries equal to ``ignore_index`` are excluded (e.g. 255 in segmentation
masks). ``mean`` averages over the non-ignored entries.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import LossBase
from .batch import check_finite_number, check_reduction, flatten_binary, reduce_binary
from .registry import register_loss

__all__ = ["BinaryCrossEntropyLoss", "BinaryLabelSmoothingLoss", "BinaryFocalLoss"]


class _BinaryBase(LossBase):
    def __init__(self, reduction: str, ignore_index: int, validate: bool):
        super().__init__(ignore_index, validate)
        self.reduction = check_reduction(reduction)

    def _flat_binary(self, logits, target):
        return flatten_binary(logits, target, self.ignore_index, self.validate, type(self).__name__)


@register_loss("bce")
class BinaryCrossEntropyLoss(_BinaryBase):
    """Binary cross-entropy with logits, ``-[t log s(z) + (1 - t) log(1 - s(z))]``, stable for any logit size."""

    def __init__(self, reduction: str = "mean", ignore_index: int = -100, validate: bool = True):
        super().__init__(reduction, ignore_index, validate)

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        batch = self._flat_binary(logits, target)
        rows = F.binary_cross_entropy_with_logits(batch.logits, batch.target, reduction="none")
        return reduce_binary(rows, batch, self.reduction)


@register_loss("ls_bce")
class BinaryLabelSmoothingLoss(_BinaryBase):
    """Label-smoothed BCE: the target becomes t' = (1 - eps) t + eps / 2 (smoothing towards 0.5, the two-class
    case of :class:`~timm_csm.losses.LabelSmoothingLoss`). eps defaults to 0.05 as the multiclass loss."""

    def __init__(self, smoothing: float = 0.05, reduction: str = "mean", ignore_index: int = -100,
                 validate: bool = True):
        super().__init__(reduction, ignore_index, validate)
        self.smoothing = check_finite_number("smoothing", smoothing, 0.0, 1.0)

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        batch = self._flat_binary(logits, target)
        smoothed = (1.0 - self.smoothing) * batch.target + 0.5 * self.smoothing
        rows = F.binary_cross_entropy_with_logits(batch.logits, smoothed, reduction="none")
        return reduce_binary(rows, batch, self.reduction)


@register_loss("focal_bce")
class BinaryFocalLoss(_BinaryBase):
    """Sigmoid focal loss (Lin et al., ICCV 2017) with soft targets:

        L = -[alpha t (1 - p)^gamma log p + (1 - alpha) (1 - t) p^gamma log(1 - p)],  p = sigmoid(z),

    with ``alpha=None`` meaning no class balancing (both weights 1). gamma defaults to 3 as the multiclass focal
    loss. log p and log(1 - p) are computed as -softplus(-z) and -softplus(z), so the loss is finite at any logit.
    """

    def __init__(self, gamma: float = 3.0, alpha=None, reduction: str = "mean", ignore_index: int = -100,
                 validate: bool = True):
        super().__init__(reduction, ignore_index, validate)
        self.gamma = check_finite_number("gamma", gamma, 0.0)
        self.alpha = None if alpha is None else check_finite_number("alpha", alpha, 0.0, 1.0)

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        batch = self._flat_binary(logits, target)
        z, t = batch.logits, batch.target
        log_p, log_not_p = -F.softplus(-z), -F.softplus(z)
        tiny = torch.finfo(z.dtype).tiny
        # (1 - p)^gamma = sigmoid(-z)^gamma and p^gamma, each clamped so the gradient stays finite for gamma < 1
        pos = t * torch.sigmoid(-z).clamp_min(tiny).pow(self.gamma) * log_p
        neg = (1.0 - t) * torch.sigmoid(z).clamp_min(tiny).pow(self.gamma) * log_not_p
        if self.alpha is not None:
            pos, neg = self.alpha * pos, (1.0 - self.alpha) * neg
        return reduce_binary(-(pos + neg), batch, self.reduction)
