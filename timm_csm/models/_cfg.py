"""Shared pretrained-config helpers for the small-image models."""
from __future__ import annotations

from typing import Any, Dict, Sequence

__all__ = ["CIFAR10_MEAN", "CIFAR10_STD", "FASHION_MNIST_MEAN", "FASHION_MNIST_STD", "small_image_cfg",
           "adapt_pretrained_cfg"]

# CIFAR-10 training-set statistics, as used by the CSM / RankMixup CIFAR transforms.
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2023, 0.1994, 0.2010)
# Fashion-MNIST training-set statistics (60k images, pixel values scaled to [0, 1]).
FASHION_MNIST_MEAN = (0.2860,)
FASHION_MNIST_STD = (0.3530,)


def small_image_cfg(**kwargs) -> Dict[str, Any]:
    """A timm pretrained cfg for an untrained 32x32 model (no weights, CIFAR normalisation)."""
    cfg = {
        "url": "", "num_classes": 10, "input_size": (3, 32, 32), "pool_size": (4, 4), "crop_pct": 1.0,
        "interpolation": "bilinear", "mean": CIFAR10_MEAN, "std": CIFAR10_STD, "first_conv": "conv1",
        "classifier": "fc", "license": "apache-2.0",
    }
    cfg.update(kwargs)
    return cfg


def _fit_channels(values: Sequence[float], in_chans: int) -> tuple:
    """Per-channel statistics for ``in_chans`` channels: grey -> repeated, RGB -> averaged for one channel."""
    values = tuple(float(v) for v in values)
    if len(values) == in_chans:
        return values
    if len(values) == 1:
        return values * in_chans
    mean = sum(values) / len(values)
    return (mean,) * in_chans


def adapt_pretrained_cfg(model, in_chans: int, img_size=None) -> None:
    """Make ``model.pretrained_cfg`` describe the model as built (channels, input size), so that
    ``timm.data.resolve_model_data_config(model)`` returns a consistent input size, mean and std."""
    cfg = dict(model.pretrained_cfg)
    c, h, w = cfg.get("input_size", (in_chans, 32, 32))
    if img_size is not None:
        h, w = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
    cfg["input_size"] = (in_chans, h, w)
    cfg["mean"] = _fit_channels(cfg.get("mean", (0.5,)), in_chans)
    cfg["std"] = _fit_channels(cfg.get("std", (0.5,)), in_chans)
    model.pretrained_cfg = cfg
    model.default_cfg = cfg
