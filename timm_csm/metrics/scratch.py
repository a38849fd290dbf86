"""Scratch memory kept between calls: the metrics' block of working values and the classwise totals' float64
copies are written on every call, and fresh memory of that size is paged in again each time."""
from __future__ import annotations

import threading

import torch

__all__ = ["scratch"]


def scratch(numel: int, dtype: torch.dtype, device, purpose: str = "block") -> torch.Tensor:
    """Scratch memory of at least ``numel`` values, kept per thread and ``purpose`` between calls on the CPU (up to
    ``_SCRATCH_KEEP`` values): a fresh block of a few megabytes is paged in on every call (its first writes fault,
    about a microsecond a page, a large share of a small evaluation); accelerators' allocators keep theirs anyway."""
    device = torch.device(device)
    if device.type != "cpu" or numel > _SCRATCH_KEEP:
        return torch.empty(numel, dtype=dtype, device=device)
    kept = _SCRATCH.__dict__.setdefault(purpose, {})
    buf = kept.get(dtype)
    if buf is None or buf.numel() < numel:
        buf = kept[dtype] = torch.empty(numel, dtype=dtype)
    return buf


_SCRATCH = threading.local()
_SCRATCH_KEEP = 1 << 21
