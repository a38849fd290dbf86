"""Non-parametric calibrators, one per class (one-vs-rest), then renormalised: isotonic regression and histogram
binning.

For each class k a map g_k: [0, 1] -> [0, 1] is fitted on the validation pairs (p_ik, 1[y_i = k]) with
p = softmax(z); a test sample gets q_k = max(g_k(p_k), eps) and the calibrated probabilities q / Σ_j q_j, returned
as logits log(q / Σ q) (softmax gives them back). The floor ``eps`` = 1e-12 keeps the logits finite where every
g_k is 0 (a row would be 0 / 0) and where one is (log 0); it moves probabilities by at most C * 1e-12. This is the
one-vs-all scheme of netcal and of Zadrozny & Elkan (2002); the per-class maps are fitted independently, so the
predicted class can change.

* Isotonic regression (Zadrozny & Elkan, KDD 2002): g_k is the non-decreasing least-squares fit of the labels on
  p_k, linearly interpolated between the fitted points and constant beyond the smallest and largest validation
  score, as scikit-learn's ``IsotonicRegression(out_of_bounds="clip")`` (tied scores are merged into their mean
  label first, as scikit-learn does). The pool-adjacent-violators solve is SciPy's
  ``scipy.optimize.isotonic_regression`` (SciPy >= 1.12, the ``[calibration]`` extra).
* Histogram binning (Zadrozny & Elkan, ICML 2001): g_k is the fraction of class-k labels among the validation
  samples whose p_k falls in each of ``n_bins`` equal-width bins (right-closed ``(lo, hi]``, 0 in the first bin:
  :func:`timm_csm.metrics.bin_index`, the metrics' rule); an empty bin maps to its midpoint (netcal's rule).
"""
from __future__ import annotations

from typing import Dict, Optional

import numpy as np
import torch

from ..extras import require
from ..metrics.binning import bin_edges, bin_index, check_n_bins
from ._checks import check_fit_inputs
from .base import PostHocCalibrator, check_finite_state

__all__ = ["IsotonicCalibration", "HistogramBinning", "PROBABILITY_FLOOR"]

PROBABILITY_FLOOR = 1e-12
_CHUNK_ELEMENTS = 1 << 22


def _renormalised_logits(q: torch.Tensor) -> torch.Tensor:
    """log(q / Σ q) of per-class calibrated probabilities q (N, C), floored at PROBABILITY_FLOOR."""
    q = q.clamp_min(PROBABILITY_FLOOR)
    log_total = q.sum(dim=1, keepdim=True).log()
    return q.log_().sub_(log_total)


def _row_chunks(n: int, c: int):
    rows = max(1, _CHUNK_ELEMENTS // c)
    return ((start, min(n, start + rows)) for start in range(0, n, rows))


def _bins(probs: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
    """The metrics' bin of each probability (:func:`timm_csm.metrics.bin_index`) by binary search: on (rows, C)
    blocks it is about 4x faster than the arithmetic route, whose edge corrections gather from memory."""
    return bin_index(probs, edges, equal_width=False)


def _isotonic_regression():
    """SciPy's PAVA solver (SciPy >= 1.12); MissingExtra naming the extra when SciPy is absent or older."""
    return require("scipy.optimize", "isotonic calibration", attribute="isotonic_regression")


def _isotonic_knots(scores: np.ndarray, labels: np.ndarray):
    """(x, y) knots of the increasing isotonic fit of ``labels`` on ``scores``: scikit-learn's construction (ties
    merged into their weighted mean, weighted PAVA), keeping only the first and last point of each constant run."""
    isotonic_regression = _isotonic_regression()
    x, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    y = np.bincount(inverse, weights=labels, minlength=len(x)) / counts
    fitted = isotonic_regression(y, weights=counts.astype(np.float64), increasing=True).x
    if len(x) > 2:  # drop the inner points of constant runs: linear interpolation is unchanged
        keep = np.ones(len(x), dtype=bool)
        keep[1:-1] = (fitted[1:-1] != fitted[:-2]) | (fitted[1:-1] != fitted[2:])
        x, fitted = x[keep], fitted[keep]
    return x, np.clip(fitted, 0.0, 1.0)


def _interpolate_rows(v: torch.Tensor, x: torch.Tensor, y: torch.Tensor, num_knots: torch.Tensor) -> torch.Tensor:
    """np.interp(v[k], x[k, :m_k], y[k, :m_k]) for every class k at once (v (C, R), knots (C, M) padded with their
    last value, m_k = num_knots[k]): constant beyond the ends. One batched binary search over the padded knots
    finds the same segment as a search over the first m_k (the padding equals the last knot)."""
    if x.shape[1] == 1:
        return y.expand_as(v).clone()
    last = (num_knots - 1).unsqueeze(1)
    v = torch.minimum(torch.maximum(v, x[:, :1]), x.gather(1, last))
    hi = torch.minimum(torch.searchsorted(x, v, right=True).clamp_(min=1), last.clamp(min=1))
    lo = hi - 1
    x_lo, y_lo = x.gather(1, lo), y.gather(1, lo)
    out = y_lo + (v - x_lo) / (x.gather(1, hi) - x_lo) * (y.gather(1, hi) - y_lo)
    single = num_knots == 1  # one knot: a constant (its padded segment has zero width)
    if bool(single.any()):
        out[single] = y[single, :1].expand(-1, v.shape[1])
    return out


class IsotonicCalibration(PostHocCalibrator):
    """One-vs-rest isotonic regression, renormalised (see :mod:`timm_csm.calibration.one_vs_rest`). The state
    holds each class's knots, padded to one length: ``knots_x`` / ``knots_y`` (C, M) and ``num_knots`` (C,)."""

    kind = "isotonic"

    def __init__(self):
        self.knots_x: Optional[torch.Tensor] = None
        self.knots_y: Optional[torch.Tensor] = None
        self.num_knots: Optional[torch.Tensor] = None

    def check_fit_dependencies(self) -> None:
        _isotonic_regression()

    def fit(self, logits, targets) -> "IsotonicCalibration":
        logits, targets = check_fit_inputs(logits, targets, type(self).__name__)
        probs = torch.softmax(logits, dim=1).cpu().numpy()
        labels = targets.cpu().numpy()
        knots = [_isotonic_knots(probs[:, k], (labels == k).astype(np.float64)) for k in range(probs.shape[1])]
        width = max(len(x) for x, _ in knots)
        pad = lambda a: np.pad(a, (0, width - len(a)), mode="edge")  # noqa: E731
        self.knots_x = torch.from_numpy(np.stack([pad(x) for x, _ in knots]))
        self.knots_y = torch.from_numpy(np.stack([pad(y) for _, y in knots]))
        self.num_knots = torch.tensor([len(x) for x, _ in knots], dtype=torch.int64)
        return self

    def _apply(self, logits: torch.Tensor) -> torch.Tensor:
        c = self.num_knots.numel()
        if logits.shape[1] != c:
            raise ValueError(f"IsotonicCalibration was fitted for {c} classes, got {logits.shape[1]}")
        out = torch.empty_like(logits)
        knots_x, knots_y = self.knots_x.to(logits.device), self.knots_y.to(logits.device)
        num_knots = self.num_knots.to(logits.device)
        for start, stop in _row_chunks(logits.shape[0], c):
            probs = torch.softmax(logits[start:stop], dim=1).T.contiguous()  # (C, rows): one search per class row
            out[start:stop] = _renormalised_logits(_interpolate_rows(probs, knots_x, knots_y, num_knots).T)
        return out

    def config(self) -> dict:
        return {}

    def state_dict(self) -> Dict[str, torch.Tensor]:
        if self.knots_x is None:
            return {}
        return {"knots_x": self.knots_x, "knots_y": self.knots_y, "num_knots": self.num_knots}

    def load_state_dict(self, state: Dict[str, torch.Tensor]) -> "IsotonicCalibration":
        if set(state) != {"knots_x", "knots_y", "num_knots"} or state["knots_x"].shape != state["knots_y"].shape \
                or state["knots_x"].ndim != 2 or tuple(state["num_knots"].shape) != (state["knots_x"].shape[0],):
            raise ValueError(f"expected (C, M) 'knots_x', 'knots_y' and (C,) 'num_knots', got {sorted(state)}")
        check_finite_state(state, "IsotonicCalibration state")
        num = state["num_knots"].long()
        if bool((num < 1).any() | (num > state["knots_x"].shape[1]).any()):
            raise ValueError("IsotonicCalibration state: 'num_knots' out of range")
        self.knots_x, self.knots_y = state["knots_x"].double().cpu(), state["knots_y"].double().cpu()
        self.num_knots = num.cpu()
        return self

    def __repr__(self) -> str:
        fitted = "unfitted" if self.num_knots is None else f"{self.num_knots.numel()} classes"
        return f"IsotonicCalibration({fitted})"


class HistogramBinning(PostHocCalibrator):
    """One-vs-rest histogram binning with ``n_bins`` equal-width bins per class, renormalised (see
    :mod:`timm_csm.calibration.one_vs_rest`). ``bin_values`` (C, n_bins) holds each bin's calibrated probability,
    ``bin_counts`` its number of validation samples."""

    kind = "histogram_binning"

    def __init__(self, n_bins: int = 15):
        self.n_bins = check_n_bins(int(n_bins))
        self.bin_values: Optional[torch.Tensor] = None
        self.bin_counts: Optional[torch.Tensor] = None

    def fit(self, logits, targets) -> "HistogramBinning":
        logits, targets = check_fit_inputs(logits, targets, type(self).__name__)
        n, c = logits.shape
        edges = bin_edges(self.n_bins, device=logits.device)
        counts = torch.zeros(c * self.n_bins, dtype=torch.float64, device=logits.device)
        positives = torch.zeros_like(counts)
        offsets = torch.arange(c, device=logits.device) * self.n_bins
        for start, stop in _row_chunks(n, c):
            index = (_bins(torch.softmax(logits[start:stop], dim=1), edges) + offsets).reshape(-1)
            counts.index_add_(0, index, torch.ones_like(index, dtype=torch.float64))
            rows = torch.arange(stop - start, device=logits.device)
            positives.index_add_(0, index.view(stop - start, c)[rows, targets[start:stop]],
                                 torch.ones(stop - start, dtype=torch.float64, device=logits.device))
        midpoints = ((edges[:-1] + edges[1:]) / 2).repeat(c)
        values = torch.where(counts > 0, positives / counts.clamp_min(1), midpoints)
        self.bin_values = values.view(c, self.n_bins).cpu()
        self.bin_counts = counts.view(c, self.n_bins).cpu()
        return self

    def _apply(self, logits: torch.Tensor) -> torch.Tensor:
        c = self.bin_values.shape[0]
        if logits.shape[1] != c:
            raise ValueError(f"HistogramBinning was fitted for {c} classes, got {logits.shape[1]}")
        edges = bin_edges(self.n_bins, device=logits.device)
        table = self.bin_values.to(logits.device).reshape(-1)
        offsets = torch.arange(c, device=logits.device) * self.n_bins
        out = torch.empty_like(logits)
        for start, stop in _row_chunks(logits.shape[0], c):
            index = _bins(torch.softmax(logits[start:stop], dim=1), edges) + offsets
            out[start:stop] = _renormalised_logits(table[index])
        return out

    def config(self) -> dict:
        return {"n_bins": self.n_bins}

    def state_dict(self) -> Dict[str, torch.Tensor]:
        return {} if self.bin_values is None else {"bin_values": self.bin_values, "bin_counts": self.bin_counts}

    def load_state_dict(self, state: Dict[str, torch.Tensor]) -> "HistogramBinning":
        if set(state) != {"bin_values", "bin_counts"} or state["bin_values"].ndim != 2 or \
                state["bin_values"].shape[1] != self.n_bins or state["bin_counts"].shape != state["bin_values"].shape:
            raise ValueError(f"expected (C, {self.n_bins}) 'bin_values' and 'bin_counts', got {sorted(state)}")
        check_finite_state(state, "HistogramBinning state")
        self.bin_values, self.bin_counts = state["bin_values"].double().cpu(), state["bin_counts"].double().cpu()
        return self

    def __repr__(self) -> str:
        fitted = "unfitted" if self.bin_values is None else f"{self.bin_values.shape[0]} classes"
        return f"HistogramBinning(n_bins={self.n_bins}, {fitted})"
