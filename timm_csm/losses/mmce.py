"""MMCE: maximum mean calibration error as a trainable regulariser (Kumar, Sarawagi & Jain, ICML 2018)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import LossBase
from .batch import check_finite_number, mean_nll
from .registry import register_loss

__all__ = ["MMCELoss", "mmce_penalty"]


def mmce_penalty(confidence: torch.Tensor, correct: torch.Tensor, weight: torch.Tensor,
                 kernel_width: float = 0.4, weighted: bool = False) -> torch.Tensor:
    """MMCE of one batch from top-label confidences r_i, correctness c_i and 0/1 row weights.

    Unweighted (MMCE_m): ``(1/N^2) sum_ij (c_i - r_i)(c_j - r_j) k(r_i, r_j)`` with the Laplacian kernel
    ``k(a, b) = exp(-|a - b| / kernel_width)``.

    Weighted (MMCE_w): the kernel distance between the correct samples weighted by (1 - r) and the incorrect ones
    weighted by r, ``sqrt(||(1/m) sum_C (1 - r_i) phi(r_i) - (1/n) sum_W r_j phi(r_j)||^2 + 1e-10)``, and 0 when
    the batch is all correct or all wrong. (The reference code normalises the within-group terms once more by the
    group sizes; this follows the formula.)
    """
    kernel = torch.exp(-(confidence.unsqueeze(1) - confidence.unsqueeze(0)).abs() / kernel_width)
    if not weighted:
        residual = (correct - confidence) * weight
        n = weight.sum().clamp_min(1.0)
        return residual @ kernel @ residual / (n * n)
    right = correct * weight
    wrong = (1.0 - correct) * weight
    m, n = right.sum(), wrong.sum()
    both = ((m > 0) & (n > 0)).to(confidence.dtype)
    vector = right * (1.0 - confidence) / m.clamp_min(1.0) - wrong * confidence / n.clamp_min(1.0)
    squared = (vector @ kernel @ vector).clamp_min(0.0)
    return both * torch.sqrt(squared + 1e-10)


@register_loss("mmce")
class MMCELoss(LossBase):
    """Cross-entropy plus MMCE: ``L = CE + lam * MMCE`` (Kumar et al., ICML 2018).

    Defaults follow the MbLS/CALS code base that the CSM tables descend from: unweighted MMCE_m with lam = 1.
    ``weighted=True`` with ``lam=2`` is the focal_calibration setting (torrvision/focal_calibration). Correctness
    c_i = 1[argmax p_i = y_i]; for soft targets c_i = y_i[argmax p_i] (a generalisation, not in the paper).
    Batch-level: memory is O(M^2) in the number of rows M (pixels for dense inputs).
    """

    def __init__(self, lam: float = 1.0, weighted: bool = False, kernel_width: float = 0.4, ignore_index: int = -100,
                 validate: bool = True):
        super().__init__(ignore_index, validate)
        self.lam = check_finite_number("lam", lam, 0.0)
        self.weighted = bool(weighted)
        self.kernel_width = check_finite_number("kernel_width", kernel_width, 0.0, low_open=True)

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        batch = self._flat(logits, target)
        log_probs = F.log_softmax(batch.logits, dim=1)
        ce = mean_nll(log_probs, batch)
        log_conf, pred = log_probs.max(dim=1)
        confidence = log_conf.exp()
        if batch.hard is not None:
            correct = (pred == batch.hard).to(confidence.dtype)
        else:
            correct = batch.soft.gather(1, pred.unsqueeze(1)).squeeze(1)
        reg = mmce_penalty(confidence, correct, batch.row_weight(), self.kernel_width, self.weighted)
        self._record(ce=ce, reg=reg)
        return ce + self.lam * reg
