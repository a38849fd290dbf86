"""Class prototypes: the mean encoder feature of each class over the real training images.

    p_k = (1 / n_k) * sum_{i : y_i = k} f(x_i)

Features are streamed in batches and summed in float64 (one (K, D) accumulator, never all N features), and the
result is cached as safetensors keyed by the encoder identity and a fingerprint of the images and labels. A cache
file that does not read (truncated, half-copied, foreign) is named in the log and computed again.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, List

import numpy as np
import torch

from ..data import ImageArrays
from ..io import save_safetensors_atomic
from .cache import dataset_fingerprint, load_cache
from .encoders import ImageEncoder, encode_images

__all__ = ["ClassPrototypes", "compute_prototypes", "load_or_compute_prototypes"]


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


def compute_prototypes(encoder: ImageEncoder, data: ImageArrays, batch_size: int = 256,
                       progress: bool = True) -> ClassPrototypes:
    """Class means of ``encoder`` features over ``data`` (float64 running sums per class)."""
    if len(data) == 0:
        raise ValueError("no images to compute prototypes from")
    labels = torch.from_numpy(np.asarray(data.labels, dtype=np.int64))
    k = data.num_classes
    state = {}

    def add(feats: torch.Tensor, rows: slice) -> None:
        f = feats.to(torch.float64)
        if "sums" not in state:
            state["sums"] = torch.zeros(k, f.shape[1], dtype=torch.float64, device=f.device)
        state["sums"].index_add_(0, labels[rows].to(f.device), f)

    encode_images(encoder, data.images, batch_size=batch_size, progress=progress, desc="prototypes", reduce=add)
    counts = torch.bincount(labels, minlength=k)
    empty = [data.class_names[i] for i in range(k) if counts[i] == 0]
    if empty:
        raise ValueError(f"classes without any training image have no prototype: {empty[:10]}")
    means = (state["sums"].cpu() / counts[:, None].to(torch.float64))
    return ClassPrototypes(means, counts, list(data.class_names), encoder.identity, dataset_fingerprint(data))


def _cache_key(encoder: ImageEncoder, data: ImageArrays) -> str:
    digest = hashlib.sha256(f"{encoder.identity}|{dataset_fingerprint(data)}".encode()).hexdigest()[:20]
    return f"prototypes-{data.source or 'data'}-{encoder.kind}-{digest}.safetensors"


def load_or_compute_prototypes(encoder: ImageEncoder, data: ImageArrays, cache_dir=None, batch_size: int = 256,
                               progress: bool = True, log: Callable[[str], None] = print) -> ClassPrototypes:
    """Prototypes from ``cache_dir`` when computed before with the same encoder and data, else computed and cached.

    ``cache_dir`` defaults to ``$TIMM_CSM_CACHE`` or ``~/.cache/timm_csm``. A damaged cache file is named through
    ``log`` and replaced.
    """
    if cache_dir is None:
        cache_dir = os.environ.get("TIMM_CSM_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "timm_csm"))
    path = Path(cache_dir) / "prototypes" / _cache_key(encoder, data)
    if path.exists():
        protos = load_cache(lambda: ClassPrototypes.load(path), f"prototype cache {path}", log)
        if protos is not None and protos.encoder == encoder.identity and protos.dataset == dataset_fingerprint(data):
            return protos
    protos = compute_prototypes(encoder, data, batch_size=batch_size, progress=progress)
    protos.save(path)
    return protos
