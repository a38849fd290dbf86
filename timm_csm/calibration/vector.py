"""Vector scaling (Guo et al., ICML 2017): a per-class scale and bias on the logits, fitted by NLL."""
from __future__ import annotations

from typing import Dict, Optional

import torch

from ._checks import check_fit_inputs
from ._kernels import row_tiling, scale_shift
from .affine import fit_affine
from .base import PostHocCalibrator, check_finite_state
from .registry import register_calibrator

__all__ = ["VectorScaling"]


@register_calibrator("vector_scaling", summary="one scale and bias per class, by validation NLL")
class VectorScaling(PostHocCalibrator):
    """``z' = w * z + b`` with w, b in R^C, minimising the validation NLL with L-BFGS from the temperature-scaling
    fit (w = 1 / T, b = 0) until an iteration lowers the objective by less than its float precision, at most
    ``max_iter`` iterations (:mod:`timm_csm.calibration.affine`; ``fit_info`` holds the iterations). Unlike
    temperature scaling it can change the predicted class. Fitting refuses fewer samples than classes and a
    validation set with a single class.
    """

    non_finite_shows_in = "values"

    def __init__(self, max_iter: int = 200):
        self.max_iter = int(max_iter)
        self.weight: Optional[torch.Tensor] = None
        self.bias: Optional[torch.Tensor] = None
        self.fit_info: Optional[dict] = None

    def fit(self, logits, targets) -> "VectorScaling":
        logits, targets = check_fit_inputs(logits, targets, type(self).__name__)
        weight, bias, self.fit_info = fit_affine(logits, targets, lambda z: z, True, self.max_iter,
                                                 type(self).__name__)
        self.weight, self.bias = weight.cpu(), bias.cpu()
        return self

    def _apply(self, logits: torch.Tensor) -> torch.Tensor:
        if logits.shape[1] != self.weight.numel():
            raise ValueError(f"VectorScaling was fitted for {self.weight.numel()} classes, got {logits.shape[1]}")
        k = row_tiling(logits.shape[1])
        # weight and bias are set together (fit, load_state_dict): one cache entry, keyed on the weight, holds both
        weight, bias = self._derived("scale_shift", self.weight, logits, lambda w: (
            w.repeat(k), self.bias.to(dtype=w.dtype, device=w.device).repeat(k)))
        return scale_shift(logits, weight, bias)

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
