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

Logits go through an exact log-softmax. Probabilities given as ``probs`` or ``log_probs`` are used as given; for the
NLL they are floored at ``PROB_FLOOR`` (1e-12) before the log, so a confident mistake costs at most
``-log(1e-12) ≈ 27.6`` instead of infinity.

The classwise pass is cheap because a row of probabilities summing to 1 has at most ``n_bins`` entries above the
first edge ``1 / n_bins``: only those are binned individually, the first bin is filled by difference with the column
totals.
"""
from __future__ import annotations

import math
from typing import List, Optional

import torch

from .binning import bin_edges, bin_index, check_n_bins
from .inputs import ROW_SUM_ATOL, PreparedInputs

__all__ = ["PROB_FLOOR", "CalibrationState", "accumulate"]

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
               max_elements: int = 1 << 17, **flags) -> CalibrationState:
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
    for p, t in inputs.chunks(max_elements):
        if p.shape[0]:
            _reduce_block(p, t, inputs, edges, local, cw_others)
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


def _check_probs(x, input_type):
    s = x.sum(1)
    if not bool(torch.isfinite(s).all()):
        raise ValueError(f"preds ({input_type}) contain NaN or inf")
    if float(x.amin()) < 0:
        raise ValueError("preds (probs) contain negative values; pass input_type='logits' for raw scores")
    dev = float((s - 1.0).abs().max())
    if dev > ROW_SUM_ATOL:
        raise ValueError(f"preds ({input_type}) rows do not sum to 1 (max deviation {dev:.3g}); pass "
                         "input_type='logits' for unnormalised scores")
    return s


def _check_soft_target(t):
    if not bool(torch.isfinite(t).all()):
        raise ValueError("target contains NaN or inf")
    if float(t.amin()) < 0 or float(t.amax()) > 1 + ROW_SUM_ATOL:
        raise ValueError("soft target values must lie in [0, 1]")
    dev = float((t.sum(1) - 1.0).abs().max())
    if dev > ROW_SUM_ATOL:
        raise ValueError(f"soft target rows do not sum to 1 (max deviation {dev:.3g})")


def _reduce_block(p_raw: torch.Tensor, t: torch.Tensor, inputs: PreparedInputs, edges: torch.Tensor,
                  st: CalibrationState, cw: Optional[_ClasswiseOthers]):
    flags = st.flags
    n, C = p_raw.shape
    input_type = inputs.input_type
    soft = inputs.soft
    x = p_raw.to(_F64, copy=True)  # working copy: modified in place below
    if soft:
        t = t.to(_F64)
        _check_soft_target(t)
    else:
        y = t.view(-1, 1)

    # raw values that must be read before x is transformed in place
    if not soft:
        raw_y = x.gather(1, y).view(-1)
    nll_i = None
    if input_type == "logits":
        m = x.amax(1)
        if not bool(torch.isfinite(x.sum(1)).all()):
            raise ValueError("preds (logits) contain NaN or inf")
        if flags["nll"] and soft:
            tz = (t * x).sum(1)
        x.sub_(m.view(-1, 1)).exp_()
        s = x.sum(1)
        conf = s.reciprocal()
        if flags["nll"]:
            lse = m + s.log()
            nll_i = lse * (t.sum(1) if soft else 1.0) - (tz if soft else raw_y)
        need_probs = flags["brier"] or flags["classwise"]
        if need_probs:
            x.div_(s.view(-1, 1))
    else:
        if input_type == "log_probs":
            if bool(torch.isnan(x).any()) or bool(torch.isposinf(x).any()):
                raise ValueError("preds (log_probs) contain NaN or +inf")
            if flags["nll"]:
                lp = x.clamp(min=_LOG_FLOOR)
                nll_i = -((t * lp).sum(1) if soft else lp.gather(1, y).view(-1))
            x.exp_()
            if not soft:
                raw_y = raw_y.exp()
        m = x.amax(1)
        _check_probs(x, input_type)
        conf = m
        if flags["nll"] and input_type == "probs":
            if soft:
                nll_i = -(t * x.clamp(min=PROB_FLOOR).log()).sum(1)
            else:
                nll_i = -raw_y.clamp(min=PROB_FLOOR).log()

    # accuracy of the top-label prediction (first index among ties)
    if soft:
        pred = x.argmax(1)
        acc = t.gather(1, pred.view(-1, 1)).view(-1)
    else:
        # m is the row maximum in the space raw_y lives in (logits, or probabilities for probs / log_probs)
        top = raw_y == m
        # a tie for the maximum needs two entries >= conf, possible only when conf <= 1/2
        maybe_tie = top & (conf <= 0.5 + ROW_SUM_ATOL)
        if bool(maybe_tie.any()):
            rows = maybe_tie.nonzero().view(-1)
            top[rows] = p_raw[rows].argmax(1) == y.view(-1)[rows]
        acc = top.to(_F64)

    st.n += n
    st.correct += acc.sum()
    st.confidence += conf.sum()
    if nll_i is not None:
        st.nll += nll_i.sum()
    if flags["brier"]:
        if soft:
            st.brier += (x - t).pow_(2).sum()
        else:
            p_y = x.gather(1, y).view(-1)
            st.brier += (x * x).sum() - 2.0 * p_y.sum() + n
    if flags["binned"]:
        b = bin_index(conf, edges)
        st.count.index_add_(0, b, torch.ones_like(conf))
        st.conf_sum.index_add_(0, b, conf)
        st.acc_sum.index_add_(0, b, acc)
    if flags["points"]:
        st.conf_points.append(conf)
        st.acc_points.append(acc)
    if cw is not None:
        _classwise_block(x, t, soft, edges, cw)


def _classwise_block(x, t, soft, edges, cw: _ClasswiseOthers):
    B = cw.B
    n = x.shape[0]
    cw.n += n
    cw.prob_total += x.sum(0)
    if B > 1:
        rows, cols = (x > edges[1]).nonzero(as_tuple=True)
        vals = x[rows, cols]
        flat = cols * B + bin_index(vals, edges)
        cw.count.index_add_(0, flat, torch.ones_like(vals))
        cw.prob.index_add_(0, flat, vals)
        if soft:
            cw.label.index_add_(0, flat, t[rows, cols])
    if soft:
        cw.label_total += t.sum(0)
    else:
        y = t.view(-1)
        p_y = x.gather(1, y.view(-1, 1)).view(-1)
        flat_y = y * B + bin_index(p_y, edges)
        if cw.hard_labels is None:
            cw.hard_labels = torch.zeros(cw.C * B, dtype=_F64, device=x.device)
        cw.hard_labels.index_add_(0, flat_y, torch.ones(n, dtype=_F64, device=x.device))
