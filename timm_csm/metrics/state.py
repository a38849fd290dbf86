"""Sufficient statistics of the calibration metrics and the single pass that accumulates them.

One pass over ``(n, C)`` blocks of predictions (float64 inside each block) produces:

* top-label bins: ``count``, ``Σ conf``, ``Σ correct`` per bin, shape ``(n_bins,)``;
* classwise bins: ``count``, ``Σ p_k``, ``Σ y_k`` per (class, bin), shape ``(C, n_bins)``;
* sums of the per-sample NLL and Brier score, of the confidence and of the (expected) accuracy;
* optionally the ``(N,)`` confidences and accuracies that equal-mass and smooth ECE need (never the ``(N, C)``
  matrix).

Definitions per sample ``i`` with probabilities ``p`` and target ``y`` (a one-hot row for class indices, or a soft
row): confidence ``max_k p_k``; prediction ``argmax_k p_k`` (ties go to the lowest class index, as ``torch.argmax``);
accuracy ``y[argmax p]`` (1/0 for class indices, the expected accuracy for soft targets); NLL
``-Σ_k y_k log p_k``; Brier ``Σ_k (p_k - y_k)^2`` (summed over classes, not divided by C).

Precision: per-sample values (softmax, confidence) are computed in the precision of the input - float64 inputs in
float64, everything else in float32 (the precision the logits carry anyway) - and every sum over samples or bins is
accumulated in float64, so the result does not drift with N (torchmetrics sums in float32). Logits go through a
max-shifted log-softmax. Probabilities given as ``probs`` or ``log_probs`` are used as given; for the NLL they are
floored at ``PROB_FLOOR`` (1e-12) before the log, so a confident mistake costs at most ``-log(1e-12) ≈ 27.6``
instead of infinity.

The classwise pass is cheap because a row of probabilities summing to 1 has at most ``n_bins`` entries above the
first edge ``1 / n_bins``: only those are binned individually, the first bin is filled by difference with the column
totals.
"""
from __future__ import annotations

from typing import List, NamedTuple, Optional

import torch

from .binning import bin_edges, bin_index, bin_sums, check_n_bins
from .blocks import PROB_FLOOR, compute_dtype, reduce_block
from .classwise import ClasswiseSums
from .inputs import PreparedInputs
from .scratch import scratch

__all__ = ["PROB_FLOOR", "CalibrationState", "accumulate", "SampleValues", "sample_values"]

_F64 = torch.float64


class CalibrationState:
    """Float64 sums that merge by addition (plus optional concatenated per-sample points)."""

    # acc_sq_sum: the per-bin sum of squared accuracies, the variance term of the debiased CE
    _SUM_FIELDS = ("count", "conf_sum", "acc_sum", "acc_sq_sum", "n", "correct", "confidence", "nll", "brier")
    _CW_FIELDS = ("cw_count", "cw_prob_sum", "cw_label_sum")

    def __init__(self, n_bins: int, num_classes: int, device=None, *, binned: bool = True, classwise: bool = True,
                 nll: bool = True, brier: bool = True, points: bool = True):
        self.n_bins = check_n_bins(n_bins)
        self.num_classes = int(num_classes)
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.flags = dict(binned=binned, classwise=classwise, nll=nll, brier=brier, points=points)
        z = lambda *shape: torch.zeros(shape, dtype=_F64, device=self.device)  # noqa: E731
        self.count, self.conf_sum, self.acc_sum, self.acc_sq_sum = z(n_bins), z(n_bins), z(n_bins), z(n_bins)
        self.n, self.correct, self.confidence, self.nll, self.brier = z(), z(), z(), z(), z()
        if classwise:
            self.cw_count, self.cw_prob_sum, self.cw_label_sum = (z(num_classes, n_bins) for _ in range(3))
        else:
            self.cw_count = self.cw_prob_sum = self.cw_label_sum = None
        self.conf_points: List[torch.Tensor] = []
        self.acc_points: List[torch.Tensor] = []

    # --- combination ------------------------------------------------------------------------------------------
    def compatible(self, other: "CalibrationState") -> None:
        if (self.n_bins, self.num_classes) != (other.n_bins, other.num_classes):
            raise ValueError(f"cannot merge states with (n_bins, num_classes) = {(self.n_bins, self.num_classes)} "
                             f"and {(other.n_bins, other.num_classes)}")
        if self.flags != other.flags:
            raise ValueError(f"cannot merge states tracking different statistics: {self.flags} vs {other.flags}")

    def add_(self, other: "CalibrationState") -> "CalibrationState":
        self.compatible(other)
        for name in self._SUM_FIELDS:
            getattr(self, name).add_(getattr(other, name).to(self.device))
        if self.flags["classwise"]:
            for name in self._CW_FIELDS:
                getattr(self, name).add_(getattr(other, name).to(self.device))
        if self.flags["points"]:
            self.conf_points.extend(t.to(self.device) for t in other.conf_points)
            self.acc_points.extend(t.to(self.device) for t in other.acc_points)
        return self

    def sum_tensors(self) -> List[torch.Tensor]:
        names = list(self._SUM_FIELDS) + (list(self._CW_FIELDS) if self.flags["classwise"] else [])
        return [getattr(self, name) for name in names]

    def points(self):
        """``(confidences, accuracies)`` as two ``(N,)`` float64 tensors."""
        if not self.flags["points"]:
            raise ValueError("this state does not keep per-sample confidences (keep_confidences=False)")
        if not self.conf_points:
            return torch.zeros(0, dtype=_F64, device=self.device), torch.zeros(0, dtype=_F64, device=self.device)
        if len(self.conf_points) > 1:  # concatenate once, keep the result
            self.conf_points = [torch.cat(self.conf_points)]
            self.acc_points = [torch.cat(self.acc_points)]
        return self.conf_points[0], self.acc_points[0]

    @property
    def num_samples(self) -> int:
        return int(self.n)

    def require(self, flag: str, what: str) -> None:
        if not self.flags[flag]:
            raise ValueError(f"{what} is not tracked by this state ({flag}=False)")
        if float(self.n) <= 0:
            raise ValueError(f"no samples: {what} of an empty set is undefined")


def accumulate(inputs: PreparedInputs, n_bins: int, state: Optional[CalibrationState] = None, *,
               max_elements: int = 1 << 20, **flags) -> CalibrationState:
    """Accumulate the statistics of ``inputs`` into a new state (merged into ``state`` when given).

    All blocks are reduced into a fresh state first, so a ``ValueError`` raised by a bad block leaves ``state``
    untouched.
    """
    if state is not None:
        flags = dict(state.flags)
    local = CalibrationState(n_bins, inputs.num_classes, inputs.device, **flags)
    classwise = (ClasswiseSums(inputs.num_classes, n_bins, inputs.device, inputs.soft) if local.flags["classwise"]
                 else None)
    buf = None
    per_sample = _PerSample()
    for p, t in inputs.chunks(max_elements):
        if p.shape[0]:
            if buf is None or buf.dtype != compute_dtype(p.dtype) or buf.numel() < p.numel() + 64 * p.shape[1]:
                size = max(max_elements, p.numel()) + 64 * p.shape[1]  # room for padded rows
                buf = scratch(size, compute_dtype(p.dtype), p.device)
            reduce_block(p, t, inputs, local.flags, per_sample, classwise, buf)
            if per_sample.count >= _FLUSH_SAMPLES:
                per_sample.flush(local)
    per_sample.flush(local)
    if classwise is not None:
        classwise.finalize(local)
    if state is None:
        return local
    return state.add_(local)


_FLUSH_SAMPLES = 1 << 16


class _PerSample:
    """Per-sample float64 vectors of the last few blocks, reduced into the state every ``_FLUSH_SAMPLES`` samples
    (a few large ops instead of many small ones per block, on vectors that stay in cache)."""

    def __init__(self):
        self.conf, self.acc, self.nll, self.brier = [], [], [], []
        self.count = 0

    def add(self, conf: torch.Tensor, acc: torch.Tensor, nll: Optional[torch.Tensor]) -> None:
        """The confidences, accuracies and (when computed) NLL of a block's samples."""
        self.conf.append(conf)
        self.acc.append(acc)
        if nll is not None:
            self.nll.append(nll)
        self.count += conf.numel()

    def flush(self, st: CalibrationState) -> None:
        if not self.conf:
            return
        conf, acc = _cat(self.conf), _cat(self.acc)
        first = float(st.n) == 0
        st.n += conf.numel()
        st.correct += acc.sum()
        st.confidence += conf.sum()
        if self.nll:
            st.nll += _cat(self.nll).sum()
        if self.brier:
            st.brier += _cat(self.brier).sum()
        if st.flags["binned"]:
            index = bin_index(conf, bin_edges(st.n_bins, device=conf.device))
            if first:  # fresh sums (NumPy's on the CPU), the same as added into the zeros
                st.count, st.conf_sum, st.acc_sum, st.acc_sq_sum = bin_sums(index, st.n_bins, conf, acc, acc * acc)
            else:
                bin_sums(index, st.n_bins, conf, acc, acc * acc, out=(st.count, st.conf_sum, st.acc_sum, st.acc_sq_sum))
        if st.flags["points"]:
            st.conf_points.append(conf)
            st.acc_points.append(acc)
        self.conf, self.acc, self.nll, self.brier = [], [], [], []
        self.count = 0


def _cat(tensors: List[torch.Tensor]) -> torch.Tensor:
    return tensors[0] if len(tensors) == 1 else torch.cat(tensors)


class SampleValues(NamedTuple):
    """Per-sample values of the metrics, exactly those the one pass sums (float64, ``(N,)``): ``confidence``,
    ``accuracy``, ``nll``, ``brier``; ``probs`` ``(N, C)`` the probabilities the classwise bins read (the compute
    precision); ``target`` the class indices ``(N,)`` or the soft targets ``(N, C)`` (float64)."""

    confidence: torch.Tensor
    accuracy: torch.Tensor
    nll: torch.Tensor
    brier: torch.Tensor
    probs: torch.Tensor
    target: torch.Tensor


def sample_values(inputs: PreparedInputs, max_elements: int = 1 << 20) -> SampleValues:
    """The per-sample values of ``inputs`` (:class:`SampleValues`), computed block by block by the code of
    :func:`accumulate`, so that a sum over any subset (a bootstrap resample) equals what the metrics of that subset
    sum. Holds the ``(N, C)`` probabilities, which :func:`accumulate` never does."""
    flags = dict(binned=False, classwise=False, nll=True, brier=True, points=True, probs=True)
    per_sample, probs, targets = _PerSample(), [], []
    for p, t in inputs.chunks(max_elements):
        if p.shape[0]:
            buf = scratch(p.numel() + 64 * p.shape[1], compute_dtype(p.dtype), p.device)
            block = reduce_block(p, t, inputs, flags, per_sample, None, buf)
            probs.append(block.clone(memory_format=torch.contiguous_format))
            targets.append(t.to(_F64) if inputs.soft else t.reshape(-1))
    if not probs:
        raise ValueError("no samples: per-sample values of an empty set are undefined")
    cat = torch.cat
    return SampleValues(cat(per_sample.conf), cat(per_sample.acc), cat(per_sample.nll), cat(per_sample.brier),
                        cat(probs), cat(targets))

