"""The full metric set written plainly in NumPy, a yardstick for ``metrics_bench.py``: the same eleven quantities as
``timm_csm.metrics.calibration_metrics`` (accuracy, confidence, ECE, adaptive ECE, classwise ECE, MCE, over- and
under-confidence, debiased CE, NLL, Brier), each by its textbook formula over the whole array, with none of
timm_csm's input checks, tie handling or exactness guarantees. What it costs is what the sums cost without the
package's work beyond them; it is not a library (its bins and ties follow the formulas, not timm_csm's rules)."""
from __future__ import annotations

import numpy as np


def _bins(values: np.ndarray, n_bins: int) -> np.ndarray:
    """Equal-width, right-closed bins ((k - 1) / B, k / B], the lowest holding 0."""
    return np.clip(np.ceil(values * n_bins).astype(np.int64) - 1, 0, n_bins - 1)


def plain_metric_set(logits: np.ndarray, labels: np.ndarray, n_bins: int = 15) -> dict:
    """The eleven metrics of ``(N, C)`` float logits and ``(N,)`` class indices, as fractions."""
    n, c = logits.shape
    rows = np.arange(n)
    top = logits.max(1, keepdims=True)
    e = np.exp(logits - top)
    s = e.sum(1)
    p = e / s[:, None]
    conf = p.max(1).astype(np.float64)
    acc = (p.argmax(1) == labels).astype(np.float64)
    p_y = p[rows, labels].astype(np.float64)
    out = {"accuracy": acc.mean(), "confidence": conf.mean(),
           "nll": np.mean(np.log(s) + top[:, 0] - logits[rows, labels]),
           "brier": np.mean(np.einsum("ij,ij->i", p, p, dtype=np.float64) - 2.0 * p_y + 1.0)}
    b = _bins(conf, n_bins)
    count = np.bincount(b, minlength=n_bins)
    conf_sum, acc_sum = np.bincount(b, conf, n_bins), np.bincount(b, acc, n_bins)
    gap = conf_sum - acc_sum
    filled = count > 0
    out["ece"] = np.abs(gap).sum() / n
    out["mce"] = (np.abs(gap[filled]) / count[filled]).max()
    # over- / under-confidence: each bin's gap of either sign weighted by its mean confidence
    mean_conf = conf_sum[filled] / count[filled]
    out["oe"] = (mean_conf * np.maximum(gap[filled], 0)).sum() / n
    out["ue"] = (mean_conf * np.maximum(-gap[filled], 0)).sum() / n
    # Kumar et al.'s debiased l2 error: each bin's squared gap less its accuracy's sampling variance (bins of one
    # sample have none and add nothing)
    mean_acc, two = acc_sum / np.maximum(count, 1), count >= 2
    var = mean_acc[two] * (1 - mean_acc[two]) / (count[two] - 1)
    debiased = (count[two] / n * ((gap[two] / count[two]) ** 2 - var)).sum()
    out["debiased_ce"] = np.sqrt(max(debiased, 0.0))
    # adaptive ECE: the sorted confidences in n_bins runs of (nearly) equal size
    order = np.argsort(conf, kind="stable")
    equal_mass = rows * n_bins // n
    out["aece"] = np.abs(np.bincount(equal_mass, conf[order], n_bins)
                         - np.bincount(equal_mass, acc[order], n_bins)).sum() / n
    # classwise ECE: every (sample, class) probability binned in its class's bins; the labels' sums from the
    # target entries (the other entries' labels are 0)
    index = _bins(p, n_bins) + (np.arange(c) * n_bins)[None, :]
    prob_sums = np.bincount(index.ravel(), p.ravel().astype(np.float64), c * n_bins)
    label_sums = np.bincount(index[rows, labels], minlength=c * n_bins)
    out["cece"] = np.abs(prob_sums - label_sums).sum() / (n * c)
    return {k: float(v) for k, v in out.items()}
