"""Weather corruptions (ImageNet-C / CIFAR-10-C levels at 32 px, spatial ones scaled with the image side). Frost is
left out: it blends photographs of frost that would have to ship with the package."""
from __future__ import annotations

import torch

from . import ops
from .registry import register_corruption, side_scale

_CIFAR_C = "CIFAR-10-C (Hendrycks & Dietterich, ICLR 2019)"


@register_corruption("fog", family="weather", levels=((0.2, 3.0), (0.5, 3.0), (0.75, 2.5), (1.0, 2.0), (1.5, 1.75)),
                     source="hand-written",
                     definition=f"(strength s, wibble decay) of a diamond-square plasma p added: (x + s p) max(x) / "
                                f"(max(x) + s); {_CIFAR_C}")
def fog(x, level, rand):
    strength, decay = level
    h, w = x.shape[-2:]
    size = 1 << max(1, (max(h, w) - 1).bit_length())
    plasma = ops.plasma_fractal(rand, size, decay)[:, None, :h, :w]
    top = x.amax(dim=(1, 2, 3), keepdim=True)
    return (x + strength * plasma) * top / (top + strength)


@register_corruption("snow", family="weather",
                     levels=((0.1, 0.2, 1.0, 0.6, 8, 3, 0.95), (0.1, 0.2, 1.0, 0.5, 10, 4, 0.9),
                             (0.15, 0.3, 1.75, 0.55, 10, 4, 0.9), (0.25, 0.3, 2.25, 0.6, 12, 6, 0.85),
                             (0.3, 0.3, 1.25, 0.65, 14, 12, 0.8)),
                     source="hand-written",
                     definition="(mean, std, zoom, threshold, blur radius px, blur sigma px, blend): flakes drawn "
                                "N(mean, std) per pixel, zoomed, kept above the threshold, motion-blurred at an angle "
                                "in [-135, -45] degrees, added twice (and rotated by 180 degrees) to the image "
                                f"brightened towards its grey level; {_CIFAR_C}")
def snow(x, level, rand):
    mean, std, factor, threshold, radius, sigma, blend = level
    scale = side_scale(x)
    flakes = ops.zoom(rand.normal(1, *x.shape[-2:], mean=mean, std=std), factor)
    flakes = flakes.where(flakes >= threshold, torch.zeros(())).clamp_(0, 1)
    flakes = ops.motion_blur(flakes, radius * scale, sigma * scale, rand.uniform(low=-135.0, high=-45.0))
    flakes = flakes.mul(255).round_().div_(255)
    x = blend * x + (1 - blend) * torch.maximum(x, ops.luma(x) * 1.5 + 0.5)
    return x + flakes + flakes.flip(-1, -2)


_WATER = (175 / 255, 238 / 255, 238 / 255)  # pale turquoise


@register_corruption("spatter", family="weather",
                     levels=((0.62, 0.1, 0.7, 0.7, 0.5), (0.65, 0.1, 0.8, 0.7, 0.5), (0.65, 0.3, 1.0, 0.69, 0.5),
                             (0.65, 0.3, 1.0, 0.68, 0.6), (0.67, 0.4, 1.0, 0.65, 0.7)),
                     source="hand-written",
                     definition="(mean, std, sigma px, threshold, intensity): a liquid layer N(mean, std) blurred by "
                                "sigma and kept above the threshold adds water's pale turquoise in proportion to it "
                                f"(intensity at its maximum); {_CIFAR_C}'s water levels 1-3 without its edge "
                                "shading; levels 4-5 continue them (ImageNet-C's std, lower thresholds, more "
                                "intensity) where CIFAR-10-C switches to mud, which barely shows on dark images")
def spatter(x, level, rand):
    mean, std, sigma, threshold, intensity = level
    liquid = ops.gaussian_blur(rand.normal(1, *x.shape[-2:], mean=mean, std=std), sigma * side_scale(x))
    liquid = liquid.where(liquid >= threshold, torch.zeros(()))
    layer = liquid / liquid.amax(dim=(1, 2, 3), keepdim=True).clamp_min(1e-12) * intensity
    water = torch.tensor(_WATER).view(1, 3, 1, 1)
    return x + layer * (water if x.shape[1] == 3 else ops.luma(water))


@register_corruption("brightness", family="weather", levels=(0.05, 0.1, 0.15, 0.2, 0.3), source="hand-written",
                     definition=f"level added to the value (V) of HSV, which scales RGB by (V + level) / V (grey: "
                                f"x + level); {_CIFAR_C}")
def brightness(x, level, rand):
    value = x.amax(dim=1, keepdim=True)
    brighter = (value + level).clamp(max=1.0)
    return torch.where(value > 0, x * brighter / value.clamp_min(1e-12), brighter.expand_as(x))
