"""Blur corruptions (ImageNet-C / CIFAR-10-C levels at 32 px, radii scaled with the image side)."""
from __future__ import annotations

import math

import torch

from . import ops
from .registry import register_corruption, side_scale

_CIFAR_C = "CIFAR-10-C (Hendrycks & Dietterich, ICLR 2019)"


@register_corruption("gaussian_blur", family="blur", levels=(0.4, 0.6, 0.7, 0.8, 1.0),
                     source="torchvision.transforms.v2.functional.gaussian_blur's kernel, as two matrix products",
                     definition=f"Gaussian blur of sigma = level px at 32 px; {_CIFAR_C}")
def gaussian_blur(x, level, rand):
    return ops.gaussian_blur(x, level * side_scale(x))


def _disk(radius: float, alias_sigma: float) -> torch.Tensor:
    """The disk of ``radius`` px as the share of each pixel it covers (8 x 8 samples a pixel, so that the kernel
    grows smoothly with the radius at any image size), smoothed by a Gaussian of ``alias_sigma`` px (anti-aliasing)
    and normalised."""
    reach = math.ceil(radius + 3 * alias_sigma) + 1
    fine = (torch.arange(-reach * 8, (reach + 1) * 8, dtype=torch.float64) + 0.5) / 8 - 0.5
    inside = ((fine[:, None] ** 2 + fine[None] ** 2) <= radius ** 2).double()
    side = 2 * reach + 1
    disk = inside.reshape(side, 8, side, 8).mean(dim=(1, 3))
    if radius < 0.5 / 8:  # thinner than one sample: the centre pixel
        disk = torch.zeros(side, side, dtype=torch.float64)
        disk[reach, reach] = 1.0
    offsets = torch.arange(-reach, reach + 1, dtype=torch.float64)
    g = torch.exp(-offsets ** 2 / (2 * max(alias_sigma, 1e-3) ** 2))
    kernel = torch.nn.functional.conv2d(disk[None, None], (g[:, None] * g[None])[None, None], padding=reach)[0, 0]
    return (kernel / kernel.sum()).float()


@register_corruption("defocus_blur", family="blur", levels=((0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1.0, 0.2), (1.5, 0.1)),
                     source="hand-written",
                     definition=f"(radius, anti-alias sigma) px at 32 px of the disk kernel the image is filtered "
                                f"with (each pixel weighted by the share of it the disk covers); {_CIFAR_C}")
def defocus_blur(x, level, rand):
    radius, alias = level
    return ops.depthwise_conv(x, _disk(radius * side_scale(x), alias * side_scale(x)))


@register_corruption("motion_blur", family="blur", levels=((6, 1.0), (6, 1.5), (6, 2.0), (8, 2.0), (9, 2.5)),
                     source="hand-written",
                     definition=f"(radius, sigma) px at 32 px of ImageMagick's motion blur, at an angle drawn "
                                f"uniformly in [-45, 45] degrees; {_CIFAR_C}")
def motion_blur(x, level, rand):
    radius, sigma = level
    return ops.motion_blur(x, radius * side_scale(x), sigma * side_scale(x), rand.uniform(low=-45.0, high=45.0))


@register_corruption("zoom_blur", family="blur", levels=(0.06, 0.11, 0.16, 0.21, 0.26),
                     source="torchvision.transforms.v2.functional.affine",
                     definition=f"the mean of the image and its centre zoomed by 1, 1.01, ... below 1 + level (scale "
                                f"free); {_CIFAR_C}")
def zoom_blur(x, level, rand):
    factors = [1 + k / 100 for k in range(int(round(level * 100)))]
    return (x + sum(ops.zoom(x, f) for f in factors)) / (len(factors) + 1)


@register_corruption("glass_blur", family="blur", levels=((0.05, 1, 1), (0.25, 1, 1), (0.4, 1, 1), (0.25, 1, 2),
                                                         (0.4, 1, 2)),
                     source="hand-written",
                     definition=f"(sigma px, max shift px, iterations) at 32 px: blur, then each iteration moves every "
                                f"pixel from a random neighbour within the max shift, then blur; {_CIFAR_C} (its "
                                "sequential pixel swaps drawn as one gather per iteration)")
def glass_blur(x, level, rand):
    sigma, delta, iterations = level
    scale = side_scale(x)
    delta = max(1, int(round(delta * scale)))
    x = ops.gaussian_blur(x, sigma * scale)
    h, w = x.shape[-2:]
    for _ in range(iterations):
        dy, dx = rand.integers(-delta, delta, h, w), rand.integers(-delta, delta, h, w)
        rows = (torch.arange(h)[None, :, None] + dy).clamp_(0, h - 1)
        cols = (torch.arange(w)[None, None, :] + dx).clamp_(0, w - 1)
        x = ops.gather_pixels(x, rows, cols)
    return ops.gaussian_blur(x, sigma * scale)

