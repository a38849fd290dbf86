"""Resolve a dataset argument to in-memory :class:`ImageArrays`.

``fashion_mnist`` (Debian's embedded copy, else the Hub when online; offline its absence is an error naming the
install command), ``digits`` (scikit-learn), or any Hugging Face dataset name or folder with an image column and a
label column (detected, or named explicitly). :func:`dataset_split_names` lists a dataset's splits and
:func:`detect_test_split` picks the split to report on when none is named: ``test``, else ``validation``, else
``val`` (Hugging Face datasets name their held-out split ``validation`` when they have no ``test``).
"""
from __future__ import annotations

import io
from typing import Iterable, List, Optional

import numpy as np

from .embedded import ImageArrays, fashion_mnist_root, load_digits, load_fashion_mnist

__all__ = ["load_image_arrays", "hf_split_to_arrays", "dataset_split_names", "detect_test_split", "EMBEDDED_DATASETS",
           "TEST_SPLIT_NAMES"]

EMBEDDED_DATASETS = ("fashion_mnist", "digits")
_IMAGE_COLUMNS = ("image", "img", "pixel_values", "png")
_LABEL_COLUMNS = ("label", "labels", "fine_label", "coarse_label", "target")
#: split names tried, in order, for the split to report on when none is named
TEST_SPLIT_NAMES = ("test", "validation", "val")
_HUB_ALIASES = {"cifar10": "uoft-cs/cifar10", "cifar100": "uoft-cs/cifar100"}


def _pick(columns, candidates, what, explicit):
    if explicit is not None:
        if explicit not in columns:
            raise ValueError(f"missing {what} column {explicit!r}; columns are {list(columns)}")
        return explicit
    for c in candidates:
        if c in columns:
            return c
    raise ValueError(f"no {what} column found (looked for {list(candidates)}); columns are {list(columns)}; "
                     f"name it explicitly")


def hf_split_to_arrays(ds, image_column: Optional[str] = None, label_column: Optional[str] = None,
                       source: str = "") -> ImageArrays:
    """Decode a Hugging Face ``Dataset`` split into uint8 (N, C, H, W) arrays. All images must share one size."""
    from PIL import Image

    image_column = _pick(ds.column_names, _IMAGE_COLUMNS, "image", image_column)
    label_column = _pick(ds.column_names, _LABEL_COLUMNS, "label", label_column)
    feature = ds.features[label_column]
    names = list(getattr(feature, "names", None) or [])
    labels = np.asarray(ds[label_column], dtype=np.int64)
    if not names:
        names = [str(i) for i in range(int(labels.max()) + 1)]
    arrays = []
    for i, img in enumerate(ds.with_format(None)[image_column]):
        if isinstance(img, dict):  # undecoded {"bytes", "path"}
            try:
                img = Image.open(io.BytesIO(img["bytes"]))
                img.load()
            except Exception as e:
                raise ValueError(f"row {i}: image does not decode ({e})") from e
        a = np.asarray(img)
        arrays.append(a[None] if a.ndim == 2 else a.transpose(2, 0, 1))
    shapes = {a.shape for a in arrays}
    if len(shapes) > 1:
        raise ValueError(f"images have different shapes {sorted(shapes)[:4]}; resize them first")
    images = np.stack(arrays).astype(np.uint8) if arrays else np.zeros((0, 1, 1, 1), np.uint8)
    return ImageArrays(images, labels, names, source)


def _offline() -> bool:
    import datasets

    return bool(datasets.config.HF_HUB_OFFLINE)


def load_image_arrays(name: str, split: str = "train", image_column=None, label_column=None) -> ImageArrays:
    """Load split ``split`` of ``name`` into memory (see the module docstring for what ``name`` may be)."""
    if name == "fashion_mnist":
        if fashion_mnist_root() is not None or _offline():
            return load_fashion_mnist(split)  # offline without Debian's copy: the error naming the install command
        name = "zalando-datasets/fashion_mnist"
    elif name == "digits":
        return load_digits(split)
    import datasets

    ds = datasets.load_dataset(_HUB_ALIASES.get(name, name), split=split)
    return hf_split_to_arrays(ds, image_column, label_column, source=name)


def dataset_split_names(name: str) -> List[str]:
    """The split names of dataset ``name`` (as :func:`load_image_arrays` takes it), read from the dataset's
    builder (data files or Hub metadata) without loading images; the embedded datasets have ``train`` and ``test``."""
    if name in EMBEDDED_DATASETS and (name == "digits" or fashion_mnist_root() is not None or _offline()):
        return ["train", "test"]
    import datasets

    hub = "zalando-datasets/fashion_mnist" if name == "fashion_mnist" else _HUB_ALIASES.get(name, name)
    return list(datasets.get_dataset_split_names(hub))


def detect_test_split(splits: Iterable[str], exclude: Iterable[str] = ()) -> str:
    """The first of :data:`TEST_SPLIT_NAMES` among ``splits`` that is not in ``exclude`` (the splits already used
    for training and validation); ``ValueError`` naming the splits when there is none."""
    splits, exclude = list(splits), set(exclude)
    for name in TEST_SPLIT_NAMES:
        if name in splits and name not in exclude:
            return name
    raise ValueError(f"no split to report test metrics on: the dataset has splits {splits} and none of "
                     f"{list(TEST_SPLIT_NAMES)} is free (used: {sorted(exclude)}); name one with --test-split")
