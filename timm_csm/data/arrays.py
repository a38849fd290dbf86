"""The in-memory image split every stage of the pipeline shares (:class:`ImageArrays`), and the content hash of a
set of images."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List

import numpy as np

__all__ = ["ImageArrays", "LabelledSplit", "images_labels_hash"]


def images_labels_hash(images, labels, with_shape: bool = True):
    """sha256 over the shape, bytes and int64 labels of uint8 images (N, C, H, W): the content key of a set of
    images, shared by the prototype and encoder caches and the anchor pools of generation. ``with_shape=False``
    hashes the bytes and labels only: the key under which the calibration benchmark recorded its real subsets."""
    import hashlib

    images = np.ascontiguousarray(images)
    h = hashlib.sha256()
    if with_shape:
        h.update(str(images.shape).encode())
    h.update(images.data)
    h.update(np.ascontiguousarray(np.asarray(labels).astype(np.int64)).data)
    return h


class LabelledSplit:
    """What a split in memory (:class:`ImageArrays`) and a lazily read one (:class:`~timm_csm.data.lazy.LazySplit`)
    share: ``labels`` (N,) in ``[0, num_classes)``, one name per class in ``class_names``."""

    labels: np.ndarray
    class_names: List[str]

    def _check_labels(self, num_images: int) -> None:
        if self.labels.shape != (num_images,):
            raise ValueError(f"labels must have shape ({num_images},), got {self.labels.shape}")
        if len(self.labels) and (self.labels.min() < 0 or self.labels.max() >= len(self.class_names)):
            raise ValueError(f"labels must lie in [0, {len(self.class_names)}), got range "
                             f"[{self.labels.min()}, {self.labels.max()}]")

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def __len__(self) -> int:
        return int(self.labels.shape[0])


@dataclass
class ImageArrays(LabelledSplit):
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
        self._check_labels(self.images.shape[0])

    def subset(self, indices) -> "ImageArrays":
        indices = np.asarray(indices)
        return ImageArrays(self.images[indices], self.labels[indices], list(self.class_names), self.source)
