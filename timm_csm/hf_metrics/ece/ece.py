"""The `evaluate` module ``ece``: :func:`timm_csm.metrics.ece` (its description is built in
:mod:`timm_csm.hf_metrics._base`)."""
from timm_csm.hf_metrics import _base


class ECE(_base.CalibrationMetric):
    metric_name = "ece"
