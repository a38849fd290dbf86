"""Proximity and the proximity-informed ECE (PIECE) of ProCal (Xiong et al., NeurIPS 2023).

A sample's proximity is how dense the data is around it in the penultimate-feature space: the mean of exp(-d) over
its ``n_neighbors`` nearest neighbours, d the squared L2 distance between L2-normalised features (the official code
uses a faiss flat L2 index, which returns squared distances). Neighbours come from a reference set (the
calibration/validation features); when the evaluated set is the reference set itself, the self-match is dropped.

PIECE bins samples jointly by confidence (``n_conf_bins`` equal-width (lo, hi] bins) and proximity
(``n_prox_bins`` quantile bins of the evaluated set's proximities), and sums |B|/N |acc(B) - conf(B)| over the joint
bins. It is never smaller than the ECE with the same confidence bins, and equals it for one proximity bin.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ..metrics import bin_edges, bin_index
from ._checks import as_logits, as_targets

__all__ = ["proximity", "piece"]


def _as_features(features, name: str) -> torch.Tensor:
    if isinstance(features, np.ndarray):
        features = torch.from_numpy(features)
    if not isinstance(features, torch.Tensor) or not features.is_floating_point() or features.ndim != 2:
        raise ValueError(f"{name} must be a floating-point (N, D) tensor or array")
    if not bool(torch.isfinite(features).all()):
        raise ValueError(f"{name} contain NaN or infinite values")
    return features.detach().double()


def proximity(features, ref_features=None, n_neighbors: int = 10, normalize: bool = True,
              chunk_size: int = 2048) -> torch.Tensor:
    """(N,) proximity of each row of ``features`` to ``ref_features`` (default: to the other rows of
    ``features``): mean over the ``n_neighbors`` nearest neighbours of exp(-squared L2 distance)."""
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


def piece(logits, targets, features, ref_features=None, *, n_neighbors: int = 10, n_conf_bins: int = 15,
          n_prox_bins: int = 10, input_type: str = "logits", prox=None) -> float:
    """Proximity-informed expected calibration error (see the module docstring).

    ``logits`` (N, C) (or probabilities with ``input_type="probs"``), ``targets`` (N,), ``features`` (N, D)
    penultimate features of the same samples, ``ref_features`` the reference set (default: ``features`` without
    self-matches). A precomputed ``prox`` (N,) skips the neighbour search.
    """
    if input_type not in ("logits", "probs"):
        raise ValueError(f"input_type must be 'logits' or 'probs', got {input_type!r}")
    scores = as_logits(logits, "logits" if input_type == "logits" else "probs").double()
    n, num_classes = scores.shape
    targets = as_targets(targets, n, num_classes).to(scores.device)
    if n == 0:
        raise ValueError("piece needs at least one sample")
    if int(n_conf_bins) < 1 or int(n_prox_bins) < 1:
        raise ValueError("n_conf_bins and n_prox_bins must be >= 1")
    probs = torch.softmax(scores, dim=1) if input_type == "logits" else scores
    confidence, pred = probs.max(dim=1)
    correct = (pred == targets).double()
    if prox is None:
        if isinstance(features, (torch.Tensor, np.ndarray)) and len(features) != n:
            raise ValueError(f"features have {len(features)} rows for {n} samples")
        prox = proximity(features, ref_features, n_neighbors)
    else:
        prox = torch.as_tensor(prox, dtype=torch.float64)
        if prox.shape != (n,):
            raise ValueError(f"prox must have shape ({n},), got {tuple(prox.shape)}")
    prox = prox.cpu()
    confidence, correct = confidence.cpu(), correct.cpu()

    conf_bin = bin_index(confidence, bin_edges(int(n_conf_bins)))  # the ECE bins of timm_csm.metrics
    quantiles = torch.linspace(0.0, 1.0, int(n_prox_bins) + 1, dtype=torch.float64)[1:-1]
    prox_inner = torch.quantile(prox, quantiles) if quantiles.numel() else quantiles
    prox_bin = torch.bucketize(prox, prox_inner, right=False)
    joint = prox_bin * int(n_conf_bins) + conf_bin
    gap = torch.zeros(int(n_prox_bins) * int(n_conf_bins), dtype=torch.float64)
    gap.index_add_(0, joint, correct - confidence)
    return float(gap.abs().sum() / n)
