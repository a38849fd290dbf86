"""The `evaluate` module ``cece``: :func:`timm_csm.metrics.classwise_ece` (its description is built in
:mod:`timm_csm.hf_metrics._base`)."""
from timm_csm.hf_metrics import _base


class CECE(_base.CalibrationMetric):
    metric_name = "cece"
