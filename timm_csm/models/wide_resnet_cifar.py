"""Wide residual networks for 32x32 images.

Zagoruyko & Komodakis, "Wide Residual Networks" (BMVC 2016): WRN-d-k has three stages of (d - 4) / 6
pre-activation basic blocks (BN-ReLU-conv3x3-BN-ReLU-[dropout]-conv3x3) with widths 16k, 32k, 64k and strides
1, 2, 2, a 3x3 stem of 16 channels, a final BN-ReLU, global average pooling and a linear classifier. A 1x1
convolution projects the shortcut where the shape changes. WRN-28-10 is the standard CIFAR configuration.

timm's model contract: ``drop_path_rate`` adds stochastic depth (Huang et al., "Deep Networks with Stochastic Depth",
ECCV 2016) on each block's residual branch, rising linearly from 0 at the first block to ``drop_path_rate`` at the
last (timm's rule); ``set_grad_checkpointing(True)`` recomputes every block in the backward pass (timm's
``checkpoint_seq``); ``features_only=True`` returns the stem and the three stage outputs, the last one before the final
BN-ReLU, as timm's pre-activation ResNetV2 does.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import DropPath, calculate_drop_path_rates
from timm.models import build_model_with_cfg, checkpoint_seq, generate_default_cfgs, register_model

from ._cfg import adapt_pretrained_cfg, small_image_cfg
from ._head import PooledLinearHead

__all__ = ["WideResNet"]

class WideBasicBlock(nn.Module):
    """Pre-activation wide basic block; the shortcut takes the pre-activated input when it is projected; the residual
    branch is dropped per sample with probability ``drop_path_rate`` in training (timm's ``DropPath``)."""

    def __init__(self, in_chs: int, out_chs: int, stride: int, drop_rate: float = 0.0, drop_path_rate: float = 0.0):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_chs)
        self.conv1 = nn.Conv2d(in_chs, out_chs, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_chs)
        self.conv2 = nn.Conv2d(out_chs, out_chs, 3, stride=1, padding=1, bias=False)
        self.drop_rate = drop_rate
        self.drop_path = DropPath(drop_path_rate) if drop_path_rate > 0 else nn.Identity()
        self.shortcut = None
        if stride != 1 or in_chs != out_chs:
            self.shortcut = nn.Conv2d(in_chs, out_chs, 1, stride=stride, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pre = F.relu(self.bn1(x))
        shortcut = x if self.shortcut is None else self.shortcut(pre)
        out = self.conv1(pre)
        out = F.relu(self.bn2(out))
        if self.drop_rate > 0:
            out = F.dropout(out, p=self.drop_rate, training=self.training)
        return self.drop_path(self.conv2(out)) + shortcut

class WideResNet(PooledLinearHead, nn.Module):
    """WRN-``depth``-``widen_factor`` for small images, with timm's model interface.

    Args:
        depth: total depth 6n + 4 (n blocks per stage).
        widen_factor: k, the width multiplier of the three stages.
        num_classes, in_chans, global_pool, drop_rate: as in timm (drop_rate: dropout before the classifier).
        block_drop_rate: dropout between the two convolutions of each block (0.3 in the WRN CIFAR runs).
        drop_path_rate: stochastic depth of the last block; block i of N gets ``drop_path_rate * i / (N - 1)``.
    """

    def __init__(self, depth: int = 28, widen_factor: int = 10, num_classes: int = 10, in_chans: int = 3,
                 global_pool: str = "avg", drop_rate: float = 0.0, block_drop_rate: float = 0.0,
                 drop_path_rate: Optional[float] = None):
        super().__init__()
        if depth < 10 or (depth - 4) % 6 != 0:
            raise ValueError(f"WideResNet depth must be 6n + 4 with n >= 1, got {depth}")
        n = (depth - 4) // 6
        widths = (16, 16 * widen_factor, 32 * widen_factor, 64 * widen_factor)
        self.num_classes = num_classes
        self.in_chans = in_chans
        self.drop_rate = drop_rate
        self.grad_checkpointing = False
        self.conv1 = nn.Conv2d(in_chans, widths[0], 3, stride=1, padding=1, bias=False)
        self.feature_info = [dict(num_chs=widths[0], reduction=1, module="conv1")]
        in_chs = widths[0]
        stage_dprs = calculate_drop_path_rates(drop_path_rate or 0.0, [n] * 3, stagewise=True)
        for i, (out_chs, stride, dprs) in enumerate(zip(widths[1:], (1, 2, 2), stage_dprs)):
            blocks = [WideBasicBlock(in_chs if j == 0 else out_chs, out_chs, stride if j == 0 else 1, block_drop_rate,
                                     dprs[j]) for j in range(n)]
            self.add_module(f"layer{i + 1}", nn.Sequential(*blocks))
            self.feature_info.append(dict(num_chs=out_chs, reduction=2 ** i, module=f"layer{i + 1}"))
            in_chs = out_chs
        self.bn_final = nn.BatchNorm2d(in_chs)
        self.num_features = self.head_hidden_size = in_chs
        self.reset_classifier(num_classes, global_pool)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False):
        return dict(stem=r"^conv1", blocks=r"^layer(\d+)" if coarse else r"^layer(\d+)\.(\d+)")

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True):
        self.grad_checkpointing = enable

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        if self.grad_checkpointing and not torch.jit.is_scripting():
            x = checkpoint_seq([self.layer1, self.layer2, self.layer3], x, flatten=True)
        else:
            x = self.layer3(self.layer2(self.layer1(x)))
        return F.relu(self.bn_final(x))

def _create(variant: str, depth: int, widen_factor: int, pretrained: bool = False, **kwargs) -> WideResNet:
    model = build_model_with_cfg(WideResNet, variant, pretrained, depth=depth, widen_factor=widen_factor,
                                 feature_cfg=dict(out_indices=(0, 1, 2, 3)), **kwargs)
    adapt_pretrained_cfg(model, model.in_chans)
    return model

_WRN_CFG = dict(first_conv="conv1", classifier="fc", pool_size=(8, 8))
default_cfgs = generate_default_cfgs({
    "wrn28_10_cifar.untrained": small_image_cfg(**_WRN_CFG),
    "wrn28_2_cifar.untrained": small_image_cfg(**_WRN_CFG),
    "wrn16_4_cifar.untrained": small_image_cfg(**_WRN_CFG),
})

@register_model
def wrn28_10_cifar(pretrained: bool = False, **kwargs) -> WideResNet:
    """WRN-28-10 (36.5 M parameters): the standard wide ResNet for CIFAR."""
    return _create("wrn28_10_cifar", 28, 10, pretrained, **kwargs)

@register_model
def wrn28_2_cifar(pretrained: bool = False, **kwargs) -> WideResNet:
    """WRN-28-2 (1.5 M parameters)."""
    return _create("wrn28_2_cifar", 28, 2, pretrained, **kwargs)

@register_model
def wrn16_4_cifar(pretrained: bool = False, **kwargs) -> WideResNet:
    """WRN-16-4 (2.7 M parameters)."""
    return _create("wrn16_4_cifar", 16, 4, pretrained, **kwargs)
