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
  ``k_reg``), o the 1-based rank of y, which discourages large sets. Unless both are given, ``k_reg`` and
  ``penalty`` are tuned as in the paper (its Appendix E, "optimise for size"): on the tuning part of the
  calibration split (below), ``k_reg`` is the (1 - alpha) quantile of the true class's rank and ``penalty`` the
  value of (0.001, 0.01, 0.1, 0.2, 0.5) with the smallest mean set size there. With ``penalty`` 0 (or ``k_reg`` at
  the number of classes) RAPS is APS.

u ~ U(0, 1) per sample (``randomized=True``, the exact-coverage form of APS / RAPS; seeded by ``seed``), or u = 1
(conservative). Fit: q = the ceil((n + 1)(1 - alpha))-th smallest of the n calibration scores (+inf when that
exceeds n: every class). Predict: {y : s(x, y) <= q}, computed for every class with the sample's one u, so the
test sample's true label is in its set exactly when its score is at most q, which is what the guarantee is about:
1 - alpha <= P(y in C(x)) <= 1 - alpha + 1/(n + 1) for continuous scores.

That probability averages over calibration splits. The coverage of one calibration split (on infinitely many test
samples) follows Beta(n + 1 - l, l), l = floor((n + 1) alpha) (Vovk, 2012; Angelopoulos & Bates, 2021, section
C.1), and the coverage measured on n_test test samples the beta-binomial law of n_test draws on top of it:
:func:`coverage_range` gives its central interval, the spread a correct procedure shows from split to split
(exact for continuous scores; ties, as LAC's on saturated probabilities, can only raise coverage).

Temperature: the scores read softmax(logits / T). A calibrator's temperature, fitted for NLL or ECE, tends to widen
APS / RAPS sets (Dabah & Tirer 2024, arXiv:2402.05806; MAPIE #483), so ``temperature="set_size"`` fits the sets'
own T instead: the T of :func:`temperature_grid` whose sets (with their quantile on the tuning part) are smallest
on average there (with RAPS's tuning, T and ``penalty`` are chosen together; ``k_reg`` does not depend on T).

Tuning part: whatever is tuned (RAPS's ``k_reg`` and ``penalty``, the sets' own T) is fitted on one seeded
``tune_fraction`` (30%) of the calibration split, with one draw of u for every candidate; the quantile q is then
computed on the other 70%, which the tuning never saw, so the guarantee and :func:`coverage_range` hold with that
part's size as n.

Calibrator part: a calibrator fitted on the images the quantile is computed on makes their scores no longer
exchangeable with the test scores (it has seen their labels), and coverage falls below 1 - alpha (isotonic
regression fitted on the quantile's 1 000 images of over-confident logits: 0.86 at a target of 0.90). So the
calibrator is given unfitted (or by its registered name) and :meth:`ConformalClassifier.fit` fits a copy of it on
one seeded ``calibrator_fraction`` (50%) of the calibration split; the tuning part and the quantile come from the
rest, which the calibrator never saw (split conformal with the calibrator as part of the model: the guarantee and
:func:`coverage_range` hold with the quantile part's size as n). :func:`fit_conformal_sets` fits the calibrator
once for several methods.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch

from ..metrics import bootstrap_columns
from ..registry import Registry
from ._checks import as_logits, as_targets
from .base import PostHocCalibrator
from .registry import calibrator_spec, create_calibrator
from .temperature import temperature_grid

__all__ = ["ConformalClassifier", "CONFORMAL_METHODS", "ConformalMethod", "register_conformal_method",
           "conformal_method_spec", "list_conformal_methods", "conformal_scores", "conformal_quantile", "coverage_range",
           "RAPS_PENALTY_GRID", "fit_conformal_sets", "calibrator_part_unmet", "coverage_outside_range",
           "CALIBRATOR_FRACTION"]

#: the penalties RAPS's automatic tuning tries (Angelopoulos et al., 2021, Appendix E)
RAPS_PENALTY_GRID = (0.001, 0.01, 0.1, 0.2, 0.5)
#: the share of the calibration split a calibrator under conformal sets is fitted on (the quantile: the rest)
CALIBRATOR_FRACTION = 0.5


@dataclass(frozen=True)
class ConformalMethod:
    """A registered conformal method: its non-conformity ``score`` ``(probs (N, C), u (N,), penalty, k_reg) ->
    s(x, k)`` (N, C), and whether it is ``penalised``: its score takes a rank penalty (``penalty``, ``k_reg``) that
    is tuned on the calibration split unless given, as RAPS's."""

    score: Callable[[torch.Tensor, torch.Tensor, float, int], torch.Tensor]
    penalised: bool = False


#: the registered conformal methods, in the order of the reports
CONFORMAL_METHODS = Registry("conformal method", sort=False)


def register_conformal_method(name: str, score: Optional[Callable] = None, *, overwrite: bool = False,
                              penalised: bool = False):
    """Register the non-conformity ``score`` ``(probs, u, penalty, k_reg) -> (N, C)`` as the conformal method
    ``name`` (without ``score``, a decorator); ``penalised``: it takes RAPS's tuned rank penalty."""
    def add(fn):
        CONFORMAL_METHODS.register(name, fn, overwrite=overwrite, spec=ConformalMethod(fn, bool(penalised)))
        return fn

    return add if score is None else add(score)


def conformal_method_spec(name: str) -> ConformalMethod:
    """The :class:`ConformalMethod` of ``name``; unknown names: one line listing the known ones."""
    return CONFORMAL_METHODS.get_spec(name)


def list_conformal_methods(filter: str = "", **where) -> List[str]:
    """The registered conformal methods (report order), optionally matching a shell-style wildcard."""
    return CONFORMAL_METHODS.list(filter, **where)


@register_conformal_method("lac")
def lac_scores(probs: torch.Tensor, u: torch.Tensor, penalty: float = 0.0, k_reg: int = 0) -> torch.Tensor:
    """LAC: 1 - p_k."""
    return 1.0 - probs


def _ranked_scores(probs: torch.Tensor, u: torch.Tensor, penalty: float, k_reg: int) -> torch.Tensor:
    """APS's score (mass ranked above k + u p_k) plus ``penalty`` max(0, rank - ``k_reg``)."""
    order = torch.argsort(probs, dim=1, descending=True, stable=True)
    sorted_probs = probs.gather(1, order)
    above = torch.cumsum(sorted_probs, dim=1) - sorted_probs  # mass ranked above each class
    scores_sorted = above + u[:, None] * sorted_probs
    if penalty:
        rank = torch.arange(1, probs.shape[1] + 1, dtype=probs.dtype, device=probs.device)
        scores_sorted = scores_sorted + penalty * (rank - k_reg).clamp_min(0.0)
    return torch.empty_like(scores_sorted).scatter_(1, order, scores_sorted)


@register_conformal_method("aps")
def aps_scores(probs: torch.Tensor, u: torch.Tensor, penalty: float = 0.0, k_reg: int = 0) -> torch.Tensor:
    """APS: the mass of the classes ranked above k + u p_k."""
    return _ranked_scores(probs, u, 0.0, 0)


@register_conformal_method("raps", penalised=True)
def raps_scores(probs: torch.Tensor, u: torch.Tensor, penalty: float = 0.0, k_reg: int = 0) -> torch.Tensor:
    """RAPS: APS's score + ``penalty`` max(0, rank - ``k_reg``)."""
    return _ranked_scores(probs, u, penalty, k_reg)


def conformal_scores(probs: torch.Tensor, method: str, u: torch.Tensor, penalty: float = 0.0,
                     k_reg: int = 0) -> torch.Tensor:
    """s(x, k) for every sample and class (N, C), float64; ``u`` (N,) the randomisation (ones: none)."""
    return conformal_method_spec(method).score(probs, u, penalty, k_reg)


def conformal_quantile(scores: torch.Tensor, alpha: float) -> float:
    """The ceil((n + 1)(1 - alpha))-th smallest of ``scores`` (n of them), +inf when that index exceeds n."""
    n = scores.numel()
    rank = math.ceil((n + 1) * (1.0 - alpha) - 1e-12)  # (n + 1)(1 - alpha) in floating point can land above k
    if rank > n:
        return math.inf
    return float(torch.kthvalue(scores.reshape(-1).double().cpu(), max(rank, 1)).values)


def coverage_range(n_calibration: int, n_test: int, alpha: float, levels=(0.05, 0.95)) -> tuple:
    """The ``levels`` quantiles of the coverage split conformal shows on ``n_test`` test samples after a
    quantile fitted on ``n_calibration`` points: the beta-binomial law BetaBinomial(n_test, n + 1 - l, l) / n_test,
    l = floor((n + 1) alpha) (see the module docstring). (1.0, 1.0) when l = 0: the quantile is infinite, every set
    holds every class."""
    n, m = int(n_calibration), int(n_test)
    if n < 1 or m < 1:
        raise ValueError(f"coverage_range needs calibration and test samples, got {n} and {m}")
    l = math.floor((n + 1) * float(alpha) + 1e-12)
    if l == 0:
        return 1.0, 1.0
    a, b = float(n + 1 - l), float(l)
    k = torch.arange(m + 1, dtype=torch.float64)
    lgamma = torch.lgamma
    log_pmf = (lgamma(torch.tensor(m + 1.0)) - lgamma(k + 1) - lgamma(m - k + 1) + lgamma(k + a) + lgamma(m - k + b)
               - lgamma(torch.tensor(m + a + b)) + lgamma(torch.tensor(a + b)) - lgamma(torch.tensor(a))
               - lgamma(torch.tensor(b)))
    cdf = torch.cumsum(torch.softmax(log_pmf, 0), 0)  # softmax: the pmf renormalised against rounding
    return tuple(float(torch.searchsorted(cdf, torch.tensor(level, dtype=torch.float64))) / m for level in levels)


def _true_ranks(probs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The 1-based rank of each sample's true class in its decreasing probabilities (ties: the stable order)."""
    order = torch.argsort(probs, dim=1, descending=True, stable=True)
    return (order == targets[:, None]).double().argmax(dim=1) + 1


class ConformalClassifier:
    """Split-conformal prediction sets (see :mod:`timm_csm.calibration.conformal`) on the logits of ``calibrator``
    (an unfitted calibrator or a registered name: ``fit`` fits a copy of it on ``calibrator_fraction`` of the
    calibration split and computes the quantile on the rest; applied first; None: the raw logits) or divided by
    ``temperature`` (a number, or ``"set_size"``: the sets' own, fitted for set size).

    ``fit(logits, targets)`` on the calibration split, then ``predict_sets(logits)`` -> bool (N, C) and
    ``evaluate(logits, targets)`` -> ``{"coverage", "coverage_range", "mean_set_size", ...}``. RAPS's ``penalty``
    and ``k_reg``: None (both) to tune them on ``tune_fraction`` of the calibration split (the module docstring).
    A calibrator fitted already is refused: on logits it never saw, fit the sets on its outputs instead,
    ``ConformalClassifier(...).fit(calibrator.transform(logits), targets)``.
    """

    def __init__(self, method: str = "aps", alpha: float = 0.1,
                 calibrator: Union[None, str, PostHocCalibrator] = None, randomized: bool = True,
                 penalty: Optional[float] = None, k_reg: Optional[int] = None, seed: int = 0,
                 tune_fraction: float = 0.3, temperature: Union[None, float, str] = None,
                 calibrator_fraction: float = CALIBRATOR_FRACTION):
        if method not in CONFORMAL_METHODS:
            raise ValueError(f"method must be one of {tuple(CONFORMAL_METHODS)}, got {method!r}")
        if not 0.0 < float(alpha) < 1.0:
            raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
        if (penalty is None) != (k_reg is None):
            raise ValueError("give both penalty and k_reg, or neither (RAPS tunes them on the calibration split)")
        if penalty is not None and (float(penalty) < 0 or int(k_reg) < 0):
            raise ValueError(f"penalty and k_reg must be >= 0, got {penalty}, {k_reg}")
        for name, fraction in (("tune_fraction", tune_fraction), ("calibrator_fraction", calibrator_fraction)):
            if not 0.0 < float(fraction) < 1.0:
                raise ValueError(f"{name} must lie in (0, 1), got {fraction}")
        if isinstance(calibrator, str):
            calibrator = create_calibrator(calibrator)
        elif calibrator is not None and calibrator.is_fitted:
            raise ValueError(f"ConformalClassifier fits its calibrator itself, on a part of the calibration split "
                             f"that the quantile never sees; pass {type(calibrator).__name__} unfitted (or its "
                             "registered name, or calibrator.unfitted()). With logits it was not fitted on, fit the "
                             "sets on its outputs: ConformalClassifier(...).fit(calibrator.transform(logits), targets)")
        if temperature is not None and calibrator is not None:
            raise ValueError("give a calibrator or the sets' own temperature, not both")
        if temperature not in (None, "set_size") and (isinstance(temperature, str) or not float(temperature) > 0):
            raise ValueError(f"temperature must be None, a positive number or 'set_size', got {temperature!r}")
        self.method, self.alpha = method, float(alpha)
        #: the calibrator to fit (None: none) and, once fitted, its copy fitted on the calibrator part
        self.unfitted_calibrator: Optional[PostHocCalibrator] = calibrator
        self.calibrator: Optional[PostHocCalibrator] = None
        self.randomized, self.seed, self.tune_fraction = bool(randomized), seed, float(tune_fraction)
        self.calibrator_fraction = float(calibrator_fraction)
        self.tunes_raps = conformal_method_spec(method).penalised and penalty is None
        self.penalty = float(penalty) if penalty is not None else None
        self.k_reg = int(k_reg) if k_reg is not None else None
        self.fits_temperature = temperature == "set_size"
        #: the temperature the scores divide the logits by (None: 1, or the calibrator's logits)
        self.temperature: Optional[float] = None if temperature in (None, "set_size") else float(temperature)
        self.quantile: Optional[float] = None
        self.n_calibration = self.n_tuning = self.n_calibrator = 0
        self._calls = 0

    def _uniform(self, n: int, device) -> torch.Tensor:
        if not self.randomized:
            return torch.ones(n, dtype=torch.float64, device=device)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self._calls)  # a fresh stream per call
        self._calls += 1
        return torch.rand(n, generator=g, dtype=torch.float64).to(device)

    def _probs(self, logits, temperature: Optional[float] = None) -> torch.Tensor:
        logits = as_logits(logits)
        if self.calibrator is not None:
            logits = self.calibrator.transform(logits)
        return torch.softmax(logits.double() / (temperature or self.temperature or 1.0), dim=1)

    def _scores(self, probs: torch.Tensor) -> torch.Tensor:
        u = self._uniform(len(probs), probs.device)
        return conformal_scores(probs, self.method, u, self.penalty, self.k_reg)

    def _tune(self, logits: torch.Tensor, targets: torch.Tensor) -> None:
        """The sets' own temperature and / or RAPS's ``k_reg`` and ``penalty``, chosen together on ``(logits,
        targets)`` (the tuning part) for the smallest mean set size, each candidate with its own quantile there
        (one draw of u for all; ties to the lowest T, then the first penalty)."""
        temperatures = temperature_grid() if self.fits_temperature else (self.temperature,)
        penalties, k_reg = (self.penalty,), self.k_reg
        if self.tunes_raps:  # the true class's rank is the same at every temperature
            ranks = _true_ranks(self._probs(logits), targets).sort().values
            k_reg = int(ranks[math.ceil((len(ranks) - 1) * (1.0 - self.alpha) - 1e-12)])  # numpy's "higher"
            penalties = RAPS_PENALTY_GRID
        u = self._uniform(len(targets), targets.device)
        best, best_size = (temperatures[0], penalties[0]), math.inf
        for t in temperatures:
            probs = self._probs(logits, t)
            for penalty in penalties:
                scores = conformal_scores(probs, self.method, u, penalty, k_reg)
                q = conformal_quantile(scores.gather(1, targets[:, None]).squeeze(1), self.alpha)
                size = float((scores <= q).sum(dim=1).double().mean())
                if size < best_size:
                    best, best_size = (t, penalty), size
        self.temperature, self.penalty, self.k_reg = best[0], best[1], k_reg

    def fit(self, logits, targets) -> "ConformalClassifier":
        """Fit on the calibration split: the calibrator on its part, then the tuning, then the quantile on the rest."""
        return self._fit(logits, targets)

    def _split(self, n: int, fraction: float, what: str, device) -> Tuple[torch.Tensor, torch.Tensor]:
        """(a seeded ``fraction`` of ``range(n)``, the rest); both must hold samples."""
        n_first = round(fraction * n)
        if not 0 < n_first < n:
            raise ValueError(f"{n} calibration samples do not divide into a part of {fraction:g} ({what}) and the "
                             "rest for the quantile")
        order = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed)).to(device)
        return order[:n_first], order[n_first:]

    def _fit(self, logits, targets, fitted_calibrator: Optional[PostHocCalibrator] = None) -> "ConformalClassifier":
        """:meth:`fit`; ``fitted_calibrator``: this split's calibrator part fitted already (by a classifier of the
        same calibrator, split and seed: :func:`fit_conformal_sets`)."""
        logits = as_logits(logits)
        targets = as_targets(targets, logits.shape[0], logits.shape[1]).to(logits.device)
        if logits.shape[0] < 1:
            raise ValueError("ConformalClassifier: the calibration split is empty")
        self._calls, self.n_tuning, self.n_calibrator = 0, 0, 0
        if self.unfitted_calibrator is not None:
            part, rest = self._split(len(targets), self.calibrator_fraction,
                                     f"the calibrator, {self.unfitted_calibrator.kind}", logits.device)
            self.calibrator = (fitted_calibrator if fitted_calibrator is not None
                               else self.unfitted_calibrator.unfitted().fit(logits[part], targets[part]))
            logits, targets, self.n_calibrator = logits[rest], targets[rest], len(part)
        if self.tunes_raps or self.fits_temperature:
            tuned = "the sets' own temperature" if self.fits_temperature else "RAPS's k_reg and penalty"
            tune, rest = self._split(len(targets), self.tune_fraction, tuned, logits.device)
            self._tune(logits[tune], targets[tune])
            logits, targets, self.n_tuning = logits[rest], targets[rest], len(tune)
        scores = self._scores(self._probs(logits))
        self.quantile = conformal_quantile(scores.gather(1, targets[:, None]).squeeze(1), self.alpha)
        self.n_calibration = len(targets)
        return self

    def predict_sets(self, logits) -> torch.Tensor:
        """Bool (N, C): class k is in sample i's set."""
        if self.quantile is None:
            raise ValueError("ConformalClassifier is not fitted: call fit(calibration_logits, targets) first")
        return self._scores(self._probs(logits)) <= self.quantile

    def evaluate(self, logits, targets, bootstrap: int = 0, seed: int = 0) -> dict:
        """Empirical coverage and its expected 5-95% range (:func:`coverage_range`), mean / median set size and
        the share of empty sets on a test split, the temperature of the scores; RAPS adds its ``penalty`` and
        ``k_reg``. With ``bootstrap`` resamples of the test samples also their 95% percentile ``intervals``
        (:func:`timm_csm.metrics.bootstrap_columns`, ``seed``)."""
        sets = self.predict_sets(logits)
        targets = as_targets(targets, sets.shape[0], sets.shape[1]).to(sets.device)
        sizes = sets.sum(dim=1).double()
        covered = sets.gather(1, targets[:, None]).double().view(-1)
        quantile = self.quantile if math.isfinite(self.quantile) else None  # None: every class (JSON has no inf)
        out = {"method": self.method, "alpha": self.alpha, "quantile": quantile, "temperature": self.temperature,
               "coverage": float(covered.mean()),
               "coverage_range": list(coverage_range(self.n_calibration, len(targets), self.alpha)),
               "n_calibration": self.n_calibration, "n_tuning": self.n_tuning, "n_calibrator": self.n_calibrator,
               "mean_set_size": float(sizes.mean()), "median_set_size": float(sizes.median()),
               "empty_sets": float((sizes == 0).double().mean())}
        if conformal_method_spec(self.method).penalised:
            out.update(penalty=self.penalty, k_reg=self.k_reg)
        if bootstrap:
            columns = {"coverage": covered, "mean_set_size": sizes, "median_set_size": sizes,
                       "empty_sets": (sizes == 0).double()}
            out["intervals"] = bootstrap_columns(columns, medians=["median_set_size"], resamples=bootstrap, seed=seed)
        return out

    def __repr__(self) -> str:
        q = "unfitted" if self.quantile is None else f"q={self.quantile:.4g}"
        t = "" if self.temperature is None else f", T={self.temperature:g}"
        return f"ConformalClassifier(method={self.method!r}, alpha={self.alpha:g}, {q}{t})"


def fit_conformal_sets(methods: Sequence[str], logits, targets, calibrator: Union[None, str, PostHocCalibrator] = None,
                       **options) -> Dict[str, ConformalClassifier]:
    """``{method: ConformalClassifier(method, calibrator=calibrator, **options).fit(logits, targets)}``, the
    calibrator fitted once, on its part of the split, for all of them (each method's sets as if fitted alone)."""
    sets: Dict[str, ConformalClassifier] = {}
    for method in methods:
        shared = next(iter(sets.values())).calibrator if sets else None
        sets[method] = ConformalClassifier(method, calibrator=calibrator, **options)._fit(logits, targets, shared)
    return sets


def calibrator_part_unmet(kind: str, n_calibration: int, num_classes: int,
                          fraction: float = CALIBRATOR_FRACTION) -> Optional[str]:
    """Why calibrator ``kind`` (a registered name) cannot be fitted on its ``fraction`` of a calibration split of
    ``n_calibration`` samples of ``num_classes`` classes (:meth:`~timm_csm.calibration.CalibratorSpec.unmet`), or
    None: the front ends leave out the sets on top of it instead of failing."""
    return calibrator_spec(kind).unmet(num_classes, round(fraction * n_calibration),
                                       "its part of the calibration split")


def coverage_outside_range(result: dict) -> Optional[str]:
    """One line when the coverage of :meth:`ConformalClassifier.evaluate`'s ``result`` lies outside its own
    expected 5-95% range (a correct procedure lands outside one split in ten, so this is a warning, not an
    error), else None."""
    lo, hi = result["coverage_range"]
    if lo <= result["coverage"] <= hi:
        return None
    side = "below" if result["coverage"] < lo else "above"
    return (f"{result['method']} coverage {result['coverage']:.4f} lies {side} its expected range {lo:.3f}-{hi:.3f} "
            f"(quantile on {result['n_calibration']} images)")
