"""Choosing a calibrator by k-fold cross-validation on the calibration split (the one ``timm-csm-calibrate``
exports among several listed, or among every one that applies with ``--calibrators auto``).

The calibration split's samples are dealt into ``folds`` folds, stratified by class (a seeded permutation, then
the samples of each class in turn, so that every fold holds about the same share of every class). Each candidate is
fitted on all folds but one and scored on the one left out, by NLL (a proper scoring rule: it rewards calibration
and sharpness together) or by ECE; the candidate with the lowest mean over the folds is chosen, ties going to the
first candidate. The caller fits the chosen calibrator again on the whole split. A candidate whose fit fails on a
fold is scored +inf there and named in the table with its error.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from ..extras import MissingExtra
from ..metrics import DEFAULT_N_BINS, ece, metrics_for, nll
from ._checks import as_logits, as_targets
from .registry import calibrator_spec, create_calibrator, list_calibrators

__all__ = ["SELECTION_METRICS", "auto_candidates", "fold_assignment", "select_calibrator", "fold_table_markdown"]

#: the metrics a calibrator is chosen by: the metric table's ``"calibrator_selection"`` view
SELECTION_METRICS = tuple(metrics_for("calibrator_selection"))


def auto_candidates(num_classes: int, n_samples: int, folds: int = 5) -> Tuple[List[str], Dict[str, str]]:
    """The registered calibrators that apply to ``num_classes`` classes and ``n_samples`` calibration samples
    split into ``folds`` folds (their capabilities, :meth:`~timm_csm.calibration.CalibratorSpec.unmet`, on one
    training fold), and ``{name: why not}`` for the others."""
    chosen, left_out = [], {}
    train_size = n_samples * (folds - 1) // folds
    for name in list_calibrators():
        why = calibrator_spec(name).unmet(num_classes, train_size, "each training fold")
        if why is not None:
            left_out[name] = why
        else:
            try:
                create_calibrator(name)  # its fit's optional dependencies (isotonic: SciPy's isotonic_regression)
            except MissingExtra as e:
                left_out[name] = str(e)
                continue
            chosen.append(name)
    return chosen, left_out


def fold_assignment(targets: torch.Tensor, folds: int, seed: int = 0) -> torch.Tensor:
    """``(N,)`` fold index of each sample, stratified by class (see the module docstring)."""
    n = targets.numel()
    if isinstance(folds, bool) or not isinstance(folds, int) or not 2 <= folds <= n:
        raise ValueError(f"folds must be an integer from 2 to the number of samples ({n}), got {folds!r}")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(int(seed)))
    order = order[torch.argsort(targets.cpu()[order], stable=True)]  # by class, shuffled within each class
    assignment = torch.empty(n, dtype=torch.long)
    assignment[order] = torch.arange(n) % folds
    return assignment


def _score(by: str, logits: torch.Tensor, targets: torch.Tensor, n_bins: int) -> float:
    return nll(logits, targets) if by == "nll" else ece(logits, targets, n_bins)


def select_calibrator(logits, targets, names: Sequence[str], folds: int = 5, by: str = "nll", seed: int = 0,
                      n_bins: int = DEFAULT_N_BINS, options: Optional[Mapping[str, Mapping[str, Any]]] = None
                      ) -> Tuple[str, Dict[str, Any]]:
    """``(name, fold table)``: the calibrator of ``names`` with the lowest mean ``by`` (``"nll"`` or ``"ece"``
    with ``n_bins`` bins) over the ``folds`` held-out folds of ``(logits, targets)``; ``options``: keyword
    arguments per name for :func:`create_calibrator`. The table: ``{"by", "folds", "seed", "fold_sizes",
    "scores": {name: [per fold]}, "mean": {name: mean}, "errors": {name: message}, "chosen"}``."""
    if by not in SELECTION_METRICS:
        raise ValueError(f"select the calibrator by one of {SELECTION_METRICS}, got {by!r}")
    names = list(dict.fromkeys(names))
    if not names:
        raise ValueError("no candidate calibrator to choose from")
    options = options or {}
    for name in names:
        create_calibrator(name, **options.get(name, {}))  # unknown names and bad options: one line, before fitting
    logits = as_logits(logits)
    targets = as_targets(targets, logits.shape[0], logits.shape[1])
    assignment = fold_assignment(targets, folds, seed)
    scores: Dict[str, List[float]] = {name: [] for name in names}
    errors: Dict[str, str] = {}
    for fold in range(folds):
        held_out = assignment == fold
        for name in names:
            try:
                calibrator = create_calibrator(name, **options.get(name, {})).fit(logits[~held_out],
                                                                                 targets[~held_out])
                value = _score(by, calibrator.transform(logits[held_out]), targets[held_out], n_bins)
            except ValueError as e:  # e.g. a fold without some class for a per-class calibrator
                errors.setdefault(name, f"fold {fold}: {str(e).splitlines()[0]}")
                value = math.inf
            scores[name].append(float(value))
    mean = {name: sum(v) / folds for name, v in scores.items()}
    chosen = min(names, key=lambda name: mean[name])
    if not math.isfinite(mean[chosen]):
        raise ValueError(f"no candidate calibrator could be fitted on every fold: {errors}")
    table = {"by": by, "folds": folds, "seed": int(seed),
             "fold_sizes": torch.bincount(assignment, minlength=folds).tolist(), "scores": scores, "mean": mean,
             "errors": errors, "chosen": chosen}
    return chosen, table


def fold_table_markdown(table: Mapping[str, Any]) -> str:
    """The fold table as markdown: one row per candidate, its score on each held-out fold and the mean."""
    folds = table["folds"]
    lines = ["| calibrator | " + " | ".join(f"fold {i} (n={table['fold_sizes'][i]})" for i in range(folds))
             + f" | mean {table['by'].upper()} |", "|---|" + "---|" * (folds + 1)]
    for name, values in table["scores"].items():
        mark = " (chosen)" if name == table["chosen"] else ""
        cells = ["failed" if not math.isfinite(v) else f"{v:.4f}" for v in values + [table["mean"][name]]]
        lines.append(f"| {name}{mark} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
