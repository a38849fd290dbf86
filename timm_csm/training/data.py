"""The data of a training run: the seeded train / validation / test splits, the CSM groups, input settings and the
evaluation loaders.

``load_data`` loads ``--dataset`` into memory (embedded ``fashion_mnist`` / ``digits``, ``cifar10`` / ``cifar100``
or any Hugging Face dataset name or folder) and takes the seeded ``--max-*-samples`` subsets. The validation set
(checkpoint selection, stateful-loss hooks, temperature scaling) is the split named by ``--val-split`` (timm's
meaning), else a seeded ``--val-fraction`` of the training split held out. The test split is ``--test-split``, else
detected (``test``, else ``validation`` / ``val``, the first not already used): a dataset laid out as
``train`` / ``validation`` reports on ``validation``. A named split the dataset lacks is an error naming its splits.
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


def _from_source(args, what: str, load):
    """``load()``, its failures turned into a ``ValueError`` that names the dataset and ``what`` was loaded."""
    name = args.dataset
    known = name in _EMBEDDED or name in _HUB_ALIASES or os.path.isdir(name) or "/" in name
    try:
        return load()
    except ValueError:
        raise  # missing / undetectable column, bad images: already a clear message
    except Exception as e:  # not found locally, on the Hub, or offline
        if not known:
            raise ValueError(f"unknown dataset {name!r}; available: {', '.join(_EMBEDDED)} (embedded), "
                             f"{', '.join(_HUB_ALIASES)} (Hub or cache), or a Hugging Face dataset name or folder "
                             f"({type(e).__name__}: {e})") from e
        raise ValueError(f"dataset {name!r}, {what} could not be loaded: {type(e).__name__}: {e}") from e


def _load_split(args, split: str):
    from ..data import load_image_arrays

    return _from_source(args, f"split {split!r}", lambda: load_image_arrays(
        args.dataset, split, image_column=args.image_column, label_column=args.label_column))


def _split_names(args) -> List[str]:
    """The dataset's split names; a split named by ``args`` that is not among them is an error naming them."""
    from ..data.sources import dataset_split_names

    splits = _from_source(args, "the split names", lambda: dataset_split_names(args.dataset))
    for flag, split in (("--train-split", args.train_split), ("--val-split", args.val_split),
                        ("--test-split", args.test_split)):
        if split is not None and split not in splits:
            raise ValueError(f"{flag} {split!r}: dataset {args.dataset!r} has no such split; its splits are "
                             f"{splits}")
    if args.val_split is not None and args.val_split == args.train_split:
        raise ValueError(f"--val-split {args.val_split!r} is the training split; name another split, or drop it to "
                         "hold out --val-fraction of the training split")
    return splits


def _hold_out(train, fraction: float, seed: int):
    """(rest, held out): a seeded ``fraction`` of ``train`` held out for validation."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"--val-fraction must lie in [0, 1), got {fraction}")
    n_val = int(round(fraction * len(train)))
    if fraction > 0 and n_val == 0:
        raise ValueError(f"--val-fraction {fraction} of {len(train)} images leaves no validation image")
    g = torch.Generator().manual_seed(derive_seed(seed, 0))
    order = torch.randperm(len(train), generator=g).numpy()
    return train.subset(np.sort(order[n_val:])), train.subset(np.sort(order[:n_val]))


def load_data(args) -> DataSplits:
    """Training / validation / test arrays for ``args`` (seeded subsets; the validation split or the held-out
    fraction). Sets ``args.test_split`` to the split reported on, so that the run records the detected name."""
    from ..data.sources import detect_test_split

    splits = _split_names(args)
    train = _load_split(args, args.train_split)
    args.test_split = args.test_split or detect_test_split(splits, exclude=(args.train_split, args.val_split))
    test = _load_split(args, args.test_split)
    val = _load_split(args, args.val_split) if args.val_split is not None else None
    for name, other in ((args.test_split, test), (args.val_split, val)):
        if other is not None and list(other.class_names) != list(train.class_names):
            raise ValueError(f"the {name!r} split names classes {other.class_names[:10]}, the "
                             f"{args.train_split!r} split {train.class_names[:10]}")
    train = _subset(train, args.max_train_samples, args.seed, 1)
    test = _subset(test, args.max_test_samples, args.seed, 2)
    if val is None:
        train, val = _hold_out(train, args.val_fraction, args.seed)
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
