"""Deterministic seed derivation for batch-level randomness.

Each batch draws its randomness from a fresh ``torch.Generator`` seeded by (run seed, epoch, step, ...), so the
random crops, flips and CSM companions of a batch are the same whatever the number of DataLoader workers, and a
resumed run replays exactly the batches an uninterrupted one would have seen.
"""
from __future__ import annotations

import contextlib
import random

import numpy as np
import torch

__all__ = ["derive_seed", "batch_generator", "preserved_global_rng", "seed_global_rng"]


def derive_seed(*keys: int) -> int:
    """A 63-bit seed that depends on every key (numpy's SeedSequence hash; no global random state is touched)."""
    entropy = [int(k) % (2 ** 63) for k in keys]
    return int(np.random.SeedSequence(entropy).generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


def batch_generator(*keys: int) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded with :func:`derive_seed` of ``keys``."""
    return torch.Generator().manual_seed(derive_seed(*keys))


@contextlib.contextmanager
def preserved_global_rng():
    """Restore the global ``random``, ``numpy`` and torch CPU generators on exit: code that draws from them (timm's
    transforms and ``Mixup``) can be seeded per sample or per batch without moving the training process's own
    random state."""
    py, npy, th = random.getstate(), np.random.get_state(), torch.random.get_rng_state()
    try:
        yield
    finally:
        random.setstate(py)
        np.random.set_state(npy)
        torch.random.set_rng_state(th)


def seed_global_rng(seed: int) -> None:
    """Seed the global ``random``, ``numpy`` and torch CPU generators (CUDA's stay the run's) with ``seed``."""
    random.seed(seed)
    np.random.seed(seed % 2 ** 32)
    torch.random.default_generator.manual_seed(seed)
