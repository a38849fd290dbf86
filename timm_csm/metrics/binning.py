"""Bins and the calibration errors computed from per-bin sums.

Binning rule (used by every binned metric here): ``n_bins`` equal-width bins with edges
``e = linspace(0, 1, n_bins + 1)`` in float64; bin ``b`` is the right-closed interval ``(e[b], e[b+1]]``, except
that a confidence of exactly 0 belongs to the first bin. A confidence of exactly 1.0 is in the last bin: there is no
hidden extra bin (torchmetrics counts 1.0 in an invisible ``n_bins + 1``-th bin, Lightning-AI/torchmetrics#3510).
Comparisons are done in float64, so ``conf == e[b]`` goes to bin ``b - 1`` exactly as the interval says.

From per-bin sums (``count_b``, ``conf_b = Σ conf``, ``acc_b = Σ correct``), with weights ``w_b = count_b / N``,
mean confidence ``c_b = conf_b / count_b`` and accuracy ``a_b = acc_b / count_b`` over non-empty bins:

* ECE (l1) = Σ_b w_b |a_b - c_b|                (Guo et al., 2017)
* RMSCE (l2) = sqrt(Σ_b w_b (a_b - c_b)^2)
* MCE (max) = max_b |a_b - c_b|
* OE = Σ_b w_b c_b max(c_b - a_b, 0)           (over-confidence, Thulasidasan et al., 2019)
* UE = Σ_b w_b c_b max(a_b - c_b, 0)           (the mirror image, weighted by c_b as in the CSM evaluation code)
* debiased CE = sqrt(max(Σ_b w_b [(a_b - c_b)^2 - s_b^2 / count_b], 0)), over bins of two samples or more
  (Kumar, Liang & Ma, NeurIPS 2019): the l2 error with the binned estimate's upward bias removed; see
  :func:`debiased_error_from_bins`
"""
from __future__ import annotations

import functools
import math
from typing import Optional, Sequence, Tuple

import numpy as np
import torch

__all__ = ["DEFAULT_N_BINS", "NORMS", "bin_edges", "bin_index", "bin_thresholds", "equal_mass_edges",
           "equal_mass_positions", "equal_mass_bins", "bin_sums",
           "calibration_error_from_bins", "overconfidence_from_bins", "underconfidence_from_bins",
           "classwise_error_from_bins", "debiased_error_from_bins", "check_n_bins"]

#: the equal-width bins of ECE-type metrics and reliability tables unless told otherwise (15, as Guo et al. 2017)
DEFAULT_N_BINS = 15
NORMS = ("l1", "l2", "max")


def check_n_bins(n_bins) -> int:
    if isinstance(n_bins, bool) or not isinstance(n_bins, int) or n_bins < 1:
        raise ValueError(f"n_bins must be an integer >= 1, got {n_bins!r}")
    return n_bins


def bin_edges(n_bins: int, device=None) -> torch.Tensor:
    """Equal-width edges ``linspace(0, 1, n_bins + 1)`` in float64."""
    return torch.linspace(0.0, 1.0, check_n_bins(n_bins) + 1, dtype=torch.float64, device=device)


def bin_index(values: torch.Tensor, edges: torch.Tensor, equal_width: bool = True) -> torch.Tensor:
    """Bin of each value for right-closed bins ``(e[b], e[b+1]]``; values <= e[1] (0 included) go to bin 0 and
    values > e[-2] (1.0 included) to the last bin. ``values`` are compared in the dtype of ``edges`` (float64).

    On the CPU, for the equal-width edges of :func:`bin_edges` the bin is ``ceil(v B) - 1``: exact unless ``v B``
    lies within rounding of an integer (the edges are within a few units in the last place of ``k / B``), and only
    those values are placed by exact comparisons with the edges; several times faster than a binary search, and
    NumPy's operations cost less than torch's on these short vectors; float32 values are scaled in float32 (their
    distance to an integer is then judged with float32's epsilon). Other edges (``equal_width=False``), and every
    tensor on an accelerator, are placed by one binary search (NumPy's ``searchsorted``, ``torch.bucketize``) of the
    sorted inner edges: the bin is the number of edges below the value.
    """
    inner = edges[1:-1]
    if not equal_width:  # edges interpolated between tied values can be out of order by a rounding: the bin is the
        inner = inner.sort().values  # number of edges below the value, which a search of the sorted edges counts
    if values.device.type != "cpu":
        return torch.bucketize(values.to(edges.dtype), inner, right=False)
    v = values.detach().numpy()
    if v.dtype not in (np.float32, np.float64):
        v = v.astype(np.float64)
    if not equal_width:
        return torch.from_numpy(np.searchsorted(inner.numpy(), v, side="left"))
    # in the values' precision: float32 values are within rounding of k / B only where float32 rounding says so
    n_bins = edges.numel() - 1
    scaled = v * n_bins
    # away from the integers, ceil(v B) - 1 is floor(v B): the conversion's truncation of a value above 0
    idx = scaled.astype(np.int64)
    np.maximum(idx, 0, out=idx)
    np.minimum(idx, n_bins - 1, out=idx)
    distance = scaled - np.rint(scaled)
    near = np.abs(distance, out=distance) <= _NEAR_EPS[scaled.dtype.type] * n_bins
    if near.any():
        idx[near] = np.searchsorted(inner.numpy(), v[near], side="left")
    return torch.from_numpy(idx)


_NEAR_EPS = {np.float32: 8 * float(np.finfo(np.float32).eps), np.float64: 8 * float(np.finfo(np.float64).eps)}


def bin_thresholds(n_bins: int, dtype: torch.dtype, device=None) -> torch.Tensor:
    """The inner edges of :func:`bin_edges` as thresholds for values of ``dtype``: the smallest value of that dtype
    above each edge ``e[1] ... e[n_bins - 1]``, so that ``v > e[b]`` (the float64 comparison of the binning rule)
    is ``v >= thresholds[b - 1]`` for any ``v`` of the dtype, and ``torch.bucketize(v, thresholds, right=True)``
    is :func:`bin_index` of ``v`` exactly, in one binary search and without a float64 copy."""
    inner = bin_edges(n_bins)[1:-1]
    rounded = inner.to(dtype)
    # rounding to the nearest value of dtype lands either above the edge (then nothing of dtype lies between) or on
    # or below it (then the next value up is the first above)
    above = torch.where(rounded.to(torch.float64) > inner, rounded,
                        torch.nextafter(rounded, torch.full_like(rounded, math.inf)))
    return above.to(device)


def equal_mass_edges(values: torch.Tensor, n_bins: int, quantile: bool = False) -> torch.Tensor:
    """Edges that split ``values`` (any order) into ``n_bins`` bins of (nearly) equal count, in float64.

    With ``v`` the sorted values and ``N`` their number, ``edges[b] = interp(pos_b, arange(N), v)``, linear
    interpolation between sorted neighbours, at one of two position rules:

    * ``quantile=False`` (adaptive ECE, AdaFocal): ``pos_b = b N / n_bins``, the
      ``np.interp(linspace(0, N, n_bins + 1), arange(N), sort(conf))`` construction of the focal-calibration / MbLS
      adaptive ECE (Nixon et al., 2019) and of AdaFocal's bins; positions beyond the last sample take the largest
      value, as ``np.interp`` clamps. With right-closed bins the first bin holds one sample more than N / n_bins
      and the last one fewer.
    * ``quantile=True`` (PIECE's proximity bins): ``pos_b = b (N - 1) / n_bins``, the linear quantiles of
      ``np.quantile`` / ``torch.quantile`` that ProCal's quantile ``KBinsDiscretizer`` uses; tied values split
      evenly (e.g. two 0.1 and two 0.9 give the inner edge 0.5, where the first rule gives 0.9).

    Between two neighbours ``lo``, ``hi`` the edge is computed as ``v[lo] (1 - f) + v[hi] f``; ``np.interp``, the
    AdaFocal code and ``torch.quantile`` compute ``v[lo] + f (v[hi] - v[lo])`` (or its mirror, and
    ``torch.quantile`` the position as ``q (N - 1)``), which can round differently in the last bits. No sample lies
    strictly between two sorted neighbours, so that difference moves a sample to the next bin only where an edge
    rounds onto (or off) a sample value. With the right-closed rule of
    :func:`bin_index` (``equal_width=False``) every sample lands in a bin, the lowest one included (the
    focal-calibration code drops it).
    """
    return equal_mass_bins(values, n_bins, quantile, index=False)[0]


def equal_mass_bins(values: torch.Tensor, n_bins: int, quantile: bool = False,
                    index: bool = True) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """The edges of :func:`equal_mass_edges` and (with ``index``) the bin of each value under them,
    ``bin_index(values, edges, equal_width=False)``: on the CPU both from one bucketing of the values
    (:class:`_Buckets`), which reads the sorted values only at the edges' ranks and places a value by its bucket
    unless an edge shares it."""
    check_n_bins(n_bins)
    n = values.numel()
    if n == 0:
        raise ValueError("equal-mass edges of an empty set are undefined: pass at least one value")
    v = values.reshape(-1).to(torch.float64)
    if n == 1:
        edges = v.expand(n_bins + 1).clone()
        return edges, (torch.zeros(1, dtype=torch.long, device=v.device) if index else None)
    lo, hi, frac = _positions(n, n_bins, quantile)
    if v.device.type == "cpu":
        buckets = _Buckets(v.detach().numpy())
        lo_v, hi_v = np.split(buckets.order_statistics(np.array(lo + hi)), 2)
        edges = lo_v * (1.0 - np.array(frac)) + hi_v * np.array(frac)
        return torch.from_numpy(edges), (torch.from_numpy(buckets.bins(np.sort(edges[1:-1]))) if index else None)
    lo, hi, frac = equal_mass_positions(n, n_bins, quantile, device=v.device)
    ordered = v.sort().values
    edges = ordered[lo] * (1.0 - frac) + ordered[hi] * frac
    return edges, (bin_index(v, edges, equal_width=False) if index else None)


class _Buckets:
    """1-D float values (no NaN) counted into about ``N / 8`` buckets of equal width between their minimum and
    maximum. A bucket's number never decreases with the value, so bucket order is value order: ranks and bins of
    the sorted values are found in a few linear passes instead of a sort of all ``N`` (several times faster)
    and a binary search per value (whose branches a CPU cannot predict); values crowded into one bucket
    cost at most that sort."""

    def __init__(self, values: np.ndarray):
        self.values = values
        self.lowest, highest = float(values.min()), float(values.max())
        self.size = max(64, 1 << max(0, (len(values) // 8).bit_length()))
        self.scale = self.size / (highest - self.lowest) if highest > self.lowest else 0.0
        self.of_values = self.of(values)
        self.counts = np.bincount(self.of_values, minlength=self.size)

    def of(self, x: np.ndarray) -> np.ndarray:
        """The bucket numbers of ``x`` (a non-decreasing function of the value)."""
        bucket = ((x - self.lowest) * self.scale).astype(np.int64)
        return np.clip(bucket, 0, self.size - 1, out=bucket)

    def order_statistics(self, ranks: np.ndarray) -> np.ndarray:
        """``np.sort(values)[ranks]``: only the values of the buckets holding a rank are sorted."""
        ends = np.cumsum(self.counts)
        holding = np.searchsorted(ends, ranks, side="right")  # the bucket of each rank
        wanted = np.zeros(self.size, dtype=bool)
        wanted[holding] = True
        chosen = np.sort(self.values[wanted[self.of_values]])  # the values of the wanted buckets, in order
        chosen_counts = np.where(wanted, self.counts, 0)
        # rank r in bucket b: the (r - first rank of b)-th value of b, after the chosen values of the buckets
        # before b
        return chosen[ranks - (ends - self.counts)[holding] + (np.cumsum(chosen_counts) - chosen_counts)[holding]]

    def bins(self, inner: np.ndarray) -> np.ndarray:
        """The number of the (sorted) ``inner`` edges below each value: ``bin_index`` of the right-closed bins. A
        value in a bucket that holds no edge lies above exactly the edges of the buckets before its own; the few
        values sharing a bucket with an edge are placed by a binary search."""
        edge_buckets = self.of(inner)
        index = np.searchsorted(edge_buckets, np.arange(self.size), side="left")[self.of_values]
        shared = np.zeros(self.size, dtype=bool)
        shared[edge_buckets] = True
        at = np.flatnonzero(shared[self.of_values])
        index[at] = np.searchsorted(inner, self.values[at], side="left")
        return index


def equal_mass_positions(n: int, n_bins: int, quantile: bool = False,
                         device=None) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Where the edges of :func:`equal_mass_edges` lie among ``n`` sorted values: ``(lo, hi, frac)``, each of
    length ``n_bins + 1``, with ``edges = v[lo] (1 - frac) + v[hi] frac`` (the bootstrap evaluates the same rule on
    resampled sequences without sorting them)."""
    lo, hi, frac = _positions(n, n_bins, quantile)
    as_tensor = lambda values, dtype: torch.tensor(values, dtype=dtype, device=device)  # noqa: E731
    return as_tensor(lo, torch.long), as_tensor(hi, torch.long), as_tensor(frac, torch.float64)


@functools.lru_cache(maxsize=64)
def _positions(n: int, n_bins: int, quantile: bool) -> Tuple[tuple, tuple, tuple]:
    """:func:`equal_mass_positions` as tuples of Python numbers (kept for the last few sizes asked: an evaluation
    asks for the same ones again and again)."""
    lo, hi, frac = [], [], []
    # a handful of positions: Python arithmetic (the same IEEE operations) costs less than a dozen tensor operations
    for pos in torch.linspace(0.0, float(n - 1 if quantile else n), n_bins + 1, dtype=torch.float64).tolist():
        below = min(math.floor(pos), n - 1)
        hi.append(min(below + 1, n - 1))
        if pos >= n - 1:  # positions beyond the last sample take the last value (np.interp clamps)
            lo.append(n - 1)
            frac.append(0.0)
        else:
            lo.append(below)
            frac.append(min(max(pos - below, 0.0), 1.0))
    return tuple(lo), tuple(hi), tuple(frac)


def bin_sums(index: torch.Tensor, n_bins: int, *values: torch.Tensor,
             out: Optional[Sequence[torch.Tensor]] = None) -> Tuple[torch.Tensor, ...]:
    """Per-bin count and sums: ``(count, Σ values[0], Σ values[1], ...)``, each ``(n_bins,)`` float64.

    ``count[b] = #{i : index[i] = b}`` and ``sum_k[b] = Σ_{i : index[i] = b} values[k][i]``. The values are added
    one sample after the other, in the order given (``index_add_``, or NumPy's ``bincount`` for fresh sums on the
    CPU: both sequential, so the sums are reproducible bit for bit), in float64. With ``out`` (``1 + len(values)``
    float64 tensors of shape ``(n_bins,)``, e.g. the sums of a streaming state) the samples are added into those
    tensors in place, which are returned.
    """
    if out is not None and (len(out) != len(values) + 1
                            or any(t.shape != (n_bins,) or t.dtype != torch.float64 for t in out)):
        raise ValueError(f"out must hold {len(values) + 1} float64 tensors of shape ({n_bins},)")
    if any(v.shape != index.shape for v in values):
        raise ValueError(f"values must have the shape of index {tuple(index.shape)}, got "
                         f"{[tuple(v.shape) for v in values]}")
    if out is None and index.device.type == "cpu":  # NumPy's bincount adds in the same order, at less cost per call
        i = index.numpy()
        count = np.bincount(i, minlength=n_bins)
        if count.size != n_bins:
            raise ValueError(f"index holds bins beyond the {n_bins} bins")
        return (torch.from_numpy(count.astype(np.float64)),
                *(torch.from_numpy(np.bincount(i, _float_array(v), minlength=n_bins)) for v in values))
    if out is None:
        out = tuple(torch.zeros(n_bins, dtype=torch.float64, device=index.device) for _ in range(len(values) + 1))
    out[0].index_add_(0, index, torch.ones(index.shape, dtype=torch.float64, device=index.device))
    for total, v in zip(out[1:], values):
        total.index_add_(0, index, v.to(torch.float64))
    return tuple(out)


def _float_array(v: torch.Tensor) -> np.ndarray:
    """The NumPy view of a CPU tensor, float32 and float64 as they are (bincount reads them in float64)."""
    v = v.detach()
    return v.numpy() if v.dtype in (torch.float32, torch.float64) else v.to(torch.float64).numpy()


def _bin_means(count, conf_sum, acc_sum):
    """``(w_b, c_b, a_b)`` of every non-empty bin, as Python floats: a few dozen bins cost less in float arithmetic
    than in a dozen tensor operations."""
    counts = count.tolist()
    total = sum(counts)
    if total <= 0:
        raise ValueError("no samples: the calibration error of an empty set is undefined")
    return [(k / total, c / k, a / k) for k, c, a in zip(counts, conf_sum.tolist(), acc_sum.tolist()) if k > 0]


def calibration_error_from_bins(count: torch.Tensor, conf_sum: torch.Tensor, acc_sum: torch.Tensor,
                                norm: str = "l1") -> float:
    """ECE (``l1``), RMS calibration error (``l2``) or MCE (``max``) from per-bin sums; see the module docstring."""
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
    bins = _bin_means(count, conf_sum, acc_sum)
    if norm == "l1":
        return sum(w * abs(a - c) for w, c, a in bins)
    if norm == "l2":
        return math.sqrt(sum(w * (a - c) ** 2 for w, c, a in bins))
    return max(abs(a - c) for _, c, a in bins)


def overconfidence_from_bins(count, conf_sum, acc_sum) -> float:
    """OE = Σ_b w_b c_b max(c_b - a_b, 0)."""
    return sum(w * c * max(c - a, 0.0) for w, c, a in _bin_means(count, conf_sum, acc_sum))


def underconfidence_from_bins(count, conf_sum, acc_sum) -> float:
    """UE = Σ_b w_b c_b max(a_b - c_b, 0)."""
    return sum(w * c * max(a - c, 0.0) for w, c, a in _bin_means(count, conf_sum, acc_sum))


def classwise_error_from_bins(count: torch.Tensor, prob_sum: torch.Tensor, label_sum: torch.Tensor,
                              n_samples: Optional[float] = None) -> float:
    """Classwise ECE from ``(C, n_bins)`` sums: mean over classes k of Σ_b (|B_kb| / N) |ȳ_kb - p̄_kb|.

    ``label_sum`` holds Σ 1[y = k] (hard) or Σ y_k (soft) per bin; classes absent from the data still count in the
    mean (their bins compare p̄ with 0). Computed as Σ_kb |Σ y_k - Σ p_k| / (C N), the same sum with each bin's
    count cancelled (an empty bin's sums are 0).
    """
    n = float(count[0].sum()) if n_samples is None else float(n_samples)
    if n <= 0:
        raise ValueError("no samples: the calibration error of an empty set is undefined")
    return float((label_sum - prob_sum).abs_().sum()) / (n * count.shape[0])



def debiased_error_from_bins(count: torch.Tensor, conf_sum: torch.Tensor, acc_sum: torch.Tensor,
                             acc_sq_sum: torch.Tensor, squared: bool = False) -> torch.Tensor:
    """The debiased l2 calibration error of Kumar, Liang & Ma ("Verified Uncertainty Calibration", NeurIPS 2019)
    from per-bin sums (last dimension: the bins; leading ones, e.g. bootstrap resamples, are kept).

    The binned estimate Σ_b w_b (a_b - c_b)^2 of the squared l2 error is biased upwards by the variance of each
    bin's accuracy a_b, which the paper's estimator subtracts: Σ_b w_b [(a_b - c_b)^2 - a_b (1 - a_b) / (n_b - 1)]
    for correctness in {0, 1}, over the bins of n_b >= 2 samples (a bin of one sample has no variance estimate and
    adds nothing). Here the variance of a_b is s_b^2 / n_b with s_b^2 = (Σ acc^2 - n_b a_b^2) / (n_b - 1), the sample
    variance of the bin's accuracies (``acc_sq_sum``: Σ acc^2): the paper's term for hard labels, and unbiased as
    well for soft targets (accuracy = the target mass on the predicted class). Returns sqrt(max(estimate, 0)), or
    with ``squared`` the estimate of the squared error itself (unbiased, so it can be negative), as a float64 tensor
    on the CPU."""
    # in NumPy on the CPU: a dozen operations on a few bins cost several times less there than in torch
    count, conf_sum, acc_sum, acc_sq_sum = (t.detach().cpu().numpy().astype(np.float64, copy=False)
                                            for t in (count, conf_sum, acc_sum, acc_sq_sum))
    total = count.sum(-1, keepdims=True)
    if (total <= 0).any():
        raise ValueError("no samples: the calibration error of an empty set is undefined")
    several = count > 1.5  # float counts (resampled weights): at least two samples
    n = np.where(several, count, 2.0)
    a, c = acc_sum / n, conf_sum / n
    variance = np.maximum((acc_sq_sum - n * a * a) / (n - 1.0), 0.0)
    estimate = np.where(several, count / total * ((a - c) ** 2 - variance / n), 0.0).sum(-1)
    return torch.from_numpy(np.asarray(estimate if squared else np.sqrt(np.maximum(estimate, 0.0))))
