"""Class prototypes: the mean encoder feature of each class over the real training images.

    p_k = (1 / n_k) * sum_{i : y_i = k} f(x_i)

Features are streamed in batches and summed in float64 (one (K, D) accumulator, never all N features), and the
result is cached as safetensors keyed by the encoder identity and a fingerprint of the images and labels. A cache
file that does not read (truncated, half-copied, foreign) is named in the log and computed again.

Choosing s on held-out real images (:func:`prototypes_and_held_out`) needs the features of the held-out share and the
class means of the rest: the same pass over the real images gives them, so each real image is encoded once.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, List, Optional, Tuple

import numpy as np
import torch

from ..data import ImageArrays
from ..io import save_safetensors_atomic
from .cache import dataset_fingerprint, load_cache
from .encoders import ImageEncoder, encode_images

__all__ = ["ClassPrototypes", "HeldOutFeatures", "compute_prototypes", "prototypes_and_held_out",
           "load_or_compute_prototypes"]


@dataclass
class ClassPrototypes:
    """(K, D) float64 class means with their counts and provenance."""

    means: torch.Tensor
    counts: torch.Tensor
    class_names: List[str]
    encoder: str = ""
    dataset: str = ""
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.means.ndim != 2 or self.means.shape[0] != len(self.class_names):
            raise ValueError(f"means must be (K={len(self.class_names)}, D), got {tuple(self.means.shape)}")
        if self.counts.shape != (len(self.class_names),):
            raise ValueError(f"counts must have shape ({len(self.class_names)},), got {tuple(self.counts.shape)}")

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def save(self, path) -> None:
        """Write safetensors atomically (tensors ``means`` float64, ``counts`` int64; the rest as metadata)."""
        meta = {"class_names": json.dumps(self.class_names), "encoder": self.encoder, "dataset": self.dataset,
                "extra": json.dumps(self.extra)}
        save_safetensors_atomic(path, {"means": self.means.contiguous(), "counts": self.counts.contiguous()}, meta)

    @classmethod
    def load(cls, path) -> "ClassPrototypes":
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            means, counts = f.get_tensor("means"), f.get_tensor("counts")
        return cls(means, counts, json.loads(meta["class_names"]), meta.get("encoder", ""), meta.get("dataset", ""),
                   json.loads(meta.get("extra", "{}")))


@dataclass
class HeldOutFeatures:
    """What s is chosen on, from the prototypes' encoding pass: the (M, D) float32 features and (M,) labels of the
    held-out real images, and the (K, D) float64 class means of the remaining ones (the images the encoder may have
    been fitted on)."""

    features: torch.Tensor
    labels: np.ndarray
    fit_means: torch.Tensor


def _class_means(sums: torch.Tensor, labels: torch.Tensor, class_names: List[str]) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(means, counts)`` from float64 per-class sums; a class without an image is an error."""
    counts = torch.bincount(labels, minlength=len(class_names))
    empty = [class_names[i] for i in range(len(class_names)) if counts[i] == 0]
    if empty:
        raise ValueError(f"classes without any training image have no prototype: {empty[:10]}")
    return sums.cpu() / counts[:, None].to(torch.float64), counts


def _encode_pass(encoder: ImageEncoder, data: ImageArrays, held_out: Optional[np.ndarray], sum_all: bool,
                 batch_size: int, progress: bool) -> Tuple[Optional[ClassPrototypes], Optional[HeldOutFeatures]]:
    """One pass of ``encoder`` over ``data.images`` in batches of ``batch_size`` rows. With ``sum_all``: the
    prototypes of all of ``data``. With ``held_out`` (row indices): the :class:`HeldOutFeatures` of those rows and
    the class means of the others. Each class sum adds its rows in row order in float64."""
    if len(data) == 0:
        raise ValueError("no images to compute prototypes from")
    labels = torch.from_numpy(np.asarray(data.labels, dtype=np.int64))
    fit_mask = None
    if held_out is not None:
        fit_mask = np.ones(len(data), dtype=bool)
        fit_mask[held_out] = False
    state = {"all": None, "fit": None, "held": []}

    def accumulate(key: str, f: torch.Tensor, rows_labels: torch.Tensor) -> None:
        if state[key] is None:
            state[key] = torch.zeros(data.num_classes, f.shape[1], dtype=torch.float64, device=f.device)
        state[key].index_add_(0, rows_labels.to(f.device), f)

    def add(feats: torch.Tensor, rows: slice) -> None:
        f = feats.to(torch.float64)
        if sum_all:
            accumulate("all", f, labels[rows])
        if fit_mask is not None:
            fit = torch.from_numpy(fit_mask[rows])
            accumulate("fit", f[fit.to(f.device)], labels[rows][fit])
            state["held"].append(feats[~fit.to(feats.device)].cpu())

    encode_images(encoder, data.images, batch_size=batch_size, progress=progress, desc="real images", reduce=add)
    protos = held = None
    if sum_all:
        means, counts = _class_means(state["all"], labels, list(data.class_names))
        protos = ClassPrototypes(means, counts, list(data.class_names), encoder.identity, dataset_fingerprint(data))
    if fit_mask is not None:
        fit_means, _ = _class_means(state["fit"], labels[torch.from_numpy(fit_mask)], list(data.class_names))
        held = HeldOutFeatures(torch.cat(state["held"]), np.asarray(data.labels)[held_out], fit_means)
    return protos, held


def compute_prototypes(encoder: ImageEncoder, data: ImageArrays, batch_size: int = 256,
                       progress: bool = True) -> ClassPrototypes:
    """Class means of ``encoder`` features over ``data`` (float64 running sums per class)."""
    return _encode_pass(encoder, data, None, True, batch_size, progress)[0]


def _cache_key(encoder: ImageEncoder, data: ImageArrays) -> str:
    digest = hashlib.sha256(f"{encoder.identity}|{dataset_fingerprint(data)}".encode()).hexdigest()[:20]
    return f"prototypes-{data.source or 'data'}-{encoder.kind}-{digest}.safetensors"


def prototypes_and_held_out(encoder: ImageEncoder, data: ImageArrays, held_out: Optional[np.ndarray] = None,
                            cache_dir=None, batch_size: int = 256, progress: bool = True,
                            log: Callable[[str], None] = print) -> Tuple[ClassPrototypes, Optional[HeldOutFeatures]]:
    """The prototypes of all of ``data`` and, with ``held_out`` (row indices), the :class:`HeldOutFeatures` of
    those rows, from one encoding pass over ``data``: each real image is encoded once.

    The prototypes come from ``cache_dir`` when computed before with the same encoder and data (then the pass, if
    any, only serves the held-out rows), else from the pass, and are cached. ``cache_dir`` defaults to
    ``$TIMM_CSM_CACHE`` or ``~/.cache/timm_csm``. A damaged cache file is named through ``log`` and replaced.
    """
    if cache_dir is None:
        cache_dir = os.environ.get("TIMM_CSM_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "timm_csm"))
    path = Path(cache_dir) / "prototypes" / _cache_key(encoder, data)
    protos = None
    if path.exists():
        protos = load_cache(lambda: ClassPrototypes.load(path), f"prototype cache {path}", log)
        if protos is not None and (protos.encoder != encoder.identity or protos.dataset != dataset_fingerprint(data)):
            protos = None
    if protos is not None and held_out is None:
        return protos, None
    computed, held = _encode_pass(encoder, data, held_out, protos is None, batch_size, progress)
    if protos is None:
        protos = computed
        protos.save(path)
    return protos, held


def load_or_compute_prototypes(encoder: ImageEncoder, data: ImageArrays, cache_dir=None, batch_size: int = 256,
                               progress: bool = True, log: Callable[[str], None] = print) -> ClassPrototypes:
    """Prototypes from ``cache_dir`` when computed before with the same encoder and data, else computed and cached
    (:func:`prototypes_and_held_out` without held-out rows)."""
    return prototypes_and_held_out(encoder, data, None, cache_dir, batch_size, progress, log)[0]
