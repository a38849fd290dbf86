"""The `evaluate` module ``nll``: :func:`timm_csm.metrics.nll` (its description is built in
:mod:`timm_csm.hf_metrics._base`)."""
from timm_csm.hf_metrics import _base


class NLL(_base.CalibrationMetric):
    metric_name = "nll"
