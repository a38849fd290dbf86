"""A split under a corruption, corrupted lazily: the images are corrupted when a batch reads them (in the DataLoader
worker that builds it), never stored.

Where: at the model's input (:func:`corrupt_at_input`), as the ImageNet-C definitions assume: each image is taken
through the geometric part of the model's evaluation transform (resize and crop to the input size), corrupted there,
and then scaled and normalised. A 250-pixel image classified at 64 pixels is corrupted at 64 pixels, so a severity
means what ``docs/shift.md`` defines whatever the size the images are stored at. The collators do this for a
:class:`CorruptedImages` (every command predicts through them); read directly, without a model's transform, its
images are corrupted at their own size."""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np
import torch

from ..lazy import LazyImages, LazySplit, take_images
from .registry import Corruption

__all__ = ["CorruptedImages", "corrupt_split", "corrupt_at_input", "corruption_site"]


class CorruptedImages(LazyImages):
    """The images of ``base`` (uint8 (N, C, H, W) in memory, or a :class:`~timm_csm.data.LazyImages`) under
    ``corruption``; image i is corrupted with draws keyed by its position in ``base``, so a subset or a batch of any
    size sees the same corrupted image. Batches (``images[rows]``) are corrupted together; ``pil(rows)`` corrupts
    each image at its own size (the per-image transforms of timm read those)."""

    def __init__(self, base, corruption: Corruption, rows=None, mode=None, size=None):
        if not isinstance(base, LazyImages):
            base = torch.as_tensor(np.asarray(base))
            if base.dtype != torch.uint8 or base.ndim != 4:
                raise ValueError(f"images must be uint8 (N, C, H, W), got {base.dtype} {tuple(base.shape)}")
        self.base, self.corruption = base, corruption
        super().__init__(len(base), rows, mode, size)

    def with_output(self, mode: Optional[str], size=None) -> "CorruptedImages":
        view = super().with_output(mode, size)
        if isinstance(self.base, LazyImages):
            view.base = self.base.with_output(mode, size)
        return view

    def _positions(self, indices) -> np.ndarray:
        idx = np.asarray(torch.as_tensor(indices).reshape(-1), dtype=np.int64)
        if len(idx) and (idx.min() < 0 or idx.max() >= len(self)):
            raise IndexError(f"image index out of range for {len(self)} images")
        return self.rows[idx]

    def __getitem__(self, indices) -> torch.Tensor:
        positions = self._positions(indices)
        return self.corruption.batch(self.base[positions], positions)

    def model_input(self, indices, transform) -> torch.Tensor:
        """The model's input of positions ``indices``: the base images through ``transform`` (an evaluation
        :class:`~timm_csm.data.BatchTransform` or :class:`~timm_csm.data.SampleTransform`), corrupted at its
        input size (:func:`corrupt_at_input`)."""
        positions = self._positions(indices)
        images = take_images(self.base, positions, per_sample=getattr(transform, "per_sample", False))
        return corrupt_at_input(transform, images, self.corruption, positions)

    def pil(self, indices):
        positions = self._positions(indices)
        if isinstance(self.base, LazyImages):
            return [self.corruption(img, int(p)) for img, p in zip(self.base.pil(positions), positions)]
        from PIL import Image

        out = self[indices].numpy()
        return [Image.fromarray(a[0] if a.shape[0] == 1 else a.transpose(1, 2, 0)) for a in out]


def corrupt_split(split, corruption: Corruption) -> LazySplit:
    """``split`` (an :class:`~timm_csm.data.ImageArrays` or a :class:`~timm_csm.data.LazySplit`) with its images
    under ``corruption``, read lazily; labels and class names unchanged."""
    return LazySplit(CorruptedImages(split.images, corruption), split.labels, list(split.class_names),
                     f"{getattr(split, 'source', '')} under {corruption.name} {corruption.severity}".strip())


def _splits_at_input(transform) -> bool:
    return hasattr(transform, "to_input_size") and getattr(transform, "splits_at_input", True)


def corrupt_at_input(transform, images, corruption: Corruption, positions: Sequence[int]) -> torch.Tensor:
    """float32 (B, C, H, W): ``images`` (a uint8 batch, or the images one by one for a per-image transform) under
    ``corruption`` at the model's input, image i drawn from ``positions[i]``: ``transform.to_input_size`` (channel
    conversion, resize and crop to the input size), the corruption on that uint8 / PIL image, then
    ``transform.from_input_size`` (scaling, normalisation). An image already at the input size is corrupted as it is
    stored (a 28-pixel image for a 28-pixel model: the same tensors as corrupting the image as read). A per-image
    transform that does not split at its tensor conversion (any callable but a ``Compose``) gets the images
    corrupted as read, which :func:`corruption_site` says."""
    if getattr(transform, "is_random", False):
        raise ValueError(f"corrupted images are evaluated, not trained on: {transform!r} is random (training "
                         "augmentation); give the evaluation transform")
    positions = np.asarray(positions, dtype=np.int64).reshape(-1)
    if not _splits_at_input(transform):
        return transform.apply([corruption(img, int(p)) for img, p in zip(images, positions)])
    at_input = transform.to_input_size(images)
    if isinstance(at_input, torch.Tensor):
        return transform.from_input_size(corruption.batch(at_input, positions))
    return transform.from_input_size(_corrupt_pil(at_input, corruption, positions))


def _corrupt_pil(images: Sequence[Any], corruption: Corruption, positions: np.ndarray) -> list:
    """PIL ``images`` under ``corruption``: as one batch when they share a size and mode (the input size), else
    one by one (the same draws either way)."""
    from PIL import Image

    if len(images) == 0 or len({(img.size, img.mode) for img in images}) > 1 or images[0].mode not in ("L", "RGB"):
        return [corruption(img, int(p)) for img, p in zip(images, positions)]
    arrays = [np.asarray(img, dtype=np.uint8) for img in images]
    batch = torch.from_numpy(np.stack([a[None] if a.ndim == 2 else a.transpose(2, 0, 1) for a in arrays]))
    out = corruption.batch(batch, positions).numpy()
    return [Image.fromarray(np.ascontiguousarray(a[0] if a.shape[0] == 1 else a.transpose(1, 2, 0))) for a in out]


def corruption_site(transform) -> str:
    """One line for a report: where :func:`corrupt_at_input` applies corruptions with ``transform``."""
    if not _splits_at_input(transform):
        return ("Corruptions are applied to the images as read, before the model's transform (a callable that does "
                "not split at the model's input size), so a severity acts at the images' own size.")
    size = getattr(transform, "img_size", None)
    size = f"{size[0]} x {size[1]} px" if size else "the model's input size"
    geometry = "resizing and cropping" if getattr(transform, "per_sample", False) else "resizing"
    return (f"Corruptions are applied at the model's input: after {geometry} to {size}, before normalisation (as "
            "the ImageNet-C definitions assume).")
