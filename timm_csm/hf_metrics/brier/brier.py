"""The `evaluate` module ``brier``: :func:`timm_csm.metrics.brier_score` (its description is built in
:mod:`timm_csm.hf_metrics._base`)."""
from timm_csm.hf_metrics import _base


class Brier(_base.CalibrationMetric):
    metric_name = "brier"
