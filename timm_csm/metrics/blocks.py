"""The per-block reductions of :func:`timm_csm.metrics.state.accumulate` (definitions and precision: the docstring
of :mod:`timm_csm.metrics.state`).

A block of ``(n, C)`` predictions becomes per-sample confidences, accuracies, NLL and Brier values (appended to the
pending per-sample vectors) and classwise bin sums. Logits of fewer than 32 classes with class-index targets (the
common case of small classifiers) are reduced in a ``(C, n)`` copy of the block: every sum, maximum and gather over
the classes then runs along the samples, where torch vectorises (over a short last dimension it runs several times
slower); the statistics are the same as in the row layout up to the order of float32 additions over the classes.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from .binning import bin_index, bin_sums
from .inputs import ROW_SUM_ATOL, PreparedInputs

__all__ = ["PROB_FLOOR", "compute_dtype", "reduce_block"]

PROB_FLOOR = 1e-12
_LOG_FLOOR = math.log(PROB_FLOOR)
_F64 = torch.float64
NARROW_CLASSES = 32


def _check_soft_target(t):
    if not bool(torch.isfinite(t).all()):
        raise ValueError("target contains NaN or inf")
    if float(t.amin()) < 0 or float(t.amax()) > 1 + ROW_SUM_ATOL:
        raise ValueError("soft target values must lie in [0, 1]")
    dev = float((t.sum(1) - 1.0).abs().max())
    if dev > ROW_SUM_ATOL:
        raise ValueError(f"soft target rows do not sum to 1 (max deviation {dev:.3g})")


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
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


def reduce_block(p_raw: torch.Tensor, t: torch.Tensor, inputs: PreparedInputs, edges: Optional[torch.Tensor],
                 flags: dict, out, cw, buf: torch.Tensor) -> Optional[torch.Tensor]:
    """Reduce one block into ``out`` (the pending per-sample vectors) and ``cw`` (the classwise sums, or None);
    ``buf`` is scratch memory of the compute dtype holding at least ``n * C + 64 C`` values. Returns the block's
    ``(n, C)`` probabilities (a view of ``buf`` or of the input) when ``flags`` keep them (Brier or classwise),
    else None."""
    n, C = p_raw.shape
    logits, soft = inputs.input_type == "logits", inputs.soft
    if logits and not soft and C < NARROW_CLASSES:
        return _column_block(p_raw, t.view(-1), edges, flags, out, cw, buf)
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
            sq = torch.linalg.vector_norm(x, dim=1).to(_F64).square_()  # one fused read of the block
            out.brier.append(sq - 2.0 * x.gather(1, y).view(-1).to(_F64) + 1.0)
    if cw is not None:
        _classwise_block(x, t, soft, edges, cw)
    return x if keep_x else None


def _column_block(p_raw: torch.Tensor, y: torch.Tensor, edges: Optional[torch.Tensor], flags: dict, out, cw, buf):
    """:func:`reduce_block` for logits of few classes and class-index targets, in a (C, n) copy of the block."""
    n, C = p_raw.shape
    # rows padded to a multiple of 64: every value goes through torch's vectorised kernels (whose results can
    # differ in the last bit from the scalar loop of a remainder), so a sample's values do not depend on the block
    width = (n + 63) // 64 * 64
    padded = buf[:C * width].view(C, width)
    padded[:, n:] = 0.0
    z = padded[:, :n].copy_(p_raw.T)
    m = padded.amax(0)[:n]
    if not bool(torch.isfinite(m).all()):
        raise ValueError("preds (logits) contain NaN or +inf (or a row that is -inf everywhere)")
    label = y.view(1, -1)
    z_y = z.gather(0, label).view(-1)
    padded[:, :n].sub_(m)
    x = padded.exp_()  # exp(z - max z): exactly 1 at the maxima of each sample
    totals = x.sum(0)
    s = totals[:n].to(_F64)
    x_y = x.gather(0, label).view(-1)
    top = x_y == 1.0
    maybe_tie = top & (s >= 2.0)  # a tie needs a second entry equal to the maximum
    if bool(maybe_tie.any()):
        # floor(x) is 1 exactly at a sample's maxima (x <= 1): two of them are a tie
        columns = (maybe_tie & (torch.floor(x).sum(0)[:n] >= 2)).nonzero().view(-1)
        if columns.numel():  # the first maximum wins, as torch.argmax
            top[columns] = torch.floor(x[:, columns]).argmax(0) == y[columns]
    out.conf.append(s.reciprocal())
    out.acc.append(top.to(_F64))
    out.count += n
    if flags["nll"]:
        out.nll.append(m.to(_F64) + s.log() - z_y.to(_F64))
    if flags["brier"] or cw is not None:
        p = x.div_(totals)  # the padding's columns too, so the sums below run on whole rows
        p_y = p.gather(0, label).view(-1)
        if flags["brier"]:
            out.brier.append(p.square().sum(0)[:n].to(_F64) - 2.0 * p_y.to(_F64) + 1.0)
        if cw is not None:
            _classwise_block(p[:, :n], y, False, edges, cw, classes=0, p_y=p_y)
        return p[:, :n].T
    return None


def _classwise_block(x, t, soft, edges, cw, classes: int = 1, p_y=None):
    """Classwise sums of the probabilities ``x`` of a block: rows of samples (``classes=1``), or a (C, n) block
    (``classes=0``, class-index targets ``t`` and their probabilities ``p_y`` given)."""
    B = cw.B
    cw.n += x.shape[1 - classes]
    cw.prob_total += x.sum(1 - classes, dtype=_F64)
    if B > 1:
        where = (x >= _first_above(float(edges[1]), x.dtype)).nonzero(as_tuple=True)
        vals = x[where].to(_F64)
        flat = where[classes] * B + bin_index(vals, edges)
        values = (vals, t[where]) if soft else (vals,)
        bin_sums(flat, cw.C * B, *values, out=(cw.count, cw.prob, cw.label)[:1 + len(values)])
    if soft:
        cw.label_total += t.sum(0)
    else:
        y = t.view(-1)
        if p_y is None:
            p_y = x.gather(1, y.view(-1, 1)).view(-1)
        flat_y = y * B + bin_index(p_y, edges)
        if cw.hard_labels is None:
            cw.hard_labels = torch.zeros(cw.C * B, dtype=_F64, device=x.device)
        bin_sums(flat_y, cw.C * B, out=(cw.hard_labels,))
