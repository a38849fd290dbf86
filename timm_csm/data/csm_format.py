"""The CSM dataset format: columns, ``datasets`` features, and the checks every reader and writer applies.

A raw generation folder holds, per image, the columns :data:`RAW_COLUMNS` (one *group* = one seed and one class
pair (a, b) rendered at every value of the lambda grid, Luo et al., ICML 2025, section 3.1). The annotated dataset
that training reads and the Hub publishes has exactly :data:`CSM_COLUMNS`, with the features of
:func:`csm_features`. Soft labels are float32 rows that sum to 1 within
:data:`~timm_csm.metrics.inputs.ROW_SUM_ATOL`, the one tolerance of every such check (annotation, publishing,
training, the losses and the metrics).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from ..metrics.inputs import ROW_SUM_ATOL

__all__ = ["RAW_COLUMNS", "CSM_COLUMNS", "REQUIRED_CSM_COLUMNS", "csm_features", "csm_dataset_from_columns",
           "check_class_names", "check_soft_labels", "GroupCheck", "check_groups"]

# raw generated shards carry at least these
RAW_COLUMNS = ("image", "group_id", "seed", "class_a", "class_b", "lambda_gen")
# the annotated dataset, in this order
CSM_COLUMNS = ("image", "label", "soft_label", "class_a", "class_b", "lambda_gen", "lambda_hat", "group_id", "seed")
# what training needs of an annotated dataset (``lambda_gen`` optional)
REQUIRED_CSM_COLUMNS = ("image", "soft_label", "class_a", "class_b", "group_id")
_LAMBDA_TOL = 1e-5


def csm_features(class_names: Sequence[str]):
    """``datasets.Features`` of an annotated CSM dataset.

    ``image`` Image; ``label`` ClassLabel (the dominant class of the soft label); ``soft_label`` Sequence of float32,
    length K, rows sum to 1; ``class_a``, ``class_b`` ClassLabel (the mixed pair); ``lambda_gen`` float32 (the
    weight of class_a in the generation condition); ``lambda_hat`` float32 (the projection coefficient);
    ``group_id``, ``seed`` int64.
    """
    import datasets

    names = [str(n) for n in class_names]
    if len(set(names)) != len(names):
        raise ValueError(f"class names must be unique, got {names}")
    return datasets.Features({
        "image": datasets.Image(),
        "label": datasets.ClassLabel(names=names),
        "soft_label": datasets.Sequence(datasets.Value("float32")),
        "class_a": datasets.ClassLabel(names=names),
        "class_b": datasets.ClassLabel(names=names),
        "lambda_gen": datasets.Value("float32"),
        "lambda_hat": datasets.Value("float32"),
        "group_id": datasets.Value("int64"),
        "seed": datasets.Value("int64"),
    })


def csm_dataset_from_columns(columns, class_names: Sequence[str]):
    """A ``datasets.Dataset`` of :func:`csm_features` from Python columns, row order kept: every one of
    :data:`CSM_COLUMNS` but ``label``, which defaults to each soft label's dominant class (its first maximum).
    ``image`` takes what ``datasets.Image`` encodes: PIL images, uint8 arrays, ``{"bytes", "path"}`` dicts."""
    import datasets

    missing = [c for c in CSM_COLUMNS if c not in columns and c != "label"]
    extra = sorted(set(columns) - set(CSM_COLUMNS))
    if missing or extra:
        raise ValueError(f"CSM columns are {list(CSM_COLUMNS)}; missing {missing}, unknown {extra}")
    columns = dict(columns)
    if "label" not in columns:
        columns["label"] = [int(np.argmax(q)) for q in columns["soft_label"]]
    return datasets.Dataset.from_dict({c: list(columns[c]) for c in CSM_COLUMNS}, features=csm_features(class_names))


def check_class_names(names: Sequence[str], expected: Sequence[str], what: str = "generated data",
                      reference: str = "the real dataset") -> None:
    """ValueError naming the differences when two class-name lists differ (count, or names position by position).

    ``what`` names the data whose classes are checked, ``reference`` the data they must match.
    """
    names, expected = [str(n) for n in names], [str(n) for n in expected]
    if names == expected:
        return
    if len(names) != len(expected):
        raise ValueError(f"the class names of the {what} do not match {reference} ({len(expected)} classes): the "
                         f"{what} has {len(names)} classes, {reference} {len(expected)} ({names[:12]} vs "
                         f"{expected[:12]})")
    diffs = [f"{i}: {a!r} != {b!r}" for i, (a, b) in enumerate(zip(names, expected)) if a != b]
    raise ValueError(f"the class names of the {what} differ from {reference}'s at {len(diffs)} position(s): "
                     + "; ".join(diffs[:5]) + (" ..." if len(diffs) > 5 else "")
                     + "; use data made for the same classes, in the same order")


def check_soft_labels(soft, num_classes: Optional[int] = None) -> None:
    """ValueError naming the first bad row of soft labels (N, K): wrong width, NaN or inf, negative values, or a
    row whose sum (in float64) is off 1 by more than :data:`~timm_csm.metrics.inputs.ROW_SUM_ATOL`."""
    soft = np.asarray(soft)
    if soft.dtype == object or soft.ndim != 2:
        lengths = sorted({len(r) for r in soft}) if soft.dtype == object else [soft.shape[1:]]
        raise ValueError(f"soft_label rows must all have length K={num_classes}, found lengths {lengths[:5]}")
    if num_classes is not None and soft.shape[1] != num_classes:
        raise ValueError(f"soft_label rows have length {soft.shape[1]}, expected K={num_classes}")
    finite = np.isfinite(soft).all(1)
    if not finite.all():
        raise ValueError(f"soft_label holds NaN or inf (first row {int(np.flatnonzero(~finite)[0])})")
    negative = (soft < 0).any(1)
    if negative.any():
        raise ValueError(f"soft_label holds negative values (first row {int(np.flatnonzero(negative)[0])})")
    sums = soft.astype(np.float64).sum(1)
    off = np.flatnonzero(np.abs(sums - 1.0) > ROW_SUM_ATOL)
    if len(off):
        raise ValueError(f"{len(off)} soft_label row(s) do not sum to 1 within {ROW_SUM_ATOL:g} (first: row "
                         f"{off[0]}, sum {sums[off[0]]:.6f}); normalise the rows")


@dataclass
class GroupCheck:
    """Result of :func:`check_groups`: groups whose members do not cover the lambda grid exactly once."""

    num_groups: int
    bad_group_ids: np.ndarray
    bad_rows: np.ndarray  # boolean mask over rows
    message: str

    @property
    def ok(self) -> bool:
        return len(self.bad_group_ids) == 0


def _nearest_on_grid(lam: np.ndarray, grid: np.ndarray, gid: np.ndarray) -> np.ndarray:
    """Index of the nearest grid value of each lambda; ValueError when one lies off the grid."""
    pos = np.clip(np.searchsorted(grid, lam), 0, len(grid) - 1)
    left = np.clip(pos - 1, 0, len(grid) - 1)
    nearest = np.where(np.abs(grid[left] - lam) < np.abs(grid[pos] - lam), left, pos)
    off = np.abs(grid[nearest] - lam) > _LAMBDA_TOL
    if off.any():
        i = int(np.flatnonzero(off)[0])
        raise ValueError(f"{int(off.sum())} row(s) have lambda_gen off the grid {grid.round(6).tolist()} "
                         f"(first: row {i}, group_id {gid[i]}, lambda_gen {lam[i]:.6f})")
    return nearest


def _check_constant_per_group(uniq: np.ndarray, inverse: np.ndarray, name: str, col) -> None:
    if col is None:
        return
    col = np.asarray(col, dtype=np.int64)
    lo = np.full(len(uniq), np.iinfo(np.int64).max)
    hi = np.full(len(uniq), np.iinfo(np.int64).min)
    np.minimum.at(lo, inverse, col)
    np.maximum.at(hi, inverse, col)
    bad = np.flatnonzero(lo != hi)
    if len(bad):
        raise ValueError(f"{len(bad)} group(s) mix different {name} values among their members "
                         f"(first: group_id {uniq[bad[0]]})")


def check_groups(group_id, lambda_gen, lambdas: Sequence[float], seed=None, class_a=None, class_b=None) -> GroupCheck:
    """Find the groups whose members are not exactly one image per value of the lambda grid.

    Raises ValueError for data that is wrong rather than incomplete: a lambda off the grid, or members of one group
    that disagree on seed or class pair.
    """
    gid = np.asarray(group_id, dtype=np.int64)
    lam = np.asarray(lambda_gen, dtype=np.float64)
    grid = np.asarray(sorted(float(v) for v in lambdas), dtype=np.float64)
    if len(grid) == 0:
        raise ValueError("empty lambda grid")
    if len(gid) == 0:
        return GroupCheck(0, np.zeros(0, np.int64), np.zeros(0, bool), "")
    nearest = _nearest_on_grid(lam, grid, gid)
    uniq, inverse, counts = np.unique(gid, return_inverse=True, return_counts=True)
    for name, col in (("seed", seed), ("class_a", class_a), ("class_b", class_b)):
        _check_constant_per_group(uniq, inverse, name, col)
    # distinct grid points per group: count unique (group, grid index) pairs
    pair = inverse * len(grid) + nearest
    distinct = np.bincount(np.unique(pair) // len(grid), minlength=len(uniq))
    bad = (counts != len(grid)) | (distinct != len(grid))
    bad_ids = uniq[bad]
    message = ""
    if len(bad_ids):
        fewer = int((counts[bad] < len(grid)).sum())
        examples = ", ".join(f"{g} ({c} rows)" for g, c in zip(bad_ids[:5], counts[bad][:5]))
        message = (f"{len(bad_ids)} of {len(uniq)} groups do not hold one image per lambda of the {len(grid)}-value "
                   f"grid ({fewer} have fewer members, {len(bad_ids) - fewer} have repeated or extra members); "
                   f"e.g. group_id {examples}")
    return GroupCheck(len(uniq), bad_ids, bad[inverse], message)
