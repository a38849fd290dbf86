"""Classwise expected calibration error: a Hugging Face `evaluate` module,
a thin wrapper over timm_csm.metrics.

Load with ``timm_csm.load_metric("cwece")`` or, after ``import timm_csm`` once, ``evaluate.load("cwece")``.
Options (``n_bins``, ``input_type``, ``task``, ``num_classes``, ``ignore_index``) go to ``evaluate.load`` or
``compute``. NumPy arrays and torch tensors skip evaluate's Arrow cache.

Predictions read as probabilities when every row lies in [0, 1] and sums to 1 (within 1e-3), else as logits
(``input_type="auto"``, the default; an explicit ``input_type`` wins, e.g. "logits" for binary logits that may all
lie in [0, 1]). One score per sample, shape (N,), is a binary task (``task="auto"``). Non-integral or out-of-range
labels, NaN, empty input and mismatched shapes raise ``ValueError`` on every route.
"""
from timm_csm.hf_metrics import _base


class CWECE(_base.CalibrationMetric):
    """Classwise expected calibration error.

    Classwise ECE (Kull et al., 2019): for every class k all samples are binned by p_k; the weighted gaps
    |mean 1[y=k] - mean p_k| are summed over bins and averaged over classes.
    """

    metric_name = "cwece"
    description = __doc__
    needs = {'classwise': True}
    value = _base.state_value("cece")
