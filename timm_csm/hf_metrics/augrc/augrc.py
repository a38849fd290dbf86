"""Area under the generalized risk-coverage curve: a Hugging Face `evaluate` module,
a thin wrapper over timm_csm.metrics.

Load with ``timm_csm.load_metric("augrc")`` or, after ``import timm_csm`` once, ``evaluate.load("augrc")``.
Options (``n_bins``, ``input_type``, ``task``, ``num_classes``, ``ignore_index``) go to ``evaluate.load`` or
``compute``. NumPy arrays and torch tensors skip evaluate's Arrow cache.

Predictions read as probabilities when every row lies in [0, 1] and sums to 1 (within 1e-3), else as logits
(``input_type="auto"``, the default; an explicit ``input_type`` wins, e.g. "logits" for binary logits that may all
lie in [0, 1]). One score per sample, shape (N,), is a binary task (``task="auto"``). Non-integral or out-of-range
labels, NaN, empty input and mismatched shapes raise ``ValueError`` on every route.
"""
from timm_csm.hf_metrics import _base


class AUGRC(_base.CalibrationMetric):
    """Area under the generalized risk-coverage curve.

    Area under the generalized risk-coverage curve (Traub et al., NeurIPS 2024): the rate of accepted errors
    (silent failures), e_k / N, averaged over the coverages k / N.
    """

    metric_name = "augrc"
    description = __doc__
    citation = _base.CITATION_SELECTIVE
    needs = {"keep_confidences": True}
    value = _base.selective_value("augrc")
