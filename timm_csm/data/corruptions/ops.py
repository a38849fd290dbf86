"""Batched image operations the corruptions share (float (B, C, H, W) in [0, 1], per-image parameters)."""
from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torchvision.transforms import InterpolationMode
from torchvision.transforms.v2 import functional as TF

from .registry import BatchRandom

__all__ = ["luma", "gaussian_blur", "depthwise_conv", "gather_pixels", "shifted", "motion_blur", "zoom",
           "affine_per_image", "plasma_fractal"]

_LUMA = (0.299, 0.587, 0.114)  # ITU-R 601-2, as PIL's convert("L") and timm_csm.data.transforms


def luma(x: torch.Tensor) -> torch.Tensor:
    """(B, 1, H, W): the grey level of ``x`` (itself when grey)."""
    if x.shape[1] == 1:
        return x
    return (x * torch.tensor(_LUMA, dtype=x.dtype).view(1, 3, 1, 1)).sum(1, keepdim=True)


def _blur_matrix(n: int, g: torch.Tensor) -> torch.Tensor:
    """(n, n): the 1-D filter ``g`` (odd length k <= 2n - 1) along a side of n pixels with reflected borders (the
    pixel beyond the edge mirrors the one inside, edge excluded), as a matrix."""
    r = len(g) // 2
    rows = torch.arange(n)[:, None].expand(n, len(g))
    cols = rows + torch.arange(-r, r + 1)[None]
    cols = torch.where(cols < 0, -cols, cols)
    cols = torch.where(cols > n - 1, 2 * (n - 1) - cols, cols)
    return torch.zeros(n, n, dtype=g.dtype).index_put_((rows, cols), g.expand(n, len(g)), accumulate=True)


def gaussian_blur(x: torch.Tensor, sigma: float) -> torch.Tensor:
    """A Gaussian blur of standard deviation ``sigma`` px: torchvision's ``gaussian_blur`` (its kernel of
    2 ceil(3 sigma) + 1 taps, kept inside the image, and its reflected borders) applied along each side as one
    matrix product, the same result as its 2-D convolution at a fraction of the cost; ``sigma`` <= 0: ``x``."""
    h, w = x.shape[-2:]
    k = min(2 * math.ceil(3 * sigma) + 1, 2 * ((min(h, w) - 1) // 2) + 1) if sigma > 0 else 1
    if k <= 1:
        return x
    taps = torch.linspace(-(k - 1) / 2, (k - 1) / 2, k, dtype=torch.float64)
    g = torch.exp(-0.5 * (taps / float(sigma)) ** 2)
    g = g / g.sum()
    return _blur_matrix(h, g).to(x.dtype) @ x @ _blur_matrix(w, g).to(x.dtype).T


def depthwise_conv(x: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    """``x`` filtered channel by channel with the odd-sized 2-D ``kernel`` (reflected borders, as OpenCV's
    filter2D); a kernel larger than the image is cropped to it."""
    c, (kh, kw) = x.shape[1], kernel.shape
    limit = 2 * ((min(x.shape[-2:]) - 1) // 2) + 1
    if kh > limit:
        cut = (kh - limit) // 2
        kernel = kernel[cut:kh - cut, cut:kw - cut]
        kernel = kernel / kernel.sum()
        kh, kw = kernel.shape
    pad = (kw // 2, kw // 2, kh // 2, kh // 2)
    weight = kernel.to(x.dtype).expand(c, 1, kh, kw)
    return F.conv2d(F.pad(x, pad, mode="reflect"), weight, groups=c)


def gather_pixels(x: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """out[b, c, i, j] = x[b, c, rows[b, i, j], cols[b, i, j]] (indices broadcast to (B, H, W), inside the image),
    the same pixel moved in every channel."""
    b, c, h, w = x.shape
    flat = (rows * w + cols).expand(b, h, w).reshape(b, 1, h * w).expand(b, c, h * w)
    return x.reshape(b, c, h * w).gather(2, flat).reshape(b, c, h, w)


def shifted(x: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor) -> torch.Tensor:
    """Each image moved by its integer (dy, dx) (B,), the border pixels repeated: out[y, x] = in[y - dy, x - dx]."""
    _, _, h, w = x.shape
    rows = (torch.arange(h)[None] - dy[:, None]).clamp_(0, h - 1)  # (B, H)
    cols = (torch.arange(w)[None] - dx[:, None]).clamp_(0, w - 1)  # (B, W)
    return gather_pixels(x, rows[:, :, None], cols[:, None, :])


def motion_blur(x: torch.Tensor, radius: float, sigma: float, angles: torch.Tensor) -> torch.Tensor:
    """ImageMagick's motion blur: the image averaged along a line at ``angles`` (degrees, (B,)) over 2 radius + 1
    taps (at least 2) weighted by a one-sided Gaussian of ``sigma`` px; taps past the image border are dropped."""
    width = max(2, 2 * int(round(radius)) + 1)
    taps = torch.arange(width, dtype=torch.float64)
    weights = torch.exp(-taps ** 2 / (2 * max(sigma, 1e-3) ** 2))
    weights = (weights / weights.sum()).float()
    theta = torch.deg2rad(angles.double())
    out = torch.zeros_like(x)
    for i in range(width):
        dy = -torch.ceil(i * torch.sin(theta) - 0.5).long()
        dx = -torch.ceil(i * torch.cos(theta) - 0.5).long()
        if bool((dy.abs() >= x.shape[-2]).all() or (dx.abs() >= x.shape[-1]).all()):
            break
        out += weights[i] * shifted(x, dy, dx)
    return out


def zoom(x: torch.Tensor, factor: float) -> torch.Tensor:
    """The centre of ``x`` magnified by ``factor`` to the same size (bilinear; torchvision's affine)."""
    if factor == 1:
        return x
    return TF.affine(x, angle=0.0, translate=[0.0, 0.0], scale=float(factor), shear=[0.0, 0.0],
                     interpolation=InterpolationMode.BILINEAR)


def affine_per_image(x: torch.Tensor, params: Sequence[dict]) -> torch.Tensor:
    """torchvision's ``affine`` with each image's own keyword arguments (``angle``, ``translate``, ``scale``,
    ``shear``): the images sharing parameters are transformed together (bilinear, zero fill)."""
    out = torch.empty_like(x)
    groups: dict = {}
    for i, p in enumerate(params):
        groups.setdefault(tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in p.items())),
                          []).append(i)
    for key, rows in groups.items():
        kwargs = dict(angle=0.0, translate=[0.0, 0.0], scale=1.0, shear=[0.0, 0.0])
        kwargs.update({k: list(v) if isinstance(v, tuple) else v for k, v in key})
        out[rows] = TF.affine(x[rows], interpolation=InterpolationMode.BILINEAR, **kwargs)
    return out


def plasma_fractal(rand: BatchRandom, size: int, decay: float) -> torch.Tensor:
    """(B, size, size) diamond-square height maps in [0, 1] (Fournier et al. 1982; the fog of ImageNet-C): the
    midpoints of each square, then of each diamond, get the mean of their corners plus a uniform perturbation of
    scale ``wibble``, which starts at 100 and is divided by ``decay`` at each halving; ``size`` a power of two."""
    b = len(rand)
    m = torch.zeros(b, size, size, dtype=torch.float64)
    counts = [3 * (size // (1 << k)) ** 2 for k in range(size.bit_length() - 1, 0, -1)]  # per halving: 3 n x n
    draws = rand.uniform(sum(counts)).double() * 2 - 1  # one draw per image, in [-1, 1)
    step, wibble, used = size, 100.0, 0
    while step >= 2:
        half, n = step // 2, size // step
        noise = draws[:, used:used + 3 * n * n].reshape(b, 3, n, n) * wibble * wibble
        used += 3 * n * n
        ul = m[:, 0::step, 0::step]
        squares = ul + ul.roll(-1, 1)
        squares = squares + squares.roll(-1, 2)
        m[:, half::step, half::step] = squares / 4 + noise[:, 0]
        dr = m[:, half::step, half::step]
        m[:, 0::step, half::step] = (dr + dr.roll(1, 1) + ul + ul.roll(-1, 2)) / 4 + noise[:, 1]
        m[:, half::step, 0::step] = (dr + dr.roll(1, 2) + ul + ul.roll(-1, 1)) / 4 + noise[:, 2]
        step //= 2
        wibble /= decay
    low = m.amin(dim=(1, 2), keepdim=True)
    span = (m.amax(dim=(1, 2), keepdim=True) - low).clamp_min(1e-12)
    return ((m - low) / span).float()
