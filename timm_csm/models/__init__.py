"""timm models for small images, registered with timm's ``register_model`` on import.

After ``import timm_csm``: ``timm.create_model("resnet18_cifar" | "resnet34_cifar" | "resnet50_cifar" |
"resnet101_cifar" | "wrn28_10_cifar" | "wrn28_2_cifar" | "wrn16_4_cifar" | "small_cnn" | "small_cnn_wide" |
"reference_cnn" | "swin_tiny" | "swin_small" | "swin_base", num_classes=K, in_chans=C)``.
"""
from . import reference_cnn  # noqa: F401  (registers reference_cnn)
from .cifar_resnet import CifarResNet
from .small_cnn import SmallCNN
from .swin_small_images import swin_config_for_size
from .wide_resnet_cifar import WideResNet

SMALL_IMAGE_MODELS = (
    "resnet18_cifar", "resnet34_cifar", "resnet50_cifar", "resnet101_cifar",
    "wrn28_10_cifar", "wrn28_2_cifar", "wrn16_4_cifar",
    "small_cnn", "small_cnn_wide", "reference_cnn",
    "swin_tiny", "swin_small", "swin_base",
)

__all__ = ["CifarResNet", "WideResNet", "SmallCNN", "swin_config_for_size", "SMALL_IMAGE_MODELS"]
