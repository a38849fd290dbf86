"""Statistics over training seeds: methods trained at the same seeds compared by the paired t-interval of their
differences, a family of such comparisons by Holm's correction, and the mean ± sample standard deviation of a
method's seeds. One module for ``timm-csm-compare`` and the benchmark pages.

:func:`paired_t_interval`: the interval of a difference between two methods trained at the same seeds;
:func:`holm`: the family's adjusted p-values and decisions at a family-wise alpha; :func:`paired_outcome`: whether
an interval lies below 0, above it, or holds it; :func:`interval_text` and :func:`mean_std` as reports show them;
:func:`detectable_difference`: the power of such a comparison, as the smallest true difference it detects.
"""
from __future__ import annotations

import math
from typing import Hashable, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from .intervals import DEFAULT_LEVEL

__all__ = ["PairedInterval", "paired_t_interval", "holm", "paired_outcome", "interval_text", "mean_std",
           "detectable_difference"]


class PairedInterval(NamedTuple):
    """Paired differences ``a[s] - b[s]`` over ``n`` common seeds: their ``mean``, its two-sided t-interval
    ``[low, high]`` (mean ± t(1 - (1 - level) / 2, n - 1) sd / sqrt(n)), the paired t-test's two-sided
    ``p_value`` (H0: mean difference 0) and ``sd``, the differences' standard deviation (what the power of the
    comparison, :func:`detectable_difference`, reads)."""

    n: int
    mean: float
    low: float
    high: float
    p_value: float
    sd: float


def _student_t():
    from ..extras import require

    return require("scipy.stats", "paired t-intervals").t  # SciPy: the [calibration] extra


def paired_t_interval(a: Mapping[Hashable, float], b: Mapping[Hashable, float],
                      level: float = DEFAULT_LEVEL) -> Optional[PairedInterval]:
    """The :class:`PairedInterval` of ``a`` minus ``b`` (values by seed) over their common seeds; None below 2."""
    if not 0.0 < float(level) < 1.0:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    seeds = sorted(set(a) & set(b))
    if len(seeds) < 2:
        return None
    d = [float(a[s]) - float(b[s]) for s in seeds]
    n = len(d)
    mean = sum(d) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in d) / (n - 1))
    student_t = _student_t()
    half = float(student_t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n)
    if sd > 0:
        p_value = float(2.0 * student_t.sf(abs(mean) / (sd / math.sqrt(n)), n - 1))
    else:  # every seed gives the same difference
        p_value = 0.0 if mean != 0 else 1.0
    return PairedInterval(n, mean, mean - half, mean + half, p_value, sd)


def holm(p_values: Sequence[float], alpha: float = 0.05) -> Tuple[List[float], List[bool]]:
    """Holm's step-down correction of a family of tests: ``(adjusted p-values, rejections at family-wise
    alpha)``, in the order given. With the p-values sorted, p_(1) <= ... <= p_(m), the adjusted p_(j) is
    max over i <= j of min(1, (m - i + 1) p_(i)), and H_(j) is rejected when it is at most ``alpha`` (the same as
    stopping at the first p_(j) > alpha / (m - j + 1))."""
    if not 0.0 < float(alpha) < 1.0:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    p = [float(v) for v in p_values]
    if any(not 0.0 <= v <= 1.0 for v in p):
        raise ValueError(f"p-values must lie in [0, 1], got {p}")
    m, adjusted, running = len(p), [0.0] * len(p), 0.0
    for rank, i in enumerate(sorted(range(m), key=p.__getitem__)):
        running = max(running, min(1.0, (m - rank) * p[i]))
        adjusted[i] = running
    return adjusted, [v <= alpha for v in adjusted]


def paired_outcome(interval) -> str:
    """``"lower"`` / ``"higher"`` where the interval of ``a - b`` (``(n, mean, low, high, ...)``) lies below /
    above 0, ``"none"`` where it holds 0."""
    _, _, low, high = tuple(interval)[:4]
    return "lower" if high < 0 else "higher" if low > 0 else "none"


def interval_text(interval, digits: int = 2) -> str:
    """``mean [low, high] (n=...)`` of a paired interval (``(n, mean, low, high, ...)``), ``-`` without one."""
    if interval is None:
        return "-"
    n, mean, lo, hi = tuple(interval)[:4]
    return f"{mean:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}] (n={n})"


def mean_std(values: Sequence[float]) -> Tuple[float, Optional[float]]:
    """The mean of ``values`` and their sample standard deviation (None for a single value)."""
    n = len(values)
    if n == 0:
        raise ValueError("mean_std of no values")
    mean = sum(values) / n
    if n < 2:
        return mean, None
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))


def detectable_difference(sd: float, n: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """The smallest true mean difference that the two-sided paired t-test over ``n`` seeds rejects at level
    ``alpha`` with probability ``power``, for per-seed differences of standard deviation ``sd`` (exact: the
    noncentral t distribution, not the normal approximation)."""
    if n < 2 or not sd >= 0 or not 0.0 < alpha < 1.0 or not 0.0 < power < 1.0:
        raise ValueError(f"need n >= 2, sd >= 0 and alpha, power in (0, 1); got n={n}, sd={sd}, alpha={alpha}, "
                         f"power={power}")
    if sd == 0:
        return 0.0
    from ..extras import require

    stats = require("scipy.stats", "power calculations")
    optimize = require("scipy.optimize", "power calculations")
    df, scale = n - 1, math.sqrt(n) / sd
    crit = float(stats.t.ppf(1.0 - alpha / 2.0, df))

    def shortfall(delta: float) -> float:  # rejection probability (both tails) at true difference delta, minus power
        nc = delta * scale
        far_tail = float(stats.nct.cdf(-crit, df, nc))  # negligible here; NaN in SciPy for a large nc
        return float(stats.nct.sf(crit, df, nc)) + (far_tail if far_tail == far_tail else 0.0) - power

    normal = (crit + float(stats.norm.ppf(power))) / scale  # the normal approximation, below the exact answer
    return float(optimize.brentq(shortfall, 0.0, 3.0 * normal))
