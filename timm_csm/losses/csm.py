"""The CSM loss (Luo et al., "Beyond One-Hot Labels: Semantic Mixing for Model Calibration", ICML 2025).

Signature (``is_csm = True``)::

    loss(logits_real, y_real, logits_gen, q_gen)

* ``logits_real`` (B, K) and ``y_real`` (B,) hard labels (or (B, K) soft targets): the real batch;
* ``logits_gen`` (M, K) and ``q_gen`` (M, K): the generated companions and their annotated soft labels
  (M = B * (1 + n_aug) with the default sampler); hard (M,) labels are accepted for the "generated images with
  hard labels" ablation.

Dense (N, K, H, W) inputs are accepted as everywhere else.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import LossBase
from .brier import reduce_brier
from .focal import focal_rows
from .batch import check_finite_number, flatten_batch, mean_ce, mean_nll, reduce_rows
from .registry import LossSpec, register_loss

__all__ = ["CSMLoss"]

_KINDS = ("l2", "soft_ce", "soft_focal")


class CSMLoss(LossBase):
    """CE on the real batch plus a soft-label term on the generated batch (official ``CeL2Loss``):

        L = CE(logits_real, y_real) + weight * (1/M) sum_m G(softmax(logits_gen_m), q_m),

    * ``kind="l2"`` (default, "csm"): G = sum_k (p_k - q_k)^2, the squared error summed over classes (Brier);
    * ``kind="soft_ce"`` ("csm_soft_ce"): G = -sum_k q_k log p_k;
    * ``kind="soft_focal"`` ("csm_soft_focal"): G = -sum_k q_k (1 - p_k)^gamma log p_k with gamma = 1.

    weight = 1.0 (the released ``CeL2Loss`` of E-Galois/CSM has no weight). The two batches are separate arguments
    because the method runs two forward passes (separate batch-norm statistics). An empty generated batch
    contributes 0.
    """

    is_csm = True

    def __init__(self, kind: str = "l2", weight: float = 1.0, gamma: float = 1.0, ignore_index: int = -100,
                 validate: bool = True):
        super().__init__(ignore_index, validate)
        if kind not in _KINDS:
            raise ValueError(f"kind must be one of {_KINDS}, got {kind!r}")
        self.kind = kind
        self.weight = check_finite_number("weight", weight, 0.0)
        self.gamma = check_finite_number("gamma", gamma, 0.0)

    def forward(self, logits_real: torch.Tensor, y_real: torch.Tensor, logits_gen: torch.Tensor,
                q_gen: torch.Tensor) -> torch.Tensor:
        real = flatten_batch(logits_real, y_real, self.ignore_index, self.validate, "CSMLoss (real batch)")
        gen = flatten_batch(logits_gen, q_gen, self.ignore_index, self.validate, "CSMLoss (generated batch)")
        if gen.num_classes != real.num_classes:
            raise ValueError(f"CSMLoss: the real batch has {real.num_classes} classes, the generated batch "
                             f"{gen.num_classes}")
        ce = mean_ce(real)
        if self.kind == "l2":
            generated = reduce_brier(gen)
        elif self.kind == "soft_ce":
            generated = mean_nll(F.log_softmax(gen.logits, dim=1), gen)
        else:
            generated = reduce_rows(focal_rows(F.log_softmax(gen.logits, dim=1), gen, self.gamma), gen)
        self._record(ce=ce, gen=generated)
        if self.weight == 1.0:  # the default: a multiplication by 1 would still cost a kernel forward and backward
            return ce + generated
        return ce + self.weight * generated


register_loss("csm", CSMLoss)


def _soft_ce(**kwargs) -> CSMLoss:
    """CSM with soft cross-entropy on the generated batch (paper Table 4 ablation)."""
    kwargs.setdefault("kind", "soft_ce")
    return CSMLoss(**kwargs)


def _soft_focal(**kwargs) -> CSMLoss:
    """CSM with soft focal loss (gamma 1) on the generated batch (paper Table 4 ablation)."""
    kwargs.setdefault("kind", "soft_focal")
    return CSMLoss(**kwargs)


register_loss("csm_soft_ce", _soft_ce, spec=LossSpec.of(CSMLoss))
register_loss("csm_soft_focal", _soft_focal, spec=LossSpec.of(CSMLoss))
