"""The data of a training run: the seeded train / validation / test splits, the CSM groups, input settings and the
evaluation loaders.

``load_data`` loads ``--dataset`` into memory (embedded ``fashion_mnist`` / ``digits``, ``cifar10`` / ``cifar100``
or any Hugging Face dataset name or folder), takes the seeded ``--max-*-samples`` subsets, then holds out a seeded
``--val-split`` fraction of the training split for checkpoint selection, stateful-loss hooks and temperature
scaling.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, List, Optional

import numpy as np
import torch

from ..data import derive_seed
from .model import fixed_input_size

__all__ = ["DataSplits", "load_data", "load_csm_groups", "resolve_input", "eval_loader"]

_EMBEDDED = ("fashion_mnist", "digits")
_HUB_ALIASES = ("cifar10", "cifar100")


@dataclass
class DataSplits:
    train: Any  # ImageArrays
    val: Any
    test: Any
    class_names: List[str]


def _subset(arrays, n: Optional[int], seed: int, salt: int):
    if n is None or n >= len(arrays):
        return arrays
    if n < 1:
        raise ValueError(f"a subset needs at least one sample, got {n}")
    g = torch.Generator().manual_seed(derive_seed(seed, salt))
    return arrays.subset(torch.randperm(len(arrays), generator=g)[:n].sort().values.numpy())


def _load_split(args, split: str):
    from ..data import load_image_arrays

    name = args.dataset
    known = name in _EMBEDDED or name in _HUB_ALIASES or os.path.isdir(name) or "/" in name
    try:
        return load_image_arrays(name, split, image_column=args.image_column, label_column=args.label_column)
    except ValueError:
        raise  # missing / undetectable column, bad images: already a clear message
    except Exception as e:  # not found locally, on the Hub, or offline
        if not known:
            raise ValueError(f"unknown dataset {name!r}; available: {', '.join(_EMBEDDED)} (embedded), "
                             f"{', '.join(_HUB_ALIASES)} (Hub or cache), or a Hugging Face dataset name or folder "
                             f"({type(e).__name__}: {e})") from e
        raise ValueError(f"dataset {name!r}, split {split!r} could not be loaded: {type(e).__name__}: {e}") from e


def load_data(args) -> DataSplits:
    """Training / validation / test arrays for ``args`` (seeded subset and validation split)."""
    train = _load_split(args, args.train_split)
    test = _load_split(args, args.test_split)
    if list(test.class_names) != list(train.class_names):
        raise ValueError(f"the {args.test_split!r} split names classes {test.class_names[:10]}, the "
                         f"{args.train_split!r} split {train.class_names[:10]}")
    train = _subset(train, args.max_train_samples, args.seed, 1)
    test = _subset(test, args.max_test_samples, args.seed, 2)
    if not 0.0 <= args.val_split < 1.0:
        raise ValueError(f"--val-split must lie in [0, 1), got {args.val_split}")
    n_val = int(round(args.val_split * len(train)))
    if args.val_split > 0 and n_val == 0:
        raise ValueError(f"--val-split {args.val_split} of {len(train)} images leaves no validation image")
    g = torch.Generator().manual_seed(derive_seed(args.seed, 0))
    order = torch.randperm(len(train), generator=g).numpy()
    val = train.subset(np.sort(order[:n_val]))
    train = train.subset(np.sort(order[n_val:]))
    if len(train) == 0:
        raise ValueError("no training images left after the validation split")
    return DataSplits(train, val, test, list(train.class_names))


def load_csm_groups(args, class_names):
    """The generated dataset of ``--csm-dataset`` (folder, installed name or Hub id), grouped for sampling."""
    from ..data import CSMGroups
    from ..hub import load_csm_dataset

    dd = load_csm_dataset(args.csm_dataset)
    ds = dd["train"] if hasattr(dd, "keys") and "train" in dd else dd
    return CSMGroups.from_dataset(ds, class_names=class_names)



def resolve_input(args, data: DataSplits, pretrained_cfg=None):
    """(img_size, in_chans, mean, std) from flags, the model config and the data."""
    from ..data import channel_stats

    in_chans = args.in_chans or int(data.train.images.shape[1])
    fixed, cfg_size = fixed_input_size(args.model)
    if args.img_size:
        img_size = int(args.img_size)
    elif fixed and cfg_size:
        img_size = int(cfg_size[-1])
    else:
        img_size = int(data.train.images.shape[-1])
    if args.mean is not None or args.std is not None:
        if args.mean is None or args.std is None:
            raise ValueError("give both --mean and --std")
        mean, std = tuple(args.mean), tuple(args.std)
    elif args.pretrained and pretrained_cfg is not None:
        from ..models._cfg import _fit_channels

        mean = _fit_channels(pretrained_cfg.get("mean", (0.5,)), in_chans)
        std = _fit_channels(pretrained_cfg.get("std", (0.5,)), in_chans)
    else:
        mean, std = channel_stats(data.train.images, in_chans)
    for what, v in (("mean", mean), ("std", std)):
        if len(v) not in (1, in_chans):
            raise ValueError(f"--{what} has {len(v)} values for {in_chans} input channels")
    return img_size, in_chans, tuple(float(m) for m in mean), tuple(float(s) for s in std)


def eval_loader(arrays, transform, batch_size: int, args, accelerator):
    from torch.utils.data import DataLoader

    from ..data import ImageCollator, IndexDataset

    loader = DataLoader(IndexDataset(len(arrays)), batch_size=batch_size, shuffle=False,
                        collate_fn=ImageCollator(arrays.images, arrays.labels, transform, args.seed),
                        num_workers=args.workers, pin_memory=args.pin_mem)
    return accelerator.prepare_data_loader(loader)
