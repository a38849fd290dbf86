"""Stage 2 of a study: the primary comparisons and their decision under Holm's correction.

A primary comparison is one setting's chosen row (CSM's) minus another method's, on one test metric, paired over
the decision seeds (:func:`timm_csm.metrics.paired_t_interval`). Every primary comparison of the study is one Holm
family at the family-wise alpha (:func:`timm_csm.metrics.holm`). "The method calibrates better" holds in a setting
iff each of its primary comparisons rejects under Holm with a negative mean difference; "does not hold" otherwise;
"pending" everywhere while any comparison lacks a choice or has fewer paired seeds than required (the decision is
made at the pre-registered number of seeds, never before).

:func:`comparison_pairs` names the comparisons from stage 1's choices (``"best_other"``: the best other method of
the metric's phase); :func:`decide` returns a :class:`Decision`.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, Mapping, NamedTuple, Optional, Sequence, Tuple

from ..extras import require
from ..metrics import PairedInterval, detectable_difference, holm, metric_spec, metrics_for, paired_t_interval

__all__ = ["HOLDS", "DOES_NOT_HOLD", "PENDING", "FAMILY_ALPHA", "POWER", "ROW_METRICS", "BEST_OTHER", "Comparison",
           "Decision", "values_by_seed", "metric_phase", "comparison_pairs", "decide", "Power", "decision_power"]

HOLDS, DOES_NOT_HOLD, PENDING = "holds", "does not hold", "pending"
#: the family-wise error rate of Holm's correction, and the power a detectable difference is stated at (PROTOCOL.md)
FAMILY_ALPHA, POWER = 0.05, 0.8
#: the metrics of a per-seed row (:func:`timm_csm.recipes.cells.per_seed_row`), by abbreviation (``acc`` is
#: accuracy): the metric table's ``"per_seed"`` view
ROW_METRICS = tuple(metric_spec(name).abbrev for name in metrics_for("per_seed"))
#: the role that stands for the best other method of a setting (stage 1's choice in the metric's phase)
BEST_OTHER = "best_other"


@dataclasses.dataclass(frozen=True)
class Comparison:
    """``method`` minus ``other`` in ``setting`` (either None while its choice is pending): the paired ``test``
    (None while pending), and once the family is complete its Holm-adjusted p-value ``p_holm`` and whether the
    method is ``lower`` under Holm (rejected with a negative mean difference)."""

    setting: str
    method: Optional[str]
    other: Optional[str]
    test: Optional[PairedInterval] = None
    p_holm: Optional[float] = None
    lower: Optional[bool] = None


@dataclasses.dataclass(frozen=True)
class Decision:
    """The primary comparisons in order and each setting's verdict (:data:`HOLDS`, :data:`DOES_NOT_HOLD` or
    :data:`PENDING`)."""

    comparisons: Tuple[Comparison, ...]
    verdicts: Mapping[str, str]


def values_by_seed(rows: Sequence[Mapping[str, Any]], key: str) -> Dict[int, float]:
    """``{seed: value of key}`` of the per-seed rows that have it."""
    return {r["seed"]: r[key] for r in rows if r.get(key) is not None}


def metric_phase(metric: str) -> str:
    """``"pre_ts"`` or ``"post_ts"``: the phase of a per-seed row key ``<metric>_<phase>`` such as ``ece_pre_ts``
    (the metric one of :data:`ROW_METRICS`)."""
    name, _, phase = metric.partition("_")
    if phase not in ("pre_ts", "post_ts") or name not in ROW_METRICS:
        raise ValueError(f"{metric!r} is no per-seed metric: <metric>_pre_ts or <metric>_post_ts with a metric of "
                         f"{', '.join(ROW_METRICS)}")
    return phase


def comparison_pairs(choices: Mapping[str, Mapping[str, Any]], others: Sequence[str], metric: str = "ece_pre_ts"
                     ) -> Tuple[Tuple[str, Optional[str], Optional[str]], ...]:
    """``(setting, row, other)`` of each primary comparison: per setting of ``choices`` (stage 1's choices,
    :func:`~.choose.stage1_choices`, in order), its chosen row minus each of ``others``, a configuration or
    :data:`BEST_OTHER`."""
    phase = metric_phase(metric)
    return tuple((setting, ch["csm"], ch["best_other"][phase] if other == BEST_OTHER else other)
                 for setting, ch in choices.items() for other in others)


def decide(pairs: Sequence[Tuple[str, Optional[str], Optional[str]]],
           rows: Mapping[str, Mapping[str, Sequence[Mapping[str, Any]]]], required_seeds: int,
           metric: str = "ece_pre_ts", alpha: float = FAMILY_ALPHA) -> Decision:
    """The decision over the primary comparisons ``pairs`` (``(setting, method, other)``), read from each setting's
    per-seed ``rows`` (``{setting: {configuration: rows}}``): the paired interval of ``metric`` over the common
    seeds, a comparison pending below ``required_seeds`` of them; Holm over the family at ``alpha`` once none is
    pending."""
    if required_seeds < 2:
        raise ValueError(f"a paired decision needs at least 2 seeds, got required_seeds={required_seeds}")
    settings = tuple(dict.fromkeys(setting for setting, _, _ in pairs))
    tests = []
    for setting, method, other in pairs:
        test = None
        if method and other:
            found = rows.get(setting, {})
            test = paired_t_interval(values_by_seed(found.get(method, ()), metric),
                                     values_by_seed(found.get(other, ()), metric))
        tests.append(test if test is not None and test.n >= required_seeds else None)
    if any(t is None for t in tests):
        return Decision(tuple(Comparison(s, m, o, t) for (s, m, o), t in zip(pairs, tests)),
                        dict.fromkeys(settings, PENDING))
    adjusted, rejections = holm([t.p_value for t in tests], alpha)
    comparisons = tuple(Comparison(s, m, o, t, p, bool(rejected and t.mean < 0))
                        for (s, m, o), t, p, rejected in zip(pairs, tests, adjusted, rejections))
    verdicts = {setting: HOLDS if all(c.lower for c in comparisons if c.setting == setting) else DOES_NOT_HOLD
                for setting in settings}
    return Decision(comparisons, verdicts)


class Power(NamedTuple):
    """What ``n`` paired seeds resolve at paired sd ``sd``: the 95% t-interval's ``half_width``, and the smallest true
    difference the two-sided paired t-test detects with the stated power at ``alpha`` (``detectable``) and at Holm's
    strictest level ``strictest_alpha`` (alpha over the family's comparisons: ``detectable_strictest``)."""

    n: int
    sd: float
    half_width: float
    alpha: float
    detectable: float
    strictest_alpha: float
    detectable_strictest: float


def decision_power(sd: float, n: int, comparisons: int, alpha: float = FAMILY_ALPHA, power: float = POWER) -> Power:
    """The :class:`Power` of a decision over ``n`` seeds whose Holm family has ``comparisons`` tests at family-wise
    ``alpha`` (:func:`timm_csm.metrics.detectable_difference`)."""
    if comparisons < 1:
        raise ValueError(f"a decision has at least one comparison, got {comparisons}")
    t = require("scipy.stats", "power calculations").t
    half = float(t.ppf(0.975, n - 1)) * sd / math.sqrt(n)
    strictest = alpha / comparisons
    return Power(n, sd, half, alpha, detectable_difference(sd, n, alpha, power), strictest,
                 detectable_difference(sd, n, strictest, power))
