"""Deterministic seed derivation for batch-level randomness.

Each batch draws its randomness from a fresh ``torch.Generator`` seeded by (run seed, epoch, step, ...), so the
random crops, flips and CSM companions of a batch are the same whatever the number of DataLoader workers, and a
resumed run replays exactly the batches an uninterrupted one would have seen.
"""
from __future__ import annotations

import numpy as np
import torch

__all__ = ["derive_seed", "batch_generator"]


def derive_seed(*keys: int) -> int:
    """A 63-bit seed that depends on every key (numpy's SeedSequence hash; no global random state is touched)."""
    entropy = [int(k) % (2 ** 63) for k in keys]
    return int(np.random.SeedSequence(entropy).generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


def batch_generator(*keys: int) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded with :func:`derive_seed` of ``keys``."""
    return torch.Generator().manual_seed(derive_seed(*keys))
