"""The data seed and the validation set drawn outside the training subset (``--data-seed``, ``--val-size``)."""
import numpy as np
import pytest

from timm_csm.training import load_data, parse_args


def _splits(*flags):
    return load_data(parse_args(["--dataset", "digits", *flags]))


def _rows(arrays):
    return {bytes(x) for x in np.ascontiguousarray(arrays.images).reshape(len(arrays), -1)}


def test_val_size_is_outside_the_training_subset_and_shared_by_training_seeds():
    a = _splits("--max-train-samples", "300", "--val-size", "200", "--data-seed", "0", "--seed", "0")
    b = _splits("--max-train-samples", "300", "--val-size", "200", "--data-seed", "0", "--seed", "7")
    assert (len(a.train), len(a.val)) == (300, 200)
    assert not _rows(a.train) & _rows(a.val)
    assert np.array_equal(a.train.images, b.train.images) and np.array_equal(a.val.images, b.val.images)


def test_val_size_does_not_depend_on_the_subset_size():
    small = _splits("--max-train-samples", "100", "--val-size", "200", "--data-seed", "3")
    large = _splits("--max-train-samples", "600", "--val-size", "200", "--data-seed", "3")
    assert np.array_equal(small.val.images, large.val.images)
    assert np.array_equal(small.val.labels, large.val.labels)


def test_data_seed_defaults_to_seed_and_changes_the_draw():
    default = _splits("--max-train-samples", "300", "--seed", "5")
    explicit = _splits("--max-train-samples", "300", "--seed", "1", "--data-seed", "5")
    other = _splits("--max-train-samples", "300", "--seed", "5", "--data-seed", "6")
    assert np.array_equal(default.train.images, explicit.train.images)
    assert not np.array_equal(default.train.images, other.train.images)


@pytest.mark.parametrize("flags, message", [
    (("--val-size", "0"), "--val-size must lie in"),
    (("--val-size", "5000"), "--val-size must lie in"),
    (("--val-size", "100", "--val-split", "test", "--test-split", "test"), "drop --val-split"),
])
def test_val_size_errors(flags, message):
    with pytest.raises(ValueError, match=message):
        _splits(*flags)
