"""Selective prediction: the risk-coverage curve and the areas under it (AURC, E-AURC, AUGRC).

A selective classifier answers only on the samples whose confidence (the top-label probability) is highest. With
the N samples ordered by decreasing confidence and e_k the number of errors (1 - accuracy, so soft targets give
fractional errors) among the first k:

* coverage c_k = k / N, selective risk r_k = e_k / k, generalised risk g_k = e_k / N;
* AURC (Geifman, Uziel & El-Yaniv, ICLR 2019) = (1/N) Σ_{k=1..N} r_k, the mean selective risk over the N
  coverages;
* E-AURC = AURC - AURC*, where AURC* is the AURC of the ideal ordering (every correct sample before every error:
  r*_k = max(0, k - (N - E)) / k with E = e_N), so E-AURC is 0 for a confidence that ranks perfectly;
* AUGRC (Traub et al., NeurIPS 2024) = (1/N) Σ_k g_k, the mean generalised risk: the rate of silent failures
  (accepted and wrong) averaged over coverages, which unlike AURC does not weigh the few most confident samples
  most.

Tied confidences have no order: within a run of tied samples the errors are spread evenly (e_k interpolates
linearly between the run's ends, the expectation over the orders of the run), so the result does not depend on the
sort. The sums are float64. TorchUncertainty's AURC integrates the curve with the trapezoid rule and rescales by
1 / (1 - 1/N); it agrees with this mean to O(1/N).
"""
from __future__ import annotations

from typing import Dict, NamedTuple, Optional

import torch

__all__ = ["RiskCoverage", "risk_coverage_from_points", "selective_metrics_from_points", "risk_coverage_curve",
           "aurc", "eaurc", "augrc"]


class RiskCoverage(NamedTuple):
    """The curve at every coverage k / N (float64 tensors of length N): ``coverage``, selective ``risk``,
    ``generalized_risk``, and the ``threshold`` (the k-th highest confidence)."""

    coverage: torch.Tensor
    risk: torch.Tensor
    generalized_risk: torch.Tensor
    threshold: torch.Tensor

    def to_dict(self, max_points: int = 200) -> Dict[str, list]:
        """Plain lists of at most ``max_points`` evenly spaced points of the curve (the last one included)."""
        n = self.coverage.numel()
        keep = torch.unique(torch.linspace(0, n - 1, min(n, max_points)).round().long())
        return {name: [float(v) for v in getattr(self, name)[keep]] for name in self._fields}


def _errors_at_coverages(confidences: torch.Tensor, errors: torch.Tensor) -> torch.Tensor:
    """e_k for k = 1..N, ties spread evenly (see the module docstring); also returns the sorted confidences."""
    order = torch.argsort(confidences, descending=True, stable=True)
    conf, err = confidences[order], errors[order]
    _, sizes = torch.unique_consecutive(conf, return_counts=True)
    ends = torch.cumsum(sizes, 0)
    run_errors = torch.zeros(sizes.numel(), dtype=torch.float64, device=conf.device)
    run_errors.index_add_(0, torch.repeat_interleave(torch.arange(sizes.numel(), device=conf.device), sizes), err)
    before = torch.cumsum(run_errors, 0) - run_errors
    starts = (ends - sizes).to(torch.float64)
    k = torch.arange(1, conf.numel() + 1, dtype=torch.float64, device=conf.device)
    per_sample = torch.repeat_interleave
    e_k = per_sample(before, sizes) + (k - per_sample(starts, sizes)) * per_sample(run_errors / sizes, sizes)
    return e_k, conf


def risk_coverage_from_points(confidences: torch.Tensor, accuracies: torch.Tensor) -> RiskCoverage:
    """The risk-coverage curve from per-sample confidences and accuracies ``(N,)`` (1 correct, 0 wrong, or the
    target mass on the predicted class)."""
    if confidences.numel() == 0:
        raise ValueError("no samples: the risk-coverage curve of an empty set is undefined")
    conf = confidences.reshape(-1).to(torch.float64)
    errors = 1.0 - accuracies.reshape(-1).to(torch.float64)
    e_k, sorted_conf = _errors_at_coverages(conf, errors)
    n = conf.numel()
    k = torch.arange(1, n + 1, dtype=torch.float64, device=conf.device)
    return RiskCoverage(k / n, e_k / k, e_k / n, sorted_conf)


def selective_metrics_from_points(confidences: torch.Tensor, accuracies: torch.Tensor) -> Dict[str, float]:
    """``{"aurc", "eaurc", "augrc"}`` from per-sample confidences and accuracies (see the module docstring)."""
    curve = risk_coverage_from_points(confidences, accuracies)
    n = curve.coverage.numel()
    total_errors = float(curve.generalized_risk[-1]) * n
    k = torch.arange(1, n + 1, dtype=torch.float64, device=curve.risk.device)
    ideal = (k - (n - total_errors)).clamp_min(0.0) / k
    aurc_value = float(curve.risk.mean())
    return {"aurc": aurc_value, "eaurc": aurc_value - float(ideal.mean()),
            "augrc": float(curve.generalized_risk.mean())}


def _points(preds, target, input_type, task, num_classes, ignore_index):
    from .functional import _state

    st = _state(preds, target, 1, input_type, task, num_classes, ignore_index, points=True)
    st.require("points", "selective-prediction metrics")
    return st.points()


def risk_coverage_curve(preds, target, *, input_type: str = "logits", task: str = "multiclass",
                        num_classes: Optional[int] = None, ignore_index: Optional[int] = None) -> RiskCoverage:
    """The risk-coverage curve of the top-label confidence (arguments as :func:`timm_csm.metrics.ece`)."""
    return risk_coverage_from_points(*_points(preds, target, input_type, task, num_classes, ignore_index))


def aurc(preds, target, *, input_type: str = "logits", task: str = "multiclass", num_classes: Optional[int] = None,
         ignore_index: Optional[int] = None) -> float:
    """Area under the risk-coverage curve: the mean selective risk over the coverages 1/N .. 1."""
    points = _points(preds, target, input_type, task, num_classes, ignore_index)
    return selective_metrics_from_points(*points)["aurc"]


def eaurc(preds, target, *, input_type: str = "logits", task: str = "multiclass",
          num_classes: Optional[int] = None, ignore_index: Optional[int] = None) -> float:
    """Excess AURC: AURC minus the AURC of the ideal ordering at the same accuracy."""
    points = _points(preds, target, input_type, task, num_classes, ignore_index)
    return selective_metrics_from_points(*points)["eaurc"]


def augrc(preds, target, *, input_type: str = "logits", task: str = "multiclass",
          num_classes: Optional[int] = None, ignore_index: Optional[int] = None) -> float:
    """Area under the generalised risk-coverage curve (Traub et al., 2024): the mean rate of accepted errors."""
    points = _points(preds, target, input_type, task, num_classes, ignore_index)
    return selective_metrics_from_points(*points)["augrc"]
