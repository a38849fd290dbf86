"""Building blocks of the passes over the logits: cache-sized row blocks, a row softmax and the affine maps of
the applies, each in the layout torch runs fastest."""
from __future__ import annotations

import functools
import math

import torch

__all__ = ["NARROW_CLASSES", "row_blocks", "softmax_rows", "log_softmax_rows", "row_tiling", "scale_shift",
           "affine_rows"]

# below this many classes torch reduces over the classes slowly (torch.softmax about 4x an explicit exp / sum)
NARROW_CLASSES = 32


def row_blocks(n: int, c: int, elements: int = 1 << 16):
    """``(start, stop)`` row ranges of about ``elements`` values each: blocks that stay in the CPU cache while
    several operations run over them."""
    rows = max(1, elements // max(c, 1))
    return [(start, min(n, start + rows)) for start in range(0, n, rows)]


def softmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """``torch.softmax(logits, dim=1)`` (a new tensor); for fewer than 32 classes as ``exp(z - max) / sum``, the
    same values to rounding at a quarter of torch's time."""
    if logits.shape[1] >= NARROW_CLASSES:
        return torch.softmax(logits, dim=1)
    e = torch.sub(logits, logits.amax(1, keepdim=True)).exp_()
    return e.div_(e.sum(1, keepdim=True))


def log_softmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """``torch.log_softmax(logits, dim=1)`` (a new tensor); for fewer than 32 classes as ``z - max - log sum
    exp(z - max)``, block by block."""
    if logits.shape[1] >= NARROW_CLASSES:
        return torch.log_softmax(logits, dim=1)
    out = torch.empty_like(logits)
    for start, stop in row_blocks(*logits.shape):
        block = logits[start:stop]
        shifted = torch.sub(block, block.amax(1, keepdim=True), out=out[start:stop])
        shifted.sub_(shifted.exp().sum(1, keepdim=True).log_())
    return out


def row_tiling(c: int) -> int:
    """The most rows :func:`scale_shift` treats as one: up to 800 values (rows of 400 to 1000 values run fastest,
    about 6x a broadcast over rows of 10 values and 1.4x over rows of 100)."""
    return max(1, 800 // c)


@functools.lru_cache(maxsize=64)
def _rows_per_tile(n: int, most: int) -> int:
    """The largest divisor of ``n`` up to ``most`` among the divisors of 720720 (2^4 3^2 5 7 11 13); ``most``
    when that leaves rows shorter than a quarter of ``most`` (the remaining rows then take a second call)."""
    common = math.gcd(n, 720720)
    best = max(d for d in range(1, min(common, most) + 1) if common % d == 0)
    return best if 4 * best >= most else most


def scale_shift(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``x * w + b`` for (C,) vectors w, b along the rows of x (N, C), given tiled as ``weight = w.repeat(m)`` and
    ``bias = b.repeat(m)`` with ``m = row_tiling(C)``: k <= m rows are processed as one long row (torch vectorises
    along the last dimension, so a broadcast over a short one runs at about half the speed)."""
    n, c = x.shape
    most = weight.numel() // c
    if most == 1:
        return torch.addcmul(bias, x, weight)
    k = _rows_per_tile(n, most) if x.is_contiguous() and n >= most else 1
    if k == 1:
        return torch.addcmul(bias[:c], x, weight[:c])
    if k < most:
        weight, bias = weight[:c * k], bias[:c * k]
    whole = (n // k) * k
    if whole == n:  # the common case, without a slice or an output buffer (each a microsecond at small sizes)
        return torch.addcmul(bias, x.view(-1, c * k), weight).view(n, c)
    out = torch.empty_like(x)
    torch.addcmul(bias, x[:whole].view(-1, c * k), weight, out=out[:whole].view(-1, c * k))
    torch.addcmul(bias[:c], x[whole:], weight[:c], out=out[whole:])
    return out


def affine_rows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``x @ weight.T + bias`` (a new contiguous (N, C) tensor); for few classes as the transpose of
    ``weight @ x.T + bias``, whose long dimension is the samples' (about 1.5x faster on a small matrix)."""
    if x.shape[1] < NARROW_CLASSES:
        return torch.addmm(bias.unsqueeze(1), weight, x.T).T.contiguous()
    return torch.addmm(bias, x, weight.T)
