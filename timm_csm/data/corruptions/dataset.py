"""A split under a corruption, corrupted lazily: the images are corrupted when a batch reads them (in the DataLoader
worker that builds it), never stored."""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from ..lazy import LazyImages, LazySplit
from .registry import Corruption

__all__ = ["CorruptedImages", "corrupt_split"]


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
