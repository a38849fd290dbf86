"""Calibrators of two-class models: Platt scaling and beta calibration.

Both read the positive-class score of two-class logits ``z = (z_0, z_1)``, the log-odds ``s = z_1 - z_0`` (so
``p = sigmoid(s)`` is the model's probability of class 1), fit a logistic regression on a feature of ``s`` by
validation NLL, and return two-class logits ``(0, s')`` whose softmax is ``(1 - p', p')``.

* Platt scaling (Platt, 1999): ``s' = a s + b``. Plain maximum likelihood on the hard labels (as scikit-learn's
  ``LogisticRegression(penalty=None)`` and netcal's ``LogisticCalibration``; Platt's smoothed targets are not used).
* Beta calibration (Kull, Silva Filho & Flach, AISTATS 2017): ``s' = a ln p - b ln(1 - p) + c``, the
  three-parameter family whose calibration maps include the identity (a = b = 1, c = 0) and sigmoid-shaped and
  inverse-sigmoid maps. As the betacal package, a and b are kept >= 0 (monotone maps): when the free fit gives
  a < 0 the fit is repeated without the ``ln p`` feature (a = 0), when it gives b < 0 without ``ln(1 - p)``.
  ``ln p = -softplus(-s)`` and ``ln(1 - p) = -softplus(s)`` are computed from the logits, so confidences of 1 in
  float32 do not produce infinities.
"""
from __future__ import annotations

from typing import Dict, Optional, Sequence

import torch
import torch.nn.functional as F

from ._checks import check_fit_inputs
from .base import PostHocCalibrator, check_finite_state
from .registry import register_calibrator

__all__ = ["PlattScaling", "BetaCalibration", "binary_log_odds"]


def binary_log_odds(logits: torch.Tensor, name: str) -> torch.Tensor:
    """``z_1 - z_0`` of two-class logits (N, 2); ``ValueError`` naming the calibrator for more classes."""
    if logits.shape[1] != 2:
        raise ValueError(f"{name} calibrates two-class models, got {logits.shape[1]} classes; use a multiclass "
                         "calibrator (temperature_scaling, vector_scaling, matrix_scaling, dirichlet, isotonic, "
                         "histogram_binning)")
    return logits[:, 1] - logits[:, 0]


def softplus(s: torch.Tensor) -> torch.Tensor:
    """``log(1 + exp(s))`` as ``max(s, 0) + log(1 + exp(-|s|))``: torch runs ``exp`` and ``log`` vectorised on the
    CPU but ``softplus`` and ``log1p`` one element at a time (about 3x slower). With ``e = exp(-|s|) <= 1``,
    ``log(1 + e)`` is within one unit in the last place of 1 of ``log1p(e)`` (1.2e-7 in float32, 2.2e-16 in
    float64), an absolute error far below the logits' own rounding."""
    return torch.neg(s.abs()).exp_().add_(1).log_().add_(s.clamp(min=0))


def _fit_logistic(features: torch.Tensor, labels: torch.Tensor, init: Sequence[float], max_iter: int, name: str):
    """Weights w (F,) and bias of ``sigmoid(features @ w + bias)`` by mean binary NLL; returns (w, bias,
    iterations).

    Newton's method on the F + 1 parameters (the gradient ``X^T (p - t) / N`` and Hessian ``X^T diag(p (1 - p)) X
    / N`` of the convex objective in one pass over the N rows each), with a backtracking line search; converged
    when the Newton decrement (twice the decrease the step predicts) falls below ``1e-15`` of the objective, after
    which the last step is taken."""
    n = features.shape[0]
    x = torch.cat([features, torch.ones(n, 1, dtype=features.dtype, device=features.device)], dim=1)
    t = labels.to(features.dtype)
    theta = torch.tensor([*init, 0.0], dtype=features.dtype, device=features.device)

    def objective(theta):
        s = x @ theta
        return float((softplus(s) - t * s).mean())

    value = objective(theta)
    for iterations in range(1, max(1, max_iter) + 1):
        p = torch.sigmoid(x @ theta)
        gradient = x.T @ (p - t) / n
        hessian = (x * (p * (1 - p)).unsqueeze(1)).T @ x / n
        step = -torch.linalg.lstsq(hessian, gradient.unsqueeze(1)).solution.squeeze(1)
        decrement = float(-(gradient @ step))
        if not decrement > 1e-15 * max(1.0, abs(value)):
            theta = theta + step if decrement == decrement else theta
            break
        rate = 1.0
        while True:  # Armijo backtracking
            trial = theta + rate * step
            trial_value = objective(trial)
            if trial_value <= value - 0.25 * rate * decrement or rate < 1e-10:
                break
            rate *= 0.5
        theta, value = trial, trial_value
    if not bool(torch.isfinite(theta).all()):
        raise ValueError(f"{name}: the fit diverged (non-finite parameters or loss)")
    return theta[:-1], theta[-1], iterations


def _two_class_logits(s: torch.Tensor) -> torch.Tensor:
    """(0, s) per row."""
    return F.pad(s.unsqueeze(1), (1, 0))


class _BinaryCalibrator(PostHocCalibrator):
    state_names: Sequence[str] = ()
    non_finite_shows_in = "values"

    def __init__(self, max_iter: int = 200):
        self.max_iter = int(max_iter)
        self.params: Optional[torch.Tensor] = None
        self.fit_info: Optional[dict] = None

    def config(self) -> dict:
        return {"max_iter": self.max_iter}

    def state_dict(self) -> Dict[str, torch.Tensor]:
        return {} if self.params is None else {"params": self.params}

    def load_state_dict(self, state: Dict[str, torch.Tensor]) -> "_BinaryCalibrator":
        if set(state) != {"params"} or tuple(state["params"].shape) != (len(self.state_names),):
            raise ValueError(f"expected 'params' of length {len(self.state_names)}, got {sorted(state)}")
        check_finite_state(state, f"{type(self).__name__} state")
        self.params = state["params"].double().cpu()
        return self

    def __repr__(self) -> str:
        if self.params is None:
            return f"{type(self).__name__}(unfitted)"
        values = ", ".join(f"{n}={v:.4g}" for n, v in zip(self.state_names, self.params.tolist()))
        return f"{type(self).__name__}({values})"


@register_calibrator("platt", summary="Platt scaling of a two-class model", binary_only=True)
class PlattScaling(_BinaryCalibrator):
    """Platt scaling of a two-class model: ``s' = a s + b`` on the log-odds s, by validation NLL (see
    :mod:`timm_csm.calibration.binary`). ``params`` = (a, b)."""

    state_names = ("a", "b")

    def fit(self, logits, targets) -> "PlattScaling":
        logits, targets = check_fit_inputs(logits, targets, type(self).__name__)
        s = binary_log_odds(logits.double(), type(self).__name__)
        w, b, iterations = _fit_logistic(s[:, None], targets, [1.0], self.max_iter, type(self).__name__)
        self.fit_info = {"iterations": iterations}
        self.params = torch.stack([w[0], b]).cpu()
        return self

    def _apply(self, logits: torch.Tensor) -> torch.Tensor:
        a, b = self.params.tolist()
        return _two_class_logits(binary_log_odds(logits, type(self).__name__).mul_(a).add_(b))


def _beta_features(s: torch.Tensor) -> torch.Tensor:
    """(ln p, -ln(1 - p)) of p = sigmoid(s), stably."""
    return torch.stack([-softplus(-s), softplus(s)], dim=1)


@register_calibrator("beta", summary="beta calibration of a two-class model", binary_only=True)
class BetaCalibration(_BinaryCalibrator):
    """Beta calibration of a two-class model: ``s' = a ln p - b ln(1 - p) + c`` with a, b >= 0, by validation NLL
    (see :mod:`timm_csm.calibration.binary`). ``params`` = (a, b, c)."""

    state_names = ("a", "b", "c")

    def fit(self, logits, targets) -> "BetaCalibration":
        logits, targets = check_fit_inputs(logits, targets, type(self).__name__)
        features = _beta_features(binary_log_odds(logits.double(), type(self).__name__))
        name = type(self).__name__
        w, c, iterations = _fit_logistic(features, targets, [1.0, 1.0], self.max_iter, name)
        if w[0] < 0:  # betacal's rule: drop the feature whose coefficient went negative and fit again
            w1, c, again = _fit_logistic(features[:, 1:], targets, [1.0], self.max_iter, name)
            w, iterations = torch.stack([torch.zeros_like(w1[0]), w1[0]]), iterations + again
        elif w[1] < 0:
            w0, c, again = _fit_logistic(features[:, :1], targets, [1.0], self.max_iter, name)
            w, iterations = torch.stack([w0[0], torch.zeros_like(w0[0])]), iterations + again
        self.fit_info = {"iterations": iterations}
        self.params = torch.stack([w[0], w[1], c]).cpu()
        return self

    def _apply(self, logits: torch.Tensor) -> torch.Tensor:
        # a ln p - b ln(1 - p) + c = (b - a) softplus(s) + a s + c, as ln p = -softplus(-s) = s - softplus(s)
        a, b, c = self.params.tolist()
        s = binary_log_odds(logits, type(self).__name__)
        return _two_class_logits(torch.add(softplus(s).mul_(b - a), s, alpha=a).add_(c))
