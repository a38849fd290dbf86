"""Noise corruptions (ImageNet-C / CIFAR-10-C levels), hand-written: torchvision's ``gaussian_noise`` draws from
the global generator, and the corruptions draw per image (:class:`~.registry.BatchRandom`)."""
from __future__ import annotations

from .registry import register_corruption

_CIFAR_C = "CIFAR-10-C (Hendrycks & Dietterich, ICLR 2019)"


@register_corruption("gaussian_noise", family="noise", levels=(0.04, 0.06, 0.08, 0.09, 0.10), source="hand-written",
                     definition=f"x + N(0, level^2) on pixel values in [0, 1]; {_CIFAR_C}")
def gaussian_noise(x, level, rand):
    return x + level * rand.normal(*x.shape[1:])


@register_corruption("shot_noise", family="noise", levels=(500, 250, 100, 75, 50), source="hand-written",
                     definition=f"Poisson(level * x) / level (photon counts; fewer is noisier); {_CIFAR_C}")
def shot_noise(x, level, rand):
    return rand.poisson(x * level) / level


@register_corruption("impulse_noise", family="noise", levels=(0.01, 0.02, 0.03, 0.05, 0.07), source="hand-written",
                     definition=f"a fraction level of the pixel values set to 0 or 1 (salt and pepper, half each); "
                                f"{_CIFAR_C}")
def impulse_noise(x, level, rand):
    hit, salt = rand.uniform(*x.shape[1:]), rand.uniform(*x.shape[1:])
    return x.where(hit >= level, (salt < 0.5).to(x.dtype))


@register_corruption("speckle_noise", family="noise", levels=(0.06, 0.10, 0.12, 0.16, 0.20), source="hand-written",
                     definition=f"x + x * N(0, level^2) (multiplicative); {_CIFAR_C}")
def speckle_noise(x, level, rand):
    return x + x * level * rand.normal(*x.shape[1:])
