"""The global group plan of semantic mixing (CSM spec section 2.3).

Group ``g`` takes the unordered class pair number ``g mod K(K-1)/2`` in lexicographic order
((0, 1), (0, 2), ..., (K-2, K-1)) and the seed ``seed_offset + g``. Every member of a group starts from the same
noise, drawn from that seed, and differs only in its condition ``lambda * e_a + (1 - lambda) * e_b`` over the lambda
grid. The plan depends on nothing but (K, number of groups, seed offset), so the output is the same for any number
of processes or batch size.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence, Tuple

import torch

from .config import DEFAULTS

__all__ = ["Group", "class_pair", "num_class_pairs", "plan_groups", "lambda_grid", "group_noise"]


@dataclass(frozen=True)
class Group:
    group_id: int
    seed: int
    class_a: int
    class_b: int


def num_class_pairs(num_classes: int) -> int:
    return num_classes * (num_classes - 1) // 2


def class_pair(index: int, num_classes: int) -> Tuple[int, int]:
    """The ``index``-th unordered pair (a < b) in lexicographic order, wrapping around after K(K-1)/2 pairs."""
    if num_classes < 2:
        raise ValueError(f"semantic mixing needs at least 2 classes, got {num_classes}")
    index %= num_class_pairs(num_classes)
    a = 0
    while index >= num_classes - 1 - a:  # row a holds the K-1-a pairs (a, a+1) ... (a, K-1)
        index -= num_classes - 1 - a
        a += 1
    return a, a + 1 + index


def plan_groups(num_classes: int, num_groups: int, seed_offset: int = 0, start: int = 0) -> List[Group]:
    """Groups ``start .. num_groups - 1`` of the global plan."""
    if num_groups < 0 or start < 0:
        raise ValueError("num_groups and start must be non-negative")
    return [Group(g, seed_offset + g, *class_pair(g, num_classes)) for g in range(start, num_groups)]


def lambda_grid(num_lambdas: int = DEFAULTS.num_lambdas, lambdas: Sequence[float] = None) -> List[float]:
    """The lambda grid: ``linspace(0, 1, num_lambdas)`` by default (the paper: 8 values with both endpoints)."""
    if lambdas is None:
        if num_lambdas < 2:
            raise ValueError(f"a lambda grid needs at least 2 values, got {num_lambdas}")
        lambdas = torch.linspace(0, 1, num_lambdas, dtype=torch.float64).tolist()
    lambdas = [float(v) for v in lambdas]
    bad = [v for v in lambdas if not 0.0 <= v <= 1.0]
    if bad:
        raise ValueError(f"lambda values must lie in [0, 1], got {bad}")
    if len(set(lambdas)) != len(lambdas):
        raise ValueError(f"lambda grid has repeated values: {lambdas}")
    return lambdas


def group_noise(seed: int, shape: Sequence[int]) -> torch.Tensor:
    """The starting noise of a group: standard normal from ``torch.Generator().manual_seed(seed)`` on the CPU."""
    return torch.randn(tuple(shape), generator=torch.Generator().manual_seed(int(seed)))
