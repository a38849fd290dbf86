"""Expected calibration error (top-label, equal-width bins): a Hugging Face `evaluate` module,
a thin wrapper over timm_csm.metrics.

Load with ``timm_csm.load_metric("ece")`` or, after ``import timm_csm`` once, ``evaluate.load("ece")``.
Options (``n_bins``, ``input_type``, ``task``, ``num_classes``, ``ignore_index``) go to ``evaluate.load`` or
``compute``. NumPy arrays and torch tensors skip evaluate's Arrow cache.
"""
from timm_csm.hf_metrics import _base


class ECE(_base.CalibrationMetric):
    """Expected calibration error (top-label, equal-width bins).

    Top-label expected calibration error (Guo et al., 2017): ECE = sum_b |B_b|/N * |acc(B_b) - conf(B_b)| over
    n_bins equal-width, right-closed confidence bins (0 in the first, 1.0 in the last bin).
    """

    metric_name = "ece"
    description = __doc__
    needs = {}
    value = _base.state_value("ece")
