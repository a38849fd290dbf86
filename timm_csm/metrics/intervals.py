"""Intervals on every reported number: a bootstrap of the calibration metrics over the evaluated samples (the
statistics over training seeds are :mod:`timm_csm.metrics.paired`).

Bootstrap: every metric of :func:`calibration_metrics`, the selective ones (AURC, E-AURC, AUGRC) and PIECE, over B
resamples of the evaluated samples, without a loop over the resamples.

Resamples: ``B`` draws of ``N`` indices with replacement from ``torch.Generator().manual_seed(seed)``, drawn in
blocks of about a million indices (:func:`resample_indices` returns them all; the blocks draw the same indices as
one call would), so that the same ``(N, B, seed)`` gives the same resamples in any report. A block's arrays (8 MB
each) stay in the processor's cache across the dozen passes over them: about twice as fast as blocks of 4 million
(``benchmarks/bootstrap_bench.py``). Each metric's interval is its default method of
:mod:`timm_csm.metrics.interval_methods` (chosen by the coverage study
``benchmarks/intervals_coverage.md``), from the B resampled values and the estimate on the data; a metric whose
intervals covered too rarely gets none, with the reason. For a well calibrated model a binned ECE is biased
upwards (the resampled bins' noise adds to the gap): its percentile interval can lie wholly above the estimate, so
every interval is widened to hold its estimate.

How one block of resamples is computed (a resample is a weight per sample: how often it was drawn):

* the samples are sorted once by confidence; each resample's weights in that order are cumulated, so every bin
  over a range of confidences is a difference of two cumulative sums: the equal-width bins of ECE / MCE / OE / UE
  at fixed positions (the debiased CE also reads the cumulated squared accuracies), the equal-mass bins of AECE at
  the positions of each resample's own edges (:func:`~timm_csm.metrics.binning.equal_mass_positions` read off the
  cumulated weights);
* AURC and AUGRC sum the tie-averaged risk-coverage curve of :mod:`timm_csm.metrics.selective` run by run of tied
  confidences, in closed form with harmonic numbers;
* accuracy, confidence, NLL and Brier are one matrix product with the per-sample values; classwise ECE is a sparse
  product with the per-(sample, class) entries above the first bin edge, the first bin filled by difference with
  a dense product, as :func:`~timm_csm.metrics.state.accumulate` does;
* the per-sample values are those of :func:`~timm_csm.metrics.state.sample_values`, the code of the metrics
  themselves, so each resample's value equals the metric of ``(preds[idx], target[idx])`` up to float64 rounding.
"""
from __future__ import annotations

import dataclasses
import warnings
from typing import Dict, Iterator, Mapping, Optional, Sequence, Tuple

import torch

from .binning import DEFAULT_N_BINS, bin_edges, bin_index, check_n_bins, debiased_error_from_bins, equal_mass_positions
from .inputs import PreparedInputs, prepare_inputs
from .interval_methods import interval_of
from .state import SampleValues, accumulate, sample_values
from .table import list_metrics, metric_spec

__all__ = ["DEFAULT_RESAMPLES", "DEFAULT_LEVEL", "resample_indices", "percentile_interval", "bootstrap_distribution",
           "bootstrap_with_estimates", "bootstrap_metrics", "bootstrap_columns", "intervals_from_distribution"]

DEFAULT_RESAMPLES = 1000
DEFAULT_LEVEL = 0.95
#: resampled indices per block (resamples per block: this over N)
_BLOCK = 1 << 20
_F64 = torch.float64


def _check(n: int, resamples: int, level: float = DEFAULT_LEVEL) -> None:
    if n < 1:
        raise ValueError("no samples: a bootstrap of an empty set is undefined")
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 1:
        raise ValueError(f"resamples must be an integer >= 1, got {resamples!r}")
    if not 0.0 < float(level) < 1.0:
        raise ValueError(f"level must lie in (0, 1), got {level}")


def _index_blocks(n: int, resamples: int, seed: int) -> Iterator[torch.Tensor]:
    generator = torch.Generator().manual_seed(int(seed))
    per_block = max(1, _BLOCK // n)
    for start in range(0, resamples, per_block):
        yield torch.randint(0, n, (min(per_block, resamples - start), n), generator=generator)


def resample_indices(n: int, resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> torch.Tensor:
    """The ``(resamples, n)`` indices of the bootstrap of ``n`` samples with ``seed`` (see the module docstring)."""
    _check(n, resamples)
    return torch.cat(list(_index_blocks(n, resamples, seed)))


def percentile_interval(values: torch.Tensor, level: float = DEFAULT_LEVEL) -> Tuple[float, float]:
    """``(low, high)``: the ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles of ``values`` (linear)."""
    _check(1, 1, level)
    q = torch.tensor([(1.0 - level) / 2.0, (1.0 + level) / 2.0], dtype=_F64)
    low, high = torch.quantile(values.to(_F64).reshape(-1), q).tolist()
    return low, high


def intervals_from_distribution(distribution: Mapping[str, torch.Tensor], level: float = DEFAULT_LEVEL,
                                estimates: Optional[Mapping[str, float]] = None,
                                methods: Optional[Mapping[str, str]] = None) -> Dict[str, Dict[str, object]]:
    """``{name: {"low", "high", "method"}}`` of each resampled metric by its default interval method (or the one
    ``methods`` names), from its resampled values and its estimate in ``estimates``; a metric with no interval
    gets ``{"low": None, "high": None, "method": None, "reason"}`` (:func:`~.interval_methods.interval_of`)."""
    _check(1, 1, level)
    estimates, methods = estimates or {}, methods or {}
    return {k: interval_of(k, v, estimates.get(k), level, methods.get(k)) for k, v in distribution.items()}


class _Sorted:
    """The per-sample values sorted by confidence, and what every block of resamples reads from them."""

    def __init__(self, values: SampleValues, n_bins: int, prox: Optional[torch.Tensor], n_prox_bins: int):
        conf = values.confidence.cpu()
        n = self.n = conf.numel()
        order = torch.argsort(conf, stable=True)
        self.column = torch.empty_like(order)  # each sample's column among the weights: 1 + its rank
        self.column[order] = torch.arange(1, n + 1)
        self.conf, self.acc = conf[order], values.accuracy.cpu()[order]
        zero = torch.zeros(1, dtype=_F64)
        self.conf_pad, self.acc_pad = torch.cat([zero, self.conf]), torch.cat([zero, self.acc])
        self.acc_sq_pad = self.acc_pad * self.acc_pad  # the debiased CE's per-bin variance of the accuracy
        self.ones = torch.ones(1, dtype=_F64)
        self.means = torch.stack([self.acc, self.conf, values.nll.cpu()[order], values.brier.cpu()[order]], 1)
        edges = bin_edges(n_bins)
        inner = torch.searchsorted(self.conf, edges[1:-1], right=True)  # samples at or below each inner edge
        self.width_bounds = torch.cat([torch.zeros(1, dtype=torch.long), inner, torch.tensor([n])])
        self.n_bins = n_bins
        # runs of tied confidences (the risk-coverage curve averages over their orders)
        starts = torch.cat([torch.tensor([True]), self.conf[1:] != self.conf[:-1]]).nonzero().view(-1)
        self.run_bounds = torch.cat([starts, torch.tensor([n])])
        sizes = self.run_bounds.diff()
        self.tied = (sizes > 1).nonzero().view(-1) if bool((sizes > 1).any()) else None
        self.run_error = torch.where(sizes > 1, 0.0, 1.0 - self.acc[starts])  # the rate of a run of one sample
        self.harmonic = torch.cat([torch.zeros(1, dtype=_F64), (1.0 / torch.arange(1, n + 1, dtype=_F64)).cumsum(0)])
        self._classwise(values, order, edges)
        self.prox = None
        if prox is not None:
            prox = prox.to(_F64).cpu()[order]
            self.prox_order = torch.argsort(prox, stable=True)
            self.prox, self.prox_sorted, self.n_prox_bins = prox, prox[self.prox_order], n_prox_bins
            self.conf_bin = bin_index(self.conf, edges)

    def _classwise(self, values: SampleValues, order: torch.Tensor, edges: torch.Tensor) -> None:
        probs = values.probs.cpu()[order]
        n, c = probs.shape
        target = values.target.cpu()[order]
        labels = target if target.ndim == 2 else torch.nn.functional.one_hot(target, c).to(_F64)
        p64 = probs.to(_F64)
        self.label_minus_prob = labels - p64  # (N, C): the class totals, whose first bin is filled by difference
        bins = bin_index(p64.reshape(-1), edges).view(n, c)
        rows, cols = (bins > 0).nonzero(as_tuple=True)  # the entries of the bins above the first (as accumulate)
        column = cols * self.n_bins + bins[rows, cols]
        width = c * self.n_bins
        sample, out_column = torch.cat([rows, rows]), torch.cat([column, column + width])
        value = torch.cat([torch.ones(rows.numel(), dtype=_F64), self.label_minus_prob[rows, cols]])
        order = torch.argsort(sample * (2 * width) + out_column)  # row-major, each entry once
        row_starts = torch.cat([torch.zeros(1, dtype=torch.long), torch.bincount(sample, minlength=n).cumsum(0)])
        with warnings.catch_warnings():  # torch calls its CSR layout beta; (dense @ CSR) is its fastest product here
            warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
            self.classwise = torch.sparse_csr_tensor(row_starts, out_column[order], value[order], (n, 2 * width),
                                                     check_invariants=False)
        self.num_classes = c

    def value_at(self, sorted_values: torch.Tensor, cum: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The value at the 0-based ``positions`` (P,) of each resample's sorted sequence, from its cumulated weights
        after a leading 0 ``cum`` (B, N + 1): the first sample whose cumulated weight exceeds the position."""
        index = torch.searchsorted(cum, positions.to(_F64).expand(cum.shape[0], -1).contiguous(), right=True)
        return sorted_values[(index - 1).clamp_(0, self.n - 1)]

    def equal_mass_edges(self, sorted_values, cum, n_bins: int, quantile: bool) -> torch.Tensor:
        lo, hi, frac = equal_mass_positions(self.n, n_bins, quantile)
        return self.value_at(sorted_values, cum, lo) * (1.0 - frac) + self.value_at(sorted_values, cum, hi) * frac


def _bin_errors(count, conf_sum, acc_sum, n: int) -> Dict[str, torch.Tensor]:
    """ECE, MCE, OE and UE of per-bin sums ``(B, bins)`` (the formulas of :mod:`timm_csm.metrics.binning`)."""
    nonempty = count > 0.5
    safe = torch.where(nonempty, count, torch.ones_like(count))
    c, a, w = conf_sum / safe, acc_sum / safe, count / n
    gap = (a - c).abs()
    return {"ece": (w * gap).sum(1), "mce": torch.where(nonempty, gap, torch.zeros_like(gap)).amax(1),
            "oe": (w * c * (c - a).clamp(min=0)).sum(1), "ue": (w * c * (a - c).clamp(min=0)).sum(1)}


def _between(cum: torch.Tensor, bounds: torch.Tensor) -> torch.Tensor:
    """Sums over the sorted positions ``[bounds[b], bounds[b + 1])`` from cumulated sums with a leading 0."""
    bounds = bounds.expand(cum.shape[0], -1)
    return cum.gather(1, bounds[:, 1:]) - cum.gather(1, bounds[:, :-1])


def _dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Row-wise dot products of two (B, K) tensors, without the (B, K) product."""
    return torch.einsum("ij,ij->i", a, b)


def _selective(s: _Sorted, cum_w: torch.Tensor, cum_acc: torch.Tensor) -> Dict[str, torch.Tensor]:
    """AURC, E-AURC and AUGRC of each resample, run by run of tied confidences in decreasing confidence: ``m``
    samples in the run, ``before`` of higher confidence, their errors ``err`` and ``err_before``; within a run the
    errors rise linearly (the average over its orders), at the rate ``err / m``, so its share of sum_k e_k / k is
    ``err_before dH + err - rate before dH`` with ``dH = H(before + m) - H(before)``, H the harmonic numbers, and
    its share of sum_k e_k is ``err_before m + err (m + 1) / 2``. A run of one sample has its own error as rate."""
    n, h = s.n, s.harmonic
    if s.tied is not None:  # the cumulated sums at the runs' bounds
        cum_w, cum_acc = cum_w.index_select(1, s.run_bounds), cum_acc.index_select(1, s.run_bounds)
    above = cum_w[:, -1:] - cum_w  # samples above each bound
    correct_above = cum_acc[:, -1:] - cum_acc
    harmonic = h[above.long()]  # counts: exact integers in float64
    dh = harmonic[:, :-1] - harmonic[:, 1:]
    m = cum_w.diff(dim=1)
    before = above[:, 1:]
    err_before = before - correct_above[:, 1:]
    total_errors = above[:, 0] - correct_above[:, 0]
    before_dh = before * dh
    rate_terms, squares = before_dh @ s.run_error, (m * m) @ s.run_error  # runs of one sample
    if s.tied is not None:  # tied runs: their rate is their resampled mean error
        t = s.tied
        err = m[:, t] - (correct_above[:, t] - correct_above[:, t + 1])
        rate_terms = rate_terms + (before_dh[:, t] * err / m[:, t].clamp(min=1.0)).sum(1)
        squares = squares + (m[:, t] * err).sum(1)
    aurc = (total_errors + _dot(dh, err_before) - rate_terms) / n
    augrc = (_dot(err_before, m) + (squares + total_errors) / 2.0) / (n * n)
    correct = (n - total_errors).clamp(min=0.0)  # the ideal ordering answers these first
    f = correct.floor().long().clamp(max=n)
    ideal = (n - f - correct * (h[n] - h[f])) / n
    return {"aurc": aurc, "eaurc": aurc - ideal, "augrc": augrc}


def _classwise_ece(s: _Sorted, w: torch.Tensor) -> torch.Tensor:
    width, c, n = s.num_classes * s.n_bins, s.num_classes, s.n
    above = w @ s.classwise  # (B, 2 C bins): counts, label - prob
    count = above[:, :width].reshape(-1, c, s.n_bins).clone()
    diff = above[:, width:].reshape(-1, c, s.n_bins).clone()
    count[:, :, 0] = n - count[:, :, 1:].sum(2)
    diff[:, :, 0] = w @ s.label_minus_prob - diff[:, :, 1:].sum(2)
    return (diff.abs() * (count > 0.5)).sum((1, 2)) / (c * n)


def _piece(s: _Sorted, w: torch.Tensor) -> torch.Tensor:
    cum = torch.cat([torch.zeros(w.shape[0], 1, dtype=_F64), w[:, s.prox_order]], 1).cumsum(1)
    edges = s.equal_mass_edges(s.prox_sorted, cum, s.n_prox_bins, quantile=True)
    prox_bin = torch.searchsorted(edges[:, 1:-1].contiguous(), s.prox.expand(w.shape[0], -1).contiguous())
    joint = prox_bin * s.n_bins + s.conf_bin
    gap = torch.zeros(w.shape[0], s.n_prox_bins * s.n_bins, dtype=_F64)
    gap.scatter_add_(1, joint, w * (s.acc - s.conf))
    return gap.abs().sum(1) / s.n


def _block(s: _Sorted, idx: torch.Tensor, selective: bool) -> Dict[str, torch.Tensor]:
    """Every metric of each resample of the block ``idx`` (B, N)."""
    n, rows = s.n, idx.shape[0]
    # weights in confidence order after a leading 0, so that the cumulated sums start at 0
    w = torch.zeros(rows, n + 1, dtype=_F64).scatter_add_(1, s.column[idx], s.ones.expand(rows, n))
    cum_w, cum_conf, cum_acc = w.cumsum(1), (w * s.conf_pad).cumsum(1), (w * s.acc_pad).cumsum(1)
    cum_acc_sq = (w * s.acc_sq_pad).cumsum(1)
    w = w[:, 1:]
    means = (w @ s.means) / n
    width_sums = [_between(c, s.width_bounds) for c in (cum_w, cum_conf, cum_acc)]
    top = _bin_errors(*width_sums, n)
    debiased = debiased_error_from_bins(*width_sums, _between(cum_acc_sq, s.width_bounds))
    edges = s.equal_mass_edges(s.conf, cum_w, s.n_bins, quantile=False)
    inner = torch.searchsorted(s.conf, edges[:, 1:-1].contiguous(), right=True)
    bounds = torch.cat([torch.zeros(rows, 1, dtype=torch.long), inner, torch.full((rows, 1), n)], 1)
    adaptive = _bin_errors(*[_between(c, bounds) for c in (cum_w, cum_conf, cum_acc)], n)
    out = {"accuracy": means[:, 0], "confidence": means[:, 1], "ece": top["ece"], "aece": adaptive["ece"],
           "cece": _classwise_ece(s, w), "mce": top["mce"], "oe": top["oe"], "ue": top["ue"],
           "debiased_ce": debiased, "nll": means[:, 2], "brier": means[:, 3]}
    if selective:
        out.update(_selective(s, cum_w, cum_acc))
    if s.prox is not None:
        out["piece"] = _piece(s, w)
    return out


def bootstrap_distribution(preds, target, n_bins: int = DEFAULT_N_BINS, *, resamples: int = DEFAULT_RESAMPLES,
                           seed: int = 0, input_type: str = "logits", selective: bool = False, prox=None,
                           n_prox_bins: int = 10) -> Dict[str, torch.Tensor]:
    """``{metric: (resamples,) float64}``: the metrics of :func:`calibration_metrics` (arguments as there) of each
    resample, plus AURC / E-AURC / AUGRC with ``selective`` and PIECE with the samples' proximities ``prox``
    (:func:`timm_csm.metrics.proximity`, ``n_prox_bins`` quantile bins, as :func:`timm_csm.metrics.piece`): the
    names of the metric table's families; a metric registered without a vectorised form here is computed resample
    by resample."""
    return bootstrap_with_estimates(preds, target, n_bins, resamples=resamples, seed=seed, input_type=input_type,
                                    selective=selective, prox=prox, n_prox_bins=n_prox_bins)[0]


def bootstrap_with_estimates(preds, target, n_bins: int = DEFAULT_N_BINS, *, resamples: int = DEFAULT_RESAMPLES,
                             seed: int = 0, input_type: str = "logits", selective: bool = False, prox=None,
                             n_prox_bins: int = 10) -> Tuple[Dict[str, torch.Tensor], Dict[str, float]]:
    """``(distribution, estimates)``: :func:`bootstrap_distribution` and each metric on the data itself, computed
    by the same code with every sample drawn once (what the basic and bias-corrected intervals reflect about)."""
    check_n_bins(n_bins)
    inputs = prepare_inputs(preds, target, input_type=input_type)
    values = sample_values(inputs)
    n = values.confidence.numel()
    _check(n, resamples)
    if prox is not None:
        check_n_bins(n_prox_bins)
        prox = torch.as_tensor(prox)
        if prox.shape != (n,) or not bool(torch.isfinite(prox).all()):
            raise ValueError(f"prox must hold one finite proximity per sample ({n}), got shape {tuple(prox.shape)}")
    s = _Sorted(values, n_bins, prox, n_prox_bins)
    blocks = [_block(s, idx, selective) for idx in _index_blocks(n, resamples, seed)]
    data = _block(s, torch.arange(n).unsqueeze(0), selective)
    keys = list_metrics("calibration") + (list_metrics("selective") if selective else []) + (
        list_metrics("proximity") if prox is not None else [])
    out, estimates = {}, {}
    for k in keys:
        if k in blocks[0]:
            out[k], estimates[k] = torch.cat([b[k] for b in blocks]), float(data[k][0])
        else:
            out[k] = _one_by_one(k, inputs, n, n_bins, resamples, seed)
            spec = metric_spec(k)
            estimates[k] = float(spec.from_state(accumulate(inputs, n_bins, **spec.state_flags)))
    return out, estimates


def _one_by_one(name: str, inputs: PreparedInputs, n: int, n_bins: int, resamples: int, seed: int) -> torch.Tensor:
    """``(resamples,)`` values of a metric registered without a vectorised form here: its ``from_state`` on each
    resample of the same indices, one pass per resample (slower, the same numbers as the metric of the resample)."""
    spec = metric_spec(name)
    values = []
    for idx in _index_blocks(n, resamples, seed):
        for row in idx:
            part = dataclasses.replace(inputs, preds=inputs.preds[row], target=inputs.target[row])
            values.append(spec.from_state(accumulate(part, n_bins, **spec.state_flags)))
    return torch.tensor(values, dtype=_F64)


def bootstrap_metrics(preds, target, n_bins: int = DEFAULT_N_BINS, *, resamples: int = DEFAULT_RESAMPLES, seed: int = 0,
                      level: float = DEFAULT_LEVEL, input_type: str = "logits", selective: bool = False, prox=None,
                      n_prox_bins: int = 10) -> Dict[str, Dict[str, float]]:
    """``{metric: {"low", "high", "method"}}``: each metric's default interval at ``level`` from
    :func:`bootstrap_with_estimates` (:func:`intervals_from_distribution`; a metric without one: ``"reason"``)."""
    _check(1, 1, level)
    distribution, estimates = bootstrap_with_estimates(preds, target, n_bins, resamples=resamples, seed=seed,
                                                       input_type=input_type, selective=selective, prox=prox,
                                                       n_prox_bins=n_prox_bins)
    return intervals_from_distribution(distribution, level, estimates)


def bootstrap_columns(columns: Mapping[str, torch.Tensor], *, medians: Sequence[str] = (),
                      resamples: int = DEFAULT_RESAMPLES, seed: int = 0,
                      level: float = DEFAULT_LEVEL) -> Dict[str, Dict[str, float]]:
    """``{name: {"low", "high"}}`` of the mean of each ``(N,)`` column (its lower median for the names in
    ``medians``, as ``torch.median``), over the resamples of :func:`resample_indices`."""
    names = list(columns)
    data = torch.stack([torch.as_tensor(columns[k]).to(_F64).cpu().reshape(-1) for k in names], 1)
    n = data.shape[0]
    _check(n, resamples, level)
    sorted_data, order = data.sort(dim=0, stable=True)
    out: Dict[str, list] = {k: [] for k in names}
    for idx in _index_blocks(n, resamples, seed):
        w = torch.zeros(idx.shape[0], n, dtype=_F64).scatter_add_(1, idx, torch.ones(idx.shape, dtype=_F64))
        means = (w @ data) / n
        for j, k in enumerate(names):
            if k in medians:
                cum = w[:, order[:, j]].cumsum(1)
                index = torch.searchsorted(cum, torch.full((idx.shape[0], 1), float((n - 1) // 2), dtype=_F64),
                                           right=True)
                out[k].append(sorted_data[index.view(-1).clamp(max=n - 1), j])
            else:
                out[k].append(means[:, j])
    # a column's mean is unbiased and its resampled values centred on it: the percentile interval, whatever its name
    return {k: dict(zip(("low", "high"), percentile_interval(torch.cat(v), level))) for k, v in out.items()}
