"""Smooth expected calibration error: a Hugging Face `evaluate` module,
a thin wrapper over timm_csm.metrics.

Load with ``timm_csm.load_metric("smece")`` or, after ``import timm_csm`` once, ``evaluate.load("smece")``.
Options (``n_bins``, ``input_type``, ``task``, ``num_classes``, ``ignore_index``) go to ``evaluate.load`` or
``compute``. NumPy arrays and torch tensors skip evaluate's Arrow cache.
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
