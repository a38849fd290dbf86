"""Batched image transforms on uint8 tensors: channel conversion, resize, CIFAR-style random crop and flip,
normalisation.

The CIFAR training recipe of the calibration lineage (and of CSM, for real and generated images alike) is
Resize(S) -> RandomCrop(S, padding=4) -> RandomHorizontalFlip -> ToTensor -> Normalize(mean, std). This module
applies it to a whole uint8 batch (B, C, H, W) at once, with every random choice drawn from a
``torch.Generator``. Random parameters are drawn by :meth:`BatchTransform.sample_params` and applied by
:meth:`BatchTransform.apply`, so a caller can draw them for a whole global batch and apply its own slice.
Padding is zero (black), as torchvision's default ``fill=0`` on the PIL image.
"""
from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["BatchTransform", "convert_channels", "channel_stats", "create_transforms", "sample_crop_flip",
           "pad_crop_flip", "resize_images"]

# ITU-R 601-2 luma, the weights of PIL's convert("L")
_LUMA = (0.299, 0.587, 0.114)


def convert_channels(images: torch.Tensor, in_chans: int) -> torch.Tensor:
    """Convert a (B, C, H, W) batch to ``in_chans`` channels: grey -> repeated, RGB(A) -> luma, RGBA -> RGB."""
    c = images.shape[1]
    if c == in_chans:
        return images
    if c == 4:  # drop alpha
        images, c = images[:, :3], 3
        if in_chans == 3:
            return images
    if c == 1:
        return images.expand(-1, in_chans, -1, -1)
    if c == 3 and in_chans == 1:
        w = torch.tensor(_LUMA, dtype=torch.float32).view(1, 3, 1, 1)
        grey = (images.float() * w).sum(1, keepdim=True)
        return grey.round_().clamp_(0, 255).to(images.dtype) if images.dtype == torch.uint8 else grey
    raise ValueError(f"cannot convert {c}-channel images to {in_chans} channels")


def resize_images(x: torch.Tensor, size: Tuple[int, int]) -> torch.Tensor:
    """A float (B, C, H, W) batch resized to ``size``: bilinear, antialiased when shrinking (as PIL's resize)."""
    shrink = x.shape[-2] > size[0] or x.shape[-1] > size[1]
    return F.interpolate(x, size=tuple(size), mode="bilinear", align_corners=False, antialias=shrink)


def channel_stats(images, in_chans: Optional[int] = None, chunk: int = 4096) -> Tuple[tuple, tuple]:
    """Per-channel mean and standard deviation of uint8 images (N, C, H, W) scaled to [0, 1] (float64 sums)."""
    images = torch.as_tensor(images)
    if images.dtype != torch.uint8 or images.ndim != 4:
        raise ValueError(f"images must be uint8 (N, C, H, W), got {images.dtype} {tuple(images.shape)}")
    if len(images) == 0:
        raise ValueError("channel_stats needs at least one image")
    c = in_chans or images.shape[1]
    s1 = torch.zeros(c, dtype=torch.float64)
    s2 = torch.zeros(c, dtype=torch.float64)
    n = 0
    for start in range(0, len(images), chunk):
        x = convert_channels(images[start:start + chunk], c).to(torch.float64) / 255.0
        s1 += x.sum((0, 2, 3))
        s2 += (x * x).sum((0, 2, 3))
        n += x.shape[0] * x.shape[2] * x.shape[3]
    mean = s1 / n
    std = (s2 / n - mean * mean).clamp_min(1e-12).sqrt()
    return tuple(round(float(v), 6) for v in mean), tuple(round(float(v), 6) for v in std)


def sample_crop_flip(n: int, padding: int, hflip: float,
                     generator: Optional[torch.Generator] = None) -> Dict[str, torch.Tensor]:
    """Random crop offsets (n, 2) in [0, 2 * padding] (row, column; drawn first) and flip flags (n,) with
    probability ``hflip`` (drawn second) for :func:`pad_crop_flip`; nothing is drawn for a zero padding or flip
    probability."""
    offsets = torch.randint(0, 2 * padding + 1, (n, 2), generator=generator) if padding > 0 else torch.zeros(
        n, 2, dtype=torch.long)
    flips = (torch.rand(n, generator=generator) < hflip) if hflip > 0 else torch.zeros(n, dtype=torch.bool)
    return {"offsets": offsets, "flips": flips}


def pad_crop_flip(x: torch.Tensor, params: Dict[str, torch.Tensor], padding: int) -> torch.Tensor:
    """Zero-pad a (B, C, H, W) batch (any dtype) by ``padding``, crop H x W at ``params["offsets"]`` and mirror the
    rows flagged in ``params["flips"]``: torchvision's ``RandomCrop(padding=p)`` then ``RandomHorizontalFlip``,
    batched, as one gather."""
    b, _, h, w = x.shape
    offsets, flips = params["offsets"], params["flips"]
    if offsets.shape != (b, 2) or flips.shape != (b,):
        raise ValueError(f"params for {offsets.shape[0]} images, batch has {b}")
    if padding > 0:
        padded = F.pad(x, (padding, padding, padding, padding))
        rows = offsets[:, 0, None] + torch.arange(h)  # (B, H)
        cols = offsets[:, 1, None] + torch.arange(w)  # (B, W)
        cols = torch.where(flips[:, None], cols.flip(1), cols)  # flipping = reading columns backwards
        bidx = torch.arange(b)[:, None, None]
        x = padded.permute(0, 2, 3, 1)[bidx, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2)
        return x.contiguous()
    if flips.any():
        x = torch.where(flips[:, None, None, None], x.flip(-1), x)
    return x


class BatchTransform:
    """uint8 (B, C, H, W) -> normalised float32 (B, in_chans, S, S).

    Steps: channel conversion to ``in_chans``; bilinear resize to ``img_size`` (antialiased when shrinking) when
    the input size differs; zero padding by ``crop_padding`` and a random ``img_size`` crop; horizontal flip
    with probability ``hflip``; scaling to [0, 1]; ``(x - mean) / std``.

    Args:
        img_size: output side S (int) or (H, W).
        mean, std: per-channel statistics in [0, 1] units (length ``in_chans``, or 1 to broadcast).
        in_chans: output channels; None keeps the input's.
        crop_padding: padding of the random crop (0 = no crop).
        hflip: horizontal flip probability.
    """

    def __init__(self, img_size: Union[int, Sequence[int]], mean: Sequence[float] = (0.5,),
                 std: Sequence[float] = (0.5,), in_chans: Optional[int] = None, crop_padding: int = 0,
                 hflip: float = 0.0):
        self.img_size = (int(img_size), int(img_size)) if isinstance(img_size, (int, np.integer)) else tuple(
            int(s) for s in img_size)
        if len(self.img_size) != 2 or min(self.img_size) < 1:
            raise ValueError(f"img_size must be a positive int or (H, W), got {img_size}")
        std_t = torch.tensor([float(s) for s in std], dtype=torch.float32)
        if (std_t <= 0).any() or not torch.isfinite(std_t).all():
            raise ValueError(f"std must be positive and finite, got {tuple(std)}")
        if crop_padding < 0:
            raise ValueError(f"crop_padding must be >= 0, got {crop_padding}")
        if not 0.0 <= hflip <= 1.0:
            raise ValueError(f"hflip must be a probability, got {hflip}")
        self.mean = tuple(float(m) for m in mean)
        self.std = tuple(float(s) for s in std)
        self.in_chans = in_chans
        if in_chans is not None and len(self.mean) not in (1, in_chans):
            raise ValueError(f"mean has {len(self.mean)} values for {in_chans} channels")
        self.crop_padding = int(crop_padding)
        self.hflip = float(hflip)
        # normalisation folded into one multiply-add on [0, 255] values
        self._scale = (1.0 / (255.0 * std_t)).view(1, -1, 1, 1)
        self._shift = (-torch.tensor(self.mean, dtype=torch.float32) / std_t).view(1, -1, 1, 1)

    @property
    def is_random(self) -> bool:
        return self.crop_padding > 0 or self.hflip > 0

    def sample_params(self, n: int, generator: Optional[torch.Generator] = None) -> Dict[str, torch.Tensor]:
        """Random parameters for ``n`` images (:func:`sample_crop_flip`): crop offsets (n, 2) and flip flags (n,)."""
        return sample_crop_flip(n, self.crop_padding, self.hflip, generator)

    def _channels(self, images: torch.Tensor) -> torch.Tensor:
        images = torch.as_tensor(images)
        if images.ndim != 4:
            raise ValueError(f"images must be (B, C, H, W), got shape {tuple(images.shape)}")
        if images.dtype != torch.uint8:
            raise ValueError(f"images must be uint8, got {images.dtype}")
        return convert_channels(images, self.in_chans) if self.in_chans is not None else images

    def to_input_size(self, images: torch.Tensor) -> torch.Tensor:
        """The geometric part of the evaluation transform alone: uint8 ``images`` in ``in_chans`` channels, resized
        to ``img_size`` (as :meth:`apply` resizes them) and rounded back to uint8, as an image stored at the input
        size holds it; images already at the input size are returned as they are. :meth:`from_input_size` finishes
        the transform (what corruptions of the model's input go between:
        :func:`~timm_csm.data.corruptions.corrupt_at_input`)."""
        images = self._channels(images)
        if tuple(images.shape[-2:]) == self.img_size:
            return images
        return resize_images(images.to(torch.float32), self.img_size).round_().clamp_(0, 255).to(torch.uint8)

    def from_input_size(self, images: torch.Tensor) -> torch.Tensor:
        """The rest of the evaluation transform after :meth:`to_input_size`: scaling and normalisation."""
        return self.apply(images)

    def apply(self, images: torch.Tensor, params: Optional[Dict[str, torch.Tensor]] = None) -> torch.Tensor:
        """Transform ``images`` with given random ``params`` (None: no crop, no flip)."""
        x = self._channels(images).to(torch.float32)
        if tuple(x.shape[-2:]) != self.img_size:
            x = resize_images(x, self.img_size)
        if params is not None:
            x = pad_crop_flip(x, params, self.crop_padding)
        if self._scale.shape[1] not in (1, x.shape[1]):
            raise ValueError(f"mean/std have {self._scale.shape[1]} channels, images have {x.shape[1]}")
        return x.mul_(self._scale).add_(self._shift)

    def __call__(self, images: torch.Tensor, generator: Optional[torch.Generator] = None) -> torch.Tensor:
        """Draw parameters for the batch from ``generator`` (when random) and apply them."""
        params = self.sample_params(len(images), generator) if self.is_random else None
        return self.apply(images, params)

    def __repr__(self):
        return (f"BatchTransform(img_size={self.img_size}, in_chans={self.in_chans}, mean={self.mean}, "
                f"std={self.std}, crop_padding={self.crop_padding}, hflip={self.hflip})")


def create_transforms(img_size, mean, std, in_chans=None, crop_padding: int = 4, hflip: float = 0.5):
    """(train, eval) transforms of the CIFAR recipe: the eval one resizes and normalises only."""
    train = BatchTransform(img_size, mean, std, in_chans, crop_padding=crop_padding, hflip=hflip)
    evaluation = BatchTransform(img_size, mean, std, in_chans)
    return train, evaluation
