"""The pieces a study's page is made of (:mod:`.report`): a number, a mean ± sd over seeds, a paired interval of
two rows over common seeds, a stage-1 grid's lines, a decision's power, a verify run's differences in words, and a
method's JSON row with every seed's numbers."""
from __future__ import annotations

import re
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ..metrics import PairedInterval, detectable_difference, interval_text, mean_std, paired_t_interval
from .choose import seed_mean
from .decide import values_by_seed
from .methods import get_method

__all__ = ["fmt", "seed_range", "mean_cell", "only_seeds", "paired", "spread", "grid_lines", "test_text",
           "power_text",
           "differences_text", "per_seed_json_row"]

Rows = Mapping[str, Sequence[Mapping[str, Any]]]


def fmt(value: Optional[float], digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def seed_range(seeds: Sequence[int]) -> str:
    """``0-14`` for a run of seeds, else the seeds listed."""
    seeds = sorted(seeds)
    if seeds == list(range(seeds[0], seeds[-1] + 1)) and len(seeds) > 1:
        return f"{seeds[0]}-{seeds[-1]}"
    return ", ".join(map(str, seeds))


def mean_cell(rows: Sequence[Mapping[str, Any]], key: str, digits: int) -> str:
    """``mean ± sd`` of ``key`` over the rows that have it, ``-`` where none has."""
    values = [r[key] for r in rows if r.get(key) is not None]
    if not values:
        return "-"
    mean, sd = mean_std(values)
    return f"{mean:.{digits}f}" + (f" ± {sd:.{digits}f}" if sd is not None else "")


def only_seeds(rows: Sequence[Mapping[str, Any]], seeds: Sequence[int]) -> List[Mapping[str, Any]]:
    return [r for r in rows if r["seed"] in seeds]


def paired(rows: Rows, a: str, b: str, key: str, seeds: Sequence[int]) -> Optional[PairedInterval]:
    """The paired interval of ``a`` minus ``b`` over ``seeds`` (``paired_t_interval``), None where either is
    missing."""
    if a not in rows or b not in rows:
        return None
    return paired_t_interval(values_by_seed(only_seeds(rows[a], seeds), key),
                             values_by_seed(only_seeds(rows[b], seeds), key))


def spread(rows: Sequence[Mapping[str, Any]], key: str) -> Optional[PairedInterval]:
    """The mean of ``key`` and its 95% t-interval over the rows (the one-sample case of a paired interval)."""
    values = values_by_seed(rows, key)
    return paired_t_interval(values, dict.fromkeys(values, 0.0))


def grid_lines(rows: Rows, names: Sequence[str], pick: Optional[str], tuning_seeds: Sequence[int]) -> List[str]:
    """One table line per configuration of a stage-1 grid: its seeds among ``tuning_seeds``, and its mean validation
    ECE, NLL, validation ECE after TS and (reported only) test ECE before and after TS over them; ``pick`` marked."""
    lines = []
    for m in names:
        r = rows.get(m, [])
        seeds = [x["seed"] for x in r if x["seed"] in tuning_seeds]
        # the means over the seeds finished so far (a choice waits for all of them)
        means = [seed_mean(r, k, seeds) if seeds else None for k in ("val_ece_pre_ts", "val_nll_pre_ts",
                                                                      "val_ece_post_ts", "ece_pre_ts", "ece_post_ts")]
        label = get_method(m).label + (" **(chosen)**" if m == pick else "")
        lines.append(f"| {label} | {len(seeds)} | " + " | ".join(
            fmt(v, 4 if i == 1 else 2) for i, v in enumerate(means)) + " |")
    return lines


def test_text(test: Optional[PairedInterval]) -> str:
    return "pending" if test is None else interval_text(test)


def power_text(test: Optional[PairedInterval], family_alpha: float, comparisons: int) -> str:
    """The comparison's paired sd and the smallest true difference its seeds detect with 80% power, at alpha 0.05
    and at Holm's strictest level over the family (``family_alpha`` over ``comparisons``)."""
    if test is None:
        return "- | -"
    strictest = family_alpha / comparisons
    return (f"{test.sd:.2f} | {detectable_difference(test.sd, test.n):.2f} / "
            f"{detectable_difference(test.sd, test.n, strictest):.2f}")


def differences_text(differences: Sequence[str]) -> str:
    """``N difference(s)``, with the largest relative one among the numbers and the result fields they are in (so
    a reader tells a rounding-level change in the metrics' arithmetic from a different training)."""
    relative, fields = [], set()
    for line in differences:
        match = re.fullmatch(r"(\S+): committed (\S+), now (\S+)", line)
        try:
            before, after = float(match.group(2)), float(match.group(3))
        except (AttributeError, ValueError):
            continue
        relative.append((abs(after - before) / max(abs(before), 1e-12), match.group(1)))
        fields.add(re.sub(r"\[\d+\]", "", match.group(1)).rsplit(".", 1)[-1])
    text = f"{len(differences)} difference(s)"
    if relative:
        size, where = max(relative)
        text += (f", {len(relative)} of them numbers, the largest {size:.2g} relative (`{where}`), in "
                 f"{', '.join(sorted(fields))}")
    return text


def per_seed_json_row(method: str, rows: List[Dict[str, Any]], **fields: Any) -> Dict[str, Any]:
    """The JSON row of ``method``'s per-seed rows (:func:`timm_csm.recipes.cells.per_seed_row`): ``method``,
    ``label``, ``fields``, ``seeds``, ``per_seed``, then each numeric field of the rows as ``{"mean", "std"}`` over the
    seeds (std None for one seed)."""
    out: Dict[str, Any] = {"method": method, "label": get_method(method).label, **fields,
                           "seeds": [r["seed"] for r in rows], "per_seed": rows}
    for key in [k for k in rows[0] if k != "seed"]:
        values = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
        if values:
            mean, sd = mean_std(values)
            out[key] = {"mean": mean, "std": sd}
    return out
