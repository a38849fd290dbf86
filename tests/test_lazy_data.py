"""Training on data read lazily: image folders of any size and mode, saved and Hub-layout datasets, timm's transforms
and ``create_dataset`` names, CSM companions read from their Arrow dataset."""
import os

import numpy as np
import pytest
import torch
from PIL import Image

from csm_fixtures import png_bytes
from timm_csm.data import (ArrowImages, FolderImages, GlobalBatchSampler, ImageCollator, LazySplit,
                           column_arrays, create_timm_transforms, hf_split_to_lazy, load_fashion_mnist,
                           open_image_split, stack_images)
from timm_csm.io import read_model_meta
from timm_csm.training import run


def _fashion_folder(root, per_split=(("train", 120), ("validation", 40)), sizes=(20, 40), modes=("L", "RGB", "RGBA")):
    """An ImageFolder layout (``<split>/<class>/<i>.png``) of real Fashion-MNIST images resized to random sizes in
    ``sizes`` and saved in turn in each of ``modes``."""
    real = load_fashion_mnist("train")
    rng = np.random.default_rng(0)
    start = 0
    for split, n in per_split:
        for i in range(start, start + n):
            folder = root / split / real.class_names[real.labels[i]].replace("/", "-")
            folder.mkdir(parents=True, exist_ok=True)
            side = int(rng.integers(sizes[0], sizes[1] + 1))
            img = Image.fromarray(real.images[i, 0]).resize((side, side))
            img.convert(modes[i % len(modes)]).save(folder / f"{i}.png")
        start += n
    return root


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return _fashion_folder(tmp_path_factory.mktemp("fashion-folder"))


def _options(tmp_path, dataset, **kw):
    return dict(dict(dataset=str(dataset), model="small_cnn", epochs=1, batch_size=16, lr=0.05, seed=0,
                     progress=False, output=str(tmp_path), experiment="run", workers=0), **kw)


def test_a_folder_of_any_size_and_mode_trains_with_timm_augmentations(folder, tmp_path):
    results = run(_options(tmp_path, folder, img_size=64, aa="rand-m9-mstd0.5", reprob=0.25))
    assert results["n_test"] == 40  # the validation/ folder is the split reported on
    assert results["n_train"] + results["n_val"] == 120
    meta = read_model_meta(tmp_path / "run" / "model_best.safetensors")
    assert meta["transform"] == "timm" and meta["img_size"] == 64 and meta["in_chans"] == 3  # RGB(A) among them


def test_the_pad_crop_recipe_reads_a_folder_of_several_sizes_at_the_given_size(folder, tmp_path):
    results = run(_options(tmp_path, folder, img_size=32, in_chans=1, max_train_samples=64))
    meta = read_model_meta(tmp_path / "run" / "model_best.safetensors")
    assert meta["transform"] == "cifar" and meta["in_chans"] == 1 and results["n_train"] == 58


def test_a_folder_of_several_sizes_without_an_input_size_is_an_error_naming_it(folder, tmp_path):
    with pytest.raises(ValueError, match="different sizes.*--img-size"):
        run(_options(tmp_path, folder, model="small_cnn", transform="cifar"))


def test_a_flag_of_the_other_recipe_is_an_error(folder, tmp_path):
    with pytest.raises(ValueError, match="no --aa"):
        run(_options(tmp_path, folder, img_size=32, transform="cifar", aa="rand-m9"))


def test_training_splits_are_read_lazily_and_labels_without_decoding(folder):
    split = open_image_split(str(folder), "train")
    assert isinstance(split, LazySplit) and isinstance(split.images, FolderImages) and len(split) == 120
    assert split.class_names == sorted(os.listdir(folder / "train"))  # timm's folder reader: classes by name
    for i in (0, 50, 119):  # each label is the class folder of its file
        class_folder = os.path.basename(os.path.dirname(os.fsdecode(split.images.paths[i])))
        assert split.class_names[split.labels[i]] == class_folder
    batch = split.images.with_output("L", (24, 24))[torch.tensor([0, 1, 2])]
    assert batch.shape == (3, 1, 24, 24) and batch.dtype == torch.uint8


def test_a_corrupt_image_file_is_an_error_naming_its_row(tmp_path):
    root = _fashion_folder(tmp_path / "data", per_split=(("train", 12),), sizes=(28, 28))
    victim = sorted((root / "train").rglob("*.png"))[0]
    victim.write_bytes(b"not a png")
    split = open_image_split(str(root), "train")
    with pytest.raises(ValueError, match=f"{victim.name}: image does not decode"):
        split.images[torch.arange(len(split))]


def test_stack_images_resizes_only_what_differs_and_converts_modes():
    imgs = [Image.new("RGB", (10, 10), (255, 0, 0)), Image.new("L", (12, 12), 128)]
    with pytest.raises(ValueError, match="different shapes"):
        stack_images(imgs, "L")
    out = stack_images(imgs, "L", size=(10, 10))
    assert out.shape == (2, 1, 10, 10) and int(out[0, 0, 0, 0]) == 76 and int(out[1, 0, 0, 0]) == 128  # luma(red)


def test_a_saved_dataset_trains(tmp_path):
    import datasets

    real = load_fashion_mnist("test")
    names = list(real.class_names)
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=names)})

    def split(lo, hi):
        return datasets.Dataset.from_dict({"image": [Image.fromarray(a[0]) for a in real.images[lo:hi]],
                                           "label": real.labels[lo:hi].tolist()}, features=features)

    datasets.DatasetDict(train=split(0, 96), test=split(96, 128)).save_to_disk(tmp_path / "saved")
    results = run(_options(tmp_path, tmp_path / "saved"))
    assert results["n_test"] == 32 and results["n_train"] + results["n_val"] == 96


def test_timm_iterable_and_torch_specs_get_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="iterable"):
        run(_options(tmp_path, "wds/some-shards"))
    with pytest.raises(ValueError, match="--data-dir"):
        run(_options(tmp_path, "torch/cifar10"))


def test_timm_transforms_keep_per_sample_seeds_across_process_splits(folder):
    """R processes of batch B see what one process of batch R*B sees: same crops, erasing and RandAugment ops."""
    split = open_image_split(str(folder), "train")
    train_tf, _ = create_timm_transforms(32, (0.5,), (0.5,), 1, auto_augment="rand-m9-mstd0.5", re_prob=0.5)
    collator = ImageCollator(split.images, split.labels, train_tf, seed=3)
    one = GlobalBatchSampler(len(split), 8, 1, 0, seed=5)
    whole = collator(next(iter(one)))["pixel_values"]
    parts = [collator(next(iter(GlobalBatchSampler(len(split), 4, 2, r, seed=5))))["pixel_values"] for r in (0, 1)]
    torch.testing.assert_close(torch.cat(parts), whole, rtol=0, atol=0)
    again = collator(next(iter(one)))["pixel_values"]
    torch.testing.assert_close(again, whole, rtol=0, atol=0)
    state = torch.random.get_rng_state()
    collator(next(iter(one)))
    assert torch.equal(torch.random.get_rng_state(), state)  # the process's own generator is untouched
    other_epoch = GlobalBatchSampler(len(split), 8, 1, 0, seed=5)
    other_epoch.set_epoch(1)
    assert not torch.equal(collator(next(iter(other_epoch)))["pixel_values"], whole)


def test_a_pretrained_timm_model_fine_tunes_at_224_from_a_local_weights_file(tmp_path):
    import timm
    from safetensors.torch import save_file

    root = _fashion_folder(tmp_path / "data", per_split=(("train", 24), ("validation", 8)), sizes=(28, 36))
    weights = timm.create_model("resnet18", num_classes=1000).state_dict()
    save_file(weights, tmp_path / "resnet18.safetensors")
    results = run(_options(tmp_path, root, model="resnet18", pretrained=True,
                           pretrained_path=str(tmp_path / "resnet18.safetensors"), in_chans=3, batch_size=8,
                           val_fraction=0.25, lr=0.001))
    meta = read_model_meta(tmp_path / "run" / "model_best.safetensors")
    assert meta["transform"] == "timm" and meta["img_size"] == 224  # the model's config, as resolve_data_config
    assert np.allclose(meta["mean"], (0.485, 0.456, 0.406)) and results["n_test"] == 8
    cfg = timm.create_model("resnet18").pretrained_cfg
    assert (meta["crop_pct"], meta["interpolation"]) == (cfg["crop_pct"], cfg["interpolation"])
    # the pretrained body was loaded: a layer that trained one step at lr 1e-3 stays near the file's weights
    from timm_csm.training import load_trained_classifier

    model, eval_tf, _ = load_trained_classifier(tmp_path / "run")
    assert eval_tf(torch.zeros(2, 3, 30, 30, dtype=torch.uint8)).shape == (2, 3, 224, 224)  # timm's resize + crop
    diff = (model.layer4[1].conv2.weight - weights["layer4.1.conv2.weight"]).abs().max()
    assert float(diff) < 0.01


def test_csm_companions_get_the_real_images_timm_train_transform(tmp_path):
    """Companions read lazily from the generated Arrow dataset go through the same per-image timm transform."""
    import sys

    sys.path.insert(0, os.path.dirname(__file__))
    from csm_testdata import save_digits_csm_folder
    from timm_csm.data import CSMCollator, CSMCompanionSampler, CSMGroups, SampleRef
    from timm_csm.hub import load_csm_dataset

    folder = save_digits_csm_folder(tmp_path / "csm-digits-aug")
    groups = CSMGroups.from_dataset(load_csm_dataset(str(folder))["train"])
    assert isinstance(groups.images, ArrowImages)  # nothing decoded up front
    train_tf, _ = create_timm_transforms(16, (0.5,), (0.5,), 1, re_prob=1.0)
    real = np.zeros((8, 1, 8, 8), np.uint8)
    collator = CSMCollator(real, np.arange(8) % groups.num_classes, train_tf, CSMCompanionSampler(groups), seed=0)
    out = collator([SampleRef(i, 0, 0, i, 8) for i in range(8)])
    assert out["mix_pixel_values"].shape == (16, 1, 16, 16)
    erased = (out["mix_pixel_values"] != out["mix_pixel_values"].flatten(1).mode(1).values[:, None, None, None])
    assert erased.flatten(1).float().mean(1).min() > 0.01  # random erasing (probability 1) reached every companion
    results = run(_options(tmp_path, "digits", loss="csm", csm_dataset=str(folder), transform="timm", img_size=16,
                           reprob=0.25, epochs=1))
    assert results["loss"] == "csm"


def test_pretrained_weights_offline_without_a_file_is_an_error_naming_both_ways(folder, tmp_path):
    with pytest.raises(ValueError, match="not in the Hub cache.*--pretrained-path"):
        run(_options(tmp_path, folder, model="resnet18", pretrained=True))
    with pytest.raises(FileNotFoundError, match="--pretrained-path .* does not exist"):
        run(_options(tmp_path, folder, model="resnet18", pretrained=True, pretrained_path=str(tmp_path / "no.pth")))


def test_a_loose_json_or_text_file_leaves_an_image_folder_an_image_folder(tmp_path):
    root = _fashion_folder(tmp_path / "data", per_split=(("train", 12),), sizes=(28, 28))
    (root / "complete.json").write_text("{}")
    (root / "train" / "notes.txt").write_text("made from Fashion-MNIST")
    assert isinstance(open_image_split(str(root), "train").images, FolderImages)
    (root / "metadata.csv").write_text("file_name,label\n")  # a datasets metadata file: read by datasets
    from timm_csm.data.sources import _image_folder_splits

    assert _image_folder_splits(str(root)) is None


def test_column_arrays_reads_the_selected_rows_in_order_and_keeps_ragged_rows():
    import datasets

    ds = datasets.Dataset.from_dict({"label": [0, 1, 2, 3, 4], "q": [[0.0, 1.0]] * 4 + [[1.0]]})
    picked = ds.select([4, 0, 2])
    cols = column_arrays(picked, ["label", "q"])
    assert cols["label"].tolist() == [4, 0, 2]
    assert [len(r) for r in cols["q"]] == [1, 2, 2]
    fixed = column_arrays(ds.select([1, 3]), ["q"])["q"]
    assert fixed.shape == (2, 2) and fixed.dtype == np.float32


def test_a_label_column_that_is_not_class_indices_is_an_error_naming_it():
    import datasets

    png = {"bytes": png_bytes(np.zeros((1, 4, 4), np.uint8)), "path": None}
    features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("float32")})
    whole = datasets.Dataset.from_dict({"image": [png] * 3, "label": [0.0, 2.0, 1.0]}, features=features)
    assert hf_split_to_lazy(whole).labels.tolist() == [0, 2, 1]
    halves = datasets.Dataset.from_dict({"image": [png] * 3, "label": [0.0, 1.5, float("nan")]}, features=features)
    with pytest.raises(ValueError, match=r"label column 'label' must hold class indices, found values of type float32"):
        hf_split_to_lazy(halves)
