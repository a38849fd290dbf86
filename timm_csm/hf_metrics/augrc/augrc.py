"""The `evaluate` module ``augrc``: :func:`timm_csm.metrics.augrc` (its description is built in
:mod:`timm_csm.hf_metrics._base`)."""
from timm_csm.hf_metrics import _base


class AUGRC(_base.CalibrationMetric):
    metric_name = "augrc"
