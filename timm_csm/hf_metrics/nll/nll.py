"""Negative log-likelihood: a Hugging Face `evaluate` module,
a thin wrapper over timm_csm.metrics.

Load with ``timm_csm.load_metric("nll")`` or, after ``import timm_csm`` once, ``evaluate.load("nll")``.
Options (``n_bins``, ``input_type``, ``task``, ``num_classes``, ``ignore_index``) go to ``evaluate.load`` or
``compute``. NumPy arrays and torch tensors skip evaluate's Arrow cache.
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
