"""What the annotation caches share: the fingerprint of a real dataset, and reading a cached file that may be damaged.

A cache file that does not read (truncated, half-copied, foreign) is named in the log and built again, never an
error and never silently trusted.
"""
from __future__ import annotations

import json
from typing import Callable, Optional, TypeVar

from ..data import ImageArrays
from ..data.arrays import images_labels_hash

__all__ = ["load_cache", "dataset_fingerprint"]

T = TypeVar("T")


def _cache_errors() -> tuple:
    import pickle

    from safetensors import SafetensorError

    # a damaged file: truncated safetensors (SafetensorError), unreadable (OSError), bad JSON (ValueError), a missing
    # tensor or key (KeyError), a truncated torch.save file (RuntimeError, EOFError, UnpicklingError), weights of
    # another shape (RuntimeError from load_state_dict)
    return SafetensorError, OSError, ValueError, KeyError, RuntimeError, EOFError, pickle.UnpicklingError


def load_cache(load: Callable[[], T], what: str, log: Callable[[str], None] = print) -> Optional[T]:
    """``load()``, or None after logging ``what`` as damaged when reading the cached file fails; the caller then
    builds the cache again."""
    try:
        return load()
    except _cache_errors() as e:
        log(f"{what} is damaged ({type(e).__name__}: {e}); building it again")
        return None


def dataset_fingerprint(data: ImageArrays) -> str:
    """``<source>-<sha256 of images, labels and class names, 16 hex>``."""
    h = images_labels_hash(data.images, data.labels)
    h.update(json.dumps(list(data.class_names)).encode())
    return f"{data.source or 'data'}-{h.hexdigest()[:16]}"
