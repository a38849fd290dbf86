"""MDCA: multi-class difference in confidence and accuracy (Hebbalaguppe et al., CVPR 2022)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ._common import LossBase, check_finite_number, masked_mean, mean_nll, reduce_rows
from .focal import focal_rows
from .registry import register_loss

__all__ = ["MDCALoss", "mdca_penalty"]

_BASES = ("ce", "ls", "focal")


def mdca_penalty(probs: torch.Tensor, target_probs: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``(1/K) sum_k |(1/N) sum_i p_ik - (1/N) sum_i y_ik|`` over the rows with weight 1."""
    n = weight.sum().clamp_min(1.0)
    w = weight.unsqueeze(1)
    return ((probs * w).sum(dim=0) / n - (target_probs * w).sum(dim=0) / n).abs().mean()


@register_loss("mdca")
class MDCALoss(LossBase):
    """``L = L_cls + beta * MDCA`` with the batch-level MDCA regulariser (:func:`mdca_penalty`).

    ``base`` picks L_cls: ``"ce"`` (NLL+MDCA, default), ``"ls"`` (label smoothing with ``smoothing``, 0.1 in the
    MDCA scripts) or ``"focal"`` (``gamma``, 1 in the MDCA scripts). beta = 1. Soft targets replace the indicator by
    y_ik. This is the official MDCA form (softmax probabilities into the regulariser, logits into L_cls), not the
    RankMixup copy that applies softmax twice (spec/baselines.md section 9).
    """

    def __init__(self, beta: float = 1.0, base: str = "ce", smoothing: float = 0.1, gamma: float = 1.0,
                 ignore_index: int = -100, validate: bool = True):
        super().__init__(ignore_index, validate)
        if base not in _BASES:
            raise ValueError(f"base must be one of {_BASES}, got {base!r}")
        self.beta = check_finite_number("beta", beta, 0.0)
        self.base = base
        self.smoothing = check_finite_number("smoothing", smoothing, 0.0, 1.0)
        self.gamma = check_finite_number("gamma", gamma, 0.0)

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        batch = self._flat(logits, target)
        log_probs = F.log_softmax(batch.logits, dim=1)
        if self.base == "ce":
            cls = mean_nll(log_probs, batch)
        elif self.base == "ls":
            cls = (1.0 - self.smoothing) * mean_nll(log_probs, batch) - self.smoothing * masked_mean(log_probs, batch)
        else:
            cls = reduce_rows(focal_rows(log_probs, batch, self.gamma), batch)
        reg = mdca_penalty(log_probs.exp(), batch.target_probs(), batch.row_weight())
        self._record(cls=cls, reg=reg)
        return cls + self.beta * reg
