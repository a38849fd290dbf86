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
from ._kernels import row_blocks, softmax_rows
from .base import PostHocCalibrator, check_finite_state
from .registry import register_calibrator

__all__ = ["IsotonicCalibration", "HistogramBinning", "PROBABILITY_FLOOR"]

PROBABILITY_FLOOR = 1e-12


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


def _interpolation_table(x: torch.Tensor, y: torch.Tensor, num_knots: torch.Tensor):
    """(x, y, slope) of every class's knots, padded with the last knot to a power-of-two width W >= 2; the slope
    of a knot's segment to the next (0 from the last real knot on: constant beyond the ends)."""
    width = 1 << max(1, (x.shape[1] - 1).bit_length())
    x = torch.cat([x, x[:, -1:].expand(-1, width - x.shape[1])], dim=1)
    y = torch.cat([y, y[:, -1:].expand(-1, width - y.shape[1])], dim=1)
    dx, dy = x.diff(dim=1), y.diff(dim=1)
    real = (torch.arange(width - 1, device=x.device) < (num_knots - 1).unsqueeze(1)) & (dx > 0)
    slopes = torch.where(real, dy / torch.where(real, dx, torch.ones_like(dx)), torch.zeros_like(dx))
    return x, y, torch.cat([slopes, torch.zeros_like(slopes[:, :1])], dim=1)


def _interpolate_rows(v: torch.Tensor, x: torch.Tensor, y: torch.Tensor, slopes: torch.Tensor) -> torch.Tensor:
    """np.interp(v[k], x[k, :m_k], y[k, :m_k]) for every class k at once (v (C, R), knots of
    :func:`_interpolation_table`): constant beyond the ends. The segment ``x[lo] <= v < x[lo + 1]`` comes from a
    branch-free binary search run on all values together (one gather and compare per halving of the width: about
    twice as fast as ``torch.searchsorted`` on small tables); values below the first knot take segment 0 and its
    value ``y[0]`` once clamped, values at or beyond the last real knot a segment of slope 0."""
    v = torch.maximum(v, x[:, :1])
    lo = torch.zeros(v.shape, dtype=torch.int64, device=v.device)
    candidate, below = torch.empty_like(lo), torch.empty(v.shape, dtype=torch.bool, device=v.device)
    step = x.shape[1] >> 1
    while step:
        torch.add(lo, step, out=candidate)
        torch.le(x.gather(1, candidate), v, out=below)
        lo.add_(below, alpha=step)
        step >>= 1
    return (v - x.gather(1, lo)).mul_(slopes.gather(1, lo)).add_(y.gather(1, lo))


@register_calibrator("isotonic", summary="one-vs-rest isotonic regression, renormalised")
class IsotonicCalibration(PostHocCalibrator):
    """One-vs-rest isotonic regression, renormalised (see :mod:`timm_csm.calibration.one_vs_rest`). The state
    holds each class's knots, padded to one length: ``knots_x`` / ``knots_y`` (C, M) and ``num_knots`` (C,)."""

    def __init__(self):
        self.knots_x: Optional[torch.Tensor] = None
        self.knots_y: Optional[torch.Tensor] = None
        self.num_knots: Optional[torch.Tensor] = None

    def check_fit_dependencies(self) -> None:
        _isotonic_regression()

    def fit(self, logits, targets) -> "IsotonicCalibration":
        logits, targets = check_fit_inputs(logits, targets, type(self).__name__)
        probs = torch.softmax(logits.double(), dim=1).cpu().numpy()
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
        like = torch.empty(0, dtype=torch.float64, device=logits.device)
        table = self._derived("table", self.knots_x, like, lambda x: _interpolation_table(
            x, self.knots_y.to(like.device), self.num_knots.to(like.device)))
        for start, stop in row_blocks(logits.shape[0], c):
            # (C, rows) float64 probabilities, one search per class row: a segment's slope can magnify float32
            # rounding of its input past the reported digits, so these are computed in the knots' precision
            q = torch.empty(c, stop - start, dtype=torch.float64, device=logits.device)
            q.copy_(softmax_rows(logits[start:stop].to(torch.float64)).T)
            q = _interpolate_rows(q, *table).clamp_min_(PROBABILITY_FLOOR)
            log_total = q.sum(0).log_()
            out[start:stop] = q.log_().sub_(log_total).T
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


@register_calibrator("histogram_binning", summary="one-vs-rest histogram binning, renormalised")
class HistogramBinning(PostHocCalibrator):
    """One-vs-rest histogram binning with ``n_bins`` equal-width bins per class, renormalised (see
    :mod:`timm_csm.calibration.one_vs_rest`). ``bin_values`` (C, n_bins) holds each bin's calibrated probability,
    ``bin_counts`` its number of validation samples."""

    def __init__(self, n_bins: int = 15):
        self.n_bins = check_n_bins(int(n_bins))
        self.bin_values: Optional[torch.Tensor] = None
        self.bin_counts: Optional[torch.Tensor] = None

    def fit(self, logits, targets) -> "HistogramBinning":
        logits, targets = check_fit_inputs(logits, targets, type(self).__name__)
        n, c = logits.shape
        size = c * self.n_bins
        counts = torch.zeros(size, dtype=torch.int64, device=logits.device)
        positives = torch.zeros_like(counts)
        offsets = torch.arange(c, device=logits.device) * self.n_bins
        for start, stop in row_blocks(n, c):
            index = self._bins(softmax_rows(logits[start:stop])) + offsets
            counts += torch.bincount(index.view(-1), minlength=size)
            positives += torch.bincount(index.gather(1, targets[start:stop, None]).view(-1), minlength=size)
        edges = bin_edges(self.n_bins, device=logits.device)
        midpoints = ((edges[:-1] + edges[1:]) / 2).repeat(c)
        counts, positives = counts.to(torch.float64), positives.to(torch.float64)
        values = torch.where(counts > 0, positives / counts.clamp_min(1), midpoints)
        self.bin_values = values.view(c, self.n_bins).cpu()
        self.bin_counts = counts.view(c, self.n_bins).cpu()
        return self

    def _bins(self, probs: torch.Tensor) -> torch.Tensor:
        """The metrics' bin of each probability (right-closed (lo, hi], 0 in the first bin). For float32
        probabilities ``ceil(p B) - 1`` in float64 is exact (the product of a float32 and a small integer is exact
        in float64, and no float32 lies between k / B and its float64 edge); float64 ones are compared with the
        edges by binary search."""
        if probs.dtype == torch.float64:
            return _bins(probs, bin_edges(self.n_bins, device=probs.device))
        return (probs.double() * self.n_bins).ceil_().sub_(1).clamp_(0, self.n_bins - 1).long()

    def _apply(self, logits: torch.Tensor) -> torch.Tensor:
        c = self.bin_values.shape[0]
        if logits.shape[1] != c:
            raise ValueError(f"HistogramBinning was fitted for {c} classes, got {logits.shape[1]}")
        # log(q / sum q) of the floored bin values q, as a difference of two look-ups
        table = self.bin_values.clamp_min(PROBABILITY_FLOOR).to(dtype=logits.dtype, device=logits.device).view(-1)
        log_table = table.log()
        offsets = torch.arange(c, device=logits.device) * self.n_bins
        out = torch.empty_like(logits)
        for start, stop in row_blocks(logits.shape[0], c):
            index = self._bins(softmax_rows(logits[start:stop])).add_(offsets)
            total = torch.take(table, index).sum(1, keepdim=True)
            torch.sub(torch.take(log_table, index), total.log_(), out=out[start:stop])
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
