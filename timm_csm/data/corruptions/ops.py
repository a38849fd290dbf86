"""Batched image operations the corruptions share (float (B, C, H, W) in [0, 1], per-image parameters)."""
from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torchvision.transforms import InterpolationMode
from torchvision.transforms.v2 import functional as TF

from .registry import BatchRandom

__all__ = ["luma", "gaussian_blur", "depthwise_conv", "shifted", "motion_blur", "zoom", "affine_per_image",
           "plasma_fractal"]

_LUMA = (0.299, 0.587, 0.114)  # ITU-R 601-2, as PIL's convert("L") and timm_csm.data.transforms


def luma(x: torch.Tensor) -> torch.Tensor:
    """(B, 1, H, W): the grey level of ``x`` (itself when grey)."""
    if x.shape[1] == 1:
        return x
    return (x * torch.tensor(_LUMA, dtype=x.dtype).view(1, 3, 1, 1)).sum(1, keepdim=True)


def gaussian_blur(x: torch.Tensor, sigma: float) -> torch.Tensor:
    """torchvision's Gaussian blur of standard deviation ``sigma`` px, kernel 2 ceil(3 sigma) + 1 (reflected
    borders), kept inside the image; ``sigma`` <= 0: ``x``."""
    if sigma <= 0:
        return x
    k = min(2 * math.ceil(3 * sigma) + 1, 2 * ((min(x.shape[-2:]) - 1) // 2) + 1)
    return TF.gaussian_blur(x, kernel_size=[k, k], sigma=[float(sigma), float(sigma)]) if k > 1 else x


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


def shifted(x: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor) -> torch.Tensor:
    """Each image moved by its integer (dy, dx) (B,), the border pixels repeated: out[y, x] = in[y - dy, x - dx]."""
    b, _, h, w = x.shape
    rows = (torch.arange(h)[None] - dy[:, None]).clamp_(0, h - 1)  # (B, H)
    cols = (torch.arange(w)[None] - dx[:, None]).clamp_(0, w - 1)  # (B, W)
    bidx = torch.arange(b)[:, None, None]
    return x.permute(0, 2, 3, 1)[bidx, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2)


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
    step, wibble = size, 100.0
    while step >= 2:
        half, n = step // 2, size // step
        ul = m[:, 0::step, 0::step]
        squares = ul + ul.roll(-1, 1)
        squares = squares + squares.roll(-1, 2)
        m[:, half::step, half::step] = squares / 4 + wibble * rand.uniform(n, n, low=-wibble, high=wibble).double()
        dr = m[:, half::step, half::step]
        left = dr + dr.roll(1, 1) + ul + ul.roll(-1, 2)
        m[:, 0::step, half::step] = left / 4 + wibble * rand.uniform(n, n, low=-wibble, high=wibble).double()
        top = dr + dr.roll(1, 2) + ul + ul.roll(-1, 1)
        m[:, half::step, 0::step] = top / 4 + wibble * rand.uniform(n, n, low=-wibble, high=wibble).double()
        step //= 2
        wibble /= decay
    low = m.amin(dim=(1, 2), keepdim=True)
    span = (m.amax(dim=(1, 2), keepdim=True) - low).clamp_min(1e-12)
    return ((m - low) / span).float()
