"""Real anchors of real-anchored semantic mixing.

In the paper's mode every group starts from pure noise. In the real-anchored mode a group starts from one real
training image of one of its two classes, noised to strength t with the group's own noise (SDEdit), and every member
of the group is denoised from there under its mixed condition. The anchor of a group depends only on the group's
seed and the pool's labels, so it is the same for any number of processes, batch size or restart.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Sequence

import numpy as np
import torch

from ..data.arrays import images_labels_hash
from .plan import Group
from .training import to_model_range

__all__ = ["AnchorPool"]

# keeps the anchor draw independent of the group's noise, which is drawn from the bare seed
_ANCHOR_SALT = 0x5EED_A1C4


@dataclass
class AnchorPool:
    """Real images a group may start from: uint8 ``images`` (N, C, H, W), int ``labels`` (N,), and ``source`` (what
    they are, e.g. dataset, split and selection) for the provenance of the generated set."""

    images: torch.Tensor
    labels: np.ndarray
    source: Dict = field(default_factory=dict)

    def __post_init__(self):
        self.images = torch.as_tensor(self.images)
        self.labels = np.asarray(self.labels).astype(np.int64)
        if self.images.dtype != torch.uint8 or self.images.ndim != 4:
            raise ValueError(f"anchor images must be uint8 (N, C, H, W), got {self.images.dtype} "
                             f"{tuple(self.images.shape)}")
        if self.labels.shape != (self.images.shape[0],):
            raise ValueError(f"{self.labels.shape[0] if self.labels.ndim else 0} anchor labels for "
                             f"{self.images.shape[0]} images")
        self._by_class = {int(c): np.flatnonzero(self.labels == c) for c in np.unique(self.labels)}

    def __len__(self) -> int:
        return int(self.images.shape[0])

    def fingerprint(self) -> str:
        """sha256 (16 hex digits) of the images and labels: a plan made with another pool is refused on restart."""
        return images_labels_hash(self.images.numpy(), self.labels).hexdigest()[:16]

    def describe(self) -> Dict:
        """The provenance recorded in the generation plan."""
        return {**self.source, "num_images": len(self), "fingerprint": self.fingerprint()}

    def index_for(self, group: Group) -> int:
        """The pool row group ``group`` starts from: class a or b with probability 1/2 each, then a uniform row of
        that class, both drawn from a generator seeded by the group's seed."""
        g = torch.Generator().manual_seed((int(group.seed) * 2654435761 + _ANCHOR_SALT) % (2 ** 63))
        side = int(torch.randint(2, (1,), generator=g))
        cls = (group.class_a, group.class_b)[side]
        rows = self._by_class.get(int(cls))
        if rows is None or len(rows) == 0:
            raise ValueError(f"group {group.group_id}: the anchor pool has no image of class {cls}")
        return int(rows[int(torch.randint(len(rows), (1,), generator=g))])

    def images_for(self, groups: Sequence[Group]) -> torch.Tensor:
        """The anchors of ``groups`` as float (G, C, H, W) in [-1, 1], the generator's input range."""
        idx = torch.tensor([self.index_for(g) for g in groups])
        return to_model_range(self.images[idx])
