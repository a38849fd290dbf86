"""Calibration metrics as plain functions on torch tensors or NumPy arrays.

Common arguments:

* ``preds``: ``(N, C)`` (or dense ``(N, C, *S)``) scores whose meaning is given by ``input_type``: ``"logits"``
  (default), ``"probs"`` or ``"log_probs"``. With ``task="binary"``: one score per sample for the positive class.
* ``target``: class indices ``(N,)`` / ``(N, *S)``, or soft targets with the shape of ``preds`` (rows sum to 1;
  binary: the probability of the positive class).
* ``n_bins``: number of equal-width (or, for adaptive ECE, equal-mass) bins; bins are right-closed ``(lo, hi]`` with
  a confidence of 0 in the first bin and 1.0 in the last (see :mod:`timm_csm.metrics.binning`).
* ``num_classes``: optional check of ``C``; classes absent from ``target`` are fine.
* ``ignore_index``: class-index value to drop (e.g. 255 in segmentation).

Per-sample values are computed in the input's precision (float64 inputs in float64, others in float32) and all sums
over samples and bins are accumulated in float64; results are Python floats (fractions, not percent). Logits may be
``-inf`` (a masked class, probability 0, as in ``torch.softmax``); NaN and ``+inf`` raise. With soft targets the
accuracy of a sample is the target mass on the predicted class, NLL is the cross-entropy ``-Σ y_k log p_k`` and the
Brier score is ``Σ_k (p_k - y_k)^2``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

import torch

from .binning import (DEFAULT_N_BINS, NORMS, bin_edges, bin_index, bin_sums, calibration_error_from_bins, check_n_bins,
                      classwise_error_from_bins, debiased_error_from_bins, equal_mass_bins,
                      overconfidence_from_bins, underconfidence_from_bins)
from .inputs import prepare_inputs
from .smooth import smooth_calibration_error
from .state import CalibrationState, accumulate
from .sweep import ece_sweep_from_points

__all__ = ["ece", "mce", "adaptive_ece", "classwise_ece", "overconfidence_error", "underconfidence_error", "nll",
           "brier_score", "smooth_ece", "ece_sweep", "debiased_ce", "reliability_table", "ReliabilityTable",
           "adaptive_ece_from_points", "reliability_table_from_points", "DEFAULT_N_BINS"]

_NONE = dict(binned=False, classwise=False, nll=False, brier=False, points=False)


def _state(preds, target, n_bins, input_type, task, num_classes, ignore_index, **flags) -> CalibrationState:
    check_n_bins(n_bins)
    inputs = prepare_inputs(preds, target, input_type=input_type, task=task, num_classes=num_classes,
                            ignore_index=ignore_index)
    return accumulate(inputs, n_bins, **{**_NONE, **flags})


@dataclass(frozen=True)
class ReliabilityTable:
    """Per-bin summary of top-label calibration (float64 tensors of length ``n_bins``; ``edges`` has one more).

    ``confidence`` and ``accuracy`` are bin means (NaN for empty bins), ``gap = accuracy - confidence``
    (negative: over-confident). ``ece`` and ``mce`` are computed from exactly these sums.
    """

    edges: torch.Tensor
    count: torch.Tensor
    conf_sum: torch.Tensor
    acc_sum: torch.Tensor

    @property
    def n_bins(self) -> int:
        return self.count.numel()

    @property
    def confidence(self) -> torch.Tensor:
        return self.conf_sum / self.count.where(self.count > 0, torch.full_like(self.count, float("nan")))

    @property
    def accuracy(self) -> torch.Tensor:
        return self.acc_sum / self.count.where(self.count > 0, torch.full_like(self.count, float("nan")))

    @property
    def gap(self) -> torch.Tensor:
        return self.accuracy - self.confidence

    @property
    def ece(self) -> float:
        return calibration_error_from_bins(self.count, self.conf_sum, self.acc_sum, "l1")

    @property
    def mce(self) -> float:
        return calibration_error_from_bins(self.count, self.conf_sum, self.acc_sum, "max")

    def to_dict(self) -> Dict[str, list]:
        """Plain lists (JSON-friendly; empty bins have ``None`` means)."""
        def clean(t):
            return [None if v != v else float(v) for v in t.tolist()]
        return {"lower": self.edges[:-1].tolist(), "upper": self.edges[1:].tolist(),
                "count": [int(c) for c in self.count.tolist()], "confidence": clean(self.confidence),
                "accuracy": clean(self.accuracy), "gap": clean(self.gap)}

    def to_markdown(self) -> str:
        rows = ["| bin | count | confidence | accuracy | gap |", "|---|---|---|---|---|"]
        d = self.to_dict()
        fmt = lambda v: "–" if v is None else f"{v:.4f}"  # noqa: E731
        for i in range(self.n_bins):
            rows.append(f"| ({d['lower'][i]:.3f}, {d['upper'][i]:.3f}] | {d['count'][i]} | "
                        f"{fmt(d['confidence'][i])} | {fmt(d['accuracy'][i])} | {fmt(d['gap'][i])} |")
        return "\n".join(rows)


def _table(state: CalibrationState) -> ReliabilityTable:
    return ReliabilityTable(bin_edges(state.n_bins, device=state.device), state.count.clone(),
                            state.conf_sum.clone(), state.acc_sum.clone())


def reliability_table_from_points(confidences: torch.Tensor, accuracies: torch.Tensor, n_bins: int = DEFAULT_N_BINS,
                                  equal_mass: bool = False) -> ReliabilityTable:
    """The reliability table of ``(N,)`` (confidence, accuracy) pairs: equal-width bins, or with ``equal_mass``
    the adaptive ones (edges interpolate the sorted confidences at positions ``b N / n_bins``,
    :func:`~timm_csm.metrics.binning.equal_mass_edges`). Bins are right-closed, so samples tied at an edge share a
    bin and every sample (the lowest included) is counted. Its ``ece`` is the top-label ECE, resp. the adaptive
    ECE, of the pairs; pairs (p_ik, 1[y_i = k]) of every class give the classwise (marginal) diagram."""
    check_n_bins(n_bins)
    if confidences.numel() == 0:
        raise ValueError("no samples: the calibration error of an empty set is undefined")
    conf = confidences.to(torch.float64).reshape(-1)
    if equal_mass:
        edges, b = equal_mass_bins(conf, n_bins)
    else:
        edges = bin_edges(n_bins, device=conf.device)
        b = bin_index(conf, edges)
    return ReliabilityTable(edges, *bin_sums(b, n_bins, conf, accuracies.to(torch.float64).reshape(-1)))


def adaptive_ece_from_points(confidences: torch.Tensor, accuracies: torch.Tensor,
                             n_bins: int = DEFAULT_N_BINS) -> float:
    """Equal-mass ECE from ``(N,)`` confidences and accuracies (:func:`reliability_table_from_points`)."""
    return reliability_table_from_points(confidences, accuracies, n_bins, equal_mass=True).ece


def ece(preds, target, n_bins: int = DEFAULT_N_BINS, *, input_type: str = "logits", norm: str = "l1",
        task: str = "multiclass", num_classes: Optional[int] = None, ignore_index: Optional[int] = None) -> float:
    """Top-label expected calibration error with equal-width bins (Guo et al., 2017).

    ``norm="l1"``: ECE = Σ_b (|B_b| / N) |acc(B_b) - conf(B_b)|; ``"l2"``: sqrt(Σ_b (|B_b| / N) (acc - conf)^2);
    ``"max"``: MCE = max over non-empty bins of |acc - conf|.
    """
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
    return _from_bins(lambda *sums: calibration_error_from_bins(*sums, norm), "ECE", preds, target, n_bins,
                      input_type, task, num_classes, ignore_index)


def _from_bins(from_bins, what: str, preds, target, n_bins, input_type, task, num_classes, ignore_index,
               squares: bool = False) -> float:
    """``from_bins(count, conf_sum, acc_sum)`` of the equal-width bins of one pass over the inputs (with
    ``squares``, also the bins' sums of squared accuracies)."""
    st = _state(preds, target, n_bins, input_type, task, num_classes, ignore_index, binned=True)
    st.require("binned", what)
    return from_bins(st.count, st.conf_sum, st.acc_sum, *((st.acc_sq_sum,) if squares else ()))


def mce(preds, target, n_bins: int = DEFAULT_N_BINS, *, input_type: str = "logits", task: str = "multiclass",
        num_classes: Optional[int] = None, ignore_index: Optional[int] = None) -> float:
    """Maximum calibration error: max over non-empty equal-width bins of |acc(B_b) - conf(B_b)|."""
    return ece(preds, target, n_bins, input_type=input_type, norm="max", task=task, num_classes=num_classes,
               ignore_index=ignore_index)


def overconfidence_error(preds, target, n_bins: int = DEFAULT_N_BINS, *, input_type: str = "logits",
                         task: str = "multiclass", num_classes: Optional[int] = None,
                         ignore_index: Optional[int] = None) -> float:
    """OE = Σ_b (|B_b| / N) conf_b max(conf_b - acc_b, 0) (Thulasidasan et al., 2019)."""
    return _from_bins(overconfidence_from_bins, "OE", preds, target, n_bins, input_type, task, num_classes,
                      ignore_index)


def underconfidence_error(preds, target, n_bins: int = DEFAULT_N_BINS, *, input_type: str = "logits",
                          task: str = "multiclass", num_classes: Optional[int] = None,
                          ignore_index: Optional[int] = None) -> float:
    """UE = Σ_b (|B_b| / N) conf_b max(acc_b - conf_b, 0), the mirror of OE as logged by the CSM evaluation."""
    return _from_bins(underconfidence_from_bins, "UE", preds, target, n_bins, input_type, task, num_classes,
                      ignore_index)


def adaptive_ece(preds, target, n_bins: int = DEFAULT_N_BINS, *, input_type: str = "logits", task: str = "multiclass",
                 num_classes: Optional[int] = None, ignore_index: Optional[int] = None) -> float:
    """Adaptive (equal-mass) ECE: the ECE formula over ``n_bins`` bins holding about N / n_bins samples each.

    See :func:`adaptive_ece_from_points` for the edge rule (the MbLS/focal-calibration interpolation, with the
    lowest sample kept).
    """
    st = _state(preds, target, n_bins, input_type, task, num_classes, ignore_index, points=True)
    st.require("points", "adaptive ECE")
    conf, acc = st.points()
    return adaptive_ece_from_points(conf, acc, n_bins)


def classwise_ece(preds, target, n_bins: int = DEFAULT_N_BINS, *, input_type: str = "logits", task: str = "multiclass",
                  num_classes: Optional[int] = None, ignore_index: Optional[int] = None) -> float:
    """Classwise ECE (Kull et al., 2019; the MbLS/focal-calibration ``ClasswiseECELoss``).

    For every class k, all N samples are binned by p_k (equal-width bins); cECE = (1/C) Σ_k Σ_b (|B_kb| / N)
    |mean_{B_kb} y_k - mean_{B_kb} p_k|, with y_k = 1[target = k] or the soft target. Classes absent from the data
    count in the mean.
    """
    st = _state(preds, target, n_bins, input_type, task, num_classes, ignore_index, classwise=True)
    st.require("classwise", "classwise ECE")
    return classwise_error_from_bins(st.cw_count, st.cw_prob_sum, st.cw_label_sum, float(st.n))


def debiased_ce(preds, target, n_bins: int = DEFAULT_N_BINS, *, input_type: str = "logits", task: str = "multiclass",
                num_classes: Optional[int] = None, ignore_index: Optional[int] = None, squared: bool = False) -> float:
    """Debiased top-label l2 calibration error (Kumar, Liang & Ma, "Verified Uncertainty Calibration", NeurIPS 2019).

    In ECE's equal-width bins, the squared l2 error Σ_b (|B_b| / N) (acc_b - conf_b)^2 less each bin's estimated
    variance of acc_b, acc_b (1 - acc_b) / (|B_b| - 1) (bins of two samples or more), then sqrt(max(., 0)); with
    ``squared`` the unbiased estimate of the squared error itself (it can be negative). A binned ECE of a well
    calibrated model is dominated by the noise of its bins; this estimate is not, so it tells small errors apart
    with fewer samples (the paper's Section 5).
    """
    return _from_bins(lambda *sums: float(debiased_error_from_bins(*sums, squared=squared)), "debiased CE", preds,
                      target, n_bins, input_type, task, num_classes, ignore_index, squares=True)


def nll(preds, target, *, input_type: str = "logits", task: str = "multiclass", num_classes: Optional[int] = None,
        ignore_index: Optional[int] = None) -> float:
    """Mean negative log-likelihood ``-(1/N) Σ_i Σ_k y_ik log p_ik`` (cross-entropy for soft targets).

    Logits use a max-shifted log-softmax (equal to ``torch.nn.functional.cross_entropy``); given probabilities are
    floored at 1e-12 before the log.
    """
    st = _state(preds, target, 1, input_type, task, num_classes, ignore_index, nll=True)
    st.require("nll", "NLL")
    return float(st.nll) / float(st.n)


def brier_score(preds, target, *, input_type: str = "logits", task: str = "multiclass",
                num_classes: Optional[int] = None, ignore_index: Optional[int] = None) -> float:
    """Multiclass Brier score ``(1/N) Σ_i Σ_k (p_ik - y_ik)^2`` (summed over classes, in [0, 2]); with
    ``task="binary"`` the binary Brier score ``(1/N) Σ_i (p_i - y_i)^2`` of the positive class (in [0, 1], as
    scikit-learn's ``brier_score_loss``), half the two-class sum."""
    st = _state(preds, target, 1, input_type, task, num_classes, ignore_index, brier=True)
    st.require("brier", "Brier score")
    value = float(st.brier) / float(st.n)
    return value / 2.0 if task == "binary" else value


def smooth_ece(preds, target, *, input_type: str = "logits", task: str = "multiclass",
               num_classes: Optional[int] = None, ignore_index: Optional[int] = None, sigma: Optional[float] = None,
               return_sigma: bool = False):
    """Smooth ECE of the top-label (confidence, accuracy) pairs (Błasiok & Nakkiran, ICLR 2024).

    Reflected Gaussian kernel; bandwidth chosen automatically as the fixed point σ = smECE_σ unless ``sigma`` is
    given. See :mod:`timm_csm.metrics.smooth`. Returns the value, or ``(value, sigma)`` with ``return_sigma``.
    """
    from .smooth import smooth_calibration_error_sigma

    st = _state(preds, target, 1, input_type, task, num_classes, ignore_index, points=True)
    st.require("points", "smooth ECE")
    conf, acc = st.points()
    if sigma is not None:
        value = smooth_calibration_error_sigma(conf, acc, sigma)
        return (value, float(sigma)) if return_sigma else value
    return smooth_calibration_error(conf, acc, return_sigma=return_sigma)


def ece_sweep(preds, target, *, input_type: str = "logits", norm: str = "l1", task: str = "multiclass",
              num_classes: Optional[int] = None, ignore_index: Optional[int] = None) -> float:
    """ECE-sweep (Roelofs et al., AISTATS 2022): the top-label ECE over the largest number of equal-mass bins whose
    accuracies stay monotone in confidence (``norm`` ``"l1"`` or ``"l2"``); see :mod:`timm_csm.metrics.sweep`."""
    st = _state(preds, target, 1, input_type, task, num_classes, ignore_index, points=True)
    st.require("points", "ECE-sweep")
    return ece_sweep_from_points(*st.points(), norm=norm)


def reliability_table(preds, target, n_bins: int = DEFAULT_N_BINS, *, input_type: str = "logits",
                      task: str = "multiclass", num_classes: Optional[int] = None,
                      ignore_index: Optional[int] = None) -> ReliabilityTable:
    """Per-bin edges, counts, mean confidence, accuracy and gap (see :class:`ReliabilityTable`)."""
    st = _state(preds, target, n_bins, input_type, task, num_classes, ignore_index, binned=True)
    st.require("binned", "a reliability table")
    return _table(st)
