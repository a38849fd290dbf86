"""The `evaluate` module ``eaurc``: :func:`timm_csm.metrics.eaurc` (its description is built in
:mod:`timm_csm.hf_metrics._base`)."""
from timm_csm.hf_metrics import _base


class EAURC(_base.CalibrationMetric):
    metric_name = "eaurc"
