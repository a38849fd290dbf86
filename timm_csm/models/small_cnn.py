"""A small, fast convolutional network for 28-32 px images (Fashion-MNIST, digits, CIFAR smoke runs).

Three stages of conv3x3-BN-ReLU (widths 16, 32, 64), 2x2 max-pooling before the second and third, global
average pooling and a linear classifier: 24 k parameters and 2 M multiply-adds for a 28x28 grey image, so a
training epoch of 10k Fashion-MNIST images takes a few seconds on one CPU core (benchmarks/train.md).
``small_cnn_wide`` doubles the widths (94 k parameters, about 3.5x the time).

timm's model contract: ``features_only=True`` returns the stage outputs (``out_indices`` over the stages, all of them
by default); ``set_grad_checkpointing(True)`` recomputes each stage after the first in the backward pass (timm's
``checkpoint_seq``); there is no residual path, so ``drop_path_rate`` (stochastic depth) must be 0 or None.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence, Union

import torch
import torch.nn as nn
from timm.models import build_model_with_cfg, checkpoint_seq, generate_default_cfgs, register_model

from ._cfg import FASHION_MNIST_MEAN, FASHION_MNIST_STD, adapt_pretrained_cfg, small_image_cfg
from ._head import PooledLinearHead

__all__ = ["SmallCNN", "build_small_cnn"]

DEFAULT_WIDTHS = (16, 32, 64)

def _norm(kind: str, channels: int) -> nn.Module:
    if kind == "batchnorm":
        return nn.BatchNorm2d(channels)
    if kind == "groupnorm":  # per-sample statistics: results do not depend on how a batch is split
        return nn.GroupNorm(math.gcd(8, channels), channels)
    raise ValueError(f"norm_layer must be 'batchnorm' or 'groupnorm', got {kind!r}")

def _stage_depths(depth: Union[int, Sequence[int]], num_stages: int) -> tuple:
    depths = (int(depth),) * num_stages if isinstance(depth, int) else tuple(int(d) for d in depth)
    if not num_stages or len(depths) != num_stages or min(depths) < 1:
        raise ValueError(f"depth must be a positive int or one positive int per stage ({num_stages} stages), "
                         f"got {depth}")
    return depths

def _check_no_drop_path(drop_path_rate: Optional[float]) -> None:
    if drop_path_rate:
        raise ValueError(f"SmallCNN has no residual blocks, so stochastic depth cannot apply: drop_path_rate must be "
                         f"0 or None, got {drop_path_rate}; leave it unset (no --drop-path) or choose a residual "
                         f"model (resnet*_cifar, wrn*_cifar, swin_*)")


class SmallCNN(PooledLinearHead, nn.Module):
    """Stages of ``depth`` conv3x3-norm-ReLU layers of widths ``widths``; 2x2 max-pool between stages.

    ``depth``: layers per stage, one int for all stages or one per stage. ``norm_layer``: "batchnorm" (default) or
    "groupnorm" (8 groups). ``conv_init``: "kaiming_normal" (He et al. 2015, fan-out, as timm's ResNets) or
    "default" (PyTorch's own ``Conv2d`` initialisation). ``drop_path_rate``: accepted as 0 or None only (no
    residual path to drop); anything larger is a ``ValueError``.
    """

    def __init__(self, num_classes: int = 10, in_chans: int = 1, widths: Sequence[int] = DEFAULT_WIDTHS,
                 depth: Union[int, Sequence[int]] = 1, global_pool: str = "avg", drop_rate: float = 0.0,
                 norm_layer: str = "batchnorm", conv_init: str = "kaiming_normal",
                 drop_path_rate: Optional[float] = None):
        super().__init__()
        _check_no_drop_path(drop_path_rate)
        if conv_init not in ("kaiming_normal", "default"):
            raise ValueError(f"conv_init must be 'kaiming_normal' or 'default', got {conv_init!r}")
        depths = _stage_depths(depth, len(widths))
        self.num_classes = num_classes
        self.in_chans = in_chans
        self.drop_rate = drop_rate
        self.grad_checkpointing = False
        self.feature_info = []
        stages = []
        in_chs = in_chans
        for i, (out_chs, d) in enumerate(zip(widths, depths)):
            layers = [nn.MaxPool2d(2)] if i > 0 else []
            for _ in range(d):
                layers += [nn.Conv2d(in_chs, out_chs, 3, padding=1, bias=False), _norm(norm_layer, out_chs),
                           nn.ReLU(inplace=True)]
                in_chs = out_chs
            stages.append(nn.Sequential(*layers))
            self.feature_info.append(dict(num_chs=out_chs, reduction=2 ** i, module=f"stages.{i}"))
        self.stages = nn.Sequential(*stages)
        self.num_features = self.head_hidden_size = in_chs
        self.reset_classifier(num_classes, global_pool)
        for m in self.modules():
            if conv_init == "kaiming_normal" and isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False):
        return dict(stem=r"^stages\.0", blocks=r"^stages\.(\d+)")

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True):
        self.grad_checkpointing = enable

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        if self.grad_checkpointing and not torch.jit.is_scripting():
            # the first stage (the stem, as in group_matcher) runs outside, as timm's ResNet stem: a segment whose
            # only input is the image would get no parameter gradients under re-entrant checkpointing
            return checkpoint_seq(self.stages[1:], self.stages[0](x))
        return self.stages(x)

default_cfgs = generate_default_cfgs({
    "small_cnn.untrained": small_image_cfg(input_size=(1, 28, 28), pool_size=(7, 7), mean=FASHION_MNIST_MEAN,
                                           std=FASHION_MNIST_STD, first_conv="stages.0.0"),
    "small_cnn_wide.untrained": small_image_cfg(input_size=(1, 28, 28), pool_size=(7, 7), mean=FASHION_MNIST_MEAN,
                                                std=FASHION_MNIST_STD, first_conv="stages.0.0"),
})

def build_small_cnn(variant: str, pretrained: bool = False, **kwargs) -> SmallCNN:
    """``build_model_with_cfg`` for a SmallCNN variant; ``features_only`` defaults to every stage."""
    num_stages = len(kwargs.get("widths", DEFAULT_WIDTHS))
    model = build_model_with_cfg(SmallCNN, variant, pretrained,
                                 feature_cfg=dict(flatten_sequential=True, out_indices=tuple(range(num_stages))),
                                 **kwargs)
    adapt_pretrained_cfg(model, model.in_chans)
    return model

@register_model
def small_cnn(pretrained: bool = False, **kwargs) -> SmallCNN:
    """SmallCNN, widths (16, 32, 64), one convolution per stage (24 k parameters at 10 classes)."""
    return build_small_cnn("small_cnn", pretrained, **kwargs)

@register_model
def small_cnn_wide(pretrained: bool = False, **kwargs) -> SmallCNN:
    """SmallCNN, widths (32, 64, 128), one convolution per stage (94 k parameters at 10 classes)."""
    return build_small_cnn("small_cnn_wide", pretrained, **dict(dict(widths=(32, 64, 128)), **kwargs))
