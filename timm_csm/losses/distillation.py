"""Knowledge distillation from a teacher's logits (Hinton, Vinyals and Dean, "Distilling the Knowledge in a Neural
Network", 2015).

A control of the calibration benchmark: where a generator and a soft-label encoder learned from more labelled data
than the classifier, distillation borrows the same knowledge without generating anything.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import LossBase
from .batch import check_finite_number, mean_ce
from .registry import register_loss

__all__ = ["DistillationLoss"]


@register_loss("kd")
class DistillationLoss(LossBase):
    """``L = (1 - alpha) CE(z_s, y) + alpha tau^2 KL(softmax(z_t / tau) || softmax(z_s / tau))``, averaged over the
    batch; the ``tau^2`` keeps the soft term's gradient scale independent of ``tau`` (Hinton et al. 2015).

    ``forward(logits, target, teacher_logits)``: the student's logits, the labels (hard (N,) or soft (N, C)) and the
    teacher's logits on the same inputs (no gradient flows into them). Defaults tau 4 and alpha 0.9: the KD baseline
    of CRD's released configuration (Tian et al., ICLR 2020: ``--kd_T 4 -r 0.1 -a 0.9``).
    """

    needs_teacher = True

    def __init__(self, temperature: float = 4.0, alpha: float = 0.9, ignore_index: int = -100, validate: bool = True):
        super().__init__(ignore_index, validate)
        self.temperature = check_finite_number("temperature", temperature, 0.0)
        self.alpha = check_finite_number("alpha", alpha, 0.0, 1.0)
        if self.temperature == 0:
            raise ValueError("temperature must be > 0")

    def forward(self, logits: torch.Tensor, target: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
        if teacher_logits.shape != logits.shape:
            raise ValueError(f"teacher logits have shape {tuple(teacher_logits.shape)}, the student's "
                             f"{tuple(logits.shape)}")
        batch = self._flat(logits, target)
        ce = mean_ce(batch)
        tau = self.temperature
        dtype = torch.promote_types(logits.dtype, torch.float32)  # half-precision logits: the KL in float32
        teacher = F.log_softmax(teacher_logits.detach().to(dtype) / tau, dim=1)
        student = F.log_softmax(logits.to(dtype) / tau, dim=1)
        rows = (teacher.exp() * (teacher - student)).sum(dim=1)
        if batch.weight is not None:
            kl = (rows * batch.weight).sum() / batch.weight.sum().clamp_min(1.0)
        else:
            kl = rows.mean()
        kl = kl * tau ** 2
        self._record(ce=ce, kd=kl)
        return (1.0 - self.alpha) * ce + self.alpha * kl
