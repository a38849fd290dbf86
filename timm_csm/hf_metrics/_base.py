"""Shared base of the ``evaluate`` modules: a thin :class:`evaluate.Metric` over :mod:`timm_csm.metrics`.

Only the module scripts (``<name>/<name>.py``) import this file, so ``evaluate`` is imported only when a metric is
loaded.

Two routes lead to the same numbers:

* the standard evaluate route (lists, ``add``/``add_batch`` into evaluate's Arrow cache, or ``num_process > 1``);
* a fast route for NumPy arrays and torch tensors in a single process: ``compute(predictions=array, ...)`` and
  ``add_batch(predictions=array, ...)`` feed a :class:`~timm_csm.metrics.CalibrationAccumulator` directly and never
  encode the ``(N, C)`` matrix to Arrow (which costs minutes and gigabytes at 2e5 x 1000).
"""
from __future__ import annotations

from typing import Dict, Optional

import datasets
import evaluate
import numpy as np
import torch

from timm_csm.metrics import CalibrationAccumulator
from timm_csm.metrics.binning import check_n_bins
from timm_csm.metrics.functional import adaptive_ece_from_points, metrics_from_state
from timm_csm.metrics.inputs import INPUT_TYPES, TASKS
from timm_csm.metrics.smooth import smooth_calibration_error

__all__ = ["CalibrationMetric", "OPTION_NAMES"]

OPTION_NAMES = ("n_bins", "input_type", "task", "num_classes", "ignore_index")

_CITATION_GUO = """\
@inproceedings{guo2017calibration,
  title={On Calibration of Modern Neural Networks},
  author={Guo, Chuan and Pleiss, Geoff and Sun, Yu and Weinberger, Kilian Q.},
  booktitle={ICML}, year={2017}
}
"""

_INPUTS = """
Args:
    predictions: (N, C) scores per sample (lists, NumPy arrays or torch tensors; dense (N, C, *S) arrays on the
        array route). Their meaning is set by `input_type`: "logits" (default), "probs" or "log_probs".
    references: class indices (N,) or soft targets (N, C) whose rows sum to 1.
    n_bins (int, default 15), input_type (str), task ("multiclass" or "binary"), num_classes (int),
    ignore_index (int): options; give them to `evaluate.load(..., n_bins=10)` or to `compute(...)`.
Returns:
    dict with one float: {"<name>": value} (a fraction, not percent).
"""


def _is_array(x) -> bool:
    return isinstance(x, (np.ndarray, torch.Tensor))


class CalibrationMetric(evaluate.Metric):
    """Base class; subclasses set ``metric_name``, ``description`` and the statistics they need."""

    metric_name = ""
    description = ""
    citation = _CITATION_GUO
    needs = {}  # flags for CalibrationAccumulator: classwise / keep_confidences / nll / brier

    def __init__(self, n_bins: int = 15, input_type: str = "logits", task: str = "multiclass",
                 num_classes: Optional[int] = None, ignore_index: Optional[int] = None, **kwargs):
        self.options = self._check_options(dict(n_bins=n_bins, input_type=input_type, task=task,
                                                num_classes=num_classes, ignore_index=ignore_index))
        self._fast: Optional[CalibrationAccumulator] = None
        super().__init__(**kwargs)

    # --- evaluate API -----------------------------------------------------------------------------------------
    def _info(self):
        hard = datasets.Features({"predictions": datasets.Sequence(datasets.Value("float32")),
                                  "references": datasets.Value("int64")})
        soft = datasets.Features({"predictions": datasets.Sequence(datasets.Value("float32")),
                                  "references": datasets.Sequence(datasets.Value("float32"))})
        return evaluate.MetricInfo(description=self.description, citation=self.citation,
                                   inputs_description=_INPUTS, features=[hard, soft],
                                   reference_urls=["https://github.com/huggingface/evaluate"])

    def _compute(self, predictions=None, references=None, **options) -> Dict[str, float]:
        opts = self._merged(options)
        acc = self._accumulator(opts)
        acc.update(np.asarray(predictions, dtype=np.float32), np.asarray(references))
        return self._result(acc, opts)

    def compute(self, *, predictions=None, references=None, **kwargs) -> Optional[dict]:
        """Compute the metric. NumPy arrays or torch tensors in a single process skip evaluate's Arrow cache."""
        if predictions is None and references is None and self._fast is None and self.writer is None:
            raise ValueError(f"{self.name}: nothing to compute (no predictions given or added)")
        if self._fast_route(predictions, references):
            opts = self._merged(kwargs)
            acc = self._fast
            self._fast = None
            if acc is not None and opts != self.options:
                raise ValueError(f"{self.name}: compute options {kwargs} differ from the options the added batches "
                                 "were accumulated with; give options to evaluate.load(...) when using add_batch")
            if predictions is not None:
                if acc is None:
                    acc = self._accumulator(opts)
                acc.update(predictions, references)
            return self._result(acc, opts)
        return super().compute(predictions=predictions, references=references, **kwargs)

    def add_batch(self, *, predictions=None, references=None, **kwargs):
        """Add a batch. NumPy arrays or torch tensors in a single process go to an in-memory accumulator."""
        if self._fast is not None or (self.writer is None and self.num_process == 1 and not kwargs
                                      and _is_array(predictions)):
            if self._fast is None:
                self._fast = self._accumulator(self.options)
            self._fast.update(_to_array(predictions), _to_array(references))
            return None
        return super().add_batch(predictions=predictions, references=references, **kwargs)

    def add(self, *, prediction=None, reference=None, **kwargs):
        """Add one example (goes to the array accumulator when array batches were added before)."""
        if self._fast is not None:
            self._fast.update(np.asarray(prediction)[None], np.asarray(reference)[None])
            return None
        return super().add(prediction=prediction, reference=reference, **kwargs)

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
        if opts["input_type"] not in INPUT_TYPES:
            raise ValueError(f"input_type must be one of {INPUT_TYPES}, got {opts['input_type']!r}")
        if opts["task"] not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {opts['task']!r}")
        return opts

    def _accumulator(self, opts) -> CalibrationAccumulator:
        flags = dict(classwise=False, keep_confidences=False, nll=False, brier=False)
        flags.update(self.needs)
        return CalibrationAccumulator(opts["num_classes"], opts["n_bins"], input_type=opts["input_type"],
                                      task=opts["task"], ignore_index=opts["ignore_index"], **flags)

    def _result(self, acc: CalibrationAccumulator, opts) -> Dict[str, float]:
        if acc.num_samples == 0:
            raise ValueError(f"{self.name}: no samples to evaluate")
        return {self.metric_name: float(self.value(acc, opts))}

    def value(self, acc: CalibrationAccumulator, opts) -> float:  # pragma: no cover - overridden
        raise NotImplementedError


def _to_array(x):
    return x if _is_array(x) else np.asarray(x)


# value helpers for the module scripts
def state_value(key: str):
    def value(self, acc, opts):
        return metrics_from_state(acc.state)[key]
    return value


def adaptive_value(self, acc, opts):
    conf, correct = acc.state.points()
    return adaptive_ece_from_points(conf, correct, opts["n_bins"])


def smooth_value(self, acc, opts):
    conf, correct = acc.state.points()
    return smooth_calibration_error(conf, correct)
