"""Bootstrap interval methods, and each metric's default: the method the coverage study chose for it.

An interval method turns the B resampled values of a metric and its estimate on the data into ``(low, high)`` at
``level``; methods are registered by name (:func:`register_interval_method`, :func:`interval_method`):

* ``"percentile"``: the ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles of the resampled values (Efron &
  Tibshirani 1993, ch. 13), linearly interpolated as ``numpy.quantile``;
* ``"basic"``: those quantiles reflected about the estimate, ``(2 est - q_high, 2 est - q_low)`` (Davison & Hinkley
  1997, sec. 5.2): where the resampled values sit above the estimate by the estimate's own bias, the reflection
  moves the interval down by that bias;
* ``"bc"``: the bias-corrected percentile interval (Efron 1982): with ``z0 = Phi^-1(share of resampled values
  below the estimate, ties counted half)``, the quantiles at ``Phi(2 z0 -+ z)``, ``z = Phi^-1((1 + level) / 2)``;
  it equals the percentile interval when the estimate is the resampled median. (BCa also needs a jackknife of the
  metric: N recomputations per interval, which the vectorised bootstrap does not afford at N = 50,000.)
* ``"symmetric"``: ``est -+ d`` with ``d`` the larger distance from the estimate to the two percentile quantiles:
  the smallest interval centred on the estimate that holds both the percentile and the basic interval, so it
  covers whenever either does (for a metric biased one way in one regime and the other way in another);
* ``"upper"``: one-sided, from 0 (or the lower quantile, if it is negative) to the ``level`` quantile: an upper
  confidence bound, for an error biased upwards whose true value can be 0 (a binned ECE of a calibrated model,
  Roelofs et al. 2022), where no two-sided interval of the bootstrap covers 0. The study takes it only for a metric
  that no two-sided method serves.

:data:`DEFAULT_INTERVALS` holds each metric's default, the one place the reports read: the method whose coverage of
the true value was nearest 95% without falling below 93% (beyond the Monte-Carlo error) in any row of
``benchmarks/intervals_coverage.md``, or ``None`` with the reason where no method reached that (the reports then
print the value alone and the reason). A metric not in that table (registered later, or not studied) gets the
percentile interval.
"""
from __future__ import annotations

import math
from statistics import NormalDist
from typing import Callable, Dict, List, Optional, Tuple

import torch

from ..registry import Registry

__all__ = ["IntervalMethod", "INTERVAL_METHODS", "register_interval_method", "interval_method",
           "list_interval_methods",
           "percentile", "basic", "bias_corrected", "symmetric", "upper", "ONE_SIDED", "DEFAULT_INTERVALS",
           "NO_INTERVAL", "AT_MOST_ONE", "default_interval", "interval_of", "INTERVAL_NOTE", "no_interval_line"]

#: (resampled values (B,), estimate, level) -> (low, high)
IntervalMethod = Callable[[torch.Tensor, float, float], Tuple[float, float]]
#: the registered interval methods, in registration order: name -> :data:`IntervalMethod`
INTERVAL_METHODS = Registry("interval method", sort=False)
_F64 = torch.float64


def register_interval_method(name: str, method: Optional[IntervalMethod] = None, *,
                             overwrite: bool = False) -> IntervalMethod:
    """Add ``method`` under ``name`` (without ``method``, a decorator); a name registered twice raises
    ``ValueError`` unless ``overwrite``."""
    return INTERVAL_METHODS.register(name, overwrite=overwrite) if method is None else \
        INTERVAL_METHODS.register(name, method, overwrite=overwrite)


def interval_method(name: str) -> IntervalMethod:
    """The registered method ``name``; unknown names raise ``ValueError`` listing the known ones."""
    return INTERVAL_METHODS.get(name)


def list_interval_methods(filter: str = "") -> List[str]:
    return INTERVAL_METHODS.list(filter)


def _quantiles(values: torch.Tensor, q: Tuple[float, float]) -> Tuple[float, float]:
    v = values.to(_F64).reshape(-1)
    if v.numel() < 1:
        raise ValueError("no resampled values: an interval needs at least one resample")
    low, high = torch.quantile(v, torch.tensor(q, dtype=_F64)).tolist()
    return low, high


def _check_level(level: float) -> float:
    if not 0.0 < float(level) < 1.0:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    return float(level)


def percentile(values: torch.Tensor, estimate: Optional[float], level: float) -> Tuple[float, float]:
    """The percentile interval (the estimate is not read)."""
    level = _check_level(level)
    return _quantiles(values, ((1.0 - level) / 2.0, (1.0 + level) / 2.0))


def basic(values: torch.Tensor, estimate: float, level: float) -> Tuple[float, float]:
    """The basic (reflected percentile) interval ``(2 est - q_high, 2 est - q_low)``."""
    low, high = percentile(values, None, level)
    return 2.0 * estimate - high, 2.0 * estimate - low


def bias_corrected(values: torch.Tensor, estimate: float, level: float) -> Tuple[float, float]:
    """The bias-corrected percentile interval. When every resampled value lies on one side of the estimate, the
    share is clamped to half a resample from 0 or 1 (z0 stays finite)."""
    level = _check_level(level)
    v = values.to(_F64).reshape(-1)
    b = v.numel()
    share = (float((v < estimate).sum()) + 0.5 * float((v == estimate).sum())) / max(b, 1)
    share = min(max(share, 0.5 / b), 1.0 - 0.5 / b) if b > 1 else 0.5
    normal = NormalDist()
    z0, z = normal.inv_cdf(share), normal.inv_cdf((1.0 + level) / 2.0)
    return _quantiles(v, (normal.cdf(2.0 * z0 - z), normal.cdf(2.0 * z0 + z)))


def symmetric(values: torch.Tensor, estimate: float, level: float) -> Tuple[float, float]:
    """``est -+ max(est - q_low, q_high - est)``: the hull of the percentile and the basic interval."""
    low, high = percentile(values, None, level)
    half = max(abs(estimate - low), abs(high - estimate))
    return estimate - half, estimate + half


def upper(values: torch.Tensor, estimate: Optional[float], level: float) -> Tuple[float, float]:
    """``(min(0, q_low), q_level)``: the one-sided upper bound at ``level`` (the estimate is not read)."""
    level = _check_level(level)
    low, high = _quantiles(values, ((1.0 - level) / 2.0, level))
    return min(0.0, low), high


#: the one-sided methods (an upper bound shown as [0, high]): taken only where no two-sided one serves
ONE_SIDED = ("upper",)

for _name, _method in (("percentile", percentile), ("basic", basic), ("bc", bias_corrected),
                       ("symmetric", symmetric), ("upper", upper)):
    register_interval_method(_name, _method)

#: why a metric has no interval (:data:`DEFAULT_INTERVALS` maps it to None); none at present: every studied metric
#: has a method that reached the study's bar
NO_INTERVAL: Dict[str, str] = {}

#: each metric's default interval method (see the module docstring); None: no interval (reason: NO_INTERVAL)
DEFAULT_INTERVALS: Dict[str, Optional[str]] = {
    "accuracy": "symmetric", "confidence": "symmetric", "ece": "upper", "aece": "upper", "cece": "upper",
    "mce": "upper", "oe": "upper", "ue": "upper", "debiased_ce": "symmetric", "nll": "symmetric",
    "brier": "symmetric", "auroc": "symmetric", "aupr_in": "symmetric", "aupr_out": "symmetric",
    "fpr95": "symmetric",
}


_WORDS = {"percentile": "percentile", "basic": "basic", "bc": "bias-corrected", "symmetric": "symmetric",
          "upper": "one-sided upper bound"}
#: how a report's bootstrap record names the methods (``results["bootstrap"]["interval"]``): those of the defaults
INTERVAL_NOTE = "each metric's own ({})".format(
    ", ".join(_WORDS.get(m, m) for m in dict.fromkeys(m for m in DEFAULT_INTERVALS.values() if m)))


def default_interval(name: str) -> Tuple[Optional[str], str]:
    """``(method, reason)``: the default method of metric ``name`` (``"percentile"`` for a metric the table does
    not hold) and, when it is None, why the metric has no interval."""
    method = DEFAULT_INTERVALS.get(name, "percentile")
    return method, ("" if method is not None else NO_INTERVAL[name])


#: the metrics that are rates or areas, at most 1 (a reflected interval is cut there as at 0)
AT_MOST_ONE = frozenset({"accuracy", "confidence", "auroc", "aupr_in", "aupr_out", "fpr95"})


def interval_of(name: str, values: torch.Tensor, estimate: Optional[float], level: float,
                method: Optional[str] = None, hold_estimate: bool = True) -> Dict[str, object]:
    """``{"low", "high", "method"}`` of metric ``name`` by ``method`` (default: :func:`default_interval`), or
    ``{"low": None, "high": None, "method": None, "reason"}`` for a metric with no interval. The basic and
    bias-corrected methods need the ``estimate``. With ``hold_estimate`` (and an estimate) the interval is widened
    to hold the estimate: a report prints each value with its interval, and a biased metric's resampled values can
    all lie on one side of it (the percentile interval of a calibrated model's binned ECE above it, the basic
    interval then below it); widening never lowers the coverage (the coverage study measures the widened ones)."""
    reason = ""
    if method is None:
        method, reason = default_interval(name)
    if method is None:
        return {"low": None, "high": None, "method": None, "reason": reason}
    if method not in ("percentile", "upper") and (estimate is None or not math.isfinite(float(estimate))):
        raise ValueError(f"the {method} interval of {name!r} needs its finite estimate, got {estimate!r}")
    low, high = interval_method(method)(values, None if estimate is None else float(estimate), level)
    if method in ("basic", "symmetric") and float(values.min()) >= 0.0 and float(estimate) >= 0.0:
        low = max(low, 0.0)  # a reflected interval of a non-negative metric: below 0 it covers nothing more
    if method in ("basic", "symmetric") and name in AT_MOST_ONE:
        high = min(high, 1.0)  # a reflected interval of a rate or an area: above 1 it covers nothing more
    if hold_estimate and estimate is not None:
        low, high = min(low, float(estimate)), max(high, float(estimate))
    return {"low": low, "high": high, "method": method}


def no_interval_line(intervals, labels: Optional[Dict[str, str]] = None) -> str:
    """One line naming the metrics whose interval is a one-sided upper bound, and each metric shown without an
    interval and why (``""`` when neither): ``intervals`` is any nesting of dicts whose leaves are the
    ``{"low", "high", ...}`` of :func:`interval_of`; ``labels`` maps a metric's name to the report's words."""
    reasons: Dict[str, str] = {}
    bounds: Dict[str, None] = {}

    def walk(node, key=None):
        if isinstance(node, dict) and "low" in node:
            if node["low"] is None and key is not None:
                reasons.setdefault(key, node.get("reason", ""))
            elif node.get("method") in ONE_SIDED and key is not None:
                bounds[key] = None
        elif isinstance(node, dict):
            for k, v in node.items():
                walk(v, k)

    walk(intervals)
    labels = labels or {}
    parts = []
    if bounds:
        parts.append(", ".join(labels.get(k, k) for k in bounds) + ": one-sided upper bounds [0, high] (biased "
                     "upwards, their two-sided intervals miss a calibrated model's 0).")
    parts += [f"{labels.get(k, k)} has no interval: {why}." for k, why in reasons.items()]
    return " ".join(parts)
