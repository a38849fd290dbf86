"""ResNets with the CIFAR stem: a 3x3 stride-1 convolution and no max-pool.

He et al., "Deep Residual Learning for Image Recognition" (CVPR 2016), in the layout the calibration
lineage (focal_calibration, MbLS, RankMixup, CSM) trains on 32x32 images: the ImageNet stem (7x7 stride-2
convolution + max-pool) is replaced by one 3x3 stride-1 convolution, so a 32x32 input reaches the last stage at
4x4; global average pooling then equals the reference 4x4 average pool. Everything else is timm's ResNet.
"""
from __future__ import annotations

import torch.nn as nn
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models.resnet import BasicBlock, Bottleneck, ResNet

from ._cfg import adapt_pretrained_cfg, small_image_cfg

__all__ = ["CifarResNet"]


class CifarResNet(ResNet):
    """timm :class:`~timm.models.resnet.ResNet` whose stem is a 3x3 stride-1 convolution without max-pool."""

    def __init__(self, block, layers, in_chans: int = 3, stem_width: int = 64, **kwargs):
        super().__init__(block, layers, in_chans=in_chans, stem_width=stem_width, **kwargs)
        inplanes = self.bn1.num_features
        self.conv1 = nn.Conv2d(in_chans, inplanes, kernel_size=3, stride=1, padding=1, bias=False)
        nn.init.kaiming_normal_(self.conv1.weight, mode="fan_out", nonlinearity="relu")
        self.maxpool = nn.Identity()
        # the stem no longer downsamples: every stage sees 4x the resolution of the ImageNet layout
        for info in self.feature_info:
            info["reduction"] = max(1, info["reduction"] // 4)


def _create(variant: str, block, layers, pretrained: bool = False, **kwargs) -> CifarResNet:
    model = build_model_with_cfg(CifarResNet, variant, pretrained, block=block, layers=layers, **kwargs)
    adapt_pretrained_cfg(model, model.in_chans)
    return model


default_cfgs = generate_default_cfgs({
    "resnet18_cifar.untrained": small_image_cfg(),
    "resnet34_cifar.untrained": small_image_cfg(),
    "resnet50_cifar.untrained": small_image_cfg(),
    "resnet101_cifar.untrained": small_image_cfg(),
})


@register_model
def resnet18_cifar(pretrained: bool = False, **kwargs) -> CifarResNet:
    """ResNet-18 (BasicBlock [2, 2, 2, 2]) with the CIFAR stem; 11.2 M parameters at 10 classes."""
    return _create("resnet18_cifar", BasicBlock, (2, 2, 2, 2), pretrained, **kwargs)


@register_model
def resnet34_cifar(pretrained: bool = False, **kwargs) -> CifarResNet:
    """ResNet-34 (BasicBlock [3, 4, 6, 3]) with the CIFAR stem."""
    return _create("resnet34_cifar", BasicBlock, (3, 4, 6, 3), pretrained, **kwargs)


@register_model
def resnet50_cifar(pretrained: bool = False, **kwargs) -> CifarResNet:
    """ResNet-50 (Bottleneck [3, 4, 6, 3]) with the CIFAR stem: the CSM / RankMixup default CIFAR network."""
    return _create("resnet50_cifar", Bottleneck, (3, 4, 6, 3), pretrained, **kwargs)


@register_model
def resnet101_cifar(pretrained: bool = False, **kwargs) -> CifarResNet:
    """ResNet-101 (Bottleneck [3, 4, 23, 3]) with the CIFAR stem."""
    return _create("resnet101_cifar", Bottleneck, (3, 4, 23, 3), pretrained, **kwargs)
