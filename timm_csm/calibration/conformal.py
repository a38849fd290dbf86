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

Temperature: the scores read softmax(logits / T). A calibrator's temperature, fitted for NLL or ECE, tends to widen
APS / RAPS sets (Dabah & Tirer 2024, arXiv:2402.05806; MAPIE #483), so ``temperature="set_size"`` fits the sets'
own T instead: on a seeded ``tuning_fraction`` of the calibration split, the T of :func:`temperature_grid` whose sets
(with their quantile on that part) are smallest on average; the quantile is then computed on the other part, which
T never saw, so the guarantee holds with that part's size as n.
"""
from __future__ import annotations

import math
from typing import Optional, Union

import torch

from ..metrics import bootstrap_columns
from ._checks import as_logits, as_targets
from .base import PostHocCalibrator
from .temperature import temperature_grid

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
                 randomized: bool = True, penalty: float = 0.01, k_reg: int = 5, seed: int = 0,
                 temperature: Union[None, float, str] = None, tuning_fraction: float = 0.5):
        if method not in CONFORMAL_METHODS:
            raise ValueError(f"method must be one of {CONFORMAL_METHODS}, got {method!r}")
        if not 0.0 < float(alpha) < 1.0:
            raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
        if float(penalty) < 0 or int(k_reg) < 0:
            raise ValueError(f"penalty and k_reg must be >= 0, got {penalty}, {k_reg}")
        if temperature is not None and calibrator is not None:
            raise ValueError("give a calibrator or the sets' own temperature, not both")
        if temperature not in (None, "set_size") and (isinstance(temperature, str) or not float(temperature) > 0):
            raise ValueError(f"temperature must be None, a positive number or 'set_size', got {temperature!r}")
        if not 0.0 < float(tuning_fraction) < 1.0:
            raise ValueError(f"tuning_fraction must lie in (0, 1), got {tuning_fraction}")
        self.method, self.alpha, self.calibrator = method, float(alpha), calibrator
        self.randomized, self.penalty, self.k_reg, self.seed = bool(randomized), float(penalty), int(k_reg), seed
        self.fit_temperature, self.tuning_fraction = temperature == "set_size", float(tuning_fraction)
        #: the temperature the scores divide the logits by (None: 1, or the calibrator's logits)
        self.temperature: Optional[float] = None if temperature in (None, "set_size") else float(temperature)
        self.quantile: Optional[float] = None
        self._calls = 0

    def _uniform(self, n: int, device) -> torch.Tensor:
        if not self.randomized:
            return torch.ones(n, dtype=torch.float64, device=device)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self._calls)  # a fresh stream per call
        self._calls += 1
        return torch.rand(n, generator=g, dtype=torch.float64).to(device)

    def _scores(self, logits, temperature: Optional[float] = None, u: Optional[torch.Tensor] = None) -> torch.Tensor:
        logits = as_logits(logits)
        if self.calibrator is not None:
            logits = self.calibrator.transform(logits)
        temperature = temperature or self.temperature
        probs = torch.softmax(logits.double() / (temperature or 1.0), dim=1)
        u = self._uniform(len(probs), probs.device) if u is None else u
        return conformal_scores(probs, self.method, u, self.penalty, self.k_reg)

    def fit(self, logits, targets) -> "ConformalClassifier":
        logits = as_logits(logits)
        targets = as_targets(targets, logits.shape[0], logits.shape[1])
        if logits.shape[0] < 1:
            raise ValueError("ConformalClassifier: the calibration split is empty")
        if self.fit_temperature:
            order = torch.randperm(len(targets), generator=torch.Generator().manual_seed(self.seed))
            n_tune = int(round(self.tuning_fraction * len(targets)))
            if not 1 <= n_tune < len(targets):
                raise ValueError(f"ConformalClassifier: {len(targets)} calibration samples cannot be split into a "
                                 f"part that fits the temperature and one for the quantile")
            tune, rest = order[:n_tune], order[n_tune:]
            self.temperature = self._set_size_temperature(logits[tune], targets[tune])
            logits, targets = logits[rest], targets[rest]
        scores = self._scores(logits)
        targets = targets.to(scores.device)
        self.quantile = conformal_quantile(scores.gather(1, targets[:, None]).squeeze(1), self.alpha)
        return self

    def _set_size_temperature(self, logits: torch.Tensor, targets: torch.Tensor) -> float:
        """The temperature of the grid with the smallest mean set size on ``(logits, targets)``, each with its own
        quantile there (one draw of the randomisation for all; ties to the lowest T)."""
        u = self._uniform(len(targets), logits.device)
        best, best_size = 1.0, math.inf
        for t in temperature_grid():
            scores = self._scores(logits, t, u)
            q = conformal_quantile(scores.gather(1, targets[:, None].to(scores.device)).squeeze(1), self.alpha)
            size = float((scores <= q).sum(dim=1).double().mean())
            if size < best_size:
                best, best_size = t, size
        return best

    def predict_sets(self, logits) -> torch.Tensor:
        """Bool (N, C): class k is in sample i's set."""
        if self.quantile is None:
            raise ValueError("ConformalClassifier is not fitted: call fit(calibration_logits, targets) first")
        return self._scores(logits) <= self.quantile

    def evaluate(self, logits, targets, bootstrap: int = 0, seed: int = 0) -> dict:
        """Empirical coverage, mean / median set size and the share of empty sets on a test split, the temperature
        of the scores; with ``bootstrap`` resamples of the test samples also their 95% percentile ``intervals``
        (:func:`timm_csm.metrics.bootstrap_columns`, ``seed``)."""
        sets = self.predict_sets(logits)
        targets = as_targets(targets, sets.shape[0], sets.shape[1]).to(sets.device)
        sizes = sets.sum(dim=1).double()
        covered = sets.gather(1, targets[:, None]).double().view(-1)
        quantile = self.quantile if math.isfinite(self.quantile) else None  # None: every class (JSON has no inf)
        out = {"method": self.method, "alpha": self.alpha, "quantile": quantile, "temperature": self.temperature,
               "coverage": float(covered.mean()), "mean_set_size": float(sizes.mean()),
               "median_set_size": float(sizes.median()), "empty_sets": float((sizes == 0).double().mean())}
        if bootstrap:
            columns = {"coverage": covered, "mean_set_size": sizes, "median_set_size": sizes,
                       "empty_sets": (sizes == 0).double()}
            out["intervals"] = bootstrap_columns(columns, medians=["median_set_size"], resamples=bootstrap, seed=seed)
        return out

    def __repr__(self) -> str:
        q = "unfitted" if self.quantile is None else f"q={self.quantile:.4g}"
        t = "" if self.temperature is None else f", T={self.temperature:g}"
        return f"ConformalClassifier(method={self.method!r}, alpha={self.alpha:g}, {q}{t})"
