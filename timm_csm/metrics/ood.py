"""Out-of-distribution detection from logits: per-sample scores and the detection metrics, in float64.

Scores (higher = more in-distribution), from logits z with p = softmax(z):

* ``"msp"``: the maximum softmax probability max_k p_k (Hendrycks & Gimpel, ICLR 2017);
* ``"max_logit"``: max_k z_k (Hendrycks et al., ICML 2022);
* ``"energy"``: log sum_k exp(z_k), the negative free energy at temperature 1 (Liu et al., NeurIPS 2020);
* ``"entropy"``: sum_k p_k log p_k, the negative predictive entropy.

Metrics of in-distribution scores ``s_in`` against out-of-distribution scores ``s_out``:

* :func:`ood_auroc`: P(s_in > s_out) + P(s_in = s_out) / 2 (the area under the ROC curve, ties counted half:
  scikit-learn's ``roc_auc_score`` with the in-distribution samples as positives);
* :func:`ood_aupr`: average precision (scikit-learn's ``average_precision_score``, sum_n (R_n - R_{n-1}) P_n over
  the distinct thresholds) with the in-distribution (``"in"``) or the out-of-distribution samples (``"out"``, their
  scores negated) as positives;
* :func:`fpr_at_tpr`: the share of out-of-distribution samples accepted at the highest threshold that accepts at
  least ``tpr`` of the in-distribution samples (FPR at 95 % TPR with ``tpr = 0.95``).

Intervals: :func:`bootstrap_ood_distribution` resamples the in- and the out-of-distribution samples apart (each
with replacement, as :func:`~timm_csm.metrics.resample_indices` draws them) and computes all four metrics of every
resample without a loop over the resamples: the scores are sorted once, a resample is a weight per sample (how often
it was drawn), and every curve is a cumulative sum of those weights read at the ends of the runs of tied scores.
"""
from __future__ import annotations

from typing import Dict, Iterator

import torch

from .inputs import as_tensor

__all__ = ["OOD_SCORES", "OOD_KEYS", "ood_score", "ood_auroc", "ood_aupr", "fpr_at_tpr", "ood_metrics",
           "bootstrap_ood_distribution", "bootstrap_ood_metrics"]

#: resampled weights per block of :func:`bootstrap_ood_distribution` (resamples per block: this over N)
_BLOCK = 1 << 21

OOD_SCORES = ("msp", "max_logit", "energy", "entropy")
OOD_KEYS = ("auroc", "aupr_in", "aupr_out", "fpr95")


def ood_score(logits, kind: str) -> torch.Tensor:
    """(N,) float64 scores ``kind`` (one of :data:`OOD_SCORES`) of logits (N, C); higher = more in-distribution."""
    z = as_tensor(logits, "logits").double()
    if z.ndim != 2 or z.shape[1] < 1:
        raise ValueError(f"logits must be (N, C), got shape {tuple(z.shape)}")
    if not torch.isfinite(z).all():
        raise ValueError("logits must be finite")
    if kind == "msp":
        return torch.softmax(z, dim=1).amax(dim=1)
    if kind == "max_logit":
        return z.amax(dim=1)
    if kind == "energy":
        return torch.logsumexp(z, dim=1)
    if kind == "entropy":
        log_p = torch.log_softmax(z, dim=1)
        return (log_p.exp() * log_p).sum(dim=1)
    raise ValueError(f"unknown OOD score {kind!r}; known: {', '.join(OOD_SCORES)}")


def _pair(scores_in, scores_out):
    s_in = as_tensor(scores_in, "scores_in").double().reshape(-1)
    s_out = as_tensor(scores_out, "scores_out").double().reshape(-1)
    if s_in.numel() == 0 or s_out.numel() == 0:
        raise ValueError(f"OOD metrics need in- and out-of-distribution scores, got {s_in.numel()} and "
                         f"{s_out.numel()}")
    if not (torch.isfinite(s_in).all() and torch.isfinite(s_out).all()):
        raise ValueError("OOD scores must be finite")
    return s_in, s_out


def _positive_curve(pos: torch.Tensor, neg: torch.Tensor):
    """(true positives, false positives) at each distinct threshold, from the highest score down."""
    scores = torch.cat([pos, neg])
    is_pos = torch.cat([torch.ones_like(pos), torch.zeros_like(neg)])
    order = torch.argsort(scores, descending=True, stable=True)
    scores, is_pos = scores[order], is_pos[order]
    last = torch.ones_like(scores, dtype=torch.bool)
    last[:-1] = scores[1:] != scores[:-1]  # the last sample of each run of equal scores
    tps = torch.cumsum(is_pos, 0)[last]
    fps = torch.cumsum(1 - is_pos, 0)[last]
    return tps, fps


def ood_auroc(scores_in, scores_out) -> float:
    """Area under the ROC curve of in- (positive) against out-of-distribution scores (ties count half)."""
    s_in, s_out = _pair(scores_in, scores_out)
    tps, fps = _positive_curve(s_in, s_out)
    tpr = torch.cat([tps.new_zeros(1), tps / s_in.numel()])
    fpr = torch.cat([fps.new_zeros(1), fps / s_out.numel()])
    return float(torch.trapezoid(tpr, fpr))


def ood_aupr(scores_in, scores_out, positive: str = "in") -> float:
    """Average precision with the ``positive`` (``"in"`` or ``"out"``) samples as the positive class."""
    s_in, s_out = _pair(scores_in, scores_out)
    if positive not in ("in", "out"):
        raise ValueError(f"positive must be 'in' or 'out', got {positive!r}")
    pos, neg = (s_in, s_out) if positive == "in" else (-s_out, -s_in)
    tps, fps = _positive_curve(pos, neg)
    precision = tps / (tps + fps)
    recall = tps / pos.numel()
    steps = torch.diff(torch.cat([recall.new_zeros(1), recall]))
    return float((steps * precision).sum())


def fpr_at_tpr(scores_in, scores_out, tpr: float = 0.95) -> float:
    """The false-positive rate (out-of-distribution samples accepted) at the highest threshold whose true-positive
    rate (in-distribution samples accepted) is at least ``tpr``."""
    if not 0.0 < float(tpr) <= 1.0:
        raise ValueError(f"tpr must lie in (0, 1], got {tpr}")
    s_in, s_out = _pair(scores_in, scores_out)
    tps, fps = _positive_curve(s_in, s_out)
    reached = (tps / s_in.numel()) >= float(tpr) - 1e-12
    return float(fps[reached][0] / s_out.numel())


def ood_metrics(scores_in, scores_out) -> Dict[str, float]:
    """``{"auroc", "aupr_in", "aupr_out", "fpr95"}`` of in- against out-of-distribution scores."""
    return {"auroc": ood_auroc(scores_in, scores_out), "aupr_in": ood_aupr(scores_in, scores_out, "in"),
            "aupr_out": ood_aupr(scores_in, scores_out, "out"), "fpr95": fpr_at_tpr(scores_in, scores_out, 0.95)}


def _sorted_weights(rank: torch.Tensor, n_total: int, resamples: int, seed: int) -> Iterator[torch.Tensor]:
    """Blocks of (resamples, n_total) float32 counts of each sample in each resample of :func:`resample_indices`,
    placed at the samples' ``rank`` in the common order (integer counts: exact in float32, as are their cumulative
    sums below 2**24)."""
    from .intervals import resample_indices

    idx = rank[resample_indices(rank.numel(), resamples, seed)]
    per_block = max(1, _BLOCK // n_total)
    for start in range(0, resamples, per_block):
        block = idx[start:start + per_block]
        yield torch.zeros(block.shape[0], n_total).scatter_add_(1, block, torch.ones(block.shape))


def _average_precision(tps: torch.Tensor, fps: torch.Tensor, n_pos: int, single: torch.Tensor) -> torch.Tensor:
    """Average precision per row from the resampled curves' counts at each threshold (a threshold adding no
    positive adds nothing, whatever its precision).

    A threshold holding one sample of the data (``single``) that a resample drew w times counts the w copies as w
    thresholds in a row, as the data's own distinct scores are counted: sum_{j=1..w} (T + j) / (T + j + F) with T,
    F the counts above it, = w - F (digamma(T + F + w + 1) - digamma(T + F + 1)). Counted as one tie instead, every
    copy would take the precision of the last, and the resampled values would all lie above the estimate (its
    interval could miss it: 0.1258 with [0.1262, 0.1263]). Ties of the data stay ties."""
    zero = tps.new_zeros(tps.shape[0], 1)
    above_tps, above_fps = torch.cat([zero, tps[:, :-1]], 1), torch.cat([zero, fps[:, :-1]], 1)
    steps = tps - above_tps
    tied = steps * tps / (tps + fps).clamp_min(1.0)
    above = above_tps + above_fps + 1
    copies = steps - above_fps * (torch.digamma(above + steps) - torch.digamma(above))
    return torch.where(single, copies, tied).sum(1) / n_pos


def bootstrap_ood_distribution(scores_in, scores_out, *, resamples: int = 1000, seed: int = 0,
                               tpr: float = 0.95) -> Dict[str, torch.Tensor]:
    """``{"auroc", "aupr_in", "aupr_out", "fpr95"}``, each (resamples,) float64: the metrics of :func:`ood_metrics`
    of each resample, the in-distribution samples drawn with ``seed`` and the out-of-distribution ones with
    ``seed + 1``; each value equals :func:`ood_metrics` of the resampled scores up to float64 rounding, the copies
    of a sample drawn more than once counted as distinct scores in the average precisions (as the data's own
    distinct scores are; :func:`_average_precision`)."""
    s_in, s_out = _pair(scores_in, scores_out)
    n_in, n_out = s_in.numel(), s_out.numel()
    scores = torch.cat([s_in, s_out])
    order = torch.argsort(scores, descending=True, stable=True)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel())
    ranked = scores[order]
    last = torch.ones_like(ranked, dtype=torch.bool)
    last[:-1] = ranked[1:] != ranked[:-1]  # the thresholds: the last sample of each run of tied scores
    runs = None if bool(last.all()) else last
    ends = torch.nonzero(last).squeeze(1)
    single = torch.diff(ends, prepend=ends.new_full((1,), -1)) == 1  # thresholds holding one sample of the data
    n = n_in + n_out
    out: Dict[str, list] = {k: [] for k in OOD_KEYS}
    for w_in, w_out in zip(_sorted_weights(rank[:n_in], n, resamples, seed),
                           _sorted_weights(rank[n_in:], n, resamples, seed + 1)):
        tps, fps = torch.cumsum(w_in, 1), torch.cumsum(w_out, 1)  # resampled samples at or above each threshold
        if runs is not None:
            tps, fps = tps[:, runs], fps[:, runs]
        tps, fps = tps.double(), fps.double()
        zero = tps.new_zeros(tps.shape[0], 1)
        prev_tps, prev_fps = torch.cat([zero, tps[:, :-1]], 1), torch.cat([zero, fps[:, :-1]], 1)
        out["auroc"].append(((fps - prev_fps) * (tps + prev_tps)).sum(1) / (2.0 * n_in * n_out))  # trapezoids
        out["aupr_in"].append(_average_precision(tps, fps, n_in, single))
        reached = tps >= (float(tpr) - 1e-12) * n_in  # the last threshold always reaches it (all samples accepted)
        out["fpr95"].append(fps.gather(1, reached.to(torch.int8).argmax(1, keepdim=True)).squeeze(1) / n_out)
        # the out-of-distribution samples as positives, scores negated: the same runs from the lowest up, each
        # threshold accepting what the in-distribution curve had not yet accepted one run above it
        out["aupr_out"].append(_average_precision((n_out - prev_fps).flip(1), (n_in - prev_tps).flip(1), n_out,
                                                  single.flip(0)))
    return {k: torch.cat(v) for k, v in out.items()}


def bootstrap_ood_metrics(scores_in, scores_out, *, resamples: int = 1000, seed: int = 0,
                          level: float = 0.95) -> Dict[str, Dict[str, float]]:
    """``{metric: {"low", "high", "method"}}``: each metric's default interval at ``level``
    (:mod:`~timm_csm.metrics.interval_methods`) from :func:`bootstrap_ood_distribution` and :func:`ood_metrics`."""
    from .intervals import intervals_from_distribution

    return intervals_from_distribution(bootstrap_ood_distribution(scores_in, scores_out, resamples=resamples,
                                                                  seed=seed), level, ood_metrics(scores_in, scores_out))

