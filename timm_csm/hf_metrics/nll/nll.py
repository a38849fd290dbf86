"""Negative log-likelihood: a Hugging Face `evaluate` module,
a thin wrapper over timm_csm.metrics.

Load with ``timm_csm.load_metric("nll")`` or, after ``import timm_csm`` once, ``evaluate.load("nll")``.
Options (``n_bins``, ``input_type``, ``task``, ``num_classes``, ``ignore_index``) go to ``evaluate.load`` or
``compute``. NumPy arrays and torch tensors skip evaluate's Arrow cache.

Predictions read as probabilities when every row lies in [0, 1] and sums to 1 (within 1e-3), else as logits
(``input_type="auto"``, the default; an explicit ``input_type`` wins, e.g. "logits" for binary logits that may all
lie in [0, 1]). One score per sample, shape (N,), is a binary task (``task="auto"``). Non-integral or out-of-range
labels, NaN, empty input and mismatched shapes raise ``ValueError`` on every route.
"""
from timm_csm.hf_metrics import _base


class NLL(_base.CalibrationMetric):
    """Negative log-likelihood.

    Mean negative log-likelihood -1/N sum_i sum_k y_ik log p_ik (cross-entropy for soft references); logits
    use a max-shifted log-softmax, given probabilities are floored at 1e-12.
    """

    metric_name = "nll"
    description = __doc__
    needs = {'nll': True}
    value = _base.state_value("nll")
