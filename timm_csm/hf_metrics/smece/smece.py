"""The `evaluate` module ``smece``: :func:`timm_csm.metrics.smooth_ece` (its description is built in
:mod:`timm_csm.hf_metrics._base`)."""
from timm_csm.hf_metrics import _base


class SMECE(_base.CalibrationMetric):
    metric_name = "smece"
