"""Geometric corruptions of MNIST-C (Mu & Gilmer, 2019) through torchvision's affine map, at five severities (MNIST-C
uses one): rotation, shear, scale and translation about the image centre, bilinear, the uncovered area black."""
from __future__ import annotations

import math

from . import ops
from .registry import register_corruption

_MNIST_C = "MNIST-C (Mu & Gilmer, 2019)"
_AFFINE = "torchvision.transforms.v2.functional.affine"


@register_corruption("rotate", family="geometric", levels=(0.2, 0.4, 0.6, 0.8, 1.0), source=_AFFINE,
                     definition=f"rotation by level radians, direction drawn per image; {_MNIST_C} uses 0.4")
def rotate(x, level, rand):
    degrees = math.degrees(level)
    return ops.affine_per_image(x, [{"angle": float(s) * degrees} for s in rand.sign()])


@register_corruption("shear", family="geometric", levels=(0.2, 0.4, 0.6, 0.8, 1.0), source=_AFFINE,
                     definition=f"horizontal shear by level radians, direction drawn per image; {_MNIST_C} uses 0.4")
def shear(x, level, rand):
    degrees = math.degrees(level)
    return ops.affine_per_image(x, [{"shear": [float(s) * degrees, 0.0]} for s in rand.sign()])


@register_corruption("scale", family="geometric", levels=(0.9, 0.8, 0.7, 0.6, 0.5), source=_AFFINE,
                     definition=f"shrunk to level x its size about the centre; {_MNIST_C} uses 0.7")
def scale(x, level, rand):
    return ops.zoom(x, level)


@register_corruption("translate", family="geometric", levels=(1, 2, 3, 4, 5), source=_AFFINE,
                     definition=f"moved by level px at 28 px (scaled with the side) along each axis, directions drawn "
                                f"per image; {_MNIST_C} uses 3")
def translate(x, level, rand):
    step = float(max(1, round(level * min(x.shape[-2:]) / 28)))
    signs = rand.sign(2)
    return ops.affine_per_image(x, [{"translate": [float(sx) * step, float(sy) * step]} for sx, sy in signs])
