"""CSM companions: for each real image of class y, generated images from a semantic-mixing group containing y.

Luo et al., "Beyond One-Hot Labels: Semantic Mixing for Model Calibration" (ICML 2025), training data section
(official ``ImageCalibDatasetMultiAug``): a *group* is the set of images generated from one seed and one class
pair (a, b) along the mixing grid lambda in linspace(0, 1, S). Members are sorted by their annotated soft label,
most a-like first (we sort by q_a - q_b, which is the reference's order by q_a when the soft label has two
non-zeros). For a real sample of class y:

1. draw a group uniformly among the complete groups that contain y (as a or b);
2. take the member most like y: position 0 when y == a, position S - 1 otherwise;
3. add ``n_aug`` distinct members drawn uniformly from the interior positions 1 .. S - 2.

Each chosen image carries its annotated soft label (K values) as target. The draw is O(1) per sample: a flat
class -> groups table with per-class offsets and counts, no rejection loop. Groups with fewer than S members
(S = the largest group size) are left out, as the reference keeps only groups with all members. Duplicates are
errors naming the group, never a reason to leave groups out: a member held twice (its ``lambda_gen`` repeated), or
two groups under one ``group_id``.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

from .csm_format import REQUIRED_CSM_COLUMNS, check_class_names, check_soft_labels
from .lazy import ArrowImages, LazyImages, column_arrays

__all__ = ["CSMGroups", "CSMCompanionSampler"]


def _class_names_of(ds) -> Optional[List[str]]:
    for column in ("label", "class_a", "class_b"):
        feature = ds.features.get(column) if hasattr(ds, "features") else None
        names = getattr(feature, "names", None)
        if names:
            return list(names)
    return None


def _image_keys(images) -> np.ndarray:
    """(M, k) uint8 rows that are equal when two images are: the pixels of in-memory images, the sha256 of the
    encoded file of lazily read ones (read in chunks, never decoded)."""
    if not isinstance(images, ArrowImages):
        return images.reshape(len(images), -1).numpy()
    import hashlib

    import datasets

    ds = images.ds.cast_column(images.column, datasets.Image(decode=False)).select(images.rows)
    keys = []
    for batch in ds.iter(batch_size=4096):
        for cell in batch[images.column]:
            data = cell.get("bytes") or open(cell["path"], "rb").read()
            keys.append(np.frombuffer(hashlib.sha256(data).digest(), dtype=np.uint8))
    return np.stack(keys)


def _check_duplicate_rows(images, q: torch.Tensor, gid: torch.Tensor, lambda_gen) -> None:
    """ValueError naming the first group that holds a member twice: its ``lambda_gen`` repeated when given, else an
    identical (image, soft label) row."""
    m = len(gid)
    gid_np = gid.numpy()
    if lambda_gen is not None:
        lam = np.round(np.asarray(lambda_gen, dtype=np.float64) * 1e6).astype(np.int64)
        if lam.shape != (m,):
            raise ValueError(f"lambda_gen must have shape ({m},), got {lam.shape}")
        key, what = np.stack([gid_np, lam], 1), "lambda_gen"
    else:
        key = np.concatenate([gid_np.astype("<i8").view(np.uint8).reshape(m, 8), _image_keys(images),
                              q.numpy().astype("<f4").view(np.uint8).reshape(m, -1)], 1)
        what = "image and soft label"
    _, first, counts = np.unique(key, axis=0, return_index=True, return_counts=True)
    repeated = first[counts > 1]
    if len(repeated):
        i = int(repeated.min())
        value = f" {lam[i] / 1e6:g}" if lambda_gen is not None else ""
        g = int(gid_np[i])
        raise ValueError(f"group {g} holds the same {what}{value} {int(counts[first == i][0])} times: its rows are "
                         f"duplicated or two groups share group_id {g} ({int((counts - 1).sum())} duplicate row(s) "
                         f"in {len(repeated)} place(s)); keep each member once, one group_id per group")


def _group_size(uniq: torch.Tensor, counts: torch.Tensor, lambda_known: bool) -> int:
    """The group size S. With ``lambda_gen`` known, repeated members are caught before and S is the largest count
    (the grid). Without it S is the most common count, and a group with more members is an error naming it (two
    groups under one ``group_id``). Groups with fewer members than S are incomplete."""
    if int(counts.max()) < 2:
        raise ValueError("every group has a single member; a CSM group needs at least 2 (the endpoints)")
    if lambda_known:
        return int(counts.max())
    values, freq = torch.unique(counts, return_counts=True)
    size = int(values[torch.argmax(freq)])  # ties: the smaller count
    larger = (counts > size).nonzero().flatten()
    if len(larger):
        g = int(larger[0])
        raise ValueError(f"group {int(uniq[g])} has {int(counts[g])} members where most groups have {size}: "
                         f"{len(larger)} group(s) hold two groups under one group_id (or extra rows); give every "
                         "group its own group_id and each member once")
    return size


@dataclass
class CSMGroups:
    """Generated images grouped for companion sampling.

    Attributes:
        images: uint8 (M, C, H, W), every generated image, in memory (a tensor) or read lazily (a
            :class:`~timm_csm.data.lazy.LazyImages`; ``images[rows]`` decodes those rows only).
        soft_labels: float32 (M, K), annotated soft labels (rows sum to 1).
        members: int64 (G, S), rows of ``images`` per complete group, most class_a-like first.
        class_a, class_b: int64 (G,), the class pair of each group.
        group_ids: int64 (G,), the ``group_id`` of each group.
        class_names: K names.
    """

    images: torch.Tensor
    soft_labels: torch.Tensor
    members: torch.Tensor
    class_a: torch.Tensor
    class_b: torch.Tensor
    group_ids: torch.Tensor
    class_names: List[str]

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def group_size(self) -> int:
        return int(self.members.shape[1])

    @property
    def num_groups(self) -> int:
        return int(self.members.shape[0])

    @classmethod
    def from_arrays(cls, images, soft_labels, class_a, class_b, group_ids, class_names: Sequence[str],
                    lambda_gen=None) -> "CSMGroups":
        """Group rows by ``group_id`` and sort each group (see the module docstring).

        Raises ValueError on bad shapes, soft labels that are not distributions, class indices out of range, a
        group whose members disagree on (class_a, class_b), and duplicates: a group holding one member twice (the
        same ``lambda_gen`` twice when given, else an identical image and soft label) or, without ``lambda_gen``,
        more members than the common group size (two groups sharing one ``group_id``). Only groups with fewer
        members than the others are left out, with a warning.
        """
        if not isinstance(images, LazyImages):
            images = torch.as_tensor(np.asarray(images))
        q = torch.as_tensor(np.asarray(soft_labels, dtype=np.float32))
        a = torch.as_tensor(np.asarray(class_a, dtype=np.int64))
        b = torch.as_tensor(np.asarray(class_b, dtype=np.int64))
        gid = torch.as_tensor(np.asarray(group_ids, dtype=np.int64))
        k = len(class_names)
        m = len(images) if isinstance(images, LazyImages) or images.ndim else 0
        if not isinstance(images, LazyImages) and (images.ndim != 4 or images.dtype != torch.uint8):
            raise ValueError(f"images must be uint8 (M, C, H, W), got {images.dtype} {tuple(images.shape)}")
        if q.ndim != 2 or q.shape != (m, k):
            raise ValueError(f"soft_label must be ({m}, {k}) for {m} images and {k} classes, got {tuple(q.shape)}")
        for name, t in (("class_a", a), ("class_b", b), ("group_id", gid)):
            if t.shape != (m,):
                raise ValueError(f"{name} must have shape ({m},), got {tuple(t.shape)}")
        if m == 0:
            raise ValueError("the CSM dataset is empty")
        check_soft_labels(q.numpy())
        for name, t in (("class_a", a), ("class_b", b)):
            if (t < 0).any() or (t >= k).any():
                raise ValueError(f"{name} must lie in [0, {k}), got range [{int(t.min())}, {int(t.max())}]")

        _check_duplicate_rows(images, q, gid, lambda_gen)
        order = torch.argsort(gid, stable=True)
        uniq, counts = torch.unique_consecutive(gid[order], return_counts=True)
        size = _group_size(uniq, counts, lambda_gen is not None)
        complete = counts == size
        n_incomplete = int((~complete).sum())
        if n_incomplete:
            warnings.warn(f"{n_incomplete} of {len(uniq)} groups have fewer than {size} members and are left out")
        starts = torch.cumsum(counts, 0) - counts
        rows = order[starts[complete, None] + torch.arange(size)]  # (G, S)
        ga, gb = a[rows], b[rows]
        if (ga != ga[:, :1]).any() or (gb != gb[:, :1]).any():
            g = int(((ga != ga[:, :1]) | (gb != gb[:, :1])).any(1).nonzero()[0])
            raise ValueError(f"group {int(uniq[complete][g])} mixes different class pairs")
        ga, gb = ga[:, 0], gb[:, 0]
        # most class_a-like first: q_a - q_b descending; ties broken by the generation weight of a, then row order
        gi = torch.arange(len(rows))[:, None]
        score = (q[rows, ga[:, None]] - q[rows, gb[:, None]]).double()
        if lambda_gen is not None:
            lam = torch.as_tensor(np.asarray(lambda_gen, dtype=np.float64))[rows]
            score = score + 1e-9 * lam  # soft labels are float32: differences below 1e-7 are ties
        rank = torch.argsort(-score, dim=1, stable=True)
        rows = rows[gi, rank]
        return cls(images=images, soft_labels=q, members=rows, class_a=ga, class_b=gb,
                   group_ids=uniq[complete], class_names=list(class_names))

    @classmethod
    def from_dataset(cls, ds, class_names: Optional[Sequence[str]] = None, image_column: str = "image") -> "CSMGroups":
        """Build from the generated dataset's ``train`` split (a ``datasets.Dataset``) in the published format:
        columns ``image``, ``soft_label`` (K floats), ``class_a``, ``class_b``, ``group_id`` (and optionally
        ``lambda_gen``). Images stay in the (memory-mapped) dataset and are decoded when a batch draws them
        (:class:`~timm_csm.data.lazy.ArrowImages`); the other columns are read into memory.

        ``class_names``: the real dataset's class names; when given, the generated dataset's ClassLabel names must
        match them (same names, same order).
        """
        columns = list(ds.column_names)
        required = [image_column if c == "image" else c for c in REQUIRED_CSM_COLUMNS]
        missing = [c for c in required if c not in columns]
        if missing:
            raise ValueError(f"the CSM dataset lacks column(s) {missing}; it has {columns}")
        plain = column_arrays(ds, [c for c in ("soft_label", "class_a", "class_b", "group_id", "lambda_gen")
                                   if c in columns])
        soft = plain["soft_label"]
        names = _class_names_of(ds)
        if names is None:
            names = list(class_names) if class_names is not None else [str(i) for i in range(len(soft[0]))]
        if class_names is not None:
            check_class_names(names, class_names, "CSM dataset", "the real dataset")
        if soft.ndim != 2:  # ragged rows
            lengths = sorted({len(r) for r in soft})
            raise ValueError(f"soft_label rows must all have {len(names)} values, found lengths {lengths}")
        soft = soft.astype(np.float32, copy=False)
        if soft.shape[1] != len(names):
            raise ValueError(f"soft_label has {soft.shape[1]} values per row, the dataset has {len(names)} classes")
        return cls.from_arrays(ArrowImages(ds, image_column), soft, plain["class_a"], plain["class_b"],
                               plain["group_id"], names, plain.get("lambda_gen"))


class CSMCompanionSampler:
    """Draw CSM companions (image rows of :class:`CSMGroups`) for a batch of real labels.

    Args:
        groups: the grouped generated data.
        n_aug: interior members per real sample besides the endpoint (reference default 1); at most S - 2.
        num_classes: number of real classes (defaults to the groups'); every class needs at least one group.
    """

    def __init__(self, groups: CSMGroups, n_aug: int = 1, num_classes: Optional[int] = None):
        k = groups.num_classes if num_classes is None else int(num_classes)
        if k != groups.num_classes:
            raise ValueError(f"the CSM dataset has {groups.num_classes} classes, the real data {k}")
        s = groups.group_size
        if n_aug < 0:
            raise ValueError(f"n_aug must be >= 0, got {n_aug}")
        if n_aug > s - 2:
            raise ValueError(f"n_aug={n_aug} is larger than the {s - 2} interior members of a group of {s} "
                             f"(choose n_aug <= {s - 2})")
        self.groups = groups
        self.n_aug = int(n_aug)
        self.num_classes = k
        # class -> groups table: each group listed under class_a and, when different, under class_b
        gidx = torch.arange(groups.num_groups)
        other = groups.class_b != groups.class_a
        cls_col = torch.cat([groups.class_a, groups.class_b[other]])
        grp_col = torch.cat([gidx, gidx[other]])
        order = torch.argsort(cls_col, stable=True)
        self._flat_groups = grp_col[order]
        self._counts = torch.bincount(cls_col, minlength=k)
        self._offsets = torch.cumsum(self._counts, 0) - self._counts
        empty = (self._counts == 0).nonzero().flatten().tolist()
        if empty:
            shown = ", ".join(f"{i} ({groups.class_names[i]!r})" for i in empty[:10])
            raise ValueError(f"{len(empty)} class(es) have no generated group, so they cannot get companions: "
                             f"{shown}{' ...' if len(empty) > 10 else ''}")

    @property
    def per_sample(self) -> int:
        """Generated images per real sample: the endpoint plus ``n_aug`` interior members."""
        return 1 + self.n_aug

    def groups_of_class(self, c: int) -> torch.Tensor:
        """Indices of the groups that contain class ``c``."""
        o, n = int(self._offsets[c]), int(self._counts[c])
        return self._flat_groups[o:o + n]

    def draw_uniforms(self, n: int, generator: Optional[torch.Generator] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """The randomness for ``n`` samples: a uniform for the group choice (n,) and keys for the interior
        choice (n, S - 2). Drawn independently of the labels, so a slice of a global batch's draw is valid."""
        u_group = torch.rand(n, generator=generator, dtype=torch.float64)
        u_interior = torch.rand(n, max(self.groups.group_size - 2, 0), generator=generator)
        return u_group, u_interior

    def select(self, labels: torch.Tensor, u_group: torch.Tensor, u_interior: torch.Tensor) -> torch.Tensor:
        """Image rows (B, 1 + n_aug) for ``labels`` (B,) given uniforms from :meth:`draw_uniforms`."""
        labels = torch.as_tensor(labels, dtype=torch.long)
        if labels.ndim != 1:
            raise ValueError(f"labels must be (B,), got shape {tuple(labels.shape)}")
        if len(labels) and (labels.min() < 0 or labels.max() >= self.num_classes):
            raise ValueError(f"labels must lie in [0, {self.num_classes}), got range "
                             f"[{int(labels.min())}, {int(labels.max())}]")
        counts = self._counts[labels]
        pick = (u_group * counts).long().clamp_(max=counts - 1)
        g = self._flat_groups[self._offsets[labels] + pick]
        s = self.groups.group_size
        endpoint = torch.where(self.groups.class_a[g] == labels, 0, s - 1)
        positions = endpoint[:, None]
        if self.n_aug:
            interior = torch.argsort(u_interior, dim=1)[:, :self.n_aug] + 1  # distinct, uniform over 1 .. S-2
            positions = torch.cat([positions, interior], dim=1)
        return self.groups.members[g[:, None], positions]

    def sample(self, labels: torch.Tensor, generator: Optional[torch.Generator] = None) -> torch.Tensor:
        """Image rows (B, 1 + n_aug) of the companions of ``labels`` (column 0: the endpoint most like y)."""
        return self.select(labels, *self.draw_uniforms(len(labels), generator))
