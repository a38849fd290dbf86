"""``reference_cnn``: the network of the reference encoder, the small classifier trained on the real data that stands
in for CLIP when no CLIP weights can be loaded (:mod:`timm_csm.annotation.reference`).

A :class:`~timm_csm.models.small_cnn.SmallCNN` with widths (16, 32, 64), one convolution in the first two stages and
two in the last, and PyTorch's default convolution initialisation: about 3.7 M multiply-adds per 28x28 grey image,
so a Fashion-MNIST epoch takes under a minute on one CPU thread. Reference-encoder folders written before this model
was registered name their layers ``features.<i>.<0|1>`` (one ``Sequential`` of conv-BN-ReLU blocks and pooling
layers); :func:`checkpoint_filter_fn` maps them onto the stages.
"""
from __future__ import annotations

import re
from typing import Dict, List, Tuple

import torch
import torch.nn as nn
from timm.models import generate_default_cfgs, register_model

from ._cfg import small_image_cfg
from .small_cnn import SmallCNN, build_small_cnn

__all__ = ["checkpoint_filter_fn"]

_OLD_KEY = re.compile(r"^features\.(\d+)\.([01])\.(.+)$")


def _conv_norm_pairs(model: nn.Module) -> List[Tuple[str, str]]:
    """(conv, norm) module names of ``model`` in forward order."""
    convs = [n for n, m in model.named_modules() if isinstance(m, nn.Conv2d)]
    norms = [n for n, m in model.named_modules() if isinstance(m, (nn.BatchNorm2d, nn.GroupNorm))]
    return list(zip(convs, norms))


def checkpoint_filter_fn(state_dict: Dict[str, torch.Tensor], model: nn.Module) -> Dict[str, torch.Tensor]:
    """Rename the layers of a state dict in the earlier layout (block ``features.<i>``: ``.0`` conv, ``.1`` norm) to
    ``model``'s stages, block by block in order; a state dict in the current layout is returned unchanged."""
    old = {k: _OLD_KEY.match(k) for k in state_dict}
    if not any(old.values()):
        return state_dict
    blocks = sorted({int(m.group(1)) for m in old.values() if m})
    pairs = _conv_norm_pairs(model)
    if len(blocks) != len(pairs):
        raise ValueError(f"the state dict holds {len(blocks)} conv blocks, the model {len(pairs)}: it does not fit "
                         f"{type(model).__name__} with these widths and depths")
    target = {b: pair for b, pair in zip(blocks, pairs)}
    out = {}
    for key, value in state_dict.items():
        m = old[key]
        out[f"{target[int(m.group(1))][int(m.group(2))]}.{m.group(3)}" if m else key] = value
    return out


default_cfgs = generate_default_cfgs({
    "reference_cnn.untrained": small_image_cfg(input_size=(1, 28, 28), pool_size=(7, 7), mean=(0.5,), std=(0.5,),
                                               first_conv="stages.0.0"),
})


@register_model
def reference_cnn(pretrained: bool = False, **kwargs) -> SmallCNN:
    """SmallCNN, widths (16, 32, 64), depths (1, 1, 2), PyTorch's default conv initialisation (the reference
    encoder's network; 10 classes: 61 k parameters)."""
    kwargs = dict(dict(widths=(16, 32, 64), depth=(1, 1, 2), conv_init="default"), **kwargs)
    return build_small_cnn("reference_cnn", pretrained, pretrained_filter_fn=checkpoint_filter_fn, **kwargs)
