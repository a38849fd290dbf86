"""The small-image timm models: registration, shapes, pretrained cfgs, channels, and timm's own models at 28-32 px."""
import pytest
import timm
import torch
from timm.data import resolve_model_data_config

import timm_csm  # noqa: F401  (registers the models)
from timm_csm.models import SMALL_IMAGE_MODELS, swin_config_for_size
from timm_csm.training import create_train_model


def test_all_registered_after_import():
    names = set(timm.list_models())
    assert set(SMALL_IMAGE_MODELS) <= names
    assert set(timm.list_models("*_cifar")) >= {"resnet18_cifar", "resnet50_cifar", "wrn28_10_cifar"}


@pytest.mark.parametrize("name,chans,size,feat_side", [
    ("resnet18_cifar", 3, 32, 4), ("resnet18_cifar", 1, 28, 4), ("wrn16_4_cifar", 3, 32, 8),
    ("small_cnn", 1, 28, 7), ("small_cnn", 3, 32, 8), ("small_cnn_wide", 1, 28, 7),
])
def test_forward_shapes_and_heads(name, chans, size, feat_side):
    model = timm.create_model(name, num_classes=7, in_chans=chans).eval()
    x = torch.randn(2, chans, size, size)
    with torch.no_grad():
        fmap = model.forward_features(x)
        feats = model.forward_head(fmap, pre_logits=True)
        logits = model(x)
    assert logits.shape == (2, 7)
    assert fmap.shape[-1] == feat_side  # CIFAR stem: no stride in the stem
    assert feats.shape == (2, model.num_features)
    assert torch.allclose(model.forward_head(fmap), logits, atol=1e-5)
    model.reset_classifier(3)
    assert model(x).shape == (2, 3)


def test_cifar_stem_is_3x3_stride_1_without_maxpool():
    model = timm.create_model("resnet50_cifar", num_classes=100)
    assert model.conv1.kernel_size == (3, 3) and model.conv1.stride == (1, 1)
    assert isinstance(model.maxpool, torch.nn.Identity)
    assert model.fc.in_features == 2048 and model.fc.out_features == 100
    # the stock ImageNet ResNet-50 reaches 1x1 at 32 px, the CIFAR one 4x4 (the reference 4x4 average pool)
    assert model.forward_features(torch.randn(1, 3, 32, 32)).shape == (1, 2048, 4, 4)
    reductions = [f["reduction"] for f in model.feature_info]
    assert reductions == [1, 1, 2, 4, 8]


def test_wide_resnet_depth_and_width():
    model = timm.create_model("wrn28_10_cifar")
    # (28 - 4) / 6 = 4 blocks per stage, widths 160 / 320 / 640
    assert [len(getattr(model, f"layer{i}")) for i in (1, 2, 3)] == [4, 4, 4]
    assert model.layer3[0].conv1.out_channels == 640 and model.num_features == 640
    n_params = sum(p.numel() for p in model.parameters())
    assert 36.0e6 < n_params < 37.0e6  # WRN-28-10 has 36.5 M parameters
    with pytest.raises(ValueError, match="6n \\+ 4"):
        timm_csm.models.WideResNet(depth=26)


@pytest.mark.parametrize("name,chans", [("resnet18_cifar", 3), ("small_cnn", 1), ("small_cnn", 3),
                                        ("wrn28_2_cifar", 1)])
def test_pretrained_cfg_resolves(name, chans):
    model = timm.create_model(name, in_chans=chans)
    cfg = resolve_model_data_config(model)
    assert cfg["input_size"][0] == chans
    assert len(cfg["mean"]) == chans and len(cfg["std"]) == chans
    assert cfg["crop_pct"] == 1.0
    if name == "resnet18_cifar":
        assert cfg["mean"] == pytest.approx((0.4914, 0.4822, 0.4465))
    with pytest.raises(RuntimeError):
        timm.create_model(name, pretrained=True)  # no weights are published for these


def test_swin_alias_small_input_config():
    assert swin_config_for_size(32) == dict(patch_size=2, window_size=4)
    assert swin_config_for_size(96) == dict(patch_size=4, window_size=4)
    assert swin_config_for_size(224) == dict(patch_size=4, window_size=7)
    model = timm.create_model("swin_tiny", num_classes=10).eval()
    assert model.patch_embed.proj.kernel_size == (2, 2)
    assert model.layers[0].blocks[0].window_size == (4, 4)
    # 32 / 2 = 16 tokens per side, then 8, 4, 2: every stage keeps a real window
    assert [layer.blocks[0].window_size[0] for layer in model.layers] == [4, 4, 4, 2]
    assert resolve_model_data_config(model)["input_size"] == (3, 32, 32)
    stock = timm.create_model("swin_tiny_patch4_window7_224")
    same = lambda m: sum(p.numel() for n, p in m.named_parameters() if "head" not in n and "relative" not in n
                         and "patch_embed" not in n)
    assert same(model) == same(stock)  # the same Swin-T, re-tiled
    with torch.no_grad():
        assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)


@pytest.mark.parametrize("name,chans,size", [
    ("resnet18", 1, 28),           # stock timm ResNet
    ("convnext_atto", 1, 32),      # ConvNeXt
    ("vit_tiny_patch16_224", 3, 32),  # ViT, fixed input size: created at 32 px
    ("swin_tiny", 1, 28),          # Swin alias, grey 28 px
    ("resnet18_cifar", 1, 28),
])
def test_train_model_factory_small_inputs(name, chans, size):
    model = create_train_model(name, num_classes=10, in_chans=chans, img_size=size).eval()
    with torch.no_grad():
        out = model(torch.randn(2, chans, size, size))
    assert out.shape == (2, 10)


def test_unknown_model_lists_available():
    with pytest.raises(ValueError) as e:
        create_train_model("resnet18_cifra", num_classes=10, in_chans=3, img_size=32)
    msg = str(e.value)
    assert "resnet18_cifar" in msg and "small_cnn" in msg and "close matches" in msg


@pytest.mark.filterwarnings("ignore::UserWarning")  # timm's position-table interpolation warns on torch 2.x
def test_swin_alias_loads_stock_imagenet_weights(tmp_path):
    """pretrained=True re-tiles the patch-4 / window-7 ImageNet checkpoint for patch 2 / window 4 (checked with a
    randomly initialised stock model saved locally, as no weights can be downloaded here)."""
    from safetensors.torch import save_file

    stock = timm.create_model("swin_tiny_patch4_window7_224")
    path = tmp_path / "swin_tiny_stock.safetensors"
    save_file({k: v.contiguous() for k, v in stock.state_dict().items()}, str(path))
    model = timm.create_model("swin_tiny", pretrained=True, pretrained_cfg_overlay=dict(file=str(path)),
                              num_classes=10).eval()
    assert model.patch_embed.proj.weight.shape == (96, 3, 2, 2)
    # weights that need no resampling are copied as they are
    torch.testing.assert_close(model.layers[2].blocks[0].mlp.fc1.weight, stock.layers[2].blocks[0].mlp.fc1.weight)
    assert model.layers[0].blocks[0].attn.relative_position_bias_table.shape == (7 * 7, 3)
    with torch.no_grad():
        assert torch.isfinite(model(torch.randn(1, 3, 32, 32))).all()
