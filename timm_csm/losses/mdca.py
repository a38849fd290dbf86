"""MDCA: multi-class difference in confidence and accuracy (Hebbalaguppe et al., CVPR 2022)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import LossBase
from .focal import focal_rows
from .batch import check_finite_number, masked_mean, mean_nll, reduce_rows
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
    """``L = L_cls + beta * MDCA`` with the batch-level MDCA regulariser (:func:`mdca_penalty`), following
    ``ClassficationAndMDCA`` of mdca-loss/MDCA-Calibration.

    ``base`` picks L_cls: ``"ce"`` (NLL+MDCA, default), ``"ls"`` (LS+MDCA, ``smoothing`` eps = 0.1 as in the MDCA
    scripts) or ``"focal"`` (FL+MDCA, ``gamma`` = 1 as in the MDCA scripts). beta = 1. The label smoothing is the
    released one: 1 - eps on the target class and eps / (K - 1) on each other class (not the uniform eps / K of the
    "ls" loss); a soft target y becomes (1 - eps) y + eps (1 - y) / (K - 1). Soft targets replace the class
    indicator by y_ik in the regulariser. This is the official MDCA form (softmax probabilities into the regulariser,
    logits into L_cls), not the copy in cvlab-yonsei/RankMixup that smooths the softmax output (softmax applied
    twice).
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
            cls = self._smoothed_nll(log_probs, batch)
        else:
            cls = reduce_rows(focal_rows(log_probs, batch, self.gamma), batch)
        reg = mdca_penalty(log_probs.exp(), batch.target_probs(), batch.row_weight())
        self._record(cls=cls, reg=reg)
        return cls + self.beta * reg

    def _smoothed_nll(self, log_probs: torch.Tensor, batch) -> torch.Tensor:
        """-sum_k y'_k log p_k with y' = (1 - eps) y + eps (1 - y) / (K - 1), as
        (1 - eps - eps / (K - 1)) NLL - eps K / (K - 1) mean_k log p_k (one reduction over the logits)."""
        off = self.smoothing / (batch.num_classes - 1)
        return ((1.0 - self.smoothing - off) * mean_nll(log_probs, batch)
                - off * batch.num_classes * masked_mean(log_probs, batch))
