"""Brier score (multiclass: summed over classes; binary: of the positive class): a Hugging Face `evaluate`
module, a thin wrapper over timm_csm.metrics.

Load with ``timm_csm.load_metric("brier")`` or, after ``import timm_csm`` once, ``evaluate.load("brier")``.
Options (``n_bins``, ``input_type``, ``task``, ``num_classes``, ``ignore_index``) go to ``evaluate.load`` or
``compute``. NumPy arrays and torch tensors skip evaluate's Arrow cache.

Predictions read as probabilities when every row lies in [0, 1] and sums to 1 (within 1e-3), else as logits
(``input_type="auto"``, the default; an explicit ``input_type`` wins, e.g. "logits" for binary logits that may all
lie in [0, 1]). One score per sample, shape (N,), is a binary task (``task="auto"``). Non-integral or out-of-range
labels, NaN, empty input and mismatched shapes raise ``ValueError`` on every route.
"""
from timm_csm.hf_metrics import _base


class Brier(_base.CalibrationMetric):
    """Brier score (Brier, 1950).

    Multiclass: 1/N sum_i sum_k (p_ik - y_ik)^2, summed over classes (range [0, 2]), Brier's (1950) definition and
    that of the calibration-loss literature. Binary task (``task="binary"``, or (N,) predictions with
    ``task="auto"``): the binary Brier score 1/N sum_i (p_i - y_i)^2 of the positive-class probability (range
    [0, 1]), as scikit-learn's ``brier_score_loss`` and evaluate's ``brier_score``; it is half the two-class sum.
    Two-column (N, 2) predictions with the multiclass task give the two-class sum.
    """

    metric_name = "brier"
    description = __doc__
    needs = {'brier': True}
    value = _base.brier_value
