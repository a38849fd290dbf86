"""The classwise ``(class, bin)`` sums of one pass, block by block (:class:`ClasswiseSums`).

A row of probabilities summing to 1 has at most ``n_bins - 1`` entries above the first edge, so only those entries
are found (one comparison with the first edge's threshold in the probabilities' own precision,
:func:`~timm_csm.metrics.binning.bin_thresholds`, and one flat index: NumPy's on the CPU, where they are several
times faster than torch's, reading the comparison's bytes eight at a time), binned and summed; the first bin is
filled by difference with the column totals when the pass ends (:meth:`ClasswiseSums.finalize`). The label sums of
class-index targets come from the target's entries alone, one per sample (their bins include the first).
"""
from __future__ import annotations

import functools
from typing import Optional

import numpy as np
import torch

from .binning import bin_edges, bin_index, bin_sums, bin_thresholds
from .scratch import scratch

__all__ = ["ClasswiseSums"]

_F64 = torch.float64


class ClasswiseSums:
    """The classwise ``(class, bin)`` sums of one pass: count, Σ p_k and Σ y_k over the entries above the first
    edge (Σ y_k of class-index targets over every bin, from the target's entries), and the column totals that fill
    the first bins."""

    def __init__(self, num_classes: int, n_bins: int, device, soft: bool = False):
        self.C, self.B, self.device, self.soft = num_classes, n_bins, device, soft
        self.edges = bin_edges(n_bins, device=device)
        self.count, self.prob, self.label = (torch.zeros(num_classes * n_bins, dtype=_F64, device=device)
                                             for _ in range(3))
        self.prob_total = torch.zeros(num_classes, dtype=_F64, device=device)
        self.label_total = torch.zeros(num_classes, dtype=_F64, device=device)
        self.n = 0

    def first_threshold(self, dtype: torch.dtype) -> float:
        """The smallest value of ``dtype`` in the second bin (:func:`bin_thresholds`)."""
        return _first_threshold(self.B, dtype)

    def add(self, p: torch.Tensor, classes_dim: int, y: Optional[torch.Tensor] = None,
            t: Optional[torch.Tensor] = None, n: Optional[int] = None, p_y: Optional[torch.Tensor] = None) -> None:
        """Add a contiguous block of probabilities: ``(n, C)`` rows (``classes_dim=1``) or ``(C, width)`` columns
        (``classes_dim=0``) of which the first ``n`` are samples and the rest zeros; ``y`` class indices (and
        ``p_y``, their probabilities, when known) or ``t`` soft targets ``(n, C)`` (the blocks of one
        :class:`ClasswiseSums` have either kind, not both)."""
        n = p.shape[1 - classes_dim] if n is None else n
        self.n += n
        self.prob_total += _column_totals(p, 1 - classes_dim)
        B = self.B
        if t is None:
            # the label sums are those of the target's entries, one per sample: gathered, binned and counted, the
            # first bin's included
            if p_y is None:
                p_y = p.gather(classes_dim, y.view((1, -1) if classes_dim == 0 else (-1, 1))).view(-1)
            self.label += bin_sums(y * B + bin_index(p_y, self.edges), self.C * B)[0]
        else:
            self.label_total += t.sum(0)
        if B > 1:
            flat, classes, vals = _entries_at_least(p, self.first_threshold(p.dtype), classes_dim)
            index = classes.mul_(B).add_(bin_index(vals, self.edges))
            # the block's sums (NumPy's bincount on the CPU), added to those of the blocks before
            if t is None:
                sums, totals = bin_sums(index, self.C * B, vals), (self.count, self.prob)
            else:  # the target's mass on each entry found
                sums = bin_sums(index, self.C * B, vals, t.reshape(-1).take(flat))
                totals = (self.count, self.prob, self.label)
            for total, part in zip(totals, sums):
                total += part

    def finalize(self, state) -> None:
        """Fill the first bins by difference (the label sums of class-index targets are complete) and add every
        sum into ``state``'s classwise sums."""
        C, B = self.C, self.B
        # in NumPy: a dozen operations on (C, n_bins) sums cost several times less there than in torch
        count, prob, label = (s.cpu().numpy().reshape(C, B).copy() for s in (self.count, self.prob, self.label))
        count[:, 0] = self.n - count[:, 1:].sum(1)
        prob[:, 0] = _first_bins(self.prob_total.cpu().numpy(), prob, self.n, "probability")
        if self.soft:
            label[:, 0] = _first_bins(self.label_total.cpu().numpy(), label, self.n, "label")
        for total, part in zip((state.cw_count, state.cw_prob_sum, state.cw_label_sum), (count, prob, label)):
            total.add_(torch.from_numpy(part).to(total.device))


def _first_bins(totals: np.ndarray, sums: np.ndarray, n: int, what: str) -> np.ndarray:
    """The first bins' sums: the column totals less the other bins' sums. A sum of non-negative values, so below 0
    only by the rounding of the two float64 sums (far less than ``_ROUNDING * n``), which is cleared; a larger
    deficit is a fault of the sums, raised."""
    first = totals - sums[:, 1:].sum(1)
    if first.min(initial=0.0) < -_ROUNDING * max(n, 1):
        raise RuntimeError(f"classwise {what} sums: a first bin came out at {first.min():.3g}, below 0 by more than "
                           "rounding (the column totals and the other bins' sums disagree)")
    return np.maximum(first, 0.0)


#: the share of the samples a first bin's sum may lie below 0 by rounding (two float64 sums of n values in [0, 1]
#: differ by at most about n^2 * 1.1e-16, below this for any n under 9e9)
_ROUNDING = 1e-6


def _column_totals(p: torch.Tensor, dim: int) -> torch.Tensor:
    """``p.sum(dim)`` in float64, a few hundred thousand values at a time copied into kept float64 scratch memory
    (:func:`scratch`): the copy stays in the cache, and no fresh memory is paged in for it."""
    if p.dtype == _F64:
        return p.sum(dim)
    step = max(1, _TOTALS_CHUNK // (p.numel() // p.shape[dim]))
    wide = scratch(min(step, p.shape[dim]) * (p.numel() // p.shape[dim]), _F64, p.device, "totals")
    totals = None
    for start in range(0, p.shape[dim], step):
        piece = p.narrow(dim, start, min(step, p.shape[dim] - start))
        piece_sum = wide[:piece.numel()].view(piece.shape).copy_(piece).sum(dim)
        totals = piece_sum if totals is None else totals.add_(piece_sum)
    return totals


_TOTALS_CHUNK = 1 << 18


@functools.lru_cache(maxsize=None)
def _first_threshold(n_bins: int, dtype: torch.dtype) -> float:
    return float(bin_thresholds(n_bins, dtype)[0])  # a dozen tensor operations: once per (n_bins, dtype)


def _entries_at_least(p: torch.Tensor, threshold: float, classes_dim: int):
    """The entries of the 2-D ``p`` that are ``>= threshold`` (a value of ``p``'s dtype, so the comparison is exact
    in it): their flat (row-major) indices, classes (along ``classes_dim``) and values."""
    width = p.shape[1]
    if p.device.type == "cpu":  # NumPy's comparison, flat nonzero and division are several times faster here
        a = p.numpy().reshape(-1)
        mask = scratch(a.size, torch.bool, "cpu", "mask").numpy()[:a.size]  # no fresh pages to fault in
        flat = _flat_nonzero(np.greater_equal(a, threshold, out=mask))
        classes = flat // width if classes_dim == 0 else flat - flat // width * width
        return torch.from_numpy(flat), torch.from_numpy(classes), torch.from_numpy(a[flat])
    flat = (p.reshape(-1) >= threshold).nonzero().view(-1)
    rows = torch.div(flat, width, rounding_mode="floor")
    return flat, (rows if classes_dim == 0 else flat - rows * width), p.reshape(-1)[flat]


def _flat_nonzero(mask: np.ndarray) -> np.ndarray:
    """``np.flatnonzero(mask)`` of a flat boolean array whose entries are mostly False: its bytes read as 64-bit
    words, and only the words holding an entry looked into (NumPy's nonzero looks at every byte, and costs several
    times the comparison that made the mask)."""
    whole = mask.size - mask.size % 8
    words = mask[:whole].view(np.uint64)
    holding = np.flatnonzero(words != 0)
    if 4 * holding.size > words.size:  # dense (few classes): nothing to skip
        return np.flatnonzero(mask)
    within = np.flatnonzero(words[holding].view(np.bool_))  # the bytes of those words, in memory order
    flat = (holding[within >> 3] << 3) | (within & 7)
    if whole == mask.size:
        return flat
    return np.concatenate([flat, whole + np.flatnonzero(mask[whole:])])
