"""Derived CSM datasets (timm_csm.recipes.derive): the same content as the benchmark's sets before the derivations
moved into the library, written once per source."""
import json

import numpy as np
import pytest
import torch

from csm_testdata import make_csm_dataset, save_csm_folder, save_digits_csm_folder

from timm_csm.hub import content_fingerprint, load_csm_dataset
from timm_csm.recipes import derive

# content_fingerprint of each set below, computed once with benchmarks/calibration_bench.py at commit 6e8ff56 (its
# dataset_fingerprint and derive_* functions, before they moved here) on this fixture: the derived sets, hence the
# generated-set fingerprints that the committed cells record, are unchanged
BEFORE = {"source": "860fcb13fbca83b23da084b822af724d0d2f64c86d4c8f13dc0ea2e75780b46a",
          "hard": "755352a5f0d476d260ba04b36faca412609c795cec156047f11a5cfb39db6f55",
          "filtered": "03cdc6650200622f10521f845a731c536f15ef00f51209f2233533a0a15fd8f2",
          "groups50": "ee2dc61b20331bab664ff6d7c27e781bffe76767dc15a13381f012108aaf9dd1",
          "s2.3": "24c740b792df0aa16940b0540e7c91ec0051f58c651f0b42eec3ca101619d15a",
          "lambda": "631bd7e43258f48f76a8636f81b258837affedebee7dab02fdad3fb313526cd5"}
# the same for the real-copies set of 300 digits (data seed 0, 200 validation images), 12 groups x 4 lambdas, and
# the digest of those 300 training images its marker records
REAL_COPIES = "fc22d45f12f3b38ebe0937b64a5f0d835fea2420e095d69447be1f3380788afe"
REAL_IMAGES = "258a0b0d6a16fe69d4c1296fcdf09c82af248c50e17a23f4f247480d0b3824ac"


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """4 classes, 2 groups per pair, 4 lambdas; group 1 misreads an endpoint and group 4 runs backwards (both
    flagged by the annotation checks)."""
    ds = make_csm_dataset(["a", "b", "c", "d"], n_lambdas=4, seeds_per_pair=2)
    backwards = {0.0: 0.4, 1 / 3: 0.3, 2 / 3: 0.2, 1.0: 0.6}

    def corrupt(row):
        if row["group_id"] == 1 and row["lambda_gen"] == 1.0:
            row["lambda_hat"] = 0.2
        if row["group_id"] == 4:
            row["lambda_hat"] = min(backwards.items(), key=lambda kv: abs(kv[0] - row["lambda_gen"]))[1]
        return row

    return save_csm_folder(ds.map(corrupt), tmp_path_factory.mktemp("csm") / "csm-toy-aug")


def test_derivations_give_the_sets_they_gave_before(tmp_path, source):
    made = {"source": source,
            "hard": derive.derive_hard_label_dataset(source, tmp_path / "hard"),
            "filtered": derive.derive_filtered_dataset(source, tmp_path / "filtered"),
            "groups50": derive.derive_group_subset(source, tmp_path / "groups50", 0.5),
            "s2.3": derive.derive_rescaled_dataset(source, tmp_path / "s2.3", 2.3),
            "lambda": derive.derive_label_dataset(source, tmp_path / "lambda", "lambda")}
    assert {k: content_fingerprint(v) for k, v in made.items()} == BEFORE
    stamp = json.loads((tmp_path / "hard" / derive.DERIVED_MARKER).read_text())
    assert stamp["source"] == str(source) and stamp["derivation"] == "label_mode=generation"


def test_a_derived_set_is_written_once_and_again_when_its_source_changes(tmp_path, source):
    folder = derive.derive_hard_label_dataset(source, tmp_path / "hard")
    marker = folder / derive.DERIVED_MARKER
    written = marker.stat().st_mtime_ns
    assert derive.derive_hard_label_dataset(source, folder) == folder and marker.stat().st_mtime_ns == written
    other = save_csm_folder(make_csm_dataset(["a", "b", "c", "d"], n_lambdas=4, shuffle_seed=1), tmp_path / "other")
    derive.derive_hard_label_dataset(other, folder)
    assert json.loads(marker.read_text())["source"] == str(other)
    with pytest.raises(ValueError, match="label must be one of hard, lambda, softmax"):
        derive.derive_label_dataset(source, tmp_path / "x", "projection")


@pytest.fixture(scope="module")
def csm_folder(tmp_path_factory):
    return save_digits_csm_folder(tmp_path_factory.mktemp("digits") / "csm-digits-aug")


def _q(folder):
    return load_csm_dataset(str(folder))["train"]


def test_hard_label_copy_is_the_one_hot_generation_class(tmp_path, csm_folder):
    folder = derive.derive_hard_label_dataset(csm_folder, tmp_path / "csm-hard")
    soft = load_csm_dataset(csm_folder)["train"]
    hard = load_csm_dataset(str(folder))["train"]
    assert len(hard) == len(soft) and hard["group_id"] == soft["group_id"]
    q = np.asarray(hard["soft_label"])
    lam, a, b = np.asarray(soft["lambda_gen"]), np.asarray(soft["class_a"]), np.asarray(soft["class_b"])
    expected = np.where(lam >= 0.5, a, b)
    assert np.array_equal(q.argmax(1), expected) and np.array_equal(q.sum(1), np.ones(len(q)))
    assert np.array_equal(np.asarray(hard["label"]), expected) and set(np.unique(q)) == {0.0, 1.0}
    # the soft source really was soft, so the copy changed something
    assert not np.array_equal(np.asarray(soft["soft_label"]), q)
    # the images are the source's
    assert hard[5]["image"].tobytes() == soft[5]["image"].tobytes()
    stamp = (folder / "derived_from.json").stat().st_mtime_ns
    assert derive.derive_hard_label_dataset(csm_folder, folder) == folder  # cached
    assert (folder / "derived_from.json").stat().st_mtime_ns == stamp


def test_filtered_copy_drops_exactly_the_flagged_groups(tmp_path, source):
    folder = derive.derive_filtered_dataset(source, tmp_path / "csm-filtered")
    soft, kept = _q(source), _q(folder)
    assert sorted(set(kept["group_id"])) == [g for g in range(12) if g not in (1, 4)] and len(kept) == 40
    first = kept[0]
    twin = soft[[i for i, (g, lam) in enumerate(zip(soft["group_id"], soft["lambda_gen"]))
                 if g == first["group_id"] and lam == first["lambda_gen"]][0]]
    assert first["image"].tobytes() == twin["image"].tobytes() and first["soft_label"] == twin["soft_label"]


def test_group_subset_keeps_the_first_groups_of_every_class_pair(tmp_path):
    # 3 classes, 3 pairs, 4 groups per pair (group ids 0-11, pair p holds p, p + 3, p + 6, p + 9)
    source = save_csm_folder(make_csm_dataset(["a", "b", "c"], n_lambdas=4, seeds_per_pair=4), tmp_path / "csm-aug")
    soft = load_csm_dataset(source)["train"]
    half = load_csm_dataset(str(derive.derive_group_subset(source, tmp_path / "half", 0.5)))["train"]
    assert sorted(set(half["group_id"])) == [0, 1, 2, 3, 4, 5] and len(half) == 24
    quarter = load_csm_dataset(str(derive.derive_group_subset(source, tmp_path / "quarter", 0.25)))["train"]
    assert sorted(set(quarter["group_id"])) == [0, 1, 2]
    row = half[0]
    twin = [i for i, (g, lam) in enumerate(zip(soft["group_id"], soft["lambda_gen"]))
            if g == row["group_id"] and lam == row["lambda_gen"]][0]
    assert row["image"].tobytes() == soft[twin]["image"].tobytes() and row["soft_label"] == soft[twin]["soft_label"]
    with pytest.raises(ValueError, match="fraction"):
        derive.derive_group_subset(source, tmp_path / "none", 0.0)


def test_real_copies_are_real_training_images_of_the_dominant_class(tmp_path):
    from timm_csm.generation.plan import plan_groups
    from timm_csm.training import load_data, parse_args

    recipe = {"dataset": "digits", "max_train_samples": 300, "val_size": 200, "data_seed": 0}
    folder = derive.derive_real_copies_dataset(recipe, tmp_path / "copies", num_groups=12, num_lambdas=4)
    ds = load_csm_dataset(str(folder))
    ds = ds["train"] if "train" in ds else ds
    real = load_data(parse_args(["--dataset", "digits", "--max-train-samples", "300", "--val-size", "200",
                                 "--data-seed", "0"])).train
    pixels = {bytes(x): int(y) for x, y in zip(np.asarray(real.images).reshape(len(real), -1), real.labels)}
    groups = plan_groups(10, 12)
    assert len(ds) == 48 and sorted(set(ds["group_id"])) == [g.group_id for g in groups]
    for row in ds:
        img = np.asarray(row["image"]).reshape(-1).astype(np.uint8)
        dominant = row["class_a"] if row["lambda_gen"] >= 0.5 else row["class_b"]
        assert pixels[bytes(img)] == dominant == row["label"]  # a real training image, of its one-hot class
        assert row["soft_label"][dominant] == 1.0 and sum(row["soft_label"]) == 1.0
    assert content_fingerprint(folder) == REAL_COPIES  # the set it gave before it moved here
    assert json.loads((folder / derive.DERIVED_MARKER).read_text()) == {
        "real": REAL_IMAGES, "num_groups": 12, "num_lambdas": 4, "seed": 0}
    stamp = (folder / "derived_from.json").stat().st_mtime_ns
    derive.derive_real_copies_dataset(recipe, tmp_path / "copies", num_groups=12, num_lambdas=4)
    assert (folder / "derived_from.json").stat().st_mtime_ns == stamp  # written once


def test_stage3_labels_follow_their_definitions(tmp_path, csm_folder):
    from timm_csm.annotation import load_reference_encoder, train_reference_encoder
    from timm_csm.data import load_digits

    source = _q(csm_folder)
    lam, a, b = (np.asarray(source[c]) for c in ("lambda_gen", "class_a", "class_b"))
    rows = np.arange(len(lam))
    # lambda: q_a = lambda_gen, q_b = 1 - lambda_gen, nothing elsewhere; no re-annotation
    q = np.asarray(_q(derive.derive_label_dataset(csm_folder, tmp_path / "lam", "lambda"))["soft_label"])
    assert np.allclose(q[rows, a], lam) and np.allclose(q[rows, b], 1 - lam) and np.allclose(q.sum(1), 1)
    assert np.count_nonzero(q, axis=1).max() == 2
    # hard: the existing hard-label copy
    hard = derive.derive_label_dataset(csm_folder, tmp_path / "hard", "hard")
    assert _q(hard)["soft_label"] == _q(derive.derive_hard_label_dataset(csm_folder, tmp_path / "hard2"))["soft_label"]
    # softmax: the annotator's probabilities over all classes on each stored image
    train_reference_encoder(load_digits("train"), tmp_path / "annotator", epochs=1, max_steps=3, progress=False,
                            log=lambda m: None)
    derived = _q(derive.derive_label_dataset(csm_folder, tmp_path / "softmax", "softmax", tmp_path / "annotator"))
    images = torch.as_tensor(np.stack([np.asarray(im)[None] for im in derived["image"]]))
    expected = load_reference_encoder(tmp_path / "annotator").classify(images).double().softmax(1).numpy()
    q = np.asarray(derived["soft_label"])
    assert np.allclose(q, expected, atol=1e-6) and np.array_equal(np.asarray(derived["label"]), q.argmax(1))
    assert (np.count_nonzero(q, axis=1) > 2).all()  # every class, not the pair only
    assert derived[3]["image"].tobytes() == source[3]["image"].tobytes()


def test_real_copies_of_a_folder_dataset_read_its_lazy_images(tmp_path):
    """A save_to_disk folder's training images are decoded on demand; the copies hold the same pixels as an
    in-memory dataset of the same images."""
    import datasets

    from timm_csm.training import load_data, parse_args

    real = load_data(parse_args(["--dataset", "digits", "--max-train-samples", "120", "--val-size", "40",
                                 "--data-seed", "0"])).train
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=list(real.class_names))})
    images = [np.ascontiguousarray(x[0]) for x in np.asarray(real.images)]
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(
        {"image": images, "label": [int(v) for v in real.labels]}, features=features)}).save_to_disk(
        str(tmp_path / "folder"))
    folder = derive.derive_real_copies_dataset({"dataset": str(tmp_path / "folder")},
                                               tmp_path / "copies", num_groups=4, num_lambdas=4)
    ds = load_csm_dataset(str(folder))
    ds = ds["train"] if "train" in ds else ds
    pixels = {bytes(np.asarray(x).reshape(-1)): int(y) for x, y in zip(images, real.labels)}
    assert len(ds) == 16
    for row in ds:
        assert pixels[bytes(np.asarray(row["image"]).reshape(-1).astype(np.uint8))] == row["label"]
