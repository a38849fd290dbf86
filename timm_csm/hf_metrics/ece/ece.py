"""Expected calibration error (top-label, equal-width bins): a Hugging Face `evaluate` module,
a thin wrapper over timm_csm.metrics.

Load with ``timm_csm.load_metric("ece")`` or, after ``import timm_csm`` once, ``evaluate.load("ece")``.
Options (``n_bins``, ``input_type``, ``task``, ``num_classes``, ``ignore_index``) go to ``evaluate.load`` or
``compute``. NumPy arrays and torch tensors skip evaluate's Arrow cache.

Predictions read as probabilities when every row lies in [0, 1] and sums to 1 (within 1e-3), else as logits
(``input_type="auto"``, the default; an explicit ``input_type`` wins, e.g. "logits" for binary logits that may all
lie in [0, 1]). One score per sample, shape (N,), is a binary task (``task="auto"``). Non-integral or out-of-range
labels, NaN, empty input and mismatched shapes raise ``ValueError`` on every route.
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
