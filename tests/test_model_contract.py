"""timm's model contract for every registered small-image model: ``features_only`` feature maps match
``feature_info``; ``drop_path_rate`` is stochastic depth with timm's linear per-block rule (residual models) or a clear
error (plain CNNs); ``set_grad_checkpointing(True)`` recomputes blocks and leaves the gradients unchanged."""
from collections import Counter

import pytest
import timm
import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import DropPath
from timm.models.resnet import BasicBlock, Bottleneck
from timm.models.swin_transformer import SwinTransformerBlock

import timm_csm  # noqa: F401  (registers the models)
from timm_csm.models import SMALL_IMAGE_MODELS
from timm_csm.models.wide_resnet_cifar import WideBasicBlock
from timm_csm.training import create_train_model

PLAIN = ("small_cnn", "small_cnn_wide", "reference_cnn")
RESIDUAL = tuple(n for n in SMALL_IMAGE_MODELS if n not in PLAIN)
RESIDUAL_BLOCKS = (BasicBlock, Bottleneck, WideBasicBlock, SwinTransformerBlock)
# small widths where the architecture takes them; ResNet's last BN of each block is not zero-initialised, so that
# every residual branch contributes at initialisation (dropping a zero branch would change nothing)
_TINY_RESNET = dict(channels=(8, 16, 32, 64), zero_init_last=False)
_TINY_SWIN = dict(embed_dim=16, num_heads=(1, 1, 1, 1))


def _tiny_kwargs(name):
    if name.startswith("resnet"):
        return _TINY_RESNET
    return _TINY_SWIN if name.startswith("swin") else {}


def _create(name, **kwargs):
    return timm.create_model(name, **_tiny_kwargs(name), **kwargs)


def _input(name, batch=2):
    """Grey 28 px for the plain CNNs, 32 px for Swin (fixed input size), 8 px for the ResNets and WRNs."""
    chans, side = (1, 28) if name in PLAIN else (3, 32 if name.startswith("swin") else 8)
    return torch.randn(batch, chans, side, side, generator=torch.Generator().manual_seed(0))


def test_every_registered_model_is_classified():
    assert set(PLAIN) | set(RESIDUAL) == set(SMALL_IMAGE_MODELS) and not set(PLAIN) & set(RESIDUAL)


@pytest.mark.parametrize("name", SMALL_IMAGE_MODELS)
def test_features_only_matches_feature_info(name):
    x = _input(name)
    num_levels = len(_create(name).feature_info)
    for extra in ({}, dict(out_indices=(1, num_levels - 1))):
        extractor = _create(name, features_only=True, **extra).eval()
        with torch.no_grad():
            feats = extractor(x)
        # every level by default, as timm's own models
        assert len(feats) == len(extra.get("out_indices", range(num_levels))) == len(extractor.feature_info.channels())
        c_axis = -1 if str(extractor.output_fmt.value) == "NHWC" else 1  # timm's Swin extractor returns NHWC
        s_axes = (1, 2) if c_axis == -1 else (2, 3)
        for f, chs, red in zip(feats, extractor.feature_info.channels(), extractor.feature_info.reduction()):
            assert f.shape[c_axis] == chs
            assert tuple(f.shape[a] for a in s_axes) == (x.shape[-2] // red, x.shape[-1] // red)


def _block_drop_rates(model):
    """The stochastic-depth rate of each residual block, in forward order (0 where the block has no DropPath)."""
    rates = []
    for block in (m for m in model.modules() if isinstance(m, RESIDUAL_BLOCKS)):
        probs = {m.drop_prob for m in block.modules() if isinstance(m, DropPath)}
        assert len(probs) <= 1
        rates.append(probs.pop() if probs else 0.0)
    return rates


@pytest.mark.parametrize("name", RESIDUAL)
def test_drop_path_is_linear_stochastic_depth(name):
    rate = 0.3
    model = _create(name, drop_path_rate=rate)
    rates = _block_drop_rates(model)
    assert len(rates) > 2
    assert rates == pytest.approx(torch.linspace(0, rate, len(rates)).tolist())
    base = _create(name, drop_path_rate=0.0)
    assert not any(isinstance(m, DropPath) for m in base.modules())
    model.load_state_dict(base.state_dict())  # same weights: no parameter is added or renamed
    x = _input(name, batch=4)
    torch.manual_seed(0)
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(x), base.eval()(x))  # inactive in eval mode
        assert not torch.allclose(model.train()(x), base.train()(x), atol=1e-4)


@pytest.mark.parametrize("name", PLAIN)
def test_drop_path_on_plain_cnn_is_an_error(name):
    for rate in (0.0, None):
        assert not any(isinstance(m, DropPath) for m in _create(name, drop_path_rate=rate).modules())
    with pytest.raises(ValueError, match="no residual blocks.*drop_path_rate must be 0 or None, got 0.1"):
        _create(name, drop_path_rate=0.1)


def test_train_model_drop_path_option():
    """``--drop-path`` reaches the model: stochastic depth on a residual model, the same clear error on a plain CNN."""
    model = create_train_model("wrn16_4_cifar", num_classes=10, in_chans=3, img_size=32, drop_path=0.2)
    assert max(_block_drop_rates(model)) == pytest.approx(0.2)
    with pytest.raises(ValueError, match="no residual blocks"):
        create_train_model("small_cnn", num_classes=10, in_chans=1, img_size=28, drop_path=0.2)


def _grads_and_calls(model, x, y, checkpointing):
    """Parameter gradients of a cross-entropy step, and how often each conv / linear layer ran forward. The seed is
    fixed: Swin drops paths by default (rate 0.1), and checkpointing replays the random state when it recomputes."""
    model.set_grad_checkpointing(checkpointing)
    model.zero_grad(set_to_none=True)
    torch.manual_seed(0)
    calls = Counter()
    hooks = [m.register_forward_hook(lambda *_, key=n: calls.update([key]))
             for n, m in model.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    F.cross_entropy(model(x), y).backward()
    for h in hooks:
        h.remove()
    return {n: p.grad.clone() for n, p in model.named_parameters()}, calls


@pytest.mark.parametrize("name", SMALL_IMAGE_MODELS)
def test_grad_checkpointing_recomputes_with_same_gradients(name):
    model = _create(name, num_classes=5).train()
    x, y = _input(name), torch.tensor([1, 3])
    plain, plain_calls = _grads_and_calls(model, x, y, checkpointing=False)
    ckpt, ckpt_calls = _grads_and_calls(model, x, y, checkpointing=True)
    torch.testing.assert_close(ckpt, plain, rtol=0, atol=1e-6)
    assert all(g.abs().sum() > 0 for g in plain.values())
    assert all(n == 1 for n in plain_calls.values())
    recomputed = [k for k, n in ckpt_calls.items() if n == 2]
    # every layer outside the stem and the head runs again in the backward pass
    assert len(recomputed) >= len(plain_calls) // 2, (len(recomputed), len(plain_calls))
