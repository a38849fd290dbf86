"""Real image-classification data that works offline.

* Fashion-MNIST from Debian's ``dataset-fashion-mnist`` package (the four original IDX files), read with numpy.
* scikit-learn's ``load_digits`` (8x8 digits shipped inside the wheel), always available; chosen explicitly.

Both return an :class:`ImageArrays` of uint8 images (N, C, H, W), int64 labels and class names, the format every
stage of the pipeline shares.
"""
from __future__ import annotations

import gzip
import os
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

import numpy as np

__all__ = [
    "ImageArrays",
    "FASHION_MNIST_CLASSES",
    "FASHION_MNIST_INSTALL",
    "fashion_mnist_root",
    "load_fashion_mnist",
    "load_digits",
    "read_idx",
]

FASHION_MNIST_CLASSES = [
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
]
_DEBIAN_FASHION_MNIST = "/usr/share/datasets/fashion-mnist"
# what installs Debian's copy (as root; a fresh machine's package lists are empty until the update)
FASHION_MNIST_INSTALL = "apt-get update && apt-get install -y dataset-fashion-mnist"


def images_labels_hash(images, labels):
    """sha256 over the shape, bytes and int64 labels of uint8 images (N, C, H, W): the content key of a set of
    images, shared by the prototype and encoder caches and the anchor pools of generation."""
    import hashlib

    images = np.ascontiguousarray(images)
    h = hashlib.sha256()
    h.update(str(images.shape).encode())
    h.update(images.data)
    h.update(np.ascontiguousarray(np.asarray(labels).astype(np.int64)).data)
    return h


@dataclass
class ImageArrays:
    """A split of an image-classification dataset held in memory.

    ``images`` is uint8 (N, C, H, W); ``labels`` int64 (N,); ``class_names`` has one name per class.
    """

    images: np.ndarray
    labels: np.ndarray
    class_names: List[str]
    source: str = ""

    def __post_init__(self):
        if self.images.ndim != 4 or self.images.dtype != np.uint8:
            raise ValueError(f"images must be uint8 (N, C, H, W), got {self.images.dtype} {self.images.shape}")
        if self.labels.shape != (self.images.shape[0],):
            raise ValueError(f"labels must have shape ({self.images.shape[0]},), got {self.labels.shape}")
        if len(self.labels) and (self.labels.min() < 0 or self.labels.max() >= len(self.class_names)):
            raise ValueError(
                f"labels must lie in [0, {len(self.class_names)}), got range [{self.labels.min()}, {self.labels.max()}]"
            )

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def subset(self, indices) -> "ImageArrays":
        indices = np.asarray(indices)
        return ImageArrays(self.images[indices], self.labels[indices], list(self.class_names), self.source)


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
    from sklearn.datasets import load_digits as _sk_load_digits

    bunch = _sk_load_digits()
    images = np.round(bunch.images * (255.0 / 16.0)).astype(np.uint8)[:, None]
    labels = bunch.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(labels))
    n_test = int(round(test_fraction * len(labels)))
    if split == "test":
        idx = order[:n_test]
    elif split == "train":
        idx = order[n_test:]
    else:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    return ImageArrays(images[idx], labels[idx], [str(i) for i in range(10)], "digits")
