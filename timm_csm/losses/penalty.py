"""Label-free confidence penalties added to cross-entropy: the entropy (confidence) penalty and the L1 penalty."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import LossBase
from .batch import check_finite_number, masked_mean, mean_nll
from .registry import register_loss

__all__ = ["EntropyPenalty", "L1Penalty"]


@register_loss("entropy_penalty")
class EntropyPenalty(LossBase):
    """Confidence penalty ``L = CE - alpha * H(p)`` (Pereyra et al., ICLR workshop 2017, "ECP").

    With ``class_mean=True`` (default) the entropy term is averaged over the N*K entries of -p log p, i.e. H/K, as
    in the MbLS/RankMixup ``PenaltyEntropy`` whose alpha = 0.1 produced the published ECP rows; ``class_mean=False``
    uses the per-sample entropy H = -sum_k p_k log p_k. log p comes from log-softmax, so no clamping is needed.
    """

    def __init__(self, alpha: float = 0.1, class_mean: bool = True, ignore_index: int = -100, validate: bool = True):
        super().__init__(ignore_index, validate)
        self.alpha = check_finite_number("alpha", alpha)
        self.class_mean = bool(class_mean)

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        batch = self._flat(logits, target)
        log_probs = F.log_softmax(batch.logits, dim=1)
        ce = mean_nll(log_probs, batch)
        entropy = masked_mean(-(log_probs.exp() * log_probs), batch)  # H / K
        if not self.class_mean:
            entropy = entropy * batch.num_classes
        self._record(ce=ce, entropy=entropy)
        return ce - self.alpha * entropy


@register_loss("l1_penalty")
class L1Penalty(LossBase):
    """L1 penalty added to cross-entropy, ``L = CE + alpha * R``.

    * ``space="probs"`` (default): the L1 distance of the softmax to uniform, R = (1/N) sum_i sum_k |p_ik - 1/K|,
      the ``PenaltyL1`` baseline of the MbLS/RankMixup code (alpha = 1).
    * ``space="logits"``: the linear penalty on logit distances, R = mean_{i,k} (max_j z_ij - z_ik), the equality
      constraint d = 0 discussed by MbLS (Liu et al., CVPR 2022) that LS and ECP approximate; it equals MbLS with
      margin 0.
    """

    def __init__(self, alpha: float = 1.0, space: str = "probs", ignore_index: int = -100, validate: bool = True):
        super().__init__(ignore_index, validate)
        if space not in ("probs", "logits"):
            raise ValueError(f"space must be 'probs' or 'logits', got {space!r}")
        self.alpha = check_finite_number("alpha", alpha)
        self.space = space

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        batch = self._flat(logits, target)
        log_probs = F.log_softmax(batch.logits, dim=1)
        ce = mean_nll(log_probs, batch)
        if self.space == "probs":
            reg = batch.num_classes * masked_mean((log_probs.exp() - 1.0 / batch.num_classes).abs(), batch)
        else:
            reg = masked_mean(batch.logits.max(dim=1, keepdim=True).values - batch.logits, batch)
        self._record(ce=ce, reg=reg)
        return ce + self.alpha * reg
