"""Vector scaling (Guo et al., ICML 2017): a per-class scale and bias on the logits, fitted by NLL."""
from __future__ import annotations

from typing import Dict, Optional

import torch
import torch.nn.functional as F

from ._checks import check_fit_inputs
from .base import PostHocCalibrator, check_finite_state
from .optim import minimise_lbfgs

__all__ = ["VectorScaling"]


class VectorScaling(PostHocCalibrator):
    """``z' = w * z + b`` with w, b in R^C, minimising the validation NLL with L-BFGS (float64, strong Wolfe line
    search) from w = 1, b = 0. Unlike temperature scaling it can change the predicted class. Fitting refuses fewer
    samples than classes and a validation set with a single class.
    """

    kind = "vector_scaling"

    def __init__(self, max_iter: int = 200):
        self.max_iter = int(max_iter)
        self.weight: Optional[torch.Tensor] = None
        self.bias: Optional[torch.Tensor] = None

    def fit(self, logits, targets) -> "VectorScaling":
        logits, targets = check_fit_inputs(logits, targets, type(self).__name__)
        num_classes = logits.shape[1]
        weight = torch.ones(num_classes, dtype=torch.float64, device=logits.device, requires_grad=True)
        bias = torch.zeros(num_classes, dtype=torch.float64, device=logits.device, requires_grad=True)
        minimise_lbfgs([weight, bias], lambda: F.cross_entropy(logits * weight + bias, targets), self.max_iter,
                       type(self).__name__)
        self.weight, self.bias = weight.detach().cpu(), bias.detach().cpu()
        return self

    def _apply(self, logits: torch.Tensor) -> torch.Tensor:
        if logits.shape[1] != self.weight.numel():
            raise ValueError(f"VectorScaling was fitted for {self.weight.numel()} classes, got {logits.shape[1]}")
        return logits * self.weight.to(logits.device) + self.bias.to(logits.device)

    def config(self) -> dict:
        return {"max_iter": self.max_iter}

    def state_dict(self) -> Dict[str, torch.Tensor]:
        if self.weight is None:
            return {}
        return {"weight": self.weight, "bias": self.bias}

    def load_state_dict(self, state: Dict[str, torch.Tensor]) -> "VectorScaling":
        if set(state) != {"weight", "bias"} or state["weight"].shape != state["bias"].shape \
                or state["weight"].ndim != 1:
            raise ValueError(f"expected 'weight' and 'bias' vectors of one length, got keys {sorted(state)}")
        check_finite_state(state, "VectorScaling state")
        self.weight = state["weight"].double().cpu()
        self.bias = state["bias"].double().cpu()
        return self

    def __repr__(self) -> str:
        fitted = "unfitted" if self.weight is None else f"{self.weight.numel()} classes"
        return f"VectorScaling({fitted})"
