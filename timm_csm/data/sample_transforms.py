"""Per-image transforms (timm's ``create_transform``) with the seeded randomness of the batched transforms.

timm's train transform (``RandomResizedCrop``, flips, ``--aa`` RandAugment / AutoAugment, ``--color-jitter``,
``--reprob`` random erasing) works on one PIL image at a time and draws from the global ``random``, ``numpy`` and
``torch`` generators. :class:`SampleTransform` keeps that transform as it is and gives it the batched transforms'
contract (:class:`~timm_csm.data.transforms.BatchTransform`): ``sample_params(n, generator)`` draws one seed per
image for the whole global batch, and ``apply(images, params)`` runs the transform on each image with the three
global generators seeded from its seed. The global generators are restored afterwards, so the training process's
own random state is untouched when the collator runs in the main process. A sample's augmentation therefore depends
only on (run seed, epoch, step, slot): R processes of batch B see the images one process of batch R*B sees.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .lazy import pil_mode
from .seeding import preserved_global_rng, seed_global_rng

__all__ = ["SampleTransform", "create_timm_transforms"]


class SampleTransform:
    """A per-image transform (PIL image -> float (C, S, S)) applied image by image with per-image seeds.

    Args:
        transform: the PIL transform (timm's ``create_transform`` output, a torchvision ``Compose``, ...).
        in_chans: channels of the output; each image is converted to ``L`` (1) or ``RGB`` (3) first.
        img_size: the output (H, W) (for the records; the transform decides the size), None when unknown.
        random: whether ``transform`` is random (a train transform); an eval transform draws nothing.
    """

    per_sample = True

    def __init__(self, transform: Callable, in_chans: int, img_size: Optional[Tuple[int, int]], random: bool):
        self.transform = transform
        self.in_chans = int(in_chans)
        self.img_size = tuple(img_size) if img_size is not None else None
        self.mode = pil_mode(self.in_chans)
        self.random = bool(random)
        self._tensor_step = _tensor_step(transform)

    @property
    def is_random(self) -> bool:
        return self.random

    @property
    def splits_at_input(self) -> bool:
        """Whether the transform is a ``Compose`` whose steps on PIL images (resize, crop: the geometry) can be run
        apart from the rest (the tensor conversion and normalisation): timm's and torchvision's can."""
        return self._tensor_step is not None

    def to_input_size(self, images: Sequence[Any]) -> List:
        """The geometric part of the transform alone: each image converted to ``L`` / ``RGB`` and taken through the
        steps before the tensor conversion (timm's eval resize and centre crop), as PIL images at the model's input
        size. :meth:`from_input_size` finishes the transform; a transform that does not split
        (:attr:`splits_at_input`) is refused in one line."""
        if self._tensor_step is None:
            raise ValueError(f"transform {self.transform!r} has no tensor conversion step to split it at the model's "
                             "input size")
        steps = self.transform.transforms[:self._tensor_step]
        out = []
        for img in images:
            img = self._pil(img)
            for step in steps:
                img = step(img)
            out.append(img)
        return out

    def from_input_size(self, images: Sequence[Any]) -> torch.Tensor:
        """float32 (B, C, H, W): the steps of the transform from its tensor conversion on (scaling, normalisation)
        of each image :meth:`to_input_size` gave."""
        steps = self.transform.transforms[self._tensor_step:]
        out = []
        for img in images:
            for step in steps:
                img = step(img)
            out.append(img)
        return torch.stack(out)

    def sample_params(self, n: int, generator: Optional[torch.Generator] = None) -> Dict[str, torch.Tensor]:
        """One seed per image (n,), drawn for the whole global batch."""
        return {"seeds": torch.randint(0, 2 ** 62, (n,), generator=generator)}

    def _pil(self, img):
        from PIL import Image

        if isinstance(img, torch.Tensor):  # a uint8 (C, H, W) row of in-memory images
            a = img.numpy()
            img = Image.fromarray(a[0] if a.shape[0] == 1 else a.transpose(1, 2, 0))
        return img if img.mode == self.mode else img.convert(self.mode)

    def apply(self, images: Sequence[Any], params: Optional[Dict[str, torch.Tensor]] = None) -> torch.Tensor:
        """float32 (B, C, S, S): the transform of each image, under its seed from ``params`` (None: unseeded,
        for a deterministic eval transform)."""
        if params is None and self.random:
            raise ValueError("a random per-image transform needs params from sample_params (one seed per image)")
        if params is not None and len(params["seeds"]) != len(images):
            raise ValueError(f"params for {len(params['seeds'])} images, batch has {len(images)}")
        with preserved_global_rng():
            out = []
            for i, img in enumerate(images):
                if params is not None:
                    seed_global_rng(int(params["seeds"][i]))
                out.append(self.transform(self._pil(img)))
        return torch.stack(out)

    def __call__(self, images, generator: Optional[torch.Generator] = None) -> torch.Tensor:
        params = self.sample_params(len(images), generator) if self.random else None
        return self.apply(images, params)

    def __repr__(self):
        return f"SampleTransform(in_chans={self.in_chans}, img_size={self.img_size}, random={self.random})"


#: the steps that turn a PIL image into a tensor (torchvision's, timm's): where a transform leaves the image's geometry
_TENSOR_STEPS = ("ToTensor", "PILToTensor", "MaybeToTensor", "MaybePILToTensor", "ToImage")


def _tensor_step(transform) -> Optional[int]:
    """The position of the first tensor conversion among the steps of a ``Compose``; None for any other callable."""
    steps = getattr(transform, "transforms", None)
    if not isinstance(steps, (list, tuple)):
        return None
    return next((i for i, step in enumerate(steps) if type(step).__name__ in _TENSOR_STEPS), None)


def _per_channel(values, in_chans: int, what: str) -> tuple:
    values = tuple(float(v) for v in values)
    if len(values) == 1:
        return values * in_chans
    if len(values) != in_chans:
        raise ValueError(f"{what} has {len(values)} values for {in_chans} channels")
    return values


def create_timm_transforms(img_size: int, mean, std, in_chans: int, interpolation: str = "bilinear",
                           crop_pct: Optional[float] = None, no_aug: bool = False, crop_mode: Optional[str] = None,
                           **train_kwargs):
    """(train, eval) :class:`SampleTransform` of ``timm.data.create_transform``: train with ``train_kwargs``
    (``scale``, ``ratio``, ``hflip``, ``vflip``, ``color_jitter``, ``auto_augment``, ``re_prob``, ``re_mode``,
    ``re_count``, ``train_interpolation``, as timm's train.py passes them), eval resizing to ``img_size / crop_pct``
    and cropping (``crop_mode``: timm's ``center`` by default, ``squash`` or ``border``). ``mean`` / ``std`` hold
    one value per channel, or one for all."""
    from timm.data import create_transform

    mean, std = _per_channel(mean, in_chans, "mean"), _per_channel(std, in_chans, "std")
    size = (in_chans, int(img_size), int(img_size))
    train_interpolation = train_kwargs.pop("train_interpolation", None) or interpolation
    train = create_transform(size, is_training=True, no_aug=no_aug, mean=mean, std=std,
                             interpolation=train_interpolation, **train_kwargs)
    evaluation = create_transform(size, is_training=False, mean=mean, std=std, interpolation=interpolation,
                                  crop_pct=crop_pct, crop_mode=crop_mode)
    return (SampleTransform(train, in_chans, size[1:], random=True),
            SampleTransform(evaluation, in_chans, size[1:], random=False))
