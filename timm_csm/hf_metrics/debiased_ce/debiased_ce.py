"""The `evaluate` module ``debiased_ce``: :func:`timm_csm.metrics.debiased_ce` (its description is built in
:mod:`timm_csm.hf_metrics._base`)."""
from timm_csm.hf_metrics import _base


class DebiasedCE(_base.CalibrationMetric):
    metric_name = "debiased_ce"
