"""Smooth expected calibration error: a Hugging Face `evaluate` module,
a thin wrapper over timm_csm.metrics.

Load with ``timm_csm.load_metric("smece")`` or, after ``import timm_csm`` once, ``evaluate.load("smece")``.
Options (``n_bins``, ``input_type``, ``task``, ``num_classes``, ``ignore_index``) go to ``evaluate.load`` or
``compute``. NumPy arrays and torch tensors skip evaluate's Arrow cache.

Predictions read as probabilities when every row lies in [0, 1] and sums to 1 (within 1e-3), else as logits
(``input_type="auto"``, the default; an explicit ``input_type`` wins, e.g. "logits" for binary logits that may all
lie in [0, 1]). One score per sample, shape (N,), is a binary task (``task="auto"``). Non-integral or out-of-range
labels, NaN, empty input and mismatched shapes raise ``ValueError`` on every route.
"""
from timm_csm.hf_metrics import _base


class SMECE(_base.CalibrationMetric):
    """Smooth expected calibration error.

    Smooth ECE (Blasiok & Nakkiran, ICLR 2024) of the top-label confidences: kernel smoothing with a reflected
    Gaussian and the automatic bandwidth sigma = smECE_sigma, as in the relplot package.
    """

    metric_name = "smece"
    description = __doc__
    needs = {'keep_confidences': True}
    value = _base.smooth_value
