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

import math
from typing import List, NamedTuple, Optional

import torch

from .binning import bin_edges, bin_index, bin_sums, check_n_bins
from .inputs import ROW_SUM_ATOL, PreparedInputs

__all__ = ["PROB_FLOOR", "CalibrationState", "accumulate", "SampleValues", "sample_values"]

PROB_FLOOR = 1e-12
_LOG_FLOOR = math.log(PROB_FLOOR)
_F64 = torch.float64


class CalibrationState:
    """Float64 sums that merge by addition (plus optional concatenated per-sample points)."""

    _SUM_FIELDS = ("count", "conf_sum", "acc_sum", "n", "correct", "confidence", "nll", "brier")
    _CW_FIELDS = ("cw_count", "cw_prob_sum", "cw_label_sum")

    def __init__(self, n_bins: int, num_classes: int, device=None, *, binned: bool = True, classwise: bool = True,
                 nll: bool = True, brier: bool = True, points: bool = True):
        self.n_bins = check_n_bins(n_bins)
        self.num_classes = int(num_classes)
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.flags = dict(binned=binned, classwise=classwise, nll=nll, brier=brier, points=points)
        z = lambda *shape: torch.zeros(shape, dtype=_F64, device=self.device)  # noqa: E731
        self.count, self.conf_sum, self.acc_sum = z(n_bins), z(n_bins), z(n_bins)
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
               max_elements: int = 1 << 18, **flags) -> CalibrationState:
    """Accumulate the statistics of ``inputs`` into a new state (merged into ``state`` when given).

    All blocks are reduced into a fresh state first, so a ``ValueError`` raised by a bad block leaves ``state``
    untouched.
    """
    if state is not None:
        flags = dict(state.flags)
    local = CalibrationState(n_bins, inputs.num_classes, inputs.device, **flags)
    edges = bin_edges(n_bins, device=inputs.device)
    cw_others = None
    if local.flags["classwise"]:
        cw_others = _ClasswiseOthers(inputs.num_classes, n_bins, inputs.device)
    buf = None
    per_sample = _PerSample()
    for p, t in inputs.chunks(max_elements):
        if p.shape[0]:
            if buf is None or buf.dtype != _compute_dtype(p.dtype) or buf.numel() < p.numel():
                buf = torch.empty(max(max_elements, p.numel()), dtype=_compute_dtype(p.dtype), device=p.device)
            _reduce_block(p, t, inputs, edges, local.flags, per_sample, cw_others, buf)
            if per_sample.count >= _FLUSH_SAMPLES:
                per_sample.flush(local, edges)
    per_sample.flush(local, edges)
    if cw_others is not None:
        cw_others.finalize(local)
    if state is None:
        return local
    return state.add_(local)


class _ClasswiseOthers:
    """Classwise sums for bins >= 1 plus column totals; bin 0 is filled by difference in :meth:`finalize`."""

    def __init__(self, C, B, device):
        self.C, self.B = C, B
        self.count = torch.zeros(C * B, dtype=_F64, device=device)
        self.prob = torch.zeros(C * B, dtype=_F64, device=device)
        self.label = torch.zeros(C * B, dtype=_F64, device=device)
        self.prob_total = torch.zeros(C, dtype=_F64, device=device)
        self.label_total = torch.zeros(C, dtype=_F64, device=device)
        self.n = 0
        self.hard_labels = None  # (C*B,) exact label counts for class-index targets

    def finalize(self, state: CalibrationState):
        C, B = self.C, self.B
        count = self.count.view(C, B).clone()
        prob = self.prob.view(C, B).clone()
        count[:, 0] = self.n - count[:, 1:].sum(1)
        prob[:, 0] = self.prob_total - prob[:, 1:].sum(1)
        if self.hard_labels is not None:
            label = self.hard_labels.view(C, B).clone()
        else:
            label = self.label.view(C, B).clone()
            label[:, 0] = self.label_total - label[:, 1:].sum(1)
        state.cw_count.add_(count)
        state.cw_prob_sum.add_(prob.clamp(min=0))
        state.cw_label_sum.add_(label.clamp(min=0))


def _check_soft_target(t):
    if not bool(torch.isfinite(t).all()):
        raise ValueError("target contains NaN or inf")
    if float(t.amin()) < 0 or float(t.amax()) > 1 + ROW_SUM_ATOL:
        raise ValueError("soft target values must lie in [0, 1]")
    dev = float((t.sum(1) - 1.0).abs().max())
    if dev > ROW_SUM_ATOL:
        raise ValueError(f"soft target rows do not sum to 1 (max deviation {dev:.3g})")


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Per-sample math runs in the input's precision (float64 stays float64, anything else becomes float32);
    every sum over samples is float64."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _first_above(threshold: float, dtype: torch.dtype) -> float:
    """Smallest value of ``dtype`` strictly above the float64 ``threshold``: ``x > threshold`` (exact float64
    semantics) equals ``x >= _first_above(threshold, dtype)`` for ``x`` of that dtype."""
    v = torch.tensor(threshold, dtype=dtype)
    if float(v) <= threshold:
        v = torch.nextafter(v, torch.tensor(float("inf"), dtype=dtype))
    return float(v)


_FLUSH_SAMPLES = 1 << 16


class _PerSample:
    """Per-sample float64 vectors of the last few blocks, reduced into the state every ``_FLUSH_SAMPLES`` samples
    (a few large ops instead of many small ones per block, on vectors that stay in cache)."""

    def __init__(self):
        self.conf, self.acc, self.nll, self.brier = [], [], [], []
        self.count = 0

    def flush(self, st: CalibrationState, edges: torch.Tensor) -> None:
        if not self.conf:
            return
        conf, acc = torch.cat(self.conf), torch.cat(self.acc)
        st.n += conf.numel()
        st.correct += acc.sum()
        st.confidence += conf.sum()
        if self.nll:
            st.nll += torch.cat(self.nll).sum()
        if self.brier:
            st.brier += torch.cat(self.brier).sum()
        if st.flags["binned"]:
            bin_sums(bin_index(conf, edges), st.n_bins, conf, acc, out=(st.count, st.conf_sum, st.acc_sum))
        if st.flags["points"]:
            st.conf_points.append(conf)
            st.acc_points.append(acc)
        self.conf, self.acc, self.nll, self.brier = [], [], [], []
        self.count = 0


def _logit_rows(c, x, t, y, soft: bool, want_nll: bool):
    """Logits ``c`` into ``x = exp(z - max z)`` (in place); the row sums, confidences, per-sample NLL (or None),
    the row maximum of ``x`` and where a tie for it is possible."""
    m = c.amax(1)
    # amax propagates NaN and +inf; -inf is a masked class (probability 0) unless the whole row is -inf
    if not bool(torch.isfinite(m).all()):
        raise ValueError("preds (logits) contain NaN or +inf (or a row that is -inf everywhere)")
    torch.sub(c, m.view(-1, 1), out=x)
    x.exp_()  # b = exp(z - max z): the probabilities times s, with max 1 exactly
    s = x.sum(1).to(_F64)  # a row sum of C terms: per-sample math, in the compute precision
    nll_i = None
    if want_nll:
        lse = m.to(_F64) + s.log()
        if soft:
            tz = torch.where(t > 0, t * c, torch.zeros((), dtype=_F64, device=c.device))  # 0 * -inf = 0
            nll_i = lse * t.sum(1) - tz.sum(1)
        else:
            nll_i = lse - c.gather(1, y).view(-1).to(_F64)
    return x, s, s.reciprocal(), nll_i, 1.0, s >= 2.0  # a tie needs a second entry equal to the max: s >= 2


def _probability_rows(c, x, t, y, soft: bool, input_type: str, want_nll: bool):
    """Probabilities or log-probabilities ``c`` as probabilities ``x`` (checked: finite, non-negative, rows summing
    to 1); the same outputs as :func:`_logit_rows`."""
    nll_i = None
    if input_type == "log_probs":
        m_log = c.amax(1)
        if bool(torch.isnan(m_log).any()) or bool(torch.isposinf(m_log).any()):
            raise ValueError("preds (log_probs) contain NaN or +inf")
        if want_nll:
            if soft:
                nll_i = -(t * c.clamp(min=_LOG_FLOOR)).sum(1)
            else:
                nll_i = -c.gather(1, y).view(-1).clamp(min=_LOG_FLOOR).to(_F64)
        torch.exp(c, out=x)
    else:
        x = c  # probabilities are only read
    s = x.sum(1).to(_F64)
    if not bool(torch.isfinite(s).all()):
        raise ValueError(f"preds ({input_type}) contain NaN or inf")
    if float(x.amin()) < 0:
        raise ValueError("preds (probs) contain negative values; pass input_type='logits' for raw scores")
    dev = float((s - 1.0).abs().max())
    if dev > ROW_SUM_ATOL:
        raise ValueError(f"preds ({input_type}) rows do not sum to 1 (max deviation {dev:.3g}); pass "
                         "input_type='logits' for unnormalised scores")
    m = x.amax(1)
    conf = m.to(_F64)
    if want_nll and input_type == "probs":
        if soft:
            nll_i = -(t * x.clamp(min=PROB_FLOOR).log()).sum(1)
        else:
            nll_i = -x.gather(1, y).view(-1).clamp(min=PROB_FLOOR).log().to(_F64)
    return x, s, conf, nll_i, m.view(-1, 1), 2.0 * conf <= s + 1e-12


def _top_label_accuracy(x, t, y, soft: bool, row_max, tie_possible, logits: bool, keep_x: bool):
    """Accuracy of the top-label prediction: argmax with ties (equal probabilities) to the lowest class index."""
    if soft:
        return t.gather(1, x.argmax(1).view(-1, 1)).view(-1)
    top = (x.gather(1, y) == row_max).view(-1)
    maybe_tie = top & tie_possible
    if bool(maybe_tie.any()):
        if logits:
            # x = exp(z - max z) <= 1, so floor(x) is 1 exactly at the row maxima and 0 elsewhere; in place when
            # the probabilities are not needed any more
            marks = torch.floor(x) if keep_x else x.floor_()
        else:
            marks = (x == row_max).to(x.dtype)
        rows = (maybe_tie & (marks.sum(1) >= 2)).nonzero().view(-1)
        if rows.numel():  # argmax of the 0/1 marks is the first maximum
            top[rows] = marks[rows].argmax(1) == y.view(-1)[rows]
    return top.to(_F64)


def _reduce_block(p_raw: torch.Tensor, t: torch.Tensor, inputs: PreparedInputs, edges: Optional[torch.Tensor],
                  flags: dict, out: _PerSample, cw: Optional[_ClasswiseOthers], buf: torch.Tensor) -> torch.Tensor:
    """Reduce one block into ``out`` (and the classwise sums ``cw``); returns the block's probabilities (valid when
    ``flags`` keep them: Brier or classwise)."""
    n, C = p_raw.shape
    logits, soft = inputs.input_type == "logits", inputs.soft
    c = p_raw if p_raw.dtype == buf.dtype else p_raw.to(buf.dtype)
    x = buf[:n * C].view(n, C)  # working block
    y = None
    if soft:
        t = t.to(_F64)
        _check_soft_target(t)
    else:
        y = t.view(-1, 1)
    if logits:
        x, s, conf, nll_i, row_max, tie_possible = _logit_rows(c, x, t, y, soft, flags["nll"])
    else:
        x, s, conf, nll_i, row_max, tie_possible = _probability_rows(c, x, t, y, soft, inputs.input_type,
                                                                     flags["nll"])
    keep_x = flags["brier"] or flags["classwise"]
    acc = _top_label_accuracy(x, t, y, soft, row_max, tie_possible, logits, keep_x)
    if logits and keep_x:
        x.div_(s.to(x.dtype).view(-1, 1))  # now the probabilities

    out.conf.append(conf)
    out.acc.append(acc)
    out.count += n
    if nll_i is not None:
        out.nll.append(nll_i)
    if flags["brier"]:
        if soft:
            out.brier.append((x - t).pow_(2).sum(1))
        else:
            sq = torch.einsum("ij,ij->i", x, x).to(_F64)
            out.brier.append(sq - 2.0 * x.gather(1, y).view(-1).to(_F64) + 1.0)
    if cw is not None:
        _classwise_block(x, t, soft, edges, cw)
    return x


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


def sample_values(inputs: PreparedInputs, max_elements: int = 1 << 18) -> SampleValues:
    """The per-sample values of ``inputs`` (:class:`SampleValues`), computed block by block by the code of
    :func:`accumulate`, so that a sum over any subset (a bootstrap resample) equals what the metrics of that subset
    sum. Holds the ``(N, C)`` probabilities, which :func:`accumulate` never does."""
    flags = dict(binned=False, classwise=False, nll=True, brier=True, points=True)
    per_sample, probs, targets = _PerSample(), [], []
    for p, t in inputs.chunks(max_elements):
        if p.shape[0]:
            buf = torch.empty(p.numel(), dtype=_compute_dtype(p.dtype), device=p.device)
            probs.append(_reduce_block(p, t, inputs, None, flags, per_sample, None, buf).clone())
            targets.append(t.to(_F64) if inputs.soft else t.reshape(-1))
    if not probs:
        raise ValueError("no samples: per-sample values of an empty set are undefined")
    cat = torch.cat
    return SampleValues(cat(per_sample.conf), cat(per_sample.acc), cat(per_sample.nll), cat(per_sample.brier),
                        cat(probs), cat(targets))


def _classwise_block(x, t, soft, edges, cw: _ClasswiseOthers):
    B = cw.B
    n = x.shape[0]
    cw.n += n
    cw.prob_total += x.sum(0, dtype=_F64)
    if B > 1:
        rows, cols = (x >= _first_above(float(edges[1]), x.dtype)).nonzero(as_tuple=True)
        vals = x[rows, cols].to(_F64)
        flat = cols * B + bin_index(vals, edges)
        values = (vals, t[rows, cols]) if soft else (vals,)
        bin_sums(flat, cw.C * B, *values, out=(cw.count, cw.prob, cw.label)[:1 + len(values)])
    if soft:
        cw.label_total += t.sum(0)
    else:
        y = t.view(-1)
        p_y = x.gather(1, y.view(-1, 1)).view(-1)
        flat_y = y * B + bin_index(p_y, edges)
        if cw.hard_labels is None:
            cw.hard_labels = torch.zeros(cw.C * B, dtype=_F64, device=x.device)
        bin_sums(flat_y, cw.C * B, out=(cw.hard_labels,))
