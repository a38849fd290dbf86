"""The `evaluate` module ``aece``: :func:`timm_csm.metrics.adaptive_ece` (its description is built in
:mod:`timm_csm.hf_metrics._base`)."""
from timm_csm.hf_metrics import _base


class AECE(_base.CalibrationMetric):
    metric_name = "aece"
