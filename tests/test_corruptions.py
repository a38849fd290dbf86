"""The corruption suite: the registry's names and severities, determinism per image and seed, shape and dtype on grey
28 x 28 and RGB 32 x 32 tensors and PIL images, the lazy dataset view, one-line refusals, and the accuracy of a
trained model falling with severity."""
import numpy as np
import pytest
import torch
from PIL import Image

from timm_csm.data import ImageArrays, load_fashion_mnist
from timm_csm.data.corruptions import (CORRUPTION_FAMILIES, SEVERITIES, CorruptedImages, corrupt_split,
                                       corruption_spec, create_corruption, list_corruptions)

NAMES = list_corruptions()
# the corruptions that draw nothing at random: the same output whatever the seed
DETERMINISTIC = {"brightness", "contrast", "defocus_blur", "gaussian_blur", "jpeg_compression", "pixelate",
                 "quantize", "scale", "stripe", "zoom_blur"}


@pytest.fixture(scope="module")
def grey():
    return torch.from_numpy(load_fashion_mnist("test").images[:6].copy())  # (6, 1, 28, 28)


@pytest.fixture(scope="module")
def rgb(grey):
    g = torch.Generator().manual_seed(0)
    colour = torch.randint(0, 256, (6, 3, 32, 32), dtype=torch.uint8, generator=g)
    return (colour.float() * 0.5 + torch.nn.functional.interpolate(grey.float(), size=32).expand(-1, 3, -1, -1) * 0.5
            ).round().to(torch.uint8)


def test_at_least_15_corruptions_of_every_family_each_with_5_severities():
    assert len(NAMES) >= 15
    assert {corruption_spec(n).family for n in NAMES} == set(CORRUPTION_FAMILIES)
    for name in NAMES:
        spec = corruption_spec(name)
        assert len(spec.levels) == 5 and spec.source and spec.definition, name
        assert [create_corruption(name, s).level for s in SEVERITIES] == list(spec.levels)


@pytest.mark.parametrize("name", NAMES)
def test_shape_dtype_and_determinism_per_image_and_seed(name, grey, rgb):
    for images in (grey, rgb):
        c = create_corruption(name, 5, seed=3)
        out = c.batch(images, indices=[10, 11, 12, 13, 14, 15])
        assert out.shape == images.shape and out.dtype == torch.uint8
        assert not torch.equal(out, images), "severity 5 changes the images"
        # one image alone, keyed by the same index, is the same image as in the batch; a second call repeats it
        assert torch.equal(create_corruption(name, 5, seed=3)(images[2], index=12), out[2])
        assert torch.equal(c.batch(images[1:3], [11, 12]), out[1:3])
        other_seed = create_corruption(name, 5, seed=4).batch(images, indices=[10, 11, 12, 13, 14, 15])
        assert torch.equal(other_seed, out) == (name in DETERMINISTIC)
    pil = Image.fromarray(grey[0, 0].numpy(), "L")
    for img in (pil, pil.convert("RGB")):
        out = create_corruption(name, 3, seed=1)(img, index=7)
        assert isinstance(out, Image.Image) and out.size == img.size and out.mode == img.mode
        assert np.array_equal(np.asarray(out), np.asarray(create_corruption(name, 3, seed=1)(img, index=7)))


def test_the_pil_and_tensor_forms_agree(rgb):
    c = create_corruption("gaussian_noise", 2, seed=0)
    img = Image.fromarray(rgb[0].permute(1, 2, 0).numpy(), "RGB")
    assert np.array_equal(np.asarray(c(img, index=5)), c(rgb[0], index=5).permute(1, 2, 0).numpy())


def test_the_lazy_view_corrupts_each_image_as_its_position_says(grey, tmp_path):
    split = ImageArrays(grey.numpy(), np.arange(6) % 3, ["a", "b", "c"], "six")
    c = create_corruption("shot_noise", 4, seed=9)
    view = corrupt_split(split, c)
    assert isinstance(view.images, CorruptedImages) and view.images.base.data_ptr() == grey.data_ptr()  # no copy
    whole = view.images[np.arange(6)]
    assert torch.equal(whole, c.batch(grey, np.arange(6)))
    part = view.subset([4, 1])
    assert torch.equal(part.images[[0, 1]], whole[[4, 1]]) and list(part.labels) == [1, 1]
    assert np.array_equal(np.asarray(part.images.pil([0])[0]), whole[4, 0].numpy())
    # a lazily read folder: the images are corrupted as they are read, at their own size
    from timm_csm.data import open_image_split

    for i, a in enumerate(grey.numpy()):
        (tmp_path / "test" / "a").mkdir(parents=True, exist_ok=True)
        Image.fromarray(a[0]).save(tmp_path / "test" / "a" / f"{i}.png")
    lazy = open_image_split(str(tmp_path), "test")
    corrupted = corrupt_split(lazy, c)
    assert torch.equal(corrupted.images[[2, 3]], c.batch(lazy.images[[2, 3]], [2, 3]))
    assert np.array_equal(np.asarray(corrupted.images.pil([3])[0]), c.batch(lazy.images[[3]], [3])[0, 0].numpy())


@pytest.mark.parametrize("call, match", [
    (lambda: create_corruption("fogg", 1), "unknown corruption 'fogg'; known corruptions: brightness, "),
    (lambda: create_corruption("fog", 6), r"severity must be one of \[1, 2, 3, 4, 5\], got 6"),
    (lambda: create_corruption("fog", 0), "got 0"),
    (lambda: create_corruption("fog", "3"), "got '3'"),
    (lambda: create_corruption("fog", True), "got True"),
    (lambda: create_corruption("fog", 1)(torch.zeros(1, 8, 8)), "uint8 images"),
    (lambda: create_corruption("fog", 1).batch(torch.zeros(2, 4, 8, 8, dtype=torch.uint8)), "1 or 3 channels"),
])
def test_bad_input_is_one_line(call, match):
    with pytest.raises(ValueError, match=match) as e:
        call()
    assert "\n" not in str(e.value)


def test_a_trained_models_accuracy_falls_with_severity():
    """A softmax regression trained for about a second on 2 000 Fashion-MNIST images, scored on 300 test images
    under every corruption: the mean accuracy over the corruptions falls at every severity, and no corruption
    leaves the images easier than clean ones, nor one severity much easier than the one before."""
    train, test = load_fashion_mnist("train"), load_fashion_mnist("test")
    x = torch.from_numpy(train.images[:2000]).float().div(255).flatten(1)
    y = torch.from_numpy(train.labels[:2000])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 10))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(150):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    images, labels = torch.from_numpy(test.images[:300]), torch.from_numpy(test.labels[:300])

    def accuracy(batch):
        with torch.no_grad():
            return float((model(batch.float().div(255)).argmax(1) == labels).double().mean())

    clean = accuracy(images)
    assert clean > 0.75
    table = np.array([[accuracy(create_corruption(n, s).batch(images)) for s in SEVERITIES] for n in NAMES])
    mean = table.mean(axis=0)
    assert clean > mean[0] and np.all(np.diff(mean) < 0), mean
    for name, row in zip(NAMES, table):
        assert row[-1] <= clean and np.all(np.diff(row) < 0.04), (name, clean, row)


def test_the_blur_is_torchvisions():
    import math

    from torchvision.transforms.v2 import functional as TF

    from timm_csm.data.corruptions.ops import gaussian_blur

    x = torch.rand(2, 3, 28, 30, generator=torch.Generator().manual_seed(0))
    for sigma in (0.35, 1.0, 5.6):
        k = min(2 * math.ceil(3 * sigma) + 1, 27)
        assert torch.allclose(gaussian_blur(x, sigma), TF.gaussian_blur(x, [k, k], [sigma, sigma]), atol=1e-5)
