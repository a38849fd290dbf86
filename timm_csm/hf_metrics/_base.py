"""Shared base of the ``evaluate`` modules: a thin :class:`evaluate.Metric` over the public API of
:mod:`timm_csm.metrics`, and the one place their descriptions are written (:func:`describe`).

Only the module scripts (``<name>/<name>.py``, which hold the class evaluate loads and its name) import this file,
so ``evaluate`` is imported only when a metric is loaded.

Two routes lead to the same numbers:

* the standard evaluate route (lists, ``add``/``add_batch`` into evaluate's Arrow cache, or ``num_process > 1``);
* a fast route for NumPy arrays and torch tensors in a single process: ``compute(predictions=array, ...)`` and
  ``add_batch(predictions=array, ...)`` feed a :class:`~timm_csm.metrics.CalibrationAccumulator` directly and never
  encode the ``(N, C)`` matrix to Arrow (which costs minutes and gigabytes at 2e5 x 1000).

Both routes validate every batch with the functional core's checks (:func:`~timm_csm.metrics.prepare_inputs`
and the value checks of :meth:`~timm_csm.metrics.CalibrationAccumulator.update`) before anything is stored, so bad
input raises a ``ValueError`` instead of being cast by Arrow (float references truncated to class indices, soft
binary targets to 0).

Reading of the predictions (``input_type="auto"``, the default): every row in ``[0, 1]`` and summing to 1 reads as
probabilities, any value outside ``[0, 1]`` as logits, and values in ``[0, 1]`` whose rows do not all sum to 1 are
refused as ambiguous (:func:`~timm_csm.metrics.infer_input_type`); ``task="auto"`` reads
one score per sample (shape ``(N,)``) as binary. An explicit ``input_type`` / ``task`` always wins. Arrays added
batch by batch must all read the same way; the Arrow route decides once, over all rows, in ``compute``.
"""
from __future__ import annotations

import inspect
from typing import Dict, Optional

import datasets
import evaluate
import numpy as np
import torch

from timm_csm.metrics import (DEFAULT_N_BINS, INPUT_TYPES, LEGACY_NAMES, ROW_SUM_ATOL, TASKS, CalibrationAccumulator,
                              MetricSpec, as_tensor, check_n_bins, infer_input_type, infer_task, metric_spec,
                              prepare_inputs, selective_metrics_from_points)

__all__ = ["CalibrationMetric", "OPTION_NAMES", "AUTO", "module_spec", "describe"]

OPTION_NAMES = ("n_bins", "input_type", "task", "num_classes", "ignore_index")
AUTO = "auto"

_USAGE = f"""
A Hugging Face `evaluate` module over timm_csm.metrics. Load it with ``timm_csm.load_metric("<name>")`` or, after
``import timm_csm`` once, ``evaluate.load("<name>")``. Options (``n_bins``, ``input_type``, ``task``,
``num_classes``, ``ignore_index``) go to ``evaluate.load`` or ``compute``. NumPy arrays and torch tensors skip
evaluate's Arrow cache.

Predictions read as probabilities when every row lies in [0, 1] and sums to 1 (within {ROW_SUM_ATOL:g}), as logits
when a value lies outside [0, 1], and values in [0, 1] whose rows do not all sum to 1 raise ``ValueError`` (they
could be either; ``input_type="auto"``, the default). An explicit ``input_type`` wins, e.g. "logits" for logits that
may all lie in [0, 1]. One score per sample, shape (N,), is a binary task (``task="auto"``). Non-integral or
out-of-range labels, NaN, empty input and mismatched shapes raise ``ValueError`` on every route.
"""


def module_spec(name: str) -> MetricSpec:
    """The metric table's entry of module ``name`` (a script cached by an earlier release may carry an earlier name,
    :data:`~timm_csm.metrics.table.LEGACY_NAMES`)."""
    return metric_spec(LEGACY_NAMES.get(name, name))


def describe(name: str) -> str:
    """The description of module ``name``: the docstring of the function of :mod:`timm_csm.metrics` it computes,
    then how the module is loaded and reads its inputs."""
    function = module_spec(name).function
    return f"{inspect.cleandoc(function.__doc__)}\n{_USAGE.replace('<name>', name)}"


_INPUTS = """
Args:
    predictions: (N, C) scores per sample, or (N,) positive-class scores for a binary task (lists, NumPy arrays or
        torch tensors; dense (N, C, *S) arrays on the array route).
    references: class indices (N,) or soft targets (N, C) whose rows sum to 1 (binary: 0/1 labels or the
        probability of the positive class, shape (N,)). Non-integral class indices, labels outside 0..C-1, NaN,
        empty input and mismatched shapes raise ValueError.
    input_type (str, default "auto"): "auto" reads the predictions as probabilities when every row lies in [0, 1]
        and sums to 1 (within <tol>; binary: every value in [0, 1]), as logits when a value lies outside [0, 1],
        and refuses values in [0, 1] whose rows do not all sum to 1; "logits", "probs" or "log_probs" fix the
        reading (pass "logits" for logits that may all lie in [0, 1]).
    task (str, default "auto"): "auto" reads (N,) predictions as binary and everything else as multiclass;
        "multiclass" or "binary" fix it (dense binary (N, *S) predictions need task="binary").
    n_bins (int, default 15), num_classes (int), ignore_index (int): further options. Give options to
        `evaluate.load(..., n_bins=10)` or to `compute(...)`.
Returns:
    dict with one float: {"<name>": value} (a fraction, not percent).
""".replace("<tol>", f"{ROW_SUM_ATOL:g}")

_PRED_VECTOR = datasets.Sequence(datasets.Value("float32"))
_PRED_SCALAR = datasets.Value("float32")
# Arrow features per (task, soft references); the validated batch picks one (evaluate would take the first that
# encodes the first example, and int64 encoding truncates 0.7 to 0)
_FEATURES = {
    ("multiclass", False): datasets.Features({"predictions": _PRED_VECTOR, "references": datasets.Value("int64")}),
    ("multiclass", True): datasets.Features({"predictions": _PRED_VECTOR, "references": _PRED_VECTOR}),
    ("binary", False): datasets.Features({"predictions": _PRED_SCALAR, "references": datasets.Value("int64")}),
    ("binary", True): datasets.Features({"predictions": _PRED_SCALAR, "references": _PRED_SCALAR}),
}
_NO_STATISTICS = dict(classwise=False, keep_confidences=False, nll=False, brier=False)


def _is_array(x) -> bool:
    return isinstance(x, (np.ndarray, torch.Tensor))


def _predictions(x, name: str = "predictions") -> torch.Tensor:
    """``x`` as a tensor; Python numbers become float64 (evaluate's float feature), arrays keep their dtype."""
    t = as_tensor(x, name)
    return t if _is_array(x) or t.is_floating_point() else t.double()


class CalibrationMetric(evaluate.Metric):
    """Base class; a subclass sets ``metric_name``, a name of the metric table (:func:`module_spec`), which gives
    the rest."""

    metric_name = ""

    def __init__(self, n_bins: int = DEFAULT_N_BINS, input_type: str = AUTO, task: str = AUTO,
                 num_classes: Optional[int] = None, ignore_index: Optional[int] = None, **kwargs):
        self.options = self._check_options(dict(n_bins=n_bins, input_type=input_type, task=task,
                                                num_classes=num_classes, ignore_index=ignore_index))
        self._fast: Optional[CalibrationAccumulator] = None
        self._arrow_kind = None  # (task, soft) of the batches in evaluate's Arrow cache
        super().__init__(**kwargs)

    # --- evaluate API -----------------------------------------------------------------------------------------
    def _info(self):
        return evaluate.MetricInfo(description=describe(self.metric_name),
                                   citation=module_spec(self.metric_name).citation,
                                   inputs_description=_INPUTS, features=list(_FEATURES.values()),
                                   reference_urls=["https://github.com/huggingface/evaluate"])

    def _compute(self, predictions=None, references=None, **options) -> Dict[str, float]:
        """The Arrow route's final step, over all stored rows (of every process)."""
        opts = self._merged(options)
        preds = np.asarray(predictions, dtype=np.float32)
        acc = self._accumulator(self._resolved(preds, opts))
        acc.update(preds, np.asarray(references))
        return self._result(acc, opts)

    def compute(self, *, predictions=None, references=None, **kwargs) -> Optional[dict]:
        """Compute the metric. NumPy arrays or torch tensors in a single process skip evaluate's Arrow cache."""
        if predictions is None and references is None and self._fast is None and self.writer is None:
            raise ValueError(f"{self.name}: nothing to compute (no predictions given or added)")
        opts = self._merged(kwargs)
        if not self._fast_route(predictions, references):
            if predictions is not None or references is not None:
                self._arrow_add(predictions, references, opts)
            return super().compute(**kwargs)
        try:
            if self._fast is not None and opts != self.options:
                raise ValueError(f"{self.name}: compute options {kwargs} differ from the options the added batches "
                                 "were accumulated with; give options to evaluate.load(...) when using add_batch")
            if predictions is not None:
                self._fast_update(predictions, references, opts)
            acc = self._fast
        finally:
            self._fast = None
        return self._result(acc, opts)

    def add_batch(self, *, predictions=None, references=None, **kwargs):
        """Add a batch. NumPy arrays or torch tensors in a single process go to an in-memory accumulator."""
        if self._fast is not None or (self.writer is None and self.num_process == 1 and not kwargs
                                      and _is_array(predictions)):
            self._fast_update(predictions, references, self.options)
            return None
        if kwargs:  # evaluate names the unknown inputs
            return super().add_batch(predictions=predictions, references=references, **kwargs)
        return self._arrow_add(predictions, references, self.options)

    def add(self, *, prediction=None, reference=None, **kwargs):
        """Add one example (goes to the array accumulator when array batches were added before)."""
        if kwargs:
            return super().add(prediction=prediction, reference=reference, **kwargs)
        preds = _predictions(prediction, "prediction").unsqueeze(0)  # a batch of one
        refs = as_tensor(reference, "reference").unsqueeze(0)
        if self._fast is not None:
            self._fast_update(preds, refs, self.options)
            return None
        preds, refs = self._checked_for_arrow(preds, refs, self.options)
        return super().add(prediction=preds[0], reference=refs[0])

    # --- validation -------------------------------------------------------------------------------------------
    def _fast_update(self, predictions, references, opts) -> None:
        preds = _predictions(predictions)
        resolved = self._resolved(preds, opts)
        acc = self._fast if self._fast is not None else self._accumulator(resolved)
        if (resolved["input_type"], resolved["task"]) != (acc.input_type, acc.task):
            raise ValueError(f"{self.name}: this batch reads as input_type={resolved['input_type']!r}, "
                             f"task={resolved['task']!r}, earlier batches as input_type={acc.input_type!r}, "
                             f"task={acc.task!r}; pass input_type=... and task=... to evaluate.load(...)")
        self._fast = acc.update(preds, references)  # kept only once a batch was accepted

    def _arrow_add(self, predictions, references, opts) -> None:
        preds, refs = self._checked_for_arrow(predictions, references, opts)
        super().add_batch(predictions=preds, references=refs)

    def _checked_for_arrow(self, predictions, references, opts):
        """Validate a batch for evaluate's Arrow cache: the functional core's shape, label and value checks.

        Returns NumPy copies in the layout of the Arrow features picked for the batch (class indices as int64,
        binary predictions as one value per sample).
        """
        preds = _predictions(predictions)
        opts = self._resolved(preds, opts)
        inputs = prepare_inputs(preds, references, input_type=opts["input_type"], task=opts["task"],
                                num_classes=opts["num_classes"], ignore_index=opts["ignore_index"])
        # the value checks (NaN / inf, rows of probabilities, soft targets) of an accumulation that keeps nothing
        CalibrationAccumulator(inputs.num_classes, 1, input_type=inputs.input_type, task=inputs.task,
                               ignore_index=opts["ignore_index"], **_NO_STATISTICS).update(preds, references)
        if inputs.dense:
            raise ValueError(f"{self.name}: dense predictions of shape {tuple(preds.shape)} need the array route: "
                             "pass a NumPy array or torch tensor (in a single process)")
        kind = (inputs.task, inputs.soft)
        if self.writer is None:
            self._arrow_kind = kind
        elif kind != self._arrow_kind:
            raise ValueError(f"{self.name}: this batch has (task, soft references) = {kind}, the batches added "
                             f"before {self._arrow_kind}; compute() them first")
        target = inputs.target.cpu()
        return inputs.preds.cpu().to(torch.float32).numpy(), (target.float() if inputs.soft else target).numpy()

    def _infer_feature_from_example(self, example):
        """The Arrow features of the validated batch (see ``_FEATURES``)."""
        if self._arrow_kind is None:  # pragma: no cover - every batch is validated first
            return super()._infer_feature_from_example(example)
        return _FEATURES[self._arrow_kind]

    @staticmethod
    def _resolved(preds, opts) -> dict:
        """``opts`` with ``task`` and ``input_type`` fixed for these predictions (explicit values win)."""
        task = infer_task(preds) if opts["task"] == AUTO else opts["task"]
        input_type = infer_input_type(preds, task) if opts["input_type"] == AUTO else opts["input_type"]
        return {**opts, "task": task, "input_type": input_type}

    # --- helpers ------------------------------------------------------------------------------------------------
    def _fast_route(self, predictions, references) -> bool:
        if self.num_process != 1 or self.writer is not None:
            return False
        if predictions is None and references is None:
            return self._fast is not None
        return _is_array(predictions) or (self._fast is not None)

    def _merged(self, options) -> dict:
        unknown = sorted(set(options) - set(OPTION_NAMES))
        if unknown:
            raise ValueError(f"{self.name}: unknown option(s) {unknown}; valid options are {list(OPTION_NAMES)}")
        return self._check_options({**self.options, **options})

    @staticmethod
    def _check_options(opts) -> dict:
        check_n_bins(opts["n_bins"])
        if opts["input_type"] not in INPUT_TYPES + (AUTO,):
            raise ValueError(f"input_type must be one of {INPUT_TYPES + (AUTO,)}, got {opts['input_type']!r}")
        if opts["task"] not in TASKS + (AUTO,):
            raise ValueError(f"task must be one of {TASKS + (AUTO,)}, got {opts['task']!r}")
        return opts

    def _accumulator(self, opts) -> CalibrationAccumulator:
        flags = module_spec(self.metric_name).accumulator_flags
        return CalibrationAccumulator(opts["num_classes"], opts["n_bins"], input_type=opts["input_type"],
                                      task=opts["task"], ignore_index=opts["ignore_index"], **flags)

    def _result(self, acc: Optional[CalibrationAccumulator], opts) -> Dict[str, float]:
        if acc is None or acc.num_samples == 0:
            raise ValueError(f"{self.name}: no samples to evaluate")
        return {self.metric_name: float(self.value(acc, opts))}

    def value(self, acc: CalibrationAccumulator, opts) -> float:
        """The module's number from the accumulated statistics: the selective-prediction areas from the kept
        confidences, the rest from :meth:`~timm_csm.metrics.CalibrationAccumulator.compute`, where the Brier score
        of a binary task is the binary score, half the two-class sum the accumulator holds (as
        :func:`~timm_csm.metrics.brier_score`)."""
        spec = module_spec(self.metric_name)
        if spec.family == "selective":
            return selective_metrics_from_points(*acc.state.points())[spec.name]
        value = acc.compute(smooth=spec.family == "smooth")[spec.name]
        return value / 2.0 if spec.name == "brier" and acc.task == "binary" else value
