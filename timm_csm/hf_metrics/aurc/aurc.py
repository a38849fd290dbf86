"""The `evaluate` module ``aurc``: :func:`timm_csm.metrics.aurc` (its description is built in
:mod:`timm_csm.hf_metrics._base`)."""
from timm_csm.hf_metrics import _base


class AURC(_base.CalibrationMetric):
    metric_name = "aurc"
