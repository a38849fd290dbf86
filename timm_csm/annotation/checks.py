"""Checks of an annotated CSM dataset: how soft its labels are, and which groups the encoder does not read as a morph.

Re-annotation assumes that the projection coefficient lambda-hat of a group's members grows with the generation
weight lambda (class a's share of the condition), and that the pure endpoints look like their classes. A group
breaks the first when its lambda-hat is not monotone in lambda (Spearman's rank correlation below a threshold), the
second when its lambda = 1 member projects nearer class b (lambda-hat < 1/2) or its lambda = 0 member nearer class a.
:func:`annotation_report` counts both and summarises max_k q_k, the confidence the soft labels ask of a classifier;
:func:`drop_groups` removes flagged groups so their effect on training can be measured.

:func:`generator_problems` reads a report as a verdict on the generator: pure-class images recognised near chance
(by the nearest real-class prototype, among all classes) or most groups flagged mean that the groups do not show
their classes, and soft labels computed from them contradict their images (a CSM classifier trained on such a set
was measured worse calibrated than cross-entropy). A good small generator has about a quarter of its groups flagged
and its pure-class images recognised well above chance (``benchmarks/calibration.md``).
"""
from __future__ import annotations

from typing import Dict, List, Sequence

import numpy as np

from ..data.lazy import column_arrays
from .config import DEFAULTS

__all__ = ["group_spearman", "flag_groups", "soft_label_confidence", "annotation_report", "drop_groups",
           "generator_problems", "generator_verdict", "MAX_FLAGGED_SHARE", "MIN_RECOGNITION_SKILL", "RECOGNISER"]

#: what recognises a pure-class image in the generator check: its nearest real-class prototype among all classes, in
#: the annotation encoder's feature space (``label_groups.pure_member_recognition``)
RECOGNISER = "nearest real-class prototype"
#: more than this share of the groups flagged: the generator is poor
MAX_FLAGGED_SHARE = 0.5
#: pure-class recognition less than this share of the way from chance (1/K) to perfect: near chance
MIN_RECOGNITION_SKILL = 0.25


def _ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks, tied values sharing the mean of their ranks (as Spearman's rho needs)."""
    order = np.argsort(x, kind="stable")
    position = np.empty(len(x), dtype=np.int64)
    position[order] = np.arange(len(x))
    sorted_x = x[order]
    starts = np.r_[True, sorted_x[1:] != sorted_x[:-1]]  # first member of each run of equal values
    run = np.cumsum(starts)[position] - 1  # run index of every element
    edges = np.r_[np.flatnonzero(starts), len(x)]  # run k spans sorted positions edges[k] .. edges[k+1] - 1
    return 0.5 * (edges[run] + edges[run + 1] - 1) + 1.0


def group_spearman(group_id, lambda_gen, lambda_hat) -> Dict[int, float]:
    """Spearman's rho between lambda_gen and lambda_hat within each group ({group_id: rho}); 1 = monotone.

    A group with fewer than 2 members, or whose lambda-hat is constant, gets NaN (no order to test).
    """
    gid = np.asarray(group_id, dtype=np.int64)
    lam = np.asarray(lambda_gen, dtype=np.float64)
    hat = np.asarray(lambda_hat, dtype=np.float64)
    if not (gid.shape == lam.shape == hat.shape) or gid.ndim != 1:
        raise ValueError(f"group_id, lambda_gen and lambda_hat must be 1-D of one length, got {gid.shape}, "
                         f"{lam.shape}, {hat.shape}")
    if not (np.isfinite(lam).all() and np.isfinite(hat).all()):
        raise ValueError("lambda_gen and lambda_hat must be finite")
    out: Dict[int, float] = {}
    order = np.argsort(gid, kind="stable")
    bounds = np.flatnonzero(np.diff(gid[order])) + 1
    for rows in np.split(order, bounds):
        if len(rows) == 0:
            continue
        ra, rb = _ranks(lam[rows]), _ranks(hat[rows])
        ra, rb = ra - ra.mean(), rb - rb.mean()
        denom = np.sqrt((ra ** 2).sum() * (rb ** 2).sum())
        out[int(gid[rows[0]])] = float((ra * rb).sum() / denom) if len(rows) > 1 and denom > 0 else float("nan")
    return out


def flag_groups(group_id, lambda_gen, lambda_hat,
                min_spearman: float = DEFAULTS.min_spearman) -> Dict[str, np.ndarray]:
    """Group ids flagged as ``not_monotone`` (Spearman rho < ``min_spearman``, or undefined) and as
    ``endpoint_misread`` (the lambda = 1 member has lambda-hat < 1/2, or the lambda = 0 member > 1/2)."""
    rho = group_spearman(group_id, lambda_gen, lambda_hat)
    not_monotone = np.array(sorted(g for g, r in rho.items() if not r >= min_spearman), dtype=np.int64)
    gid = np.asarray(group_id, dtype=np.int64)
    lam = np.asarray(lambda_gen, dtype=np.float64)
    hat = np.asarray(lambda_hat, dtype=np.float64)
    misread = ((lam == 1.0) & (hat < 0.5)) | ((lam == 0.0) & (hat > 0.5))
    return {"not_monotone": not_monotone, "endpoint_misread": np.unique(gid[misread])}


def soft_label_confidence(soft_labels, quantiles: Sequence[float] = (0.1, 0.25, 0.5, 0.75, 0.9)) -> Dict:
    """Distribution of max_k q_k over the rows of ``soft_labels`` (N, K): mean, quantiles, and the share of rows
    above 0.9 and 0.99 (labels that are in effect one-hot)."""
    q = np.asarray(soft_labels, dtype=np.float64)
    if q.ndim != 2 or q.shape[0] == 0:
        raise ValueError(f"soft_labels must be a non-empty (N, K) array, got shape {q.shape}")
    top = q.max(axis=1)
    return {"mean": float(top.mean()), "quantiles": {f"{p:g}": float(np.quantile(top, p)) for p in quantiles},
            "share_above_0.9": float((top > 0.9).mean()), "share_above_0.99": float((top > 0.99).mean())}


def annotation_report(dataset, min_spearman: float = DEFAULTS.min_spearman) -> Dict:
    """:func:`soft_label_confidence` and :func:`flag_groups` of an annotated CSM ``datasets.Dataset``."""
    cols = column_arrays(dataset, ["group_id", "lambda_gen", "lambda_hat", "soft_label"])
    flags = flag_groups(cols["group_id"], cols["lambda_gen"], cols["lambda_hat"], min_spearman)
    rho = np.array([r for r in group_spearman(cols["group_id"], cols["lambda_gen"], cols["lambda_hat"]).values()])
    either = np.union1d(flags["not_monotone"], flags["endpoint_misread"])
    return {
        "num_groups": int(len(rho)),
        "max_soft_label": soft_label_confidence(np.stack(list(cols["soft_label"]))),
        "spearman_median": float(np.nanmedian(rho)) if np.isfinite(rho).any() else float("nan"),
        "min_spearman": float(min_spearman),
        "not_monotone": int(len(flags["not_monotone"])),
        "endpoint_misread": int(len(flags["endpoint_misread"])),
        "flagged": int(len(either)),
        "flagged_group_ids": either.tolist(),
    }


def drop_groups(dataset, group_ids):
    """``dataset`` without the rows of ``group_ids`` (whole groups, so no group is left incomplete)."""
    group_of_row = column_arrays(dataset, ["group_id"])["group_id"]
    return dataset.select(np.flatnonzero(~np.isin(group_of_row, np.asarray(list(group_ids), dtype=np.int64))))


def generator_problems(report: Dict) -> List[str]:
    """What makes the generator of an annotated set poor, one phrase each (an empty list: none): its pure-class
    images recognised near chance (``report["pure_class_recognition"]``: ``{"accuracy", "chance", "num_images"}``
    and optionally ``"by"``, what recognised them; less than :data:`MIN_RECOGNITION_SKILL` of the way from chance to
    perfect), or more than :data:`MAX_FLAGGED_SHARE` of the groups flagged (``num_groups``, ``flagged``)."""
    problems = []
    recognition = report.get("pure_class_recognition")
    if recognition is not None:
        acc, chance = recognition["accuracy"], recognition["chance"]
        if acc < chance + MIN_RECOGNITION_SKILL * (1.0 - chance):
            by = recognition.get("by", RECOGNISER)
            problems.append(f"pure-class images recognised {acc:.1%}, near chance {chance:.1%} "
                            f"({recognition['num_images']} images, {by})")
    if report.get("num_groups") and report["flagged"] > MAX_FLAGGED_SHARE * report["num_groups"]:
        problems.append(f"{report['flagged']} of {report['num_groups']} groups flagged")
    return problems


def generator_verdict(report: Dict) -> str:
    """The generator check of ``report`` in one line, with its numbers: ``poor: <the problems>`` or ``good enough:
    <the same measures>`` (:func:`generator_problems`)."""
    problems = generator_problems(report)
    if problems:
        return "poor: " + "; ".join(problems)
    measures = []
    recognition = report.get("pure_class_recognition")
    if recognition is not None:
        acc, chance = recognition["accuracy"], recognition["chance"]
        bar = chance + MIN_RECOGNITION_SKILL * (1.0 - chance)
        measures.append(f"pure-class images recognised {acc:.1%}, chance {chance:.1%}, poor below {bar:.1%} "
                        f"({recognition['num_images']} images, {recognition.get('by', RECOGNISER)})")
    if report.get("num_groups"):
        measures.append(f"{report['flagged']} of {report['num_groups']} groups flagged, poor above "
                        f"{MAX_FLAGGED_SHARE:.0%}")
    return "good enough: " + "; ".join(measures)
