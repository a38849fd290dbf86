"""Corruptions at the model's input: between the evaluation transform's resize / crop and its normalisation, for
images in memory and read from a folder, through the batched and timm's per-image transforms. Images already at the
input size give the tensors they gave before corruptions moved there; larger images are corrupted at the input
size (the noise of severity 5 keeps its defined strength); a transform that does not split says so in the report's
line; the shift evaluation prints its projected time."""
import hashlib

import numpy as np
import pytest
import torch
from PIL import Image

from timm_csm.data import (BatchTransform, ImageArrays, ImageCollator, create_timm_transforms, create_transforms,
                           open_image_split)
from timm_csm.data.corruptions import (SEVERITIES, corrupt_split, corruption_site, create_corruption,
                                       list_corruptions)
from timm_csm.data.sample_transforms import SampleTransform

# sha256 of the model input of 4 seeded 28 x 28 grey images under every corruption at every severity, through the
# batched 28-pixel transform, computed before corruptions moved to the model's input: the native-size benchmark
# numbers (Fashion-MNIST at a 28-pixel model) are unchanged
NATIVE_SIZE_DIGEST = "d8eac2d47fd70adb18621fe108a03a9a1eb3e941043c232d305c5025279b6f9d"


def _model_input(split, transform, corruption, rows):
    corrupted = corrupt_split(split, corruption)
    return ImageCollator(corrupted.images, corrupted.labels, transform)(list(rows))["pixel_values"]


def test_images_at_the_input_size_give_the_tensors_they_gave_before():
    images = np.random.default_rng(0).integers(0, 256, (4, 1, 28, 28), dtype=np.uint8)
    split = ImageArrays(images, np.arange(4) % 2, ["a", "b"], "")
    tf = BatchTransform(28, (0.3,), (0.35,), in_chans=1)
    h = hashlib.sha256()
    for name in list_corruptions():
        for s in SEVERITIES:
            c = create_corruption(name, s, seed=0)
            x = _model_input(split, tf, c, range(4))
            # and the same as corrupting the stored images, then transforming them
            assert torch.equal(x, tf.apply(c.batch(torch.from_numpy(images), np.arange(4)))), (name, s)
            h.update(x.numpy().tobytes())
    assert h.hexdigest() == NATIVE_SIZE_DIGEST


def _flat_rgb(n, side, value=128):
    return np.full((n, 3, side, side), value, dtype=np.uint8)


def _pixels(x, mean, std):
    """Normalised model input back to [0, 1] pixel values."""
    return x * torch.tensor(std).view(1, -1, 1, 1) + torch.tensor(mean).view(1, -1, 1, 1)


def test_larger_rgb_images_in_memory_are_corrupted_at_the_input_size():
    """Severity 5 of Gaussian noise adds noise of sigma 0.10 to the pixels the model sees; corrupted at 96 pixels
    and then shrunk to 32, its antialiased resize would average it down to about a third."""
    split = ImageArrays(_flat_rgb(6, 96), np.zeros(6, dtype=np.int64), ["a"], "")
    mean, std = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)
    tf = BatchTransform(32, mean, std, in_chans=3)
    c = create_corruption("gaussian_noise", 5, seed=0)
    x = _model_input(split, tf, c, range(6))
    assert x.shape == (6, 3, 32, 32)
    noise = _pixels(x, mean, std) - 128 / 255
    assert 0.09 < float(noise.std()) < 0.11
    # the corruption of the image resized to the input size, drawn from each image's own position
    resized = tf.to_input_size(torch.from_numpy(split.images))
    assert resized.shape == (6, 3, 32, 32) and resized.dtype == torch.uint8
    assert torch.equal(_model_input(split, tf, c, [4, 1]), tf.apply(c.batch(resized[[4, 1]], [4, 1])))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """An image folder of 80-pixel RGB images: flat grey ones, and seeded random ones."""
    root = tmp_path_factory.mktemp("rgb80")
    rng = np.random.default_rng(1)
    for i in range(4):
        (root / "test" / "a").mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (80, 80), (128, 128, 128)).save(root / "test" / "a" / f"flat{i}.png")
        Image.fromarray(rng.integers(0, 256, (80, 80, 3), dtype=np.uint8)).save(root / "test" / "a" / f"rand{i}.png")
    return open_image_split(str(root), "test")


def test_a_folder_through_timms_transform_is_corrupted_after_its_resize_and_crop(folder):
    mean, std = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)
    _, tf = create_timm_transforms(32, mean, std, 3, crop_pct=0.875)
    c = create_corruption("gaussian_noise", 5, seed=2)
    x = _model_input(folder, tf, c, range(len(folder)))
    assert x.shape == (8, 3, 32, 32)
    flat = [i for i, name in enumerate(folder.images.identity().split(b"\0")) if b"flat" in name]
    noise = _pixels(x[flat], mean, std) - 128 / 255
    assert 0.09 < float(noise.std()) < 0.11
    # timm's resize to 36 and centre crop to 32, written out here, then the corruption, then the tensor steps
    from torchvision.transforms import CenterCrop, Resize

    to_tensor, normalize = tf.transform.transforms[-2:]
    expected = []
    for i, img in enumerate(folder.images.pil(range(len(folder)))):
        at_input = CenterCrop(32)(Resize(36)(img.convert("RGB")))  # 36 = int(32 / 0.875)
        expected.append(normalize(to_tensor(c(at_input, index=i))))
    assert torch.equal(x, torch.stack(expected))
    assert corruption_site(tf) == ("Corruptions are applied at the model's input: after resizing and cropping to "
                                   "32 x 32 px, before normalisation (as the ImageNet-C definitions assume).")


def test_a_hugging_face_dataset_is_corrupted_at_the_input_size():
    import datasets

    from timm_csm.data import hf_split_to_lazy

    images = [Image.new("RGB", (80, 80), (128, 128, 128)) for _ in range(4)]
    ds = datasets.Dataset.from_dict({"image": images, "label": [0, 1, 0, 1]},
                                    features=datasets.Features({"image": datasets.Image(),
                                                                "label": datasets.ClassLabel(names=["a", "b"])}))
    split = hf_split_to_lazy(ds)
    mean, std = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)
    x = _model_input(split, BatchTransform(32, mean, std, in_chans=3), create_corruption("gaussian_noise", 5), range(4))
    assert x.shape == (4, 3, 32, 32) and 0.09 < float((_pixels(x, mean, std) - 128 / 255).std()) < 0.11


def test_a_transform_that_does_not_split_corrupts_the_images_as_read_and_says_so(folder):
    def to_tensor(img):  # a user's own callable: no steps to split at the model's input
        return torch.from_numpy(np.asarray(img.resize((32, 32)), dtype=np.float32)).permute(2, 0, 1) / 255

    tf = SampleTransform(to_tensor, 3, (32, 32), random=False)
    c = create_corruption("contrast", 4)
    x = _model_input(folder, tf, c, [1, 2])
    assert torch.equal(x, torch.stack([to_tensor(c(img, index=i)) for i, img in zip([1, 2], folder.images.pil([1, 2]))]))
    assert corruption_site(tf).startswith("Corruptions are applied to the images as read, before the model's transform")


def test_a_random_transform_is_refused_in_one_line():
    train_tf, _ = create_transforms(32, (0.5,), (0.25,), 3)
    with pytest.raises(ValueError, match="corrupted images are evaluated, not trained on") as e:
        _model_input(ImageArrays(_flat_rgb(2, 32), np.zeros(2, dtype=np.int64), ["a"], ""), train_tf,
                     create_corruption("fog", 1), [0, 1])
    assert "\n" not in str(e.value)


def test_the_shift_evaluation_projects_its_time_and_says_where_it_corrupts():
    from torch.utils.data import DataLoader

    from timm_csm.data import IndexDataset
    from timm_csm.evaluation.shift import ShiftEvaluation
    from timm_csm.evaluation.shift_report import shift_markdown

    rng = np.random.default_rng(0)
    split = ImageArrays(rng.integers(0, 256, (40, 3, 48, 48), dtype=np.uint8), np.arange(40) % 4, list("abcd"), "")
    tf = BatchTransform(16, (0.5,), (0.25,), in_chans=3)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 16 * 16, 4)).eval()

    def predict_split(s):
        loader = DataLoader(IndexDataset(len(s)), batch_size=16, collate_fn=ImageCollator(s.images, s.labels, tf))
        with torch.no_grad():
            out = [(model(b["pixel_values"]), b["labels"]) for b in loader]
        return torch.cat([o[0] for o in out]), torch.cat([o[1] for o in out])

    shift = ShiftEvaluation.create("gaussian_noise,rotate", [1, 5], seed=0)
    seconds = shift.projected_seconds(predict_split, split)
    assert 0 < seconds < 60
    lines = []
    out = shift.run(predict_split, split, predict_split(split), None, {}, log=lines.append, transform=tf,
                    progress=False)
    projected = [line for line in lines if "projected" in line]
    assert len(projected) == 1 and projected[0].startswith("shift: 2 corruptions x 2 severities x 40 images, about ")
    assert lines[:2] == [f"shift: {corruption_site(tf)}", projected[0]]  # both before the first cell
    assert out["shift"]["applied"] == corruption_site(tf)
    assert "at the model's input: after resizing to 16 x 16 px, before normalisation" in shift_markdown(out)
