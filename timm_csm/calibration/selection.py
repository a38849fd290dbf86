"""Choosing one calibrator among several on the calibration split alone: K-fold cross-validation.

Each candidate is fitted on K - 1 folds of the calibration split and scored on the fold left out; its score is the
negative log-likelihood (a proper scoring rule: it rewards calibration and sharpness together, and needs no bins)
over all held-out predictions, its ECE reported beside it. The lowest NLL is chosen (the first listed on a tie).
The test split takes no part, so the test metrics of the chosen calibrator stay an unbiased estimate.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Sequence

import torch

from ..metrics import ece, nll
from ._checks import as_logits, as_targets
from .factory import create_calibrator

__all__ = ["cross_validated_scores", "select_calibrator"]


def cross_validated_scores(names: Sequence[str], logits, targets, folds: int = 5, seed: int = 0, n_bins: int = 15,
                           make: Callable[[str], Any] = create_calibrator) -> Dict[str, Dict[str, float]]:
    """``{name: {"nll", "ece"}}`` of each calibrator (built by ``make(name)``) on held-out folds of ``logits`` /
    ``targets``: the ``folds`` parts of a seeded permutation, each predicted by a calibrator fitted on the others."""
    logits = as_logits(logits)
    targets = as_targets(targets, logits.shape[0], logits.shape[1])
    n = len(targets)
    if not 2 <= folds <= n:
        raise ValueError(f"cross-validation needs 2 <= folds <= samples, got {folds} folds for {n} samples")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    parts = torch.arange(n) % folds
    scores = {}
    for name in names:
        held_out = torch.empty_like(logits, dtype=torch.float64)
        for k in range(folds):
            fit_rows, test_rows = order[parts != k], order[parts == k]
            calibrator = make(name).fit(logits[fit_rows], targets[fit_rows])
            held_out[test_rows] = calibrator.transform(logits[test_rows]).double()
        scores[name] = {"nll": nll(held_out, targets), "ece": ece(held_out, targets, n_bins=n_bins)}
    return scores


def select_calibrator(scores: Dict[str, Dict[str, float]]) -> str:
    """The name with the lowest held-out NLL in ``scores`` (:func:`cross_validated_scores`); the first on a tie."""
    if not scores:
        raise ValueError("no calibrator to choose from")
    return min(scores, key=lambda name: scores[name]["nll"])
