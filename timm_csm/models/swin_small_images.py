"""Short Swin aliases that adapt timm's Swin Transformer to the input size.

``swin_tiny`` / ``swin_small`` / ``swin_base`` are timm's ``swin_{tiny,small,base}_patch4_window7_224``
(Liu et al., "Swin Transformer", ICCV 2021) with a patch size and window chosen for the image size:

=============  ==========  ======  =========================================
image size     patch size  window  feature maps at 32 px / 64 px
=============  ==========  ======  =========================================
<= 64 px       2           4       16/8/4/2 at 32 px, 32/16/8/4 at 64 px
65 - 223 px    4           4
>= 224 px      4           7       (the ImageNet configuration)
=============  ==========  ======  =========================================

At 32 px the ImageNet layout (patch 4, window 7) leaves 8/4/2/1 feature maps and clamped windows; patch 2 with
window 4 keeps four attention stages with real windows. ``patch_size`` / ``window_size`` keyword arguments
override the rule. ``pretrained=True`` loads the ImageNet-1k weights of the stock model; timm's checkpoint filter
resamples the patch embedding and the relative-position tables to the new patch and window sizes.

The rest of timm's model contract is the stock model's: ``features_only=True`` returns every stage's map in NHWC
layout (the extractor's ``output_fmt``), ``drop_path_rate`` is stochastic depth rising linearly over the blocks (0.1
by default, as in timm), and ``set_grad_checkpointing(True)`` recomputes each block in the backward pass.
"""
from __future__ import annotations

from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models.swin_transformer import SwinTransformer, checkpoint_filter_fn

from ._cfg import adapt_pretrained_cfg

__all__ = ["swin_config_for_size"]

_SIZES = {
    "swin_tiny": dict(embed_dim=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24)),
    "swin_small": dict(embed_dim=96, depths=(2, 2, 18, 2), num_heads=(3, 6, 12, 24)),
    "swin_base": dict(embed_dim=128, depths=(2, 2, 18, 2), num_heads=(4, 8, 16, 32)),
}


def swin_config_for_size(img_size) -> dict:
    """``patch_size`` and ``window_size`` for an input of ``img_size`` (int or (H, W)); see the module table."""
    side = min(img_size) if isinstance(img_size, (tuple, list)) else int(img_size)
    if side <= 64:
        return dict(patch_size=2, window_size=4)
    if side < 224:
        return dict(patch_size=4, window_size=4)
    return dict(patch_size=4, window_size=7)


def _cfg(weights: str):
    return {
        "hf_hub_id": f"timm/{weights}", "num_classes": 1000, "input_size": (3, 32, 32), "pool_size": None,
        "crop_pct": 1.0, "interpolation": "bicubic", "fixed_input_size": True, "mean": IMAGENET_DEFAULT_MEAN,
        "std": IMAGENET_DEFAULT_STD, "first_conv": "patch_embed.proj", "classifier": "head.fc", "license": "mit",
    }


default_cfgs = generate_default_cfgs({
    "swin_tiny.ms_in1k": _cfg("swin_tiny_patch4_window7_224.ms_in1k"),
    "swin_small.ms_in1k": _cfg("swin_small_patch4_window7_224.ms_in1k"),
    "swin_base.ms_in1k": _cfg("swin_base_patch4_window7_224.ms_in22k_ft_in1k"),
})


def _create(variant: str, pretrained: bool = False, **kwargs) -> SwinTransformer:
    img_size = kwargs.get("img_size", 32)
    model_args = dict(_SIZES[variant], **swin_config_for_size(img_size))
    model_args.update(kwargs)
    model_args["img_size"] = img_size
    depths = model_args["depths"]
    model = build_model_with_cfg(
        SwinTransformer, variant, pretrained, pretrained_filter_fn=checkpoint_filter_fn,
        feature_cfg=dict(flatten_sequential=True, out_indices=tuple(range(len(depths)))), **model_args)
    adapt_pretrained_cfg(model, model_args.get("in_chans", 3), img_size)
    return model


@register_model
def swin_tiny(pretrained: bool = False, **kwargs) -> SwinTransformer:
    """Swin-T (28 M parameters) sized for the input: patch 2, window 4 at 32 px (default input 32x32)."""
    return _create("swin_tiny", pretrained, **kwargs)


@register_model
def swin_small(pretrained: bool = False, **kwargs) -> SwinTransformer:
    """Swin-S (50 M parameters) sized for the input: patch 2, window 4 at 32 px (default input 32x32)."""
    return _create("swin_small", pretrained, **kwargs)


@register_model
def swin_base(pretrained: bool = False, **kwargs) -> SwinTransformer:
    """Swin-B (88 M parameters) sized for the input: patch 2, window 4 at 32 px (default input 32x32)."""
    return _create("swin_base", pretrained, **kwargs)
