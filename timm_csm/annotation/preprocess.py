"""Batched image preprocessing on tensors: uint8 (B, C, H, W) in, normalised float (B, C', h, w) out.

The steps follow the eval transforms of open_clip and timm (resize the shortest side, centre-crop, scale to [0, 1],
normalise), but run on a whole batch at once instead of image by image through PIL. Bicubic and bilinear resizing use
``antialias=True``, PyTorch's PIL-compatible kernels (Keys cubic with a = -0.5), and the resized values are rounded
back to uint8 levels as PIL does, so the result is within a few grey levels of the PIL pipeline.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["ImagePreprocessor", "as_uint8_batch"]

_LUMA = (0.299, 0.587, 0.114)  # ITU-R 601-2, as PIL's convert("L")


def as_uint8_batch(images) -> torch.Tensor:
    """uint8 (B, C, H, W) tensor from a numpy array or tensor of that layout (a single (C, H, W) image is batched)."""
    if isinstance(images, np.ndarray):
        images = np.ascontiguousarray(images)
        if not images.flags.writeable:  # torch refuses read-only buffers (memory-mapped or Arrow-backed arrays)
            images = images.copy()
        images = torch.from_numpy(images)
    if not isinstance(images, torch.Tensor):
        raise ValueError(f"images must be a numpy array or a torch tensor, got {type(images).__name__}")
    if images.dtype != torch.uint8:
        raise ValueError(f"images must be uint8 (B, C, H, W), got dtype {images.dtype}")
    if images.ndim == 3:
        images = images[None]
    if images.ndim != 4 or images.shape[1] not in (1, 3):
        raise ValueError(f"images must be uint8 (B, C, H, W) with C in (1, 3), got shape {tuple(images.shape)}")
    return images


def _pair(size) -> Optional[Tuple[int, int]]:
    if size is None:
        return None
    if isinstance(size, int):
        return (size, size)
    size = tuple(int(s) for s in size)
    return size[-2:] if len(size) >= 2 else (size[0], size[0])


@dataclass
class ImagePreprocessor:
    """Resize, centre-crop and normalise a uint8 batch.

    Args:
        size: output (h, w) or one int; None keeps the input size.
        mean, std: per-channel normalisation of values in [0, 1].
        channels: channels the model expects; grey images are repeated to 3, RGB ones are converted to luma for 1.
        interpolation: "bicubic", "bilinear" or "nearest".
        resize_mode: "shortest" (resize the shortest side to ``size / crop_pct``, then centre-crop ``size``) or
            "squash" (resize both sides to ``size`` exactly).
        crop_pct: timm's crop fraction; the resize target is ``floor(size / crop_pct)``.
    """

    size: Optional[Tuple[int, int]]
    mean: Sequence[float]
    std: Sequence[float]
    channels: int = 3
    interpolation: str = "bicubic"
    resize_mode: str = "shortest"
    crop_pct: float = 1.0

    def __post_init__(self):
        self.size = _pair(self.size)
        self.mean = tuple(float(m) for m in self.mean)
        self.std = tuple(float(s) for s in self.std)
        if len(self.mean) == 1 and self.channels == 3:
            self.mean, self.std = self.mean * 3, self.std * 3
        elif len(self.mean) == 3 and self.channels == 1:  # an RGB data config on a model built with in_chans=1
            self.mean, self.std = (sum(self.mean) / 3,), (sum(self.std) / 3,)
        if len(self.mean) != self.channels or len(self.std) != self.channels:
            raise ValueError(f"mean/std need {self.channels} values, got {self.mean} / {self.std}")
        if self.interpolation not in ("bicubic", "bilinear", "nearest"):
            raise ValueError(f"interpolation must be bicubic, bilinear or nearest, got {self.interpolation!r}")
        if self.resize_mode not in ("shortest", "squash"):
            raise ValueError(f"resize_mode must be 'shortest' or 'squash', got {self.resize_mode!r}")
        if not 0 < self.crop_pct <= 1:
            raise ValueError(f"crop_pct must lie in (0, 1], got {self.crop_pct}")
        self._mean = torch.tensor(self.mean).view(1, -1, 1, 1)
        self._scale = 1.0 / (255.0 * torch.tensor(self.std).view(1, -1, 1, 1))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["size"] = list(self.size) if self.size else None
        return d

    def _resize(self, x: torch.Tensor, out_hw: Tuple[int, int]) -> torch.Tensor:
        if tuple(x.shape[-2:]) == tuple(out_hw):
            return x
        if self.interpolation == "nearest":
            return F.interpolate(x, size=out_hw, mode="nearest")
        # PIL resamples uint8 images in two passes, horizontal then vertical, rounding and clipping to uint8 after
        # each; doing the same keeps the overshoot of the cubic kernel identical near saturated pixels
        kw = {"mode": self.interpolation, "align_corners": False, "antialias": True}
        if x.shape[-1] != out_hw[1]:
            x = F.interpolate(x, size=(x.shape[-2], out_hw[1]), **kw).round_().clamp_(0, 255)
        if x.shape[-2] != out_hw[0]:
            x = F.interpolate(x, size=(out_hw[0], x.shape[-1]), **kw).round_().clamp_(0, 255)
        return x

    def _geometry(self, x: torch.Tensor) -> torch.Tensor:
        if self.size is None:
            return x
        h, w = x.shape[-2:]
        th, tw = self.size
        if self.resize_mode == "squash":
            return self._resize(x, (th, tw))
        scale_h, scale_w = (math.floor(th / self.crop_pct), math.floor(tw / self.crop_pct))
        if (h, w) != (th, tw):
            if th == tw:  # torchvision Resize(int): the shortest side becomes scale, aspect ratio kept
                short, long = (h, w) if h <= w else (w, h)
                new_short, new_long = scale_h, int(scale_h * long / short)
                out = (new_short, new_long) if h <= w else (new_long, new_short)
            else:
                out = (scale_h, scale_w)
            x = self._resize(x, out)
        h, w = x.shape[-2:]
        if (h, w) != (th, tw):
            if h < th or w < tw:
                raise ValueError(f"cannot centre-crop {(th, tw)} from {(h, w)}")
            top, left = int(round((h - th) / 2.0)), int(round((w - tw) / 2.0))
            x = x[..., top: top + th, left: left + tw]
        return x

    def __call__(self, images, device=None, dtype=torch.float32) -> torch.Tensor:
        x = as_uint8_batch(images)
        if device is not None:
            x = x.to(device, non_blocking=True)
        x = x.float()
        c = x.shape[1]
        if c == 3 and self.channels == 1:
            x = (x * torch.tensor(_LUMA, device=x.device).view(1, 3, 1, 1)).sum(1, keepdim=True).round_()
        elif c != self.channels and not (c == 1 and self.channels == 3):
            raise ValueError(f"images have {c} channels, the model expects {self.channels}")
        x = self._geometry(x)  # grey images are resized before they are repeated to 3 channels: 3x less work
        if x.shape[1] == 1 and self.channels == 3:
            x = x.expand(-1, 3, -1, -1)
        x = (x - 255.0 * self._mean.to(x.device)) * self._scale.to(x.device)
        return x.to(dtype).contiguous()
