"""Excess area under the risk-coverage curve: a Hugging Face `evaluate` module,
a thin wrapper over timm_csm.metrics.

Load with ``timm_csm.load_metric("eaurc")`` or, after ``import timm_csm`` once, ``evaluate.load("eaurc")``.
Options (``n_bins``, ``input_type``, ``task``, ``num_classes``, ``ignore_index``) go to ``evaluate.load`` or
``compute``. NumPy arrays and torch tensors skip evaluate's Arrow cache.

Predictions read as probabilities when every row lies in [0, 1] and sums to 1 (within 1e-3), else as logits
(``input_type="auto"``, the default; an explicit ``input_type`` wins, e.g. "logits" for binary logits that may all
lie in [0, 1]). One score per sample, shape (N,), is a binary task (``task="auto"``). Non-integral or out-of-range
labels, NaN, empty input and mismatched shapes raise ``ValueError`` on every route.
"""
from timm_csm.hf_metrics import _base


class EAURC(_base.CalibrationMetric):
    """Excess area under the risk-coverage curve.

    Excess AURC (Geifman et al., ICLR 2019): AURC minus the AURC of a confidence that ranks every correct
    prediction above every error at the same accuracy; 0 is a perfect ranking.
    """

    metric_name = "eaurc"
    description = __doc__
    citation = _base.CITATION_SELECTIVE
    needs = {"keep_confidences": True}
    value = _base.selective_value("eaurc")
