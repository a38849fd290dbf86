"""Collators: gather uint8 images by index, transform them, and build the training batch of each method.

Every collator is called by a DataLoader with a list of :class:`~timm_csm.data.loader.SampleRef` (or plain
int indices) and returns a dict of tensors:

=====================  =========================================================================================
collator               keys
=====================  =========================================================================================
ImageCollator          ``pixel_values`` (B, C, S, S), ``labels`` (B,), ``index`` (B,)
CSMCollator            + ``mix_pixel_values`` (B*(1+n_aug), C, S, S), ``mix_targets`` (B*(1+n_aug), K)
MixupCollator          ``pixel_values`` mixed, ``labels`` soft (B, K), ``lam`` (B,), ``index``
RegMixupCollator       ``pixel_values``, ``labels`` (B,), ``mix_pixel_values`` (B, ...), ``mix_targets`` (B, K),
                       ``lam`` (B,)
RankMixupCollator      ``pixel_values``, ``labels`` (B,), ``mix_pixel_values`` (M*B, ...) copy-major,
                       ``mix_targets`` (M*B, K), ``lam`` (M,)
TimmMixupCollator      ``pixel_values`` mixed or cut-mixed by timm's ``Mixup``, ``labels`` soft (B, K), ``index``
=====================  =========================================================================================

Randomness: a batch of SampleRefs draws from ``torch.Generator(derive_seed(seed, epoch, step, ...))``. Draws that
are per sample (crops, flips, CSM companions) are made for the whole global batch and sliced by slot, so they do
not depend on how the global batch is split across processes or workers. Mixing partners are drawn within the
local batch (a partner must be on the same process). Plain int indices use a per-worker counter
(seed, worker id, call number) instead.
"""
from __future__ import annotations

from typing import Dict, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from .csm import CSMCompanionSampler
from .lazy import LazyImages, take_images
from .loader import SampleRef
from .seeding import batch_generator, preserved_global_rng, seed_global_rng
from .transforms import BatchTransform

__all__ = ["ImageCollator", "CSMCollator", "MixupCollator", "RegMixupCollator", "RankMixupCollator",
           "TimmMixupCollator", "mix_soft_targets"]

_LOCAL_STREAM = 1  # key separating per-process draws (mixing) from global per-slot draws


def _as_tensor_images(images):
    """uint8 (N, C, H, W) images as a tensor; a :class:`~timm_csm.data.lazy.LazyImages` stays lazy."""
    if isinstance(images, LazyImages):
        return images
    images = torch.as_tensor(images)
    if images.ndim != 4 or images.dtype != torch.uint8:
        raise ValueError(f"images must be uint8 (N, C, H, W), got {images.dtype} {tuple(images.shape)}")
    return images


def mix_soft_targets(labels: torch.Tensor, partner: torch.Tensor, lam: torch.Tensor, num_classes: int,
                     smoothing: float = 0.0) -> torch.Tensor:
    """lam * onehot(y) + (1 - lam) * onehot(y[partner]), with optional label smoothing eps/K on both one-hots.

    ``lam`` is (B,) or a scalar tensor; rows of the result sum to 1.
    """
    off = smoothing / num_classes
    onehot = F.one_hot(labels, num_classes).float() * (1.0 - smoothing) + off
    lam = lam.float().reshape(-1, 1) if lam.ndim else lam.float()
    return lam * onehot + (1.0 - lam) * onehot[partner]


class ImageCollator:
    """Gather images and hard labels and apply ``transform`` (random parameters drawn per slot).

    Args:
        images: uint8 (N, C, H, W) (numpy or torch); labels: int (N,).
        transform: a :class:`BatchTransform`.
        seed: run seed for the batch generators.
    """

    def __init__(self, images, labels, transform: BatchTransform, seed: int = 0):
        self.images = _as_tensor_images(images)
        self.labels = torch.as_tensor(np.asarray(labels), dtype=torch.long)
        if self.labels.shape != (len(self.images),):
            raise ValueError(f"labels must have shape ({len(self.images)},), got {tuple(self.labels.shape)}")
        self.transform = transform
        self.seed = int(seed)
        self._calls = 0
        # a split under a corruption (CorruptedImages) is corrupted at the model's input, between the transform's
        # geometry and its normalisation (corrupt_at_input), not as its images are read; asked by the method, so that
        # a training run does not import the corruptions
        self._corrupted = callable(getattr(self.images, "model_input", None))

    # -- batch bookkeeping -------------------------------------------------------------------------------------
    def _resolve(self, batch) -> Tuple[torch.Tensor, torch.Tensor, int, torch.Generator, torch.Generator]:
        """(indices, slots, global size, global generator, local generator) of a batch."""
        if len(batch) == 0:
            raise ValueError("empty batch")
        if isinstance(batch[0], SampleRef):
            idx = torch.tensor([r.index for r in batch], dtype=torch.long)
            slots = torch.tensor([r.slot for r in batch], dtype=torch.long)
            first = batch[0]
            keys = (self.seed, first.epoch, first.step)
            return (idx, slots, first.global_size, batch_generator(*keys),
                    batch_generator(*keys, _LOCAL_STREAM, first.slot))
        info = torch.utils.data.get_worker_info()
        worker = info.id if info is not None else -1
        self._calls += 1
        idx = torch.as_tensor([int(i) for i in batch], dtype=torch.long)
        keys = (self.seed, 2 ** 62, worker + 1, self._calls)
        return idx, torch.arange(len(idx)), len(idx), batch_generator(*keys), batch_generator(*keys, _LOCAL_STREAM)

    def _take(self, images, rows: torch.Tensor):
        """The rows of ``images`` the transform takes: a uint8 batch, or images one by one (per-image transforms)."""
        return take_images(images, rows, per_sample=getattr(self.transform, "per_sample", False))

    def _transform(self, images, slots: torch.Tensor, global_size: int, generator,
                   per_slot: int = 1) -> torch.Tensor:
        """Transform ``images`` (len(slots) * per_slot rows, slot-major) with parameters drawn for the global batch."""
        if not self.transform.is_random:
            return self.transform.apply(images)
        params = self.transform.sample_params(global_size * per_slot, generator)
        rows = (slots[:, None] * per_slot + torch.arange(per_slot)).flatten()
        return self.transform.apply(images, {k: v[rows] for k, v in params.items()})

    def _gather(self, batch):
        idx, slots, global_size, g_global, g_local = self._resolve(batch)
        if self._corrupted:
            x = self.images.model_input(idx, self.transform)
        else:
            x = self._transform(self._take(self.images, idx), slots, global_size, g_global)
        return idx, slots, global_size, g_global, g_local, x

    def __call__(self, batch) -> Dict[str, torch.Tensor]:
        idx, _, _, _, _, x = self._gather(batch)
        return {"pixel_values": x, "labels": self.labels[idx], "index": idx}


class CSMCollator(ImageCollator):
    """Real batch plus CSM companions (:class:`~timm_csm.data.csm.CSMCompanionSampler`), both through the same
    ``transform``, as the reference applies the real-image train transform to generated images too.

    Output adds ``mix_pixel_values`` (B*(1+n_aug), C, S, S), sample-major (the endpoint of sample 0, its interior
    members, then sample 1, ...) and ``mix_targets`` (B*(1+n_aug), K), the annotated soft labels.
    """

    def __init__(self, images, labels, transform: BatchTransform, companions: CSMCompanionSampler, seed: int = 0):
        super().__init__(images, labels, transform, seed)
        if len(self.labels) and int(self.labels.max()) >= companions.num_classes:
            raise ValueError(f"real labels reach {int(self.labels.max())}, the CSM data has "
                             f"{companions.num_classes} classes")
        self.companions = companions

    def __call__(self, batch) -> Dict[str, torch.Tensor]:
        idx, slots, global_size, g, _, x = self._gather(batch)
        y = self.labels[idx]
        u_group, u_interior = self.companions.draw_uniforms(global_size, g)
        rows = self.companions.select(y, u_group[slots], u_interior[slots]).flatten()
        groups = self.companions.groups
        mix = self._transform(self._take(groups.images, rows), slots, global_size, g,
                              per_slot=self.companions.per_sample)
        return {"pixel_values": x, "labels": y, "index": idx, "mix_pixel_values": mix,
                "mix_targets": groups.soft_labels[rows]}


def _beta(alpha: float, size, generator: torch.Generator) -> torch.Tensor:
    """Beta(alpha, alpha) draws from a numpy Generator seeded by ``generator`` (torch has no seeded Beta)."""
    seed = int(torch.randint(0, 2 ** 62, (1,), generator=generator))
    return torch.from_numpy(np.random.default_rng(seed).beta(alpha, alpha, size=size)).float()


class _MixCollatorBase(ImageCollator):
    def __init__(self, images, labels, transform, num_classes: int, alpha: float, seed: int = 0):
        super().__init__(images, labels, transform, seed)
        if alpha <= 0:
            raise ValueError(f"alpha must be > 0, got {alpha}")
        if num_classes < 1 or (len(self.labels) and int(self.labels.max()) >= num_classes):
            raise ValueError(f"labels must lie in [0, {num_classes})")
        self.alpha = float(alpha)
        self.num_classes = int(num_classes)

    def _mix(self, x, y, lam, generator):
        """x~ = lam x + (1 - lam) x[perm], targets likewise; perm a random permutation of the local batch."""
        perm = torch.randperm(len(x), generator=generator)
        lam_x = lam.view(-1, 1, 1, 1) if lam.ndim else lam
        mixed = lam_x * x + (1.0 - lam_x) * x[perm]
        return mixed, mix_soft_targets(y, perm, lam, self.num_classes, getattr(self, "smoothing", 0.0))


class MixupCollator(_MixCollatorBase):
    """Mixup (Zhang et al., ICLR 2018): train on x~ = lam x_i + (1 - lam) x_pi(i) with targets
    lam y_i + (1 - lam) y_pi(i), lam ~ Beta(alpha, alpha), pi a random permutation of the batch (any batch size,
    odd included). ``mode="batch"`` draws one lam per batch (the calibration references), ``"elem"`` one per
    sample. ``smoothing`` adds label smoothing to the one-hots (0 by default, unlike timm's Mixup).
    Use with a soft-target loss (soft cross-entropy)."""

    def __init__(self, images, labels, transform, num_classes: int, alpha: float = 1.0, mode: str = "batch",
                 smoothing: float = 0.0, seed: int = 0):
        super().__init__(images, labels, transform, num_classes, alpha, seed)
        if mode not in ("batch", "elem"):
            raise ValueError(f"mode must be 'batch' or 'elem', got {mode!r}")
        if not 0.0 <= smoothing < 1.0:
            raise ValueError(f"smoothing must lie in [0, 1), got {smoothing}")
        self.mode = mode
        self.smoothing = float(smoothing)

    def __call__(self, batch):
        idx, _, _, _, g_local, x = self._gather(batch)
        y = self.labels[idx]
        lam = _beta(self.alpha, len(x) if self.mode == "elem" else 1, g_local)
        lam = lam if self.mode == "elem" else lam.expand(len(x))
        mixed, targets = self._mix(x, y, lam, g_local)
        return {"pixel_values": mixed, "labels": targets, "lam": lam, "index": idx}


class RegMixupCollator(_MixCollatorBase):
    """RegMixup (Pinto et al., NeurIPS 2022): the clean batch plus one mixed copy used as a regulariser,
    lam ~ Beta(alpha, alpha) with large alpha (20 for CIFAR-10, 10 for CIFAR-100), one lam per batch as the
    reference. The objective is :func:`timm_csm.losses.regmixup_objective`, (CE(f(x), y) + eta CE(f(x~), y~)) / 2
    by default, the released code's mean over the concatenated batch."""

    def __init__(self, images, labels, transform, num_classes: int, alpha: float = 20.0, seed: int = 0):
        super().__init__(images, labels, transform, num_classes, alpha, seed)

    def __call__(self, batch):
        idx, _, _, _, g_local, x = self._gather(batch)
        y = self.labels[idx]
        lam = _beta(self.alpha, 1, g_local).expand(len(x))
        mixed, targets = self._mix(x, y, lam, g_local)
        return {"pixel_values": x, "labels": y, "index": idx, "mix_pixel_values": mixed, "mix_targets": targets,
                "lam": lam}


class RankMixupCollator(_MixCollatorBase):
    """RankMixup (Noh et al., ICCV 2023): the clean batch plus ``num_mixup`` mixed copies, copy q using one
    lam_q ~ Beta(alpha, alpha) for the whole batch and a fresh permutation. MRL uses one copy, M-NDCG three.

    ``mix_pixel_values`` is copy-major: rows q*B .. (q+1)*B - 1 are copy q; ``lam`` holds the M values lam_q.
    """

    def __init__(self, images, labels, transform, num_classes: int, alpha: float = 2.0, num_mixup: int = 1,
                 seed: int = 0):
        super().__init__(images, labels, transform, num_classes, alpha, seed)
        if num_mixup < 1:
            raise ValueError(f"num_mixup must be >= 1, got {num_mixup}")
        self.num_mixup = int(num_mixup)

    def __call__(self, batch):
        idx, _, _, _, g_local, x = self._gather(batch)
        y = self.labels[idx]
        lams = _beta(self.alpha, self.num_mixup, g_local)
        mixed, targets = zip(*(self._mix(x, y, lams[q], g_local) for q in range(self.num_mixup)))
        return {"pixel_values": x, "labels": y, "index": idx, "mix_pixel_values": torch.cat(mixed),
                "mix_targets": torch.cat(targets), "lam": lams}


class TimmMixupCollator(ImageCollator):
    """timm's ``Mixup`` (Mixup and CutMix, per batch / pair / element, with switching and label smoothing, as timm's
    ``--mixup`` / ``--cutmix``) on the transformed local batch. ``Mixup`` draws from numpy's global generator: it is
    seeded from the batch's local generator and restored afterwards, so batches stay seeded. timm pairs each image
    with its mirror in the batch, so the local batch size must be even."""

    def __init__(self, images, labels, transform, mixup_fn, seed: int = 0):
        super().__init__(images, labels, transform, seed)
        self.mixup_fn = mixup_fn

    def __call__(self, batch):
        idx, _, _, _, g_local, x = self._gather(batch)
        if len(x) % 2:
            raise ValueError(f"timm's Mixup / CutMix pairs images within a batch: the batch of {len(x)} must be even")
        with preserved_global_rng():
            seed_global_rng(int(torch.randint(0, 2 ** 62, (1,), generator=g_local)))
            mixed, targets = self.mixup_fn(x, self.labels[idx])
        return {"pixel_values": mixed, "labels": targets, "index": idx}
