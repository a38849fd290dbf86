"""Digital corruptions: ImageNet-C / CIFAR-10-C's contrast, JPEG, pixelation and elastic transform, MNIST-C's
quantisation and stripes."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torchvision.transforms import InterpolationMode
from torchvision.transforms.v2 import functional as TF

from . import ops
from .registry import register_corruption

_CIFAR_C = "CIFAR-10-C (Hendrycks & Dietterich, ICLR 2019)"
_MNIST_C = "MNIST-C (Mu & Gilmer, 2019)"


def _uint8(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(0, 1).mul(255).round_().to(torch.uint8)


@register_corruption("contrast", family="digital", levels=(0.75, 0.5, 0.4, 0.3, 0.15),
                     source="torchvision.transforms.v2.functional.adjust_contrast",
                     definition=f"(x - m) level + m, m the mean grey level of the image (CIFAR-10-C takes each "
                                f"channel's mean); {_CIFAR_C}")
def contrast(x, level, rand):
    return TF.adjust_contrast(x, level)


@register_corruption("jpeg_compression", family="digital", levels=(80, 65, 58, 50, 40),
                     source="torchvision.transforms.v2.functional.jpeg",
                     definition=f"JPEG encoding at quality level, decoded; {_CIFAR_C}")
def jpeg_compression(x, level, rand):
    return TF.jpeg(_uint8(x), int(level)).float() / 255


@register_corruption("pixelate", family="digital", levels=(0.95, 0.9, 0.85, 0.75, 0.65),
                     source="torchvision.transforms.v2.functional.resize",
                     definition=f"shrunk to level x the side (antialiased) and enlarged back with nearest "
                                f"neighbours, pixel centres aligned (ImageNet-C's enlargement); {_CIFAR_C}")
def pixelate(x, level, rand):
    h, w = x.shape[-2:]
    small = TF.resize(x, [max(1, int(h * level)), max(1, int(w * level))],
                      interpolation=InterpolationMode.BILINEAR, antialias=True)
    return TF.resize(small, [h, w], interpolation=InterpolationMode.NEAREST_EXACT)


@register_corruption("elastic_transform", family="digital",
                     levels=((0.0, 0.0, 0.03), (0.05, 0.2, 0.05), (0.08, 0.06, 0.06), (0.1, 0.04, 0.07),
                             (0.1, 0.03, 0.08)),
                     source="hand-written (torch grid_sample)",
                     definition="(alpha, sigma, affine shift) as fractions of the side: the three points of a "
                                "triangle moved by up to the affine shift (a random affine map), then a displacement "
                                "field U(-1, 1) blurred by sigma and scaled by alpha, sampled once with reflected "
                                f"borders; {_CIFAR_C}'s (alpha, sigma) with its affine shifts in increasing order (it "
                                "lowers them as the elastic part grows, which makes severity 1 harder than 2) and "
                                "one resampling instead of two")
def elastic_transform(x, level, rand):
    alpha, sigma, shift = level
    b, _, h, w = x.shape
    side = min(h, w)
    c = torch.tensor([w / 2, h / 2]).floor()
    third = float(side // 3)
    src = torch.stack([c + third, c + torch.tensor([third, -third]), c - third])  # (3, 2) as (x, y)
    dst = src + rand.uniform(3, 2, low=-shift * side, high=shift * side)  # (B, 3, 2)
    ones = torch.ones(b, 3, 1)
    # the affine map dst -> src of each image: its inverse map, which sampling needs
    inverse = torch.linalg.solve(torch.cat([dst, ones], 2), src[None].expand(b, 3, 2))  # (B, 3, 2)
    field = rand.uniform(2, h, w, low=-1.0, high=1.0)
    field = ops.gaussian_blur(field, sigma * side) * alpha * side if alpha > 0 else torch.zeros_like(field)
    ys, xs = torch.meshgrid(torch.arange(h, dtype=torch.float32), torch.arange(w, dtype=torch.float32), indexing="ij")
    points = torch.stack([xs + field[:, 0], ys + field[:, 1], torch.ones(b, h, w)], -1)  # (B, H, W, 3)
    source = points.reshape(b, -1, 3) @ inverse  # (B, H * W, 2) pixel coordinates (x, y)
    grid = source.reshape(b, h, w, 2) * torch.tensor([2 / max(w - 1, 1), 2 / max(h - 1, 1)]) - 1
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="reflection", align_corners=True)


@register_corruption("quantize", family="digital", levels=(5, 4, 3, 2, 1),
                     source="torchvision.transforms.v2.functional.posterize",
                     definition=f"pixel values kept to their level highest bits (posterize; MNIST-C rounds to the "
                                f"nearest of 2^level values); {_MNIST_C}")
def quantize(x, level, rand):
    return TF.posterize(_uint8(x), int(level)).float() / 255


@register_corruption("stripe", family="digital", levels=(0.05, 0.1, 0.15, 0.2, 0.25), source="hand-written",
                     definition=f"the left and right level x width columns inverted (1 - x); level 0.25 is "
                                f"{_MNIST_C}'s stripe (7 of 28 columns a side)")
def stripe(x, level, rand):
    w = x.shape[-1]
    k = max(1, int(round(level * w)))
    out = x.clone()
    out[..., :k] = 1 - x[..., :k]
    out[..., w - k:] = 1 - x[..., w - k:]
    return out
