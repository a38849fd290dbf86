"""Resolve a dataset argument to its splits: in memory (:class:`ImageArrays`) or read lazily (:class:`LazySplit`).

``fashion_mnist`` (Debian's embedded copy, else the Hub when online; offline its absence is an error naming the
install command), ``digits`` (scikit-learn), or any Hugging Face dataset name or folder with an image column and a
label column (detected, or named explicitly), or a timm ``create_dataset`` name (``hfds/...``, ``torch/...``).
:func:`load_image_arrays` decodes a split into memory (the generator, encoder and annotation stages);
:func:`open_image_split` is what training reads: the embedded datasets in memory, everything else lazily.
:func:`dataset_split_names` lists a dataset's splits and :func:`detect_test_split` picks the split to report on
when none is named: ``test``, else ``validation``, else ``val`` (Hugging Face datasets name their held-out split
``validation`` when they have no ``test``), else none.
"""
from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple

import numpy as np

from .arrays import ImageArrays
from .embedded import fashion_mnist_root, load_digits, load_fashion_mnist, load_mnist5k
from .lazy import ArrowImages, DatasetImages, FolderImages, LazySplit, column_arrays

__all__ = ["load_image_arrays", "open_image_split", "hf_split_to_arrays", "hf_split_to_lazy", "dataset_split_names",
           "detect_test_split", "hold_out_test_split", "same_dataset", "decode_split", "EMBEDDED_DATASETS",
           "TEST_SPLIT_NAMES"]

EMBEDDED_DATASETS = ("fashion_mnist", "digits", "mnist5k")
#: the embedded datasets read from a Python package (the [data] extra installs both)
_PACKAGED = {"digits": load_digits, "mnist5k": load_mnist5k}
_IMAGE_COLUMNS = ("image", "img", "pixel_values", "png")
_LABEL_COLUMNS = ("label", "labels", "fine_label", "coarse_label", "target")
#: split names tried, in order, for the split to report on when none is named
TEST_SPLIT_NAMES = ("test", "validation", "val")
_HUB_ALIASES = {"cifar10": "uoft-cs/cifar10", "cifar100": "uoft-cs/cifar100"}
# timm create_dataset prefixes: map-style ones read here, iterable ones refused
_ITERABLE_PREFIXES = ("wds", "tfds", "hfids")
_TIMM_PREFIXES = ("hfds", "torch") + _ITERABLE_PREFIXES


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


def _image_label_columns(ds, image_column, label_column):
    """(image column, labels (N,), class names) of a Hugging Face split; the label column is read, no image."""
    image_column = _pick(ds.column_names, _IMAGE_COLUMNS, "image", image_column)
    label_column = _pick(ds.column_names, _LABEL_COLUMNS, "label", label_column)
    names = list(getattr(ds.features[label_column], "names", None) or [])
    values = column_arrays(ds, [label_column])[label_column]
    whole_floats = values.dtype.kind == "f" and np.isfinite(values).all() and (values == np.round(values)).all()
    if values.dtype.kind not in "iub" and not whole_floats:
        raise ValueError(f"label column {label_column!r} must hold class indices, found values of type "
                         f"{values.dtype} ({values[:3].tolist()} ...)")
    labels = values.astype(np.int64)
    if not names:
        names = [str(i) for i in range(int(labels.max()) + 1)] if len(labels) else []
    return image_column, labels, names


def hf_split_to_lazy(ds, image_column: Optional[str] = None, label_column: Optional[str] = None,
                     source: str = "") -> LazySplit:
    """A Hugging Face ``Dataset`` split read lazily: its labels now, its images when a batch asks for them."""
    image_column, labels, names = _image_label_columns(ds, image_column, label_column)
    return LazySplit(ArrowImages(ds, image_column), labels, names, source)


def hf_split_to_arrays(ds, image_column: Optional[str] = None, label_column: Optional[str] = None,
                       source: str = "") -> ImageArrays:
    """Decode a Hugging Face ``Dataset`` split into uint8 (N, C, H, W) arrays. All images must share one size."""
    from PIL import Image

    image_column, labels, names = _image_label_columns(ds, image_column, label_column)
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
    """Load split ``split`` of ``name`` into memory (see the module docstring for what ``name`` may be). An image
    folder is listed by timm's folder reader, as training reads it (the same images in the same order, nothing
    downloaded or converted), and decoded here."""
    if name == "fashion_mnist":
        if fashion_mnist_root() is not None or _offline():
            return load_fashion_mnist(split)  # offline without Debian's copy: the error naming the install command
        name = "zalando-datasets/fashion_mnist"
    elif name in _PACKAGED:
        return _PACKAGED[name](split)
    name = _local_name(name)
    folders = _image_folder_splits(name)
    if folders is not None:
        return decode_split(_folder_split(name, folders, split))
    return hf_split_to_arrays(_hf_split(name, split), image_column, label_column, source=name)


_DECODE_CHUNK = 1024  # images decoded at a time by decode_split


def decode_split(split: LazySplit) -> ImageArrays:
    """A lazily read split decoded into memory: uint8 (N, C, H, W) in the images' own channels (grey stays grey);
    images of different sizes are an error naming them."""
    n = len(split)
    chunks = [split.images[np.arange(i, min(n, i + _DECODE_CHUNK))].numpy() for i in range(0, n, _DECODE_CHUNK)]
    images = np.concatenate(chunks) if chunks else np.zeros((0, 1, 1, 1), np.uint8)
    return ImageArrays(images, split.labels, list(split.class_names), split.source)


#: sub-folder names of an image folder that are splits (timm's and Hugging Face's conventions)
_SPLIT_DIRS = ("train", "training", "validation", "val", "valid", "test", "testing")
# files that make a folder a data folder of ``datasets`` (loose notes, class maps or markers do not)
_DATA_FILES = (".parquet", ".arrow", ".csv", ".jsonl")


def _image_folder_splits(name: str) -> Optional[Dict[str, Path]]:
    """``{split: its class-level folder}`` of an ImageFolder layout (``[<split>/]<class>/<image>``, images only), or
    None when ``name`` is not one (a data folder of parquet / CSV / metadata files is read by ``datasets``): its split
    sub-folders, else ``train`` for the folder itself. Looks at the folder and split levels and at the first class
    folder only, so that a folder of a million images is recognised at once."""
    from timm.data.readers.img_extensions import get_img_extensions

    root = Path(name)
    if not root.is_dir() or _is_saved(name):
        return None
    splits = [d.name for d in sorted(root.iterdir()) if d.is_dir() and d.name.lower() in _SPLIT_DIRS]
    for level in [root] + [root / s for s in splits]:
        for entry in os.scandir(level):
            stem, suffix = os.path.splitext(entry.name)
            if entry.is_file() and (suffix.lower() in _DATA_FILES or stem.lower() == "metadata"):
                return None
    class_level = root / splits[0] if splits else root
    extensions = tuple(get_img_extensions())
    class_dirs = (e.path for e in sorted(os.scandir(class_level), key=lambda e: e.name) if e.is_dir())
    # the first class folder holding an image (an empty one is reported by _folder_split, naming it)
    if not any(any(f.name.lower().endswith(extensions) for f in os.scandir(d)) for d in class_dirs):
        return None
    return {s: root / s for s in splits} if splits else {"train": root}


def _folder_split(name: str, folders: Dict[str, Path], split: str) -> LazySplit:
    """Split ``split`` of the ImageFolder layout ``name`` (``folders``: :func:`_image_folder_splits`), its files
    listed by timm's folder reader (nothing decoded)."""
    if split not in folders:
        raise ValueError(f'Unknown split "{split}". Should be one of {list(folders)}.')
    from timm.utils.misc import natural_key

    # shared by every split, in the order of timm's folder reader (natural: 1, 2, 10), so that a model trained with
    # timm on the folder is scored with its own label indices
    classes = sorted({d.name for f in folders.values() for d in f.iterdir() if d.is_dir()}, key=natural_key)
    images = FolderImages(folders[split], classes)
    present = set(np.unique(images.labels).tolist())
    empty = [c for i, c in enumerate(classes) if i not in present and (folders[split] / c).is_dir()]
    if empty:
        raise ValueError(f"{folders[split]}: class folder(s) {empty} hold no images; remove them or add images "
                         "(an empty folder would become a class of its own)")
    return LazySplit(images, images.labels, images.class_names, name)


def _local_name(name: str) -> str:
    """``name`` with a leading ``~`` expanded. A file, or a path-like name that does not exist, is a one-line error:
    a name starting with ``.``, ``/`` or ``~``, or holding more than a Hub id's one ``/`` (or a backslash on
    Windows), is a folder, never looked up on the Hub, where it would fail as an unreachable or malformed repository
    id. ``org/name`` stays a Hub id when no such folder exists."""
    path = os.path.expanduser(name)
    if os.path.isfile(path):
        raise ValueError(f"{name} is a file, not a folder: give an image folder ([<split>/]<class>/<image>), a "
                         "datasets folder or a dataset name")
    separators = {os.sep, os.altsep} - {None, "/"}
    path_like = name.startswith((".", "/", "~")) or name.count("/") > 1 or any(s in name for s in separators)
    if path_like and not os.path.exists(path):
        raise ValueError(f"no such folder: {name}")
    return path


def _is_saved(name: str) -> bool:
    """Whether ``name`` is a folder written by ``save_to_disk`` (read with ``load_from_disk``)."""
    folder = Path(name)
    return (folder / "dataset_dict.json").is_file() or (folder / "state.json").is_file()


def _hf_split(name: str, split: str):
    """Split ``split`` of a Hugging Face dataset: a Hub id or alias, a data folder (``imagefolder`` for an image
    folder), or a ``save_to_disk`` folder. Arrow-backed and memory-mapped: nothing is decoded."""
    import datasets

    if _is_saved(name):
        saved = datasets.load_from_disk(name)
        if isinstance(saved, datasets.Dataset):
            if split != "train":
                raise ValueError(f"unknown split {split!r}: {name} holds a single dataset, read as 'train'")
            return saved
        if split not in saved:
            raise ValueError(f'Unknown split "{split}". Should be one of {list(saved)}.')
        return saved[split]
    return datasets.load_dataset(_HUB_ALIASES.get(name, name), split=split)


def _timm_spec(name: str) -> Tuple[str, str]:
    """(prefix, rest) of a timm ``create_dataset`` name (``hfds/cifar10``, ``torch/cifar100``); ('', name) else.
    timm's iterable readers are refused: sampling by index is what keeps batches seeded per sample."""
    prefix, sep, rest = name.partition("/")
    if not (sep and prefix.lower() in _TIMM_PREFIXES and rest):
        return "", name
    if prefix.lower() in _ITERABLE_PREFIXES:
        raise ValueError(f"{name}: timm's {prefix}/ datasets are iterable, and training here samples by index "
                         "(per-sample seeds, CSM companions); use the Hugging Face dataset (hfds/<id>, or its "
                         "name), an image folder, or a saved dataset")
    return prefix.lower(), rest


def _torch_split(rest: str, split: str, data_dir: Optional[str]) -> LazySplit:
    """A torchvision dataset through timm's ``create_dataset("torch/<name>")``, read from ``data_dir`` (never
    downloaded: this reads what is there)."""
    from timm.data import create_dataset

    if not data_dir:
        raise ValueError(f"torch/{rest}: give --data-dir, the folder torchvision's {rest} files are in")
    ds = create_dataset(f"torch/{rest}", root=data_dir, split=split, is_training=split == "train", download=False)
    names = [str(c) for c in getattr(ds, "classes", None) or sorted(set(map(int, ds.targets)))]
    return LazySplit(DatasetImages(ds), np.asarray(ds.targets, dtype=np.int64), names, f"torch/{rest}")


def open_image_split(name: str, split: str = "train", image_column=None, label_column=None,
                     data_dir: Optional[str] = None):
    """Split ``split`` of dataset ``name`` for training: the embedded datasets in memory (:class:`ImageArrays`),
    every other dataset read lazily (:class:`~timm_csm.data.lazy.LazySplit`): image folders (``[<split>/]<class>/
    <image>``, listed by timm's folder reader), Hugging Face datasets (Hub ids, data folders, ``save_to_disk``
    folders) and timm's ``create_dataset`` names ``hfds/<Hub id>`` (the same
    dataset) and ``torch/<name>`` (torchvision's files in ``data_dir``). timm's iterable readers (``wds/``,
    ``tfds/``, ``hfids/``) are refused."""
    if name in EMBEDDED_DATASETS:
        return load_image_arrays(name, split)
    prefix, rest = _timm_spec(name)
    if prefix == "torch":
        return _torch_split(rest, split, data_dir)
    rest = _local_name(rest)
    folders = _image_folder_splits(rest)
    if folders is not None:
        return _folder_split(rest, folders, split)
    return hf_split_to_lazy(_hf_split(rest, split), image_column, label_column, source=rest)


def dataset_split_names(name: str) -> List[str]:
    """The split names of dataset ``name`` (as :func:`open_image_split` takes it), read from the dataset's
    builder (data files or Hub metadata) without loading images; the embedded datasets and torchvision's have
    ``train`` and ``test``."""
    prefix, rest = _timm_spec(name)
    if prefix == "torch" or (name in EMBEDDED_DATASETS and (
            name in _PACKAGED or fashion_mnist_root() is not None or _offline())):
        return ["train", "test"]
    import datasets

    rest = _local_name(rest)
    folders = _image_folder_splits(rest)
    if folders is not None:
        return list(folders)
    if _is_saved(rest):
        saved = datasets.load_from_disk(rest)
        return list(saved) if isinstance(saved, datasets.DatasetDict) else ["train"]
    hub = "zalando-datasets/fashion_mnist" if rest == "fashion_mnist" else _HUB_ALIASES.get(rest, rest)
    return list(datasets.get_dataset_split_names(hub))


def same_dataset(a, b) -> bool:
    """Whether dataset arguments ``a`` and ``b`` name the same data: one folder (paths resolved), else one name."""
    if a is None or b is None:
        return False
    if os.path.exists(str(a)) and os.path.exists(str(b)):
        return Path(a).resolve() == Path(b).resolve()
    return str(a) == str(b)


def hold_out_test_split(split, fraction: float, seed: int):
    """``(rest, test)``: a seeded ``fraction`` of a split (in memory or lazy) held out as the test split of a dataset
    that has none (a flat ``<class>/<image>`` folder), as ``datasets``' ``train_test_split`` would; the same
    ``(fraction, seed)`` holds out the same images wherever it is called (``--test-fraction`` of training, the
    recipe's stages), both parts in the split's order."""
    import torch

    from .seeding import derive_seed

    if not 0.0 < fraction < 1.0:
        raise ValueError(f"--test-fraction must lie in (0, 1), got {fraction}")
    n_test = int(round(fraction * len(split)))
    if not 0 < n_test < len(split):
        raise ValueError(f"--test-fraction {fraction} of {len(split)} images leaves no test or no training image")
    order = torch.randperm(len(split), generator=torch.Generator().manual_seed(derive_seed(seed, 4))).numpy()
    return split.subset(np.sort(order[n_test:])), split.subset(np.sort(order[:n_test]))


def detect_test_split(splits: Iterable[str], exclude: Iterable[str] = ()) -> Optional[str]:
    """The first of :data:`TEST_SPLIT_NAMES` among ``splits`` that is not in ``exclude`` (the splits already used
    for training and validation); None when there is none (a flat ``<class>/<image>`` folder has only ``train``):
    the caller decides whether a run without a test split makes sense."""
    splits, exclude = list(splits), set(exclude)
    for name in TEST_SPLIT_NAMES:
        if name in splits and name not in exclude:
            return name
    return None
