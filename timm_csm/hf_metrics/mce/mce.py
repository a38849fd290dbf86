"""Maximum calibration error: a Hugging Face `evaluate` module,
a thin wrapper over timm_csm.metrics.

Load with ``timm_csm.load_metric("mce")`` or, after ``import timm_csm`` once, ``evaluate.load("mce")``.
Options (``n_bins``, ``input_type``, ``task``, ``num_classes``, ``ignore_index``) go to ``evaluate.load`` or
``compute``. NumPy arrays and torch tensors skip evaluate's Arrow cache.
"""
from timm_csm.hf_metrics import _base


class MCE(_base.CalibrationMetric):
    """Maximum calibration error.

    Maximum calibration error: the largest |acc - conf| over non-empty equal-width confidence bins.
    """

    metric_name = "mce"
    description = __doc__
    needs = {}
    value = _base.state_value("mce")
