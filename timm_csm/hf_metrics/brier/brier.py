"""Multiclass Brier score: a Hugging Face `evaluate` module,
a thin wrapper over timm_csm.metrics.

Load with ``timm_csm.load_metric("brier")`` or, after ``import timm_csm`` once, ``evaluate.load("brier")``.
Options (``n_bins``, ``input_type``, ``task``, ``num_classes``, ``ignore_index``) go to ``evaluate.load`` or
``compute``. NumPy arrays and torch tensors skip evaluate's Arrow cache.
"""
from timm_csm.hf_metrics import _base


class Brier(_base.CalibrationMetric):
    """Multiclass Brier score.

    Multiclass Brier score 1/N sum_i sum_k (p_ik - y_ik)^2, summed over classes (range [0, 2]).
    """

    metric_name = "brier"
    description = __doc__
    needs = {'brier': True}
    value = _base.state_value("brier")
