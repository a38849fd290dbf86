"""The `evaluate` module ``mce``: :func:`timm_csm.metrics.mce` (its description is built in
:mod:`timm_csm.hf_metrics._base`)."""
from timm_csm.hf_metrics import _base


class MCE(_base.CalibrationMetric):
    metric_name = "mce"
