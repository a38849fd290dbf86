"""Image splits read lazily: rows are decoded when a batch asks for them, in the DataLoader worker that builds it.

A :class:`LazyImages` is a random-access view of the images of a dataset too large (or too varied) to decode up
front: the files of an image folder (timm's ``ReaderImageFolder`` lists them), a Hugging Face ``datasets.Dataset``
column (Arrow, memory-mapped: Hub datasets, data folders, saved datasets), or any map-style dataset returning
``(image, target)`` (the torchvision datasets behind timm's ``torch/...`` specs). ``images.pil(rows)`` gives PIL
images; ``images[rows]`` gives a uint8 (B, C, H, W) tensor in the channel count of ``mode`` for the batched
transforms of :mod:`timm_csm.data.transforms`; rows of different sizes are resized to a common size there (see
:func:`stack_images`). :class:`LazySplit` pairs the images with their labels (read from the label column with
:func:`column_arrays`, never by decoding images) and is what :class:`ImageArrays` is for in-memory data: ``len``,
``labels``, ``class_names``, ``subset``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

from .arrays import LabelledSplit

__all__ = ["column_arrays", "LazyImages", "ArrowImages", "DatasetImages", "FolderImages", "LazySplit", "stack_images",
           "pil_mode", "take_images", "image_geometry", "sampled_channel_stats", "split_digest"]


def pil_mode(in_chans: Optional[int]) -> Optional[str]:
    """The PIL mode images are converted to for ``in_chans`` channels (timm's ``input_img_mode``): 1 -> ``L``,
    3 -> ``RGB``; None keeps each image's own channels (``L`` / ``RGB``; alpha and palettes go to ``RGB``)."""
    if in_chans is None:
        return None
    if in_chans not in (1, 3):
        raise ValueError(f"images decoded from files can be given 1 or 3 channels, not {in_chans}")
    return "L" if in_chans == 1 else "RGB"


def _as_chw(img, mode: Optional[str]) -> np.ndarray:
    """uint8 (C, H, W) of a PIL image in ``mode`` (None: ``L`` stays grey, everything else becomes ``RGB``)."""
    target = mode or ("L" if img.mode in ("L", "1", "I", "I;16", "F") else "RGB")
    if img.mode != target:
        img = img.convert(target)
    a = np.asarray(img, dtype=np.uint8)
    return a[None] if a.ndim == 2 else a.transpose(2, 0, 1)


def stack_images(images, mode: Optional[str] = None, size: Optional[Tuple[int, int]] = None) -> torch.Tensor:
    """uint8 (B, C, H, W) of PIL ``images`` converted to ``mode``. Images of different sizes are each resized to
    ``size`` (bilinear, antialiased when shrinking, as the batched transform resizes a batch), so that they stack;
    without ``size`` that is an error naming the sizes."""
    arrays = [_as_chw(img, mode) for img in images]
    if len({a.shape for a in arrays}) > 1:
        if size is None:
            shapes = sorted({a.shape for a in arrays})
            raise ValueError(f"images have different shapes {shapes[:4]}; give an image size to resize them to "
                             "(--img-size)")
        arrays = [_resize_uint8(a, size) for a in arrays]
    return torch.from_numpy(np.stack(arrays))


def _resize_uint8(a: np.ndarray, size: Tuple[int, int]) -> np.ndarray:
    if a.shape[1:] == tuple(size):
        return a
    from .transforms import resize_images

    x = torch.from_numpy(np.array(a))[None].float()  # a copy: arrays of PIL images are read-only
    return resize_images(x, size).round_().clamp_(0, 255).to(torch.uint8)[0].numpy()


class LazyImages:
    """Random access to the images of a dataset, decoded per request. Subclasses implement ``_load(rows)`` (PIL
    images of the underlying rows); ``rows`` maps this view's positions to them (a subset keeps a view)."""

    def __init__(self, num_rows: int, rows: Optional[np.ndarray] = None, mode: Optional[str] = None,
                 size: Optional[Tuple[int, int]] = None):
        self.rows = np.arange(num_rows, dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64)
        self.mode, self.size = mode, size

    def __len__(self) -> int:
        return len(self.rows)

    def _load(self, rows: Sequence[int]) -> List:
        raise NotImplementedError

    def _view(self, rows: np.ndarray, mode, size) -> "LazyImages":
        view = object.__new__(type(self))
        view.__dict__.update(self.__dict__, rows=rows, mode=mode, size=size)
        return view

    def identity(self) -> bytes:
        """Which images this view holds, in order: the rows of the underlying dataset (a folder: its files)."""
        return np.ascontiguousarray(self.rows).tobytes()

    def subset(self, indices) -> "LazyImages":
        return self._view(self.rows[np.asarray(indices, dtype=np.int64)], self.mode, self.size)

    def with_output(self, mode: Optional[str], size: Optional[Tuple[int, int]] = None) -> "LazyImages":
        """The same images, stacked in ``mode`` and resized to ``size`` when their sizes differ."""
        return self._view(self.rows, mode, size)

    def pil(self, indices) -> List:
        """PIL images of positions ``indices``."""
        idx = np.asarray(torch.as_tensor(indices).reshape(-1), dtype=np.int64)
        if len(idx) and (idx.min() < 0 or idx.max() >= len(self)):
            raise IndexError(f"image index out of range for {len(self)} images")
        return self._load(self.rows[idx].tolist())

    def __getitem__(self, indices) -> torch.Tensor:
        """uint8 (len(indices), C, H, W) of positions ``indices`` (see :func:`stack_images`)."""
        return stack_images(self.pil(indices), self.mode, self.size)


def column_arrays(ds, columns: Sequence[str]) -> dict:
    """``{column: numpy array}`` of the non-image ``columns`` of a ``datasets.Dataset``, read in one formatted slice.
    (``ds[column]`` formats row by row: 8.6 s against 0.05 s for the label columns of a 10k-row generated set.) A
    fixed-length sequence column gives a 2-D array, a ragged one an object array of rows."""
    return dict(ds.select_columns(list(columns)).with_format("numpy")[:])


class ArrowImages(LazyImages):
    """The ``column`` of a ``datasets.Dataset`` (image feature, or undecoded ``{"bytes", "path"}`` dicts). Only that
    column is read; the Arrow table stays memory-mapped, and pickling (to DataLoader workers) keeps it so."""

    def __init__(self, ds, column: str, rows=None, mode=None, size=None):
        if column not in ds.column_names:
            raise ValueError(f"missing image column {column!r}; columns are {ds.column_names}")
        self.ds = ds.select_columns([column])
        self.column = column
        super().__init__(len(ds), rows, mode, size)

    def _load(self, rows):
        from PIL import Image
        import io

        out = []
        for row, img in zip(rows, self.ds[rows][self.column] if rows else []):
            if isinstance(img, dict):
                try:
                    img = Image.open(io.BytesIO(img["bytes"]) if img.get("bytes") else img["path"])
                    img.load()
                except Exception as e:
                    raise ValueError(f"row {row}: image does not decode ({e})") from e
            out.append(img)
        return out


class DatasetImages(LazyImages):
    """The images of a map-style dataset whose items are ``(image, target)`` (torchvision datasets, timm's
    ``ImageDataset`` without a transform)."""

    def __init__(self, dataset, rows=None, mode=None, size=None):
        self.dataset = dataset
        super().__init__(len(dataset), rows, mode, size)

    def _load(self, rows):
        from PIL import Image

        out = []
        for row in rows:
            img = self.dataset[row][0]
            out.append(img if isinstance(img, Image.Image) else Image.fromarray(np.asarray(img)))
        return out


class FolderImages(LazyImages):
    """The images of an ImageFolder layout (``<class>/<image>``), listed by timm's ``ReaderImageFolder``: only the
    file paths are held, each image is opened when a batch asks for it. ``class_names`` (default: the folder's
    class folders in the reader's natural order, 1, 2, 10) give the label order, so that the splits of one dataset
    share it; ``labels`` are the reader's."""

    def __init__(self, folder, class_names=None, rows=None, mode=None, size=None):
        from timm.data.readers.reader_image_folder import ReaderImageFolder

        class_map = {c: i for i, c in enumerate(class_names)} if class_names else ""
        reader = ReaderImageFolder(str(folder), class_map=class_map)
        self.paths = np.array([os.fsencode(p) for p, _ in reader.samples])  # bytes: 1 byte a character, not 4
        self.labels = np.array([t for _, t in reader.samples], dtype=np.int64)
        self.class_names = [c for c, _ in sorted(reader.class_to_idx.items(), key=lambda kv: kv[1])]
        super().__init__(len(self.paths), rows, mode, size)

    def identity(self) -> bytes:
        """The class folder and file name of each image, in order: the same wherever the folder is read from."""
        return b"\0".join(b"/".join(path.rsplit(os.sep.encode(), 2)[-2:]) for path in self.paths[self.rows])

    def _load(self, rows):
        from PIL import Image

        out = []
        for row in rows:
            path = os.fsdecode(self.paths[row])
            try:
                img = Image.open(path)
                img.load()
            except Exception as e:
                raise ValueError(f"{path}: image does not decode ({e})") from e
            out.append(img)
        return out


@dataclass
class LazySplit(LabelledSplit):
    """A split read lazily: ``images`` (:class:`LazyImages`), int64 ``labels`` (N,), ``class_names``."""

    images: LazyImages
    labels: np.ndarray
    class_names: List[str]
    source: str = ""

    def __post_init__(self):
        self.labels = np.asarray(self.labels, dtype=np.int64)
        self._check_labels(len(self.images))

    def subset(self, indices) -> "LazySplit":
        indices = np.asarray(indices, dtype=np.int64)
        return LazySplit(self.images.subset(indices), self.labels[indices], list(self.class_names), self.source)


def take_images(images, indices, per_sample: bool = False):
    """The rows ``indices`` of ``images`` (a uint8 (N, C, H, W) tensor or a :class:`LazyImages`): a uint8 batch, or
    with ``per_sample`` the images one by one (PIL images of a lazy source, uint8 (C, H, W) rows of a tensor)."""
    if isinstance(images, LazyImages):
        return images.pil(indices) if per_sample else images[indices]
    batch = images[indices]
    return list(batch) if per_sample else batch


def split_digest(split) -> str:
    """sha256 (16 hex digits) of which images a split holds, in order, with their labels and class names: the image
    bytes of a split in memory, the files of an image folder (class folder and name), the rows of any other lazy
    source. A training run records it for its validation and test images, so that a later command drawing them
    again by the run's seeded rule can tell that it found the same images."""
    import hashlib

    from .arrays import images_labels_hash

    labels = np.ascontiguousarray(np.asarray(split.labels, dtype=np.int64))
    if isinstance(split.images, LazyImages):
        h = hashlib.sha256(split.images.identity())
        h.update(labels.tobytes())
    else:
        h = images_labels_hash(np.asarray(split.images), labels)
    h.update("\0".join(map(str, split.class_names)).encode())
    return h.hexdigest()[:16]


_PROBE = 64  # images looked at to infer channels and size


def image_geometry(split, seed: int = 0) -> Tuple[int, Optional[int]]:
    """(channels, side) of a split's images: in memory, the array's (side None when not square); lazily, from up to
    64 seeded rows: 1 channel when all are grey, else 3; the side when all share one square size, else None."""
    if not isinstance(split.images, LazyImages):
        _, c, h, w = split.images.shape
        return int(c), int(h) if h == w else None
    n = len(split.images)
    if n == 0:
        raise ValueError("the split holds no image")
    rows = np.random.default_rng(seed).choice(n, size=min(n, _PROBE), replace=False)
    probe = split.images.pil(np.sort(rows))
    grey = all(img.mode in ("L", "1", "I", "I;16", "F") for img in probe)
    sizes = {img.size for img in probe}
    side = next(iter(sizes))[0] if len(sizes) == 1 and len(set(next(iter(sizes)))) == 1 else None
    return (1 if grey else 3), side


def sampled_channel_stats(split, in_chans: int, size: Tuple[int, int], max_images: int = 2048, seed: int = 0):
    """Per-channel mean and std of a split (:func:`~timm_csm.data.transforms.channel_stats`): of every image in
    memory, of up to ``max_images`` seeded rows (resized to ``size`` when sizes differ) of a lazy split."""
    from .transforms import channel_stats

    if not isinstance(split.images, LazyImages):
        return channel_stats(split.images, in_chans)
    n = len(split.images)
    rows = np.sort(np.random.default_rng(seed).choice(n, size=min(n, max_images), replace=False))
    images = split.images.with_output(pil_mode(in_chans), size)
    return channel_stats(torch.cat([images[rows[i:i + 256]] for i in range(0, len(rows), 256)]), in_chans)
