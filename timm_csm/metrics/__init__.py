"""Calibration metrics: a pure functional core on torch tensors (NumPy accepted) and a streaming accumulator.

Functions: :func:`ece` (norms l1 / l2 / max), :func:`adaptive_ece`, :func:`classwise_ece`, :func:`mce`,
:func:`overconfidence_error`, :func:`underconfidence_error`, :func:`debiased_ce` (Kumar et al.'s debiased l2
error), :func:`nll`, :func:`brier_score`, :func:`smooth_ece`, :func:`ece_sweep` (Roelofs et al.'s
monotone sweep of equal-mass bins),
:func:`reliability_table`, :func:`calibration_metrics` (all of them in one pass) and :func:`piece` (ProCal's
proximity-informed ECE, from penultimate features via :func:`proximity`). Selective prediction: :func:`aurc`,
:func:`eaurc`, :func:`augrc` and :func:`risk_coverage_curve` (:mod:`timm_csm.metrics.selective`;
:func:`selective_metrics_from_points` from kept confidences). Out-of-distribution detection: :func:`ood_score`
(max softmax, max logit, energy, entropy), :func:`ood_auroc`, :func:`ood_aupr`, :func:`fpr_at_tpr` and
:func:`ood_metrics` (:mod:`timm_csm.metrics.ood`). Intervals (:mod:`timm_csm.metrics.intervals`):
:func:`bootstrap_metrics` (each metric's interval by its default method of :mod:`timm_csm.metrics.interval_methods`,
vectorised over the resamples). Over training
seeds (:mod:`timm_csm.metrics.paired`): :func:`paired_t_interval`, :func:`holm`'s correction, :func:`mean_std`.
Streaming: :class:`CalibrationAccumulator`.
The metric table (:mod:`timm_csm.metrics.table`): each metric's one name (its result key, ``evaluate`` module and
report column), label, scale, direction and the statistics it reads, for every consumer; :func:`register_metric`
adds one, :func:`list_metrics` and :func:`metric_spec` read it.
The input contract, which every function and the accumulator apply: :func:`prepare_inputs` (with
:func:`infer_input_type` / :func:`infer_task` for callers that read the input type from the data, as the
``evaluate`` modules do). Plots: :mod:`timm_csm.metrics.plots` (needs matplotlib).

Conventions (details in :mod:`timm_csm.metrics.functional` and :mod:`timm_csm.metrics.binning`): ``input_type`` is
explicit (``"logits"``, ``"probs"``, ``"log_probs"``); targets are class indices or soft targets; bins are
right-closed ``(lo, hi]`` with 0 in the first and 1.0 in the last bin; sums are float64; results are fractions.
"""
from .accumulator import CalibrationAccumulator
from .binning import DEFAULT_N_BINS, bin_edges, bin_index, check_n_bins
from .functional import (ReliabilityTable, adaptive_ece, brier_score, classwise_ece, debiased_ce, ece, ece_sweep, mce,
                         nll,
                         overconfidence_error, reliability_table, reliability_table_from_points, smooth_ece,
                         underconfidence_error)
from .interval_methods import (DEFAULT_INTERVALS, INTERVAL_METHODS, interval_method, list_interval_methods,
                               register_interval_method)
from .intervals import (bootstrap_columns, bootstrap_distribution, bootstrap_metrics, bootstrap_with_estimates,
                        percentile_interval, resample_indices)
from .paired import (PairedInterval, detectable_difference, holm, interval_text, mean_std, paired_outcome,
                     paired_t_interval)
from .ood import OOD_KEYS, OOD_SCORES, fpr_at_tpr, ood_aupr, ood_auroc, ood_metrics, ood_score
from .inputs import (INPUT_TYPES, ROW_SUM_ATOL, TASKS, PreparedInputs, as_tensor, infer_input_type, infer_task,
                     prepare_inputs)
from .proximity import piece, proximity
from .selective import RiskCoverage, augrc, aurc, eaurc, risk_coverage_curve, selective_metrics_from_points
from .table import (LEGACY_NAMES, METRIC_KEYS, METRICS, SELECTIVE_KEYS, VIEWS, MetricSpec, calibration_metrics,
                    list_metrics, metric_of_abbrev, metric_spec, metrics_for, register_metric)

__all__ = ["ece", "adaptive_ece", "classwise_ece", "mce", "overconfidence_error", "underconfidence_error", "nll",
           "brier_score", "smooth_ece", "ece_sweep", "debiased_ce", "reliability_table", "reliability_table_from_points",
           "calibration_metrics",
           "piece", "proximity", "CalibrationAccumulator", "ReliabilityTable", "METRIC_KEYS", "INPUT_TYPES", "TASKS",
           "ROW_SUM_ATOL", "bin_edges", "bin_index", "aurc", "eaurc", "augrc", "risk_coverage_curve", "RiskCoverage",
           "selective_metrics_from_points", "SELECTIVE_KEYS", "check_n_bins", "as_tensor", "infer_input_type",
           "infer_task", "prepare_inputs", "PreparedInputs", "ood_score", "ood_auroc", "ood_aupr", "fpr_at_tpr",
           "ood_metrics", "OOD_SCORES", "OOD_KEYS", "bootstrap_metrics", "bootstrap_distribution",
           "bootstrap_with_estimates", "interval_method", "list_interval_methods", "register_interval_method",
           "INTERVAL_METHODS", "METRICS",
           "DEFAULT_INTERVALS",
           "bootstrap_columns", "resample_indices", "percentile_interval", "paired_t_interval", "PairedInterval",
           "paired_outcome", "interval_text", "mean_std", "holm", "detectable_difference", "MetricSpec",
           "register_metric", "metric_spec", "list_metrics", "metrics_for", "metric_of_abbrev", "VIEWS",
           "DEFAULT_N_BINS", "LEGACY_NAMES"]
