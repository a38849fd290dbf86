"""The RegMixup objective (Pinto et al., "Using Mixup as a Regularizer Can Surprisingly Improve Accuracy and
Out-of-Distribution Robustness", NeurIPS 2022): the loss on the clean batch plus cross-entropy on one mixed copy of
it, x~ = lam x + (1 - lam) x_perm with lam ~ Beta(alpha, alpha) (:class:`timm_csm.data.RegMixupCollator`).
"""
from __future__ import annotations

import torch

from .batch import check_finite_number

__all__ = ["regmixup_objective", "REGMIXUP_REDUCTIONS"]

REGMIXUP_REDUCTIONS = ("mean", "sum")


def regmixup_objective(clean_loss: torch.Tensor, mixed_loss: torch.Tensor, weight: float = 1.0,
                       reduction: str = "mean") -> torch.Tensor:
    """Combine the mean loss on the clean batch (B rows) with the mean cross-entropy on its mixed copy (B rows):

    * ``"mean"`` (default, the released code of FrancescoPinto/RegMixup): ``(clean + weight * mixed) / 2``. Its
      training step concatenates [x; x~] into one batch of 2B and averages the mixup criterion
      lam CE(., [y; y]) + (1 - lam) CE(., [y; y_perm]) over the 2B rows, which for weight = 1 is half the sum of
      the two batch means (the clean rows see lam y + (1 - lam) y = y);
    * ``"sum"``: ``clean + weight * mixed``, the paper's equation with eta = ``weight``: the same gradients scaled
      by 2, i.e. twice the learning rate and half the relative weight decay of the released recipe.
    """
    if reduction not in REGMIXUP_REDUCTIONS:
        raise ValueError(f"RegMixup reduction must be one of {REGMIXUP_REDUCTIONS}, got {reduction!r}")
    weight = check_finite_number("RegMixup weight", weight, 0.0)
    total = clean_loss + weight * mixed_loss
    return total / 2.0 if reduction == "mean" else total
