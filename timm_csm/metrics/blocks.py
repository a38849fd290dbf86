"""The per-block reductions of :func:`timm_csm.metrics.state.accumulate` (definitions and precision: the docstring
of :mod:`timm_csm.metrics.state`).

A block of ``(n, C)`` predictions becomes per-sample confidences, accuracies, NLL and Brier values (appended to the
pending per-sample vectors) and classwise bin sums, in one read of the block and a few dozen tensor operations
(the count of operations, not the arithmetic, is what small inputs pay for). Logits of fewer than 32 classes with
class-index targets (the common case of small classifiers) are reduced in a ``(C, n)`` copy of the block: every
sum, maximum and gather over the classes then runs along the samples, where torch vectorises (over a short last
dimension it runs several times slower); the statistics are the same as in the row layout up to the order of
float32 additions over the classes.

The classwise sums of the block's probabilities: :mod:`timm_csm.metrics.classwise`.

The exponentials are base-2 exponentials of the scaled differences (:func:`_exp_`), which torch computes at
several times less cost than its natural exponential on the CPU. The Brier score of class-index targets comes from
the exponentials' sum of squares and row sum (:func:`_brier_of_exp`), so the probabilities are formed only for the
classwise sums (or when asked for); the same sum of squares tells the few samples whose maximum may be tied
(:func:`_tie_possible`). The block's working memory is kept between calls
(:func:`~timm_csm.metrics.scratch.scratch`).
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import numpy as np
import torch

from .classwise import ClasswiseSums
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


def _exp_(x: torch.Tensor) -> torch.Tensor:
    """``exp(x)`` in place, as ``2^(x log2 e)``: torch's base-2 exponential costs several times less than its
    natural one on the CPU (the product adds a cheap elementwise pass); 0 stays exactly 0, so the maxima of
    ``z - max z`` stay exactly 1, and the product adds one rounding, of the size of that of ``z - max z``."""
    return x.mul_(_LOG2_E).exp2_()


_LOG2_E = math.log2(math.e)


def _check_logit_maxima(m: torch.Tensor) -> None:
    # amax propagates NaN and +inf; -inf is a masked class (probability 0) unless the whole row is -inf
    # NumPy's test on the CPU: torch's isfinite is several operations
    finite = np.isfinite(m.numpy()).all() if m.device.type == "cpu" else torch.isfinite(m).all()
    if not bool(finite):
        raise ValueError("preds (logits) contain NaN or +inf (or a row that is -inf everywhere)")


def _resolve_ties(top: torch.Tensor, tie_possible: torch.Tensor, y: torch.Tensor, classes_dim: int,
                  marks: Callable[[Optional[torch.Tensor]], Optional[torch.Tensor]]) -> None:
    """Correct ``top`` (``x_y`` equals the maximum of its sample) in place where the maximum is tied: argmax, and
    so the prediction, is the first maximum (the lowest class index). ``marks(samples)`` gives the 0/1 marks of the
    maxima of those samples (along ``1 - classes_dim``), and ``marks(None)`` those of every sample, or None when no
    sample's maximum is repeated; it is called only where ``top`` and ``tie_possible`` meet, for those samples alone
    when they are few."""
    candidates = _nonzero(top & tie_possible)
    if not candidates.numel():
        return
    if candidates.numel() * _FEW_CANDIDATES <= top.numel():  # a few samples: only their entries are read
        marked = marks(candidates)
        within = _nonzero(marked.sum(classes_dim) >= 2)
        samples = candidates[within]
    else:
        marked = marks(None)
        if marked is None:
            return
        within = samples = _nonzero(top & tie_possible & (marked.sum(classes_dim) >= 2))
    if samples.numel():  # argmax of the 0/1 marks is the first maximum
        top[samples] = marked.index_select(1 - classes_dim, within).argmax(classes_dim) == y[samples]


_FEW_CANDIDATES = 16


def _nonzero(mask: torch.Tensor) -> torch.Tensor:
    """The indices of the True entries of a 1-D ``mask`` (NumPy's on the CPU, several times faster there)."""
    if mask.device.type == "cpu":
        return torch.from_numpy(np.flatnonzero(mask.numpy()))
    return mask.nonzero().view(-1)


def _equal_marks(x: torch.Tensor, value) -> torch.Tensor:
    """``x == value`` as 0/1 bytes (NumPy's comparison on the CPU, several times faster there than torch's)."""
    if x.device.type == "cpu":
        other = value.numpy() if isinstance(value, torch.Tensor) else value
        return torch.from_numpy((x.numpy() == other).view(np.uint8))
    return (x == value).to(torch.uint8)


def _maxima_of_exp(x: torch.Tensor, classes_dim: int, in_place: bool, block: Optional[torch.Tensor] = None,
                   others: int = 0) -> Callable[[Optional[torch.Tensor]], Optional[torch.Tensor]]:
    """The ``marks`` of :func:`_resolve_ties` for ``x = exp(z - max z)``, which is exactly 1 at the maxima and below
    1 elsewhere: for given samples, their entries equal to 1; for every sample, None when the entries equal to 1
    are no more than one per sample (counted in ``block``, the contiguous memory holding ``x`` and ``others``
    further entries equal to 1), else ``floor(x)`` (in place if ``in_place``)."""
    def marks(samples: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        if samples is not None:
            return _equal_marks(x.index_select(1 - classes_dim, samples), 1.0)
        whole = x if block is None else block
        if whole.device.type == "cpu":  # NumPy's comparison and count are several times faster than torch's here
            ones = int(np.count_nonzero(whole.numpy() == 1.0))
        else:
            ones = int((whole == 1.0).sum())
        if ones <= x.shape[1 - classes_dim] + others:
            return None
        return x.floor_() if in_place else torch.floor(x)
    return marks


def reduce_block(p_raw: torch.Tensor, t: torch.Tensor, inputs: PreparedInputs, flags: dict, out,
                 cw: Optional[ClasswiseSums], buf: torch.Tensor) -> Optional[torch.Tensor]:
    """Reduce one block into ``out`` (the pending per-sample vectors) and ``cw`` (the classwise sums, or None);
    ``buf`` is scratch memory of the compute dtype holding at least ``n * C + 64 C`` values. Returns the block's
    ``(n, C)`` probabilities (a view of ``buf`` or of the input) when the classwise sums or ``flags["probs"]`` ask
    for them, else None."""
    n, C = p_raw.shape
    logits, soft = inputs.input_type == "logits", inputs.soft
    if logits and not soft and C < NARROW_CLASSES:
        return _column_block(p_raw, t.view(-1), flags, out, cw, buf)
    c = p_raw if p_raw.dtype == buf.dtype else p_raw.to(buf.dtype)
    if logits and not soft:
        return _hard_logit_rows(c, t.view(-1), flags, out, cw, buf[:n * C].view(n, C))
    x = buf[:n * C].view(n, C)  # working block
    y = None
    if soft:
        t = t.to(_F64)
        _check_soft_target(t)
    else:
        y = t.view(-1, 1)
    if logits:
        x, s, conf, nll_i, row_max, tie_possible = _soft_logit_rows(c, x, t, flags["nll"])
    else:
        x, s, conf, nll_i, row_max, tie_possible = _probability_rows(c, x, t, y, soft, inputs.input_type,
                                                                     flags["nll"])
    keep_x = flags["brier"] or flags.get("probs", False) or cw is not None
    acc = _top_label_accuracy(x, t, y, soft, row_max, tie_possible)
    if logits and keep_x:
        x.div_(s.to(x.dtype).view(-1, 1))  # now the probabilities
    out.add(conf, acc, nll_i)
    if flags["brier"]:
        if soft:
            out.brier.append((x - t).pow_(2).sum(1))
        else:
            sq = torch.linalg.vector_norm(x, dim=1).to(_F64).square_()  # one fused read of the block
            out.brier.append(sq - 2.0 * x.gather(1, y).view(-1).to(_F64) + 1.0)
    if cw is not None:
        if soft:
            cw.add(x, 1, t=t)
        else:
            cw.add(x, 1, y=y.view(-1))
    return x if keep_x else None


def _hard_logit_rows(c, y, flags, out, cw, x):
    """:func:`reduce_block` for logits of 32 classes or more with class-index targets, in the rows of ``x``."""
    m = c.amax(1)
    _check_logit_maxima(m)
    torch.sub(c, m.view(-1, 1), out=x)
    _exp_(x)  # exp(z - max z): the probabilities times s, exactly 1 at the maxima of each row
    s32 = x.sum(1)
    s = s32.to(_F64)  # a row sum of C terms: per-sample math, in the compute precision
    label = y.view(-1, 1)
    x_y = x.gather(1, label).view(-1)
    top = x_y == 1.0
    keep_p = flags.get("probs", False) or cw is not None
    squares = torch.linalg.vector_norm(x, dim=1).to(_F64).square_() if flags["brier"] else None  # one fused read
    # floor(x) in place when x is not needed any more
    _resolve_ties(top, _tie_possible(s, squares, x.shape[1], x.dtype), y, 1,
                  _maxima_of_exp(x, 1, not keep_p))
    nll_i = None
    if flags["nll"]:
        nll_i = s.log().add_(m.to(_F64)).sub_(c.gather(1, label).view(-1).to(_F64))
    out.add(s.reciprocal(), top.to(_F64), nll_i)
    if squares is not None:
        out.brier.append(_brier_of_exp(squares, x_y, s))
    if not keep_p:
        return None
    x.div_(s32.view(-1, 1))  # now the probabilities
    if cw is not None:
        cw.add(x, 1, y=y, p_y=x_y / s32)  # the same division as the block's: the gathered probability, bit for bit
    return x


def _tie_possible(s: torch.Tensor, squares: Optional[torch.Tensor], C: int, dtype: torch.dtype) -> torch.Tensor:
    """Where the maximum of ``x = exp(z - max z)`` (exactly 1) may be tied: a second entry equal to 1 makes
    ``Σ x^2 >= 2`` (``squares``, a float sum of C squares, within its rounding: at most ``C + 2`` units of ``dtype``
    below), and, without the squares, ``s = Σ x >= 2``, which most rows of many classes meet."""
    if squares is None:
        return s >= 2.0
    return squares >= 2.0 * (1.0 - (C + 2) * _EPS[dtype])


_EPS = {dtype: torch.finfo(dtype).eps for dtype in (torch.float32, torch.float64)}


def _brier_of_exp(squares: torch.Tensor, x_y: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """The Brier score of class-index targets from the exponentials ``x = s p`` (``squares``: ``Σ_k x_k^2`` in
    float64, ``x_y`` the target's entry, ``s`` the row sums): ``Σ_k p_k^2 - 2 p_y + 1 = (Σ_k x_k^2 / s - 2 x_y) / s
    + 1``, so the probabilities need not be formed."""
    return squares.div_(s).sub_(x_y.to(_F64), alpha=2.0).div_(s).add_(1.0)


def _soft_logit_rows(c, x, t, want_nll: bool):
    """Logits ``c`` with soft targets ``t`` into ``x = exp(z - max z)`` (in place); the row sums, confidences,
    per-sample NLL (or None), the row maximum of ``x`` and where a tie for it is possible."""
    m = c.amax(1)
    _check_logit_maxima(m)
    torch.sub(c, m.view(-1, 1), out=x)
    _exp_(x)  # b = exp(z - max z): the probabilities times s, with max 1 exactly
    s = x.sum(1).to(_F64)  # a row sum of C terms: per-sample math, in the compute precision
    nll_i = None
    if want_nll:
        lse = m.to(_F64) + s.log()
        tz = torch.where(t > 0, t * c, torch.zeros((), dtype=_F64, device=c.device))  # 0 * -inf = 0
        nll_i = lse * t.sum(1) - tz.sum(1)
    return x, s, s.reciprocal(), nll_i, 1.0, s >= 2.0  # a tie needs a second entry equal to the max: s >= 2


def _probability_rows(c, x, t, y, soft: bool, input_type: str, want_nll: bool):
    """Probabilities or log-probabilities ``c`` as probabilities ``x`` (checked: finite, non-negative, rows summing
    to 1); the same outputs as :func:`_soft_logit_rows`."""
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


def _top_label_accuracy(x, t, y, soft: bool, row_max, tie_possible):
    """Accuracy of the top-label prediction from probabilities ``x``: argmax with ties (equal probabilities) to
    the lowest class index."""
    if soft:
        return t.gather(1, x.argmax(1).view(-1, 1)).view(-1)
    top = (x.gather(1, y) == row_max).view(-1)
    def marks(samples):
        if samples is None:
            return (x == row_max).to(x.dtype)
        at_max = row_max if isinstance(row_max, float) else row_max.index_select(0, samples)
        return _equal_marks(x.index_select(0, samples), at_max)
    _resolve_ties(top, tie_possible, y.view(-1), 1, marks)
    return top.to(_F64)


def _column_block(p_raw: torch.Tensor, y: torch.Tensor, flags: dict, out, cw, buf):
    """:func:`reduce_block` for logits of few classes and class-index targets, in a (C, n) copy of the block."""
    n, C = p_raw.shape
    # rows padded to a multiple of 64: every value goes through torch's vectorised kernels (whose results can
    # differ in the last bit from the scalar loop of a remainder), so a sample's values do not depend on the block
    width = (n + 63) // 64 * 64
    padded = buf[:C * width].view(C, width)
    padded[:, n:] = 0.0
    z = padded[:, :n].copy_(p_raw.T)
    m_all = padded.amax(0)  # the padding's maxima are 0
    m = m_all[:n]
    _check_logit_maxima(m)
    label = y.view(1, -1)
    z_y = z.gather(0, label).view(-1)
    x = _exp_(padded.sub_(m_all))  # exp(z - max z): exactly 1 at the maxima of each sample
    totals = x.sum(0)
    s = totals[:n].to(_F64)
    x_y = x.gather(0, label).view(-1)
    top = x_y == 1.0
    keep_p = flags.get("probs", False) or cw is not None
    squares = x.square().sum(0)[:n].to(_F64) if flags["brier"] else None
    # the padding's entries are all 1
    _resolve_ties(top, _tie_possible(s, squares, C, x.dtype), y, 0,
                  _maxima_of_exp(x[:, :n], 0, False, x, C * (width - n)))
    nll_i = s.log().add_(m.to(_F64)).sub_(z_y.to(_F64)) if flags["nll"] else None
    out.add(s.reciprocal(), top.to(_F64), nll_i)
    if squares is not None:
        out.brier.append(_brier_of_exp(squares, x_y, s))
    if not keep_p:
        return None
    p = x.div_(totals)  # the padding's columns too, so the sums below run on whole rows
    if cw is not None:
        p[:, n:] = 0.0  # the padding holds no entries
        # the same division as the block's: the gathered probability, bit for bit
        cw.add(p, 0, y=y, n=n, p_y=x_y / totals[:n])
    return p[:, :n].T
