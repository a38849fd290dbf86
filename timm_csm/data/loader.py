"""Index-based data loading for in-memory image arrays, sharded across processes by global batches.

The DataLoader carries only *references* (:class:`SampleRef`: the sample index, the epoch, the global step and
the position of the sample in its global batch); the collators gather the uint8 images and draw the batch's
randomness from a generator keyed by (seed, epoch, step). Process ``r`` of ``R`` takes positions
``r*B .. (r+1)*B - 1`` of every global batch of ``R*B`` samples, so with per-process batch B the union of the
processes' batches is exactly the single-process batch of size R*B, with the same augmentations and companions.
"""
from __future__ import annotations

from typing import Iterator, List, NamedTuple

import torch
from torch.utils.data import Dataset, Sampler

from .seeding import derive_seed

__all__ = ["SampleRef", "IndexDataset", "GlobalBatchSampler"]


class SampleRef(NamedTuple):
    """A sample of a global batch: its dataset ``index``, ``epoch``, ``step`` (global batch number), ``slot``
    (position in the global batch) and ``global_size`` (samples in the global batch)."""

    index: int
    epoch: int
    step: int
    slot: int
    global_size: int


class IndexDataset(Dataset):
    """A map-style dataset of ``length`` items that returns what it is indexed with (an int or a SampleRef);
    the collator does the loading."""

    def __init__(self, length: int):
        self.length = int(length)

    def __len__(self) -> int:
        return self.length

    def _check(self, ref):
        i = ref.index if isinstance(ref, SampleRef) else int(ref)
        if not 0 <= i < self.length:
            raise IndexError(f"index {i} out of range for {self.length} samples")
        return ref

    def __getitem__(self, ref):
        return self._check(ref)

    def __getitems__(self, refs):
        return [self._check(r) for r in refs]


class GlobalBatchSampler(Sampler[List[SampleRef]]):
    """Batch sampler yielding this process's share of each global batch.

    Args:
        num_samples: dataset size N.
        batch_size: per-process batch size B (timm convention); a global batch holds ``num_replicas * B``.
        num_replicas, rank: process count and this process's rank.
        shuffle: a fresh permutation each epoch from ``derive_seed(seed, epoch)``; else sequential order.
        drop_last: drop a final incomplete global batch. Otherwise it is split as evenly as possible and
            processes short of samples repeat samples from the start of the epoch (as DistributedSampler does),
            so every process runs the same number of steps.
    """

    def __init__(self, num_samples: int, batch_size: int, num_replicas: int = 1, rank: int = 0,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = True):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} out of range for {num_replicas} processes")
        self.num_samples = int(num_samples)
        self.batch_size = int(batch_size)
        self.num_replicas = int(num_replicas)
        self.rank = int(rank)
        self.shuffle = shuffle
        self.seed = int(seed)
        self.drop_last = drop_last
        self.epoch = 0
        if drop_last and self.num_samples < self.global_batch_size:
            raise ValueError(f"{self.num_samples} samples cannot fill one global batch of {self.global_batch_size} "
                             f"({self.num_replicas} x {self.batch_size}); lower the batch size")

    @property
    def global_batch_size(self) -> int:
        return self.batch_size * self.num_replicas

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        full, rest = divmod(self.num_samples, self.global_batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def order(self) -> torch.Tensor:
        """The epoch's sample order (a permutation when shuffling)."""
        if self.shuffle:
            g = torch.Generator().manual_seed(derive_seed(self.seed, self.epoch))
            return torch.randperm(self.num_samples, generator=g)
        return torch.arange(self.num_samples)

    def __iter__(self) -> Iterator[List[SampleRef]]:
        order = self.order().tolist()
        gb = self.global_batch_size
        for step in range(len(self)):
            chunk = order[step * gb:(step + 1) * gb]
            share = self.batch_size
            if len(chunk) < gb:  # final partial global batch: equal shares, topped up from the epoch start
                share = -(-len(chunk) // self.num_replicas)
                chunk = chunk + order[:self.num_replicas * share - len(chunk)]
            lo = self.rank * share
            yield [SampleRef(chunk[s], self.epoch, step, s, len(chunk)) for s in range(lo, lo + share)]
