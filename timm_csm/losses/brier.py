"""Brier-score loss (multiclass)."""
from __future__ import annotations

import torch

from .base import LossBase
from .batch import FlatBatch, check_reduction, reduce_rows
from .registry import register_loss

__all__ = ["BrierLoss", "brier_rows", "reduce_brier"]


class _SoftmaxBrier(torch.autograd.Function):
    """sum_k (softmax(z)_k - y_k)^2 per row, or ``scale`` times its sum over rows, with a fused backward

        d/dz_j = 2 p_j (d_j - sum_k p_k d_k),  d = p - y,   d/dy = -2 d,

    which needs two (M, C) temporaries instead of the four of the unfused autograd graph. Reducing inside the
    function spares the mean its own forward and backward kernels: at a batch of 128 each costs about as much as
    the fused cross-entropy. The Brier term is the bulk of the CSM loss (it runs on the 2B generated rows)."""

    @staticmethod
    def forward(ctx, logits, target_probs, scale):
        probs = torch.softmax(logits, dim=1)
        diff = probs - target_probs
        ctx.save_for_backward(probs, diff)
        ctx.scale = scale
        if scale is None:
            return diff.square().sum(dim=1)
        flat = diff.reshape(-1)
        return flat.dot(flat).mul_(scale)

    @staticmethod
    def backward(ctx, grad_out):
        probs, diff = ctx.saved_tensors
        grad = grad_out.unsqueeze(1) * 2.0 if ctx.scale is None else grad_out * (2.0 * ctx.scale)
        grad_logits = grad_target = None
        if ctx.needs_input_grad[0]:
            # (d - <p, d>) * p * grad: a broadcast subtraction and two in-place products (addcmul with a broadcast
            # row factor is slower on the CPU)
            centred = diff - (probs * diff).sum(dim=1, keepdim=True)
            grad_logits = centred.mul_(probs).mul_(grad)
        if ctx.needs_input_grad[1]:
            grad_target = -grad * diff
        return grad_logits, grad_target, None


def brier_rows(logits: torch.Tensor, target_probs: torch.Tensor) -> torch.Tensor:
    """Per-row squared error between softmax and target, summed over classes: sum_k (p_k - y_k)^2."""
    return _SoftmaxBrier.apply(logits, target_probs, None)


def reduce_brier(batch: FlatBatch, reduction: str = "mean") -> torch.Tensor:
    """The Brier rows of a flattened batch, reduced as :func:`~timm_csm.losses.batch.reduce_rows` does; the
    mean and sum of unmasked rows are computed inside the autograd function."""
    if batch.weight is None and reduction != "none":
        scale = 1.0 / max(batch.num_rows, 1) if reduction == "mean" else 1.0
        return _SoftmaxBrier.apply(batch.logits, batch.target_probs(), scale)
    return reduce_rows(brier_rows(batch.logits, batch.target_probs()), batch, reduction)


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
        return reduce_brier(batch, self.reduction)
