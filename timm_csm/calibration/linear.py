"""Matrix scaling and Dirichlet calibration: a full affine map of the logits (or log-probabilities), fitted by NLL.

Both are multinomial logistic regression on a fixed feature of each sample (Kull et al., NeurIPS 2019, "Beyond
temperature scaling: obtaining well-calibrated multi-class probabilities with Dirichlet calibration"):

* matrix scaling (Guo et al., ICML 2017): ``z' = W z + b`` on the logits z;
* Dirichlet calibration: ``z' = W log softmax(z) + b``, the same map on the log-probabilities (a Dirichlet
  likelihood ratio per class, which is what the name says).

W in R^{C x C} starts at the identity and b at 0 (the uncalibrated model); the objective is the mean validation NLL
plus Kull et al.'s ODIR penalty (Off-Diagonal and Intercept Regularisation)::

    L(W, b) = -(1/N) Σ_i log softmax(W x_i + b)[y_i]
              + reg_lambda / (C (C - 1)) Σ_{j != k} W_jk^2  +  reg_mu / C Σ_j b_j^2

which leaves the diagonal free (each class keeps its own scale) and shrinks the class interactions and the biases;
``reg="l2"`` penalises every weight instead, ``reg_lambda / (C (C - 1)) Σ_{j,k} W_jk^2`` (the plain L2 variant of
Kull et al.). Both default to no penalty (0, as Guo's matrix scaling); with many classes and few validation samples
set them (Kull et al. pick them by cross-validation over 10^-7 .. 10^-1). Minimised with L-BFGS from the
temperature-scaling fit (:mod:`timm_csm.calibration.affine`: fused float32 passes for float32 logits, float64 sums
and parameters); ``loss`` is the final objective and ``fit_info`` the iterations.
"""
from __future__ import annotations

from typing import Dict, Optional

import torch

from ._checks import check_fit_inputs
from ._kernels import affine_rows, log_softmax_rows
from .affine import fit_affine
from .base import PostHocCalibrator, check_finite_state
from .registry import register_calibrator

__all__ = ["MatrixScaling", "DirichletCalibration"]

_REGS = ("odir", "l2")
#: the penalty strengths of the ODIR regulariser: off-diagonal weights, intercepts
ODIR_PENALTIES = ("reg_lambda", "reg_mu")


def _one_per_parameter(num_classes: int) -> int:
    """The parameters of W (C x C) and b (C): the fewest samples that identify them."""
    return num_classes * (num_classes + 1)


class _AffineCalibrator(PostHocCalibrator):
    """``z' = W x(z) + b`` with ``x`` the logits or the log-probabilities; see the module docstring."""

    on_log_probs = False
    non_finite_shows_in = "rows"

    def __init__(self, reg_lambda: float = 0.0, reg_mu: float = 0.0, reg: str = "odir", max_iter: int = 500):
        if reg not in _REGS:
            raise ValueError(f"reg must be one of {_REGS}, got {reg!r}")
        if not (float(reg_lambda) >= 0 and float(reg_mu) >= 0):
            raise ValueError(f"reg_lambda and reg_mu must be >= 0, got {reg_lambda}, {reg_mu}")
        self.reg_lambda, self.reg_mu, self.reg = float(reg_lambda), float(reg_mu), reg
        self.max_iter = int(max_iter)
        self.weight: Optional[torch.Tensor] = None
        self.bias: Optional[torch.Tensor] = None
        self.loss: Optional[float] = None
        self.fit_info: Optional[dict] = None

    def _features(self, logits: torch.Tensor) -> torch.Tensor:
        return log_softmax_rows(logits) if self.on_log_probs else logits

    def penalty(self, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """The regulariser of the objective (0 with the default zero strengths)."""
        c = weight.shape[0]
        squares = weight.square().sum()
        if self.reg == "odir":
            squares = squares - weight.diagonal().square().sum()
        return self.reg_lambda * squares / (c * (c - 1)) + self.reg_mu * bias.square().sum() / c

    def fit(self, logits, targets) -> "_AffineCalibrator":
        logits, targets = check_fit_inputs(logits, targets, type(self).__name__)
        penalised = self.reg_lambda > 0 or self.reg_mu > 0
        weight, bias, self.fit_info = fit_affine(logits, targets, self._features, False, self.max_iter,
                                                 type(self).__name__, self.penalty if penalised else None)
        self.loss = self.fit_info["objective"]
        self.weight, self.bias = weight.cpu(), bias.cpu()
        return self

    def _apply(self, logits: torch.Tensor) -> torch.Tensor:
        if logits.shape[1] != self.bias.numel():
            raise ValueError(f"{type(self).__name__} was fitted for {self.bias.numel()} classes, got "
                             f"{logits.shape[1]}")
        return affine_rows(self._features(logits), self._derived("weight", self.weight, logits),
                           self._derived("bias", self.bias, logits))

    def config(self) -> dict:
        return {"reg_lambda": self.reg_lambda, "reg_mu": self.reg_mu, "reg": self.reg, "max_iter": self.max_iter}

    def state_dict(self) -> Dict[str, torch.Tensor]:
        return {} if self.weight is None else {"weight": self.weight, "bias": self.bias}

    def load_state_dict(self, state: Dict[str, torch.Tensor]) -> "_AffineCalibrator":
        if set(state) != {"weight", "bias"} or state["bias"].ndim != 1 or \
                tuple(state["weight"].shape) != (state["bias"].numel(),) * 2:
            raise ValueError(f"expected a (C, C) 'weight' and a (C,) 'bias', got keys {sorted(state)}")
        check_finite_state(state, f"{type(self).__name__} state")
        self.weight, self.bias = state["weight"].double().cpu(), state["bias"].double().cpu()
        return self

    def __repr__(self) -> str:
        fitted = "unfitted" if self.weight is None else f"{self.bias.numel()} classes"
        return f"{type(self).__name__}(reg_lambda={self.reg_lambda:g}, reg_mu={self.reg_mu:g}, {fitted})"


@register_calibrator("matrix_scaling", summary="a full linear map of the logits, by validation NLL",
                     penalties=ODIR_PENALTIES, min_samples=_one_per_parameter)
class MatrixScaling(_AffineCalibrator):
    """Matrix scaling (Guo et al., 2017): ``z' = W z + b`` on the logits, W (C x C) and b fitted by validation NLL
    with the optional ODIR penalty of Kull et al. (2019); see :mod:`timm_csm.calibration.linear`. It can change
    the predicted class."""


@register_calibrator("dirichlet", summary="Dirichlet calibration (Kull et al., 2019): a linear map of the "
                     "log-probabilities", penalties=ODIR_PENALTIES, min_samples=_one_per_parameter)
class DirichletCalibration(_AffineCalibrator):
    """Dirichlet calibration (Kull et al., NeurIPS 2019): ``z' = W log softmax(z) + b``, fitted by validation NLL
    with the ODIR penalty ``reg_lambda`` (off-diagonal weights) and ``reg_mu`` (intercepts); see
    :mod:`timm_csm.calibration.linear`. It can change the predicted class."""

    on_log_probs = True
