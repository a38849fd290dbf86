"""The corruption registry, in the style of timm's model registry.

    @register_corruption("gaussian_noise", family="noise", levels=(0.04, 0.06, 0.08, 0.09, 0.10),
                         source="hand-written", definition="sigma of the noise added to pixel values in [0, 1]")
    def gaussian_noise(x, level, rand): return x + level * rand.normal(*x.shape[1:])

    corruption = create_corruption("gaussian_noise", severity=3, seed=0)
    corruption(image)                      # uint8 (C, H, W) tensor or PIL image -> the same type, shape and dtype
    corruption.batch(images, indices)      # uint8 (B, C, H, W), image i drawn from (seed, indices[i])
    list_corruptions("*blur")              # ['defocus_blur', 'gaussian_blur', 'glass_blur', 'motion_blur', ...]

A registered function takes ``x`` float32 (B, C, H, W) in [0, 1] (C = 1 or 3), the severity's ``level`` (one of
the five ``levels``) and a :class:`BatchRandom` with one generator per image; it returns the corrupted batch, which
is clamped to [0, 1] and rounded back to uint8. Every random draw is per image, from a generator seeded by the
corruption's seed, its name and the image's index, so an image's corruption does not depend on the batch it is in,
the batch size or the number of workers; the five severities of one corruption share the draws (common random
numbers: severity changes only the level). Spatial levels (blur radii, shifts) are given for 32 x 32 images and
scaled with the image side (:func:`side_scale`).
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ...registry import Registry

__all__ = ["CorruptionSpec", "CORRUPTIONS", "Corruption", "BatchRandom", "register_corruption", "create_corruption",
           "list_corruptions", "corruption_spec", "side_scale", "SEVERITIES", "CORRUPTION_FAMILIES",
           "REFERENCE_SIDE"]

SEVERITIES = (1, 2, 3, 4, 5)
CORRUPTION_FAMILIES = ("noise", "blur", "weather", "digital", "geometric")
#: the image side the spatial levels are given for (CIFAR-10-C's)
REFERENCE_SIDE = 32


@dataclass(frozen=True)
class CorruptionSpec:
    """A registered corruption: its function, ``family``, the ``levels`` of severities 1-5, where it comes from
    (``source``: the library function it applies, or "hand-written") and what a level means (``definition``)."""

    name: str
    fn: Callable
    family: str
    levels: Tuple
    source: str
    definition: str


def _create_corruption(name: str, fn, spec: CorruptionSpec, severity: int, seed: int = 0) -> "Corruption":
    if isinstance(severity, bool) or not isinstance(severity, (int, np.integer)) or severity not in SEVERITIES:
        raise ValueError(f"corruption severity must be one of {list(SEVERITIES)}, got {severity!r}")
    return Corruption(spec, int(severity), int(seed))


#: the registered corruptions: name -> ``fn(x, level, rand)``, with its :class:`CorruptionSpec`
CORRUPTIONS = Registry("corruption", create=_create_corruption)


def register_corruption(name: str, fn: Optional[Callable] = None, *, overwrite: bool = False, family: str,
                        levels: Sequence, source: str, definition: str):
    """Register ``fn(x, level, rand)`` under ``name`` (without ``fn``, a decorator) with the five ``levels`` of its
    severities."""
    if family not in CORRUPTION_FAMILIES:
        raise ValueError(f"register_corruption({name!r}): family must be one of {CORRUPTION_FAMILIES}, got {family!r}")
    if len(levels) != len(SEVERITIES):
        raise ValueError(f"register_corruption({name!r}): give {len(SEVERITIES)} levels, got {len(levels)}")

    def _register(fn):
        return CORRUPTIONS.register(name, fn, overwrite=overwrite,
                                    spec=CorruptionSpec(name, fn, family, tuple(levels), source, definition))

    return _register if fn is None else _register(fn)


def list_corruptions(filter: str = "", family: Optional[str] = None) -> List[str]:
    """Sorted registered names, optionally filtered by a shell-style wildcard and a family."""
    return CORRUPTIONS.list(filter, family=family)


def corruption_spec(name: str) -> CorruptionSpec:
    """The :class:`CorruptionSpec` of ``name``; an unknown name is a one-line error listing the known ones."""
    return CORRUPTIONS.get_spec(name)


def create_corruption(name: str, severity: int, seed: int = 0) -> "Corruption":
    """The corruption ``name`` at ``severity`` (1-5) drawing from ``seed``; bad names or severities: one line."""
    return CORRUPTIONS.create(name, severity, seed)


def side_scale(x: torch.Tensor) -> float:
    """The image side of ``x`` (B, C, H, W) relative to :data:`REFERENCE_SIDE`: the factor of spatial levels."""
    return min(x.shape[-2:]) / REFERENCE_SIDE


_MASK64 = (1 << 64) - 1


def _image_seeds(key: int, indices: np.ndarray) -> List[int]:
    """One 63-bit seed per image index: the splitmix64 finaliser of ``key`` + index (vectorised, no state)."""
    with np.errstate(over="ignore"):
        z = np.uint64(key & _MASK64) + np.asarray(indices, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return [int(v >> np.uint64(1)) for v in z]


class BatchRandom:
    """Per-image random draws for a batch: every method draws each image's rows from that image's own generator,
    so the values of image i depend only on its seed (and on the draws made before, which are the same for every
    image of one corruption)."""

    def __init__(self, seeds: Sequence[int]):
        self.generators = [torch.Generator().manual_seed(int(s)) for s in seeds]

    def __len__(self) -> int:
        return len(self.generators)

    def _draw(self, fn) -> torch.Tensor:
        return torch.stack([fn(g) for g in self.generators])

    def uniform(self, *shape: int, low: float = 0.0, high: float = 1.0) -> torch.Tensor:
        """(B, *shape) uniform in [low, high)."""
        return self._draw(lambda g: torch.rand(shape, generator=g)) * (high - low) + low

    def normal(self, *shape: int, mean: float = 0.0, std: float = 1.0) -> torch.Tensor:
        """(B, *shape) normal."""
        return self._draw(lambda g: torch.randn(shape, generator=g)) * std + mean

    def sign(self, *shape: int) -> torch.Tensor:
        """(B, *shape) of -1.0 / +1.0 with equal probability."""
        return self.uniform(*shape).lt(0.5).float() * 2 - 1

    def integers(self, low: int, high: int, *shape: int) -> torch.Tensor:
        """(B, *shape) int64 uniform in [low, high]."""
        return self._draw(lambda g: torch.randint(low, high + 1, shape, generator=g))

    def poisson(self, rates: torch.Tensor) -> torch.Tensor:
        """Poisson draws of ``rates`` (B, ...), row i from image i's generator."""
        return torch.stack([torch.poisson(r, generator=g) for r, g in zip(rates, self.generators)])


class Corruption:
    """One registered corruption at one severity and seed: a callable on a uint8 (C, H, W) tensor or a PIL image
    (grey ``L`` or ``RGB``; other modes through ``RGB``) that keeps its type, shape and dtype. ``index``: the
    image's position in its dataset, which keys its random draws with the seed."""

    def __init__(self, spec: CorruptionSpec, severity: int, seed: int):
        self.spec, self.severity, self.seed = spec, severity, seed
        self._key = (int(seed) * 0x2545F4914F6CDD1D + zlib.crc32(spec.name.encode())) & _MASK64

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def level(self):
        return self.spec.levels[self.severity - 1]

    def batch(self, images: torch.Tensor, indices: Optional[Sequence[int]] = None) -> torch.Tensor:
        """uint8 (B, C, H, W) -> uint8 (B, C, H, W); ``indices`` (default 0..B-1) key each image's draws."""
        images = torch.as_tensor(images)
        if images.dtype != torch.uint8 or images.ndim != 4 or images.shape[1] not in (1, 3):
            raise ValueError(f"corruption {self.name!r} takes uint8 images (B, C, H, W) with 1 or 3 channels, got "
                             f"{images.dtype} {tuple(images.shape)}")
        idx = np.arange(len(images)) if indices is None else np.asarray(indices, dtype=np.int64).reshape(-1)
        if len(idx) != len(images):
            raise ValueError(f"{len(idx)} indices for {len(images)} images")
        if len(images) == 0:
            return images.clone()
        rand = BatchRandom(_image_seeds(self._key, idx))
        out = self.spec.fn(images.float().div_(255.0), self.level, rand)
        return out.clamp_(0.0, 1.0).mul_(255.0).round_().to(torch.uint8)

    def __call__(self, image, index: int = 0):
        """The corrupted ``image`` (uint8 (C, H, W) tensor or PIL image), drawn from (seed, ``index``)."""
        if isinstance(image, torch.Tensor):
            if image.ndim != 3:
                raise ValueError(f"corruption {self.name!r} takes one uint8 image (C, H, W), got shape "
                                 f"{tuple(image.shape)}; use .batch() for (B, C, H, W)")
            return self.batch(image[None], [index])[0]
        from PIL import Image

        if not isinstance(image, Image.Image):
            raise ValueError(f"corruption {self.name!r} takes a uint8 tensor (C, H, W) or a PIL image, got "
                             f"{type(image).__name__}")
        mode = "L" if image.mode in ("L", "1", "I", "I;16", "F") else "RGB"
        a = np.array(image.convert(mode) if image.mode != mode else image, dtype=np.uint8)  # a writable copy
        chw = torch.from_numpy(a[None] if a.ndim == 2 else np.ascontiguousarray(a.transpose(2, 0, 1)))
        out = self.batch(chw[None], [index])[0].numpy()
        result = Image.fromarray(out[0] if mode == "L" else out.transpose(1, 2, 0), mode)
        return result if result.mode == image.mode else result.convert(image.mode)

    def __repr__(self) -> str:
        return f"Corruption({self.name!r}, severity={self.severity}, seed={self.seed})"
