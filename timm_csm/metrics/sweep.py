"""ECE-sweep (Roelofs, Cain, Shlens & Mozer, "Mitigating Bias in Calibration Error Estimation", AISTATS 2022).

A binned ECE's bias depends on its number of bins, and is largest for a well calibrated model (the noise of each bin's
accuracy adds up). ECE-sweep lets the data choose it: sort the samples by confidence, split them into ``b`` bins of
equal count (sizes differing by at most one, the larger ones first, as ``numpy.array_split``), and take the largest
``b`` whose bins' accuracies are monotone (non-decreasing in confidence), sweeping ``b = 1, 2, ...`` and stopping at
the first ``b`` that breaks it. The error is then the binned error over those ``b`` bins:

* ``norm="l1"``: Σ_b (|B_b| / N) |acc_b - conf_b| (the ECE formula);
* ``norm="l2"``: sqrt(Σ_b (|B_b| / N) (acc_b - conf_b)^2).

Each ``b`` costs O(b) on the prefix sums of the sorted samples, so the whole sweep costs O(N log N + b*^2), ``b*``
the chosen number of bins (tens to hundreds for a classifier's confidences; up to N only where the accuracies are
sorted by confidence sample for sample).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

__all__ = ["SweepResult", "sweep_from_points", "ece_sweep_from_points"]

_NORMS = ("l1", "l2")


class SweepResult(NamedTuple):
    """The ECE-sweep ``error`` and the number of equal-mass bins ``n_bins`` the sweep chose."""

    error: float
    n_bins: int


def _bin_bounds(n: int, b: int) -> np.ndarray:
    """The ``b + 1`` boundaries of ``numpy.array_split``'s ``b`` bins of ``n`` sorted samples."""
    q, r = divmod(n, b)
    k = np.arange(b + 1)
    return k * q + np.minimum(k, r)


def sweep_from_points(confidences: torch.Tensor, accuracies: torch.Tensor, norm: str = "l1") -> SweepResult:
    """ECE-sweep of ``(N,)`` (confidence, accuracy) pairs (the accuracy 0 or 1, or a soft target's mass on the
    predicted class), with the number of bins it chose; see the module docstring."""
    if norm not in _NORMS:
        raise ValueError(f"norm must be one of {_NORMS}, got {norm!r}")
    conf = confidences.detach().to("cpu", torch.float64).reshape(-1).numpy()
    acc = accuracies.detach().to("cpu", torch.float64).reshape(-1).numpy()
    if conf.shape != acc.shape:
        raise ValueError(f"confidences and accuracies must have one value per sample, got {conf.shape} and {acc.shape}")
    n = conf.size
    if n == 0:
        raise ValueError("no samples: the calibration error of an empty set is undefined")
    order = np.argsort(conf, kind="stable")
    # prefix sums of the sorted samples: a bin's sums are two look-ups
    conf_cum = np.concatenate(([0.0], np.cumsum(conf[order])))
    acc_cum = np.concatenate(([0.0], np.cumsum(acc[order])))
    chosen = 1
    for b in range(2, n + 1):
        bounds = _bin_bounds(n, b)
        bin_acc = np.diff(acc_cum[bounds]) / np.diff(bounds)
        if np.any(np.diff(bin_acc) < 0):
            break
        chosen = b
    bounds = _bin_bounds(n, chosen)
    count = np.diff(bounds).astype(np.float64)
    gap = (np.diff(acc_cum[bounds]) - np.diff(conf_cum[bounds])) / count
    weight = count / n
    error = float(np.sum(weight * np.abs(gap))) if norm == "l1" else float(np.sqrt(np.sum(weight * gap * gap)))
    return SweepResult(error, chosen)


def ece_sweep_from_points(confidences: torch.Tensor, accuracies: torch.Tensor, norm: str = "l1") -> float:
    """The error of :func:`sweep_from_points`."""
    return sweep_from_points(confidences, accuracies, norm).error
