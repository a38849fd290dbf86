"""Split-conformal prediction sets on top of any calibrator: LAC (threshold), APS and RAPS.

Fitted on a calibration split (logits, labels) and applied to test logits, a :class:`ConformalClassifier` returns
for each sample a set of classes that holds the true one with probability at least 1 - alpha, on average over
calibration and test draws, whenever the calibration and test samples are exchangeable (Vovk et al., 2005; the
split / inductive form). With p = softmax of the (optionally calibrated) logits and a non-conformity score s(x, y):

* ``"lac"`` (least ambiguous set-valued classifier, Sadinle et al., 2019; TorchUncertainty's "THR"):
  s(x, y) = 1 - p_y;
* ``"aps"`` (adaptive prediction sets, Romano, Sesia & Candès, NeurIPS 2020): with the classes in decreasing p,
  s(x, y) = (mass of the classes ranked above y) + u p_y;
* ``"raps"`` (regularised APS, Angelopoulos et al., ICLR 2021): the APS score + ``penalty`` max(0, o(x, y) -
  ``k_reg``), o the 1-based rank of y, which discourages large sets.

u ~ U(0, 1) per sample (``randomized=True``, the exact-coverage form of APS / RAPS; seeded by ``seed``), or u = 1
(conservative). Fit: q = the ceil((n + 1)(1 - alpha))-th smallest of the n calibration scores (+inf when that
exceeds n: every class). Predict: {y : s(x, y) <= q}, computed for every class with the sample's one u, so the
test sample's true label is in its set exactly when its score is at most q, which is what the guarantee is about:
1 - alpha <= P(y in C(x)) <= 1 - alpha + 1/(n + 1) for continuous scores.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from ._checks import as_logits, as_targets
from .base import PostHocCalibrator

__all__ = ["ConformalClassifier", "CONFORMAL_METHODS", "conformal_scores", "conformal_quantile"]

CONFORMAL_METHODS = ("lac", "aps", "raps")


def conformal_scores(probs: torch.Tensor, method: str, u: torch.Tensor, penalty: float = 0.0,
                     k_reg: int = 0) -> torch.Tensor:
    """s(x, k) for every sample and class (N, C), float64; ``u`` (N,) the randomisation (ones: none)."""
    if method == "lac":
        return 1.0 - probs
    order = torch.argsort(probs, dim=1, descending=True, stable=True)
    sorted_probs = probs.gather(1, order)
    above = torch.cumsum(sorted_probs, dim=1) - sorted_probs  # mass ranked above each class
    scores_sorted = above + u[:, None] * sorted_probs
    if method == "raps":
        rank = torch.arange(1, probs.shape[1] + 1, dtype=probs.dtype, device=probs.device)
        scores_sorted = scores_sorted + penalty * (rank - k_reg).clamp_min(0.0)
    return torch.empty_like(scores_sorted).scatter_(1, order, scores_sorted)


def conformal_quantile(scores: torch.Tensor, alpha: float) -> float:
    """The ceil((n + 1)(1 - alpha))-th smallest of ``scores`` (n of them), +inf when that index exceeds n."""
    n = scores.numel()
    rank = math.ceil((n + 1) * (1.0 - alpha) - 1e-12)  # (n + 1)(1 - alpha) in floating point can land above k
    if rank > n:
        return math.inf
    return float(torch.kthvalue(scores.reshape(-1).double().cpu(), max(rank, 1)).values)


class ConformalClassifier:
    """Split-conformal prediction sets (see :mod:`timm_csm.calibration.conformal`) on the logits of ``calibrator``
    (fitted, applied first; None: the raw logits).

    ``fit(logits, targets)`` on the calibration split, then ``predict_sets(logits)`` -> bool (N, C) and
    ``evaluate(logits, targets)`` -> ``{"coverage", "mean_set_size", ...}``.
    """

    def __init__(self, method: str = "aps", alpha: float = 0.1, calibrator: Optional[PostHocCalibrator] = None,
                 randomized: bool = True, penalty: float = 0.01, k_reg: int = 5, seed: int = 0):
        if method not in CONFORMAL_METHODS:
            raise ValueError(f"method must be one of {CONFORMAL_METHODS}, got {method!r}")
        if not 0.0 < float(alpha) < 1.0:
            raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
        if float(penalty) < 0 or int(k_reg) < 0:
            raise ValueError(f"penalty and k_reg must be >= 0, got {penalty}, {k_reg}")
        self.method, self.alpha, self.calibrator = method, float(alpha), calibrator
        self.randomized, self.penalty, self.k_reg, self.seed = bool(randomized), float(penalty), int(k_reg), seed
        self.quantile: Optional[float] = None
        self._calls = 0

    def _uniform(self, n: int, device) -> torch.Tensor:
        if not self.randomized:
            return torch.ones(n, dtype=torch.float64, device=device)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self._calls)  # a fresh stream per call
        self._calls += 1
        return torch.rand(n, generator=g, dtype=torch.float64).to(device)

    def _scores(self, logits) -> torch.Tensor:
        logits = as_logits(logits)
        if self.calibrator is not None:
            logits = self.calibrator.transform(logits)
        probs = torch.softmax(logits.double(), dim=1)
        return conformal_scores(probs, self.method, self._uniform(len(probs), probs.device), self.penalty,
                                self.k_reg)

    def fit(self, logits, targets) -> "ConformalClassifier":
        scores = self._scores(logits)
        targets = as_targets(targets, scores.shape[0], scores.shape[1]).to(scores.device)
        if scores.shape[0] < 1:
            raise ValueError("ConformalClassifier: the calibration split is empty")
        self.quantile = conformal_quantile(scores.gather(1, targets[:, None]).squeeze(1), self.alpha)
        return self

    def predict_sets(self, logits) -> torch.Tensor:
        """Bool (N, C): class k is in sample i's set."""
        if self.quantile is None:
            raise ValueError("ConformalClassifier is not fitted: call fit(calibration_logits, targets) first")
        return self._scores(logits) <= self.quantile

    def evaluate(self, logits, targets) -> dict:
        """Empirical coverage, mean / median set size and the share of empty sets on a test split."""
        sets = self.predict_sets(logits)
        targets = as_targets(targets, sets.shape[0], sets.shape[1]).to(sets.device)
        sizes = sets.sum(dim=1).double()
        quantile = self.quantile if math.isfinite(self.quantile) else None  # None: every class (JSON has no inf)
        return {"method": self.method, "alpha": self.alpha, "quantile": quantile,
                "coverage": float(sets.gather(1, targets[:, None]).double().mean()),
                "mean_set_size": float(sizes.mean()), "median_set_size": float(sizes.median()),
                "empty_sets": float((sizes == 0).double().mean())}

    def __repr__(self) -> str:
        q = "unfitted" if self.quantile is None else f"q={self.quantile:.4g}"
        return f"ConformalClassifier(method={self.method!r}, alpha={self.alpha:g}, {q})"
