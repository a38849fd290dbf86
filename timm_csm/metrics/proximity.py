"""Proximity and the proximity-informed expected calibration error (PIECE) of ProCal (Xiong et al., NeurIPS 2023).

A sample's proximity is how dense the data is around it in the penultimate-feature space: the mean of exp(-d) over
its ``n_neighbors`` nearest neighbours, d the squared L2 distance between L2-normalised features (the official code
uses a faiss flat L2 index, which returns squared distances). Neighbours come from a reference set (the
calibration/validation features); when the evaluated set is the reference set itself, the self-match is dropped.

PIECE bins samples jointly by confidence (``n_conf_bins`` equal-width bins, exactly the bins of :func:`ece`) and
proximity (``n_prox_bins`` quantile bins of the evaluated set's proximities) and sums |B|/N |acc(B) - conf(B)| over
the joint bins. By the triangle inequality it is never smaller than the ECE with the same confidence bins, and it
equals that ECE for one proximity bin.

Deviations from the official code: both kinds of bins are right-closed ``(lo, hi]``, as every binned metric here
(the official code's ``np.digitize`` confidence bins and quantile ``KBinsDiscretizer`` proximity bins are
``[lo, hi)``, and the latter merges duplicate edges). The proximity edges are the linear quantiles of the official
code, computed by :func:`timm_csm.metrics.binning.equal_mass_edges` (``quantile=True``), which shares the
interpolation of the adaptive ECE edges but keeps the quantile positions ``b (N - 1) / n_bins``: the AECE
positions ``b N / n_bins`` would put tied proximities (and the sample at each position) into the lower bin. Compared
with ``torch.quantile`` (used here before the edges were shared) an edge can differ in the last bits, which changes
PIECE only where an edge rounds onto a sample's proximity. PIECE's confidences and accuracies are now those of
:func:`ece` (computed in the input's precision, so float32 logits give float32 softmax confidences, where the
earlier code here took a float64 softmax): one proximity bin reproduces the reported ECE.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from .binning import bin_edges, bin_index, bin_sums, check_n_bins, equal_mass_edges
from .inputs import as_tensor, prepare_inputs
from .state import accumulate

__all__ = ["proximity", "piece"]

_POINTS_ONLY = dict(binned=False, classwise=False, nll=False, brier=False, points=True)


def _as_features(features, name: str) -> torch.Tensor:
    x = as_tensor(features, name)
    if not x.is_floating_point() or x.ndim != 2:
        raise ValueError(f"{name} must be a floating-point (N, D) tensor or array, got dtype {x.dtype} and shape "
                         f"{tuple(x.shape)}")
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} contain NaN or infinite values")
    return x.double()


def proximity(features, ref_features=None, n_neighbors: int = 10, normalize: bool = True,
              chunk_size: int = 2048) -> torch.Tensor:
    """(N,) proximity of each row of ``features`` to ``ref_features`` (default: to the other rows of
    ``features``): mean over the ``n_neighbors`` nearest neighbours of exp(-squared L2 distance), in float64."""
    query = _as_features(features, "features")
    exclude_self = ref_features is None
    ref = query if exclude_self else _as_features(ref_features, "ref_features")
    if ref.shape[1] != query.shape[1]:
        raise ValueError(f"features have dimension {query.shape[1]}, ref_features {ref.shape[1]}")
    available = ref.shape[0] - (1 if exclude_self else 0)
    if not 1 <= int(n_neighbors) <= available:
        raise ValueError(f"n_neighbors must be between 1 and {available} (reference points), got {n_neighbors}")
    k = int(n_neighbors)
    if normalize:
        query, ref = F.normalize(query, dim=1), F.normalize(ref, dim=1)
    ref_sq = (ref * ref).sum(dim=1)
    out = torch.empty(query.shape[0], dtype=torch.float64)
    for start in range(0, query.shape[0], chunk_size):
        block = query[start:start + chunk_size]
        dist = ((block * block).sum(dim=1, keepdim=True) + ref_sq.unsqueeze(0) - 2.0 * block @ ref.t()).clamp_min(0)
        if exclude_self:
            rows = torch.arange(block.shape[0])
            dist[rows, rows + start] = float("inf")
        nearest = torch.topk(dist, k, dim=1, largest=False).values
        out[start:start + block.shape[0]] = torch.exp(-nearest).mean(dim=1).cpu()
    return out


def _sample_proximity(features, ref_features, n_neighbors: int, prox, n: int) -> torch.Tensor:
    if prox is None:
        rows = _as_features(features, "features").shape[0]
        if rows != n:  # before the O(N M) neighbour search
            raise ValueError(f"features have {rows} rows for {n} samples")
        return proximity(features, ref_features, n_neighbors)
    prox = as_tensor(prox, "prox").to(torch.float64).cpu()
    if prox.shape != (n,):
        raise ValueError(f"prox must have shape ({n},), got {tuple(prox.shape)}")
    if not bool(torch.isfinite(prox).all()):
        raise ValueError("prox contains NaN or infinite values")
    return prox


def piece(preds, target, features, ref_features=None, *, n_neighbors: int = 10, n_conf_bins: int = 15,
          n_prox_bins: int = 10, input_type: str = "logits", prox: Optional[torch.Tensor] = None) -> float:
    """Proximity-informed expected calibration error (see the module docstring).

    ``preds`` (N, C) scores of ``input_type`` (``"logits"``, ``"probs"`` or ``"log_probs"``), ``target`` (N,) class
    indices or (N, C) soft targets, ``features`` (N, D) penultimate features of the same samples, ``ref_features``
    the reference set (default: ``features`` without self-matches). A precomputed ``prox`` (N,) skips the
    neighbour search. Confidences and accuracies are those of :func:`ece` (the input's precision, float64 sums).
    """
    check_n_bins(n_conf_bins)
    check_n_bins(n_prox_bins)
    shape = tuple(as_tensor(preds, "preds").shape)
    if len(shape) != 2:
        raise ValueError(f"preds must have shape (N, C) (one row per sample with features), got {shape}")
    inputs = prepare_inputs(preds, target, input_type=input_type)
    conf, acc = accumulate(inputs, n_conf_bins, **_POINTS_ONLY).points()
    n = conf.numel()
    if n == 0:
        raise ValueError("no samples: PIECE of an empty set is undefined")
    conf, acc = conf.cpu(), acc.cpu()
    prox = _sample_proximity(features, ref_features, n_neighbors, prox, n)
    conf_bin = bin_index(conf, bin_edges(n_conf_bins))
    prox_bin = bin_index(prox, equal_mass_edges(prox, n_prox_bins, quantile=True), equal_width=False)
    _, gap = bin_sums(prox_bin * n_conf_bins + conf_bin, n_prox_bins * n_conf_bins, acc - conf)
    return float(gap.abs().sum() / n)
