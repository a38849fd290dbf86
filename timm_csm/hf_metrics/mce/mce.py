"""Maximum calibration error: a Hugging Face `evaluate` module,
a thin wrapper over timm_csm.metrics.

Load with ``timm_csm.load_metric("mce")`` or, after ``import timm_csm`` once, ``evaluate.load("mce")``.
Options (``n_bins``, ``input_type``, ``task``, ``num_classes``, ``ignore_index``) go to ``evaluate.load`` or
``compute``. NumPy arrays and torch tensors skip evaluate's Arrow cache.

Predictions read as probabilities when every row lies in [0, 1] and sums to 1 (within 1e-3), else as logits
(``input_type="auto"``, the default; an explicit ``input_type`` wins, e.g. "logits" for binary logits that may all
lie in [0, 1]). One score per sample, shape (N,), is a binary task (``task="auto"``). Non-integral or out-of-range
labels, NaN, empty input and mismatched shapes raise ``ValueError`` on every route.
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
