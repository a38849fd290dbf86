"""The data of a training run: the seeded train / validation / test splits, the CSM groups, input settings and the
evaluation loaders.

``load_data`` opens ``--dataset`` (the embedded ``fashion_mnist`` / ``digits`` in memory; ``cifar10`` / ``cifar100``,
any Hugging Face dataset name or folder and timm's ``hfds/`` / ``torch/`` names read lazily:
:func:`timm_csm.data.open_image_split`) and takes the seeded ``--max-*-samples`` subsets. The validation set
(checkpoint selection, stateful-loss hooks, temperature scaling) is the split named by ``--val-split`` (timm's
meaning), else a seeded ``--val-fraction`` of the training split held out. The test split is ``--test-split``, else
detected (``test``, else ``validation`` / ``val``, the first not already used): a dataset laid out as
``train`` / ``validation`` reports on ``validation``; a flat ``<class>/<image>`` folder (one split, ``train``)
trains with ``--val-fraction`` and reports on its validation images only, or on a seeded ``--test-fraction`` of it
held out first (:func:`~timm_csm.data.sources.hold_out_test_split`). A named split the dataset lacks is an error
naming its splits.
``build_transforms`` chooses the input size, channels, normalisation and recipe (the batched pad-crop recipe or
timm's ``create_transform``, image by image).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import numpy as np
import torch

from ..data import EMBEDDED_DATASETS, derive_seed
from .config import TrainConfig
from ..evaluation.model import fixed_input_size

__all__ = ["DataSplits", "apply_input_size", "load_data", "held_out_digests", "run_held_out_splits",
           "HELD_OUT_DIGESTS", "load_csm_groups", "input_channels", "transform_kind", "build_transforms",
           "eval_loader", "TIMM_TRANSFORM_FLAGS"]

_HUB_ALIASES = ("cifar10", "cifar100")


@dataclass
class DataSplits:
    train: Any  # ImageArrays (in memory) or LazySplit
    val: Any
    test: Any  # None: the dataset has no free test split (a training run then reports validation only)
    class_names: List[str]
    ood: Any = None  # the images of --ood, scored against the test split


def _subset(arrays, n: Optional[int], seed: int, salt: int):
    if n is None or n >= len(arrays):
        return arrays
    if n < 1:
        raise ValueError(f"a subset needs at least one sample, got {n}")
    g = torch.Generator().manual_seed(derive_seed(seed, salt))
    return arrays.subset(torch.randperm(len(arrays), generator=g)[:n].sort().values.numpy())


def _from_source(config: TrainConfig, what: str, load):
    """``load()``, its failures turned into a ``ValueError`` that names the dataset and ``what`` was loaded."""
    name = config.dataset
    known = name in EMBEDDED_DATASETS or name in _HUB_ALIASES or os.path.isdir(name) or "/" in name
    try:
        return load()
    except (ValueError, ImportError):
        raise  # missing / undetectable column, bad images, a missing optional package: already a clear message
    except Exception as e:  # not found locally, on the Hub, or offline
        if not known:
            raise ValueError(f"unknown dataset {name!r}; available: {', '.join(EMBEDDED_DATASETS)} (embedded), "
                             f"{', '.join(_HUB_ALIASES)} (Hub or cache), or a Hugging Face dataset name or folder "
                             f"({type(e).__name__}: {e})") from e
        raise ValueError(f"dataset {name!r}, {what} could not be loaded: {type(e).__name__}: {e}") from e


def _load_split(config: TrainConfig, split: str):
    from ..data import open_image_split

    return _from_source(config, f"split {split!r}", lambda: open_image_split(
        config.dataset, split, image_column=config.image_column, label_column=config.label_column,
        data_dir=config.data_dir))


def _split_names(config: TrainConfig) -> List[str]:
    """The dataset's split names; a split named by ``config`` that is not among them is an error naming them."""
    from ..data.sources import dataset_split_names

    splits = _from_source(config, "the split names", lambda: dataset_split_names(config.dataset))
    for flag, split in (("--train-split", config.train_split), ("--val-split", config.val_split),
                        ("--test-split", config.test_split)):
        if split is not None and split not in splits:
            raise ValueError(f"{flag} {split!r}: dataset {config.dataset!r} has no such split; its splits are "
                             f"{splits}")
    if config.val_split is not None and config.val_split == config.train_split:
        raise ValueError(f"--val-split {config.val_split!r} is the training split; name another split, or drop it to "
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


def _draw_validation(train, size: int, seed: int):
    """(rest, validation): ``size`` images of ``train`` drawn with ``seed``, before any training subset is taken, so
    that the validation set is the same whatever the subset's size and never overlaps it."""
    if not 0 < size < len(train):
        raise ValueError(f"--val-size must lie in [1, {len(train) - 1}] for a training split of {len(train)} images, "
                         f"got {size}")
    g = torch.Generator().manual_seed(derive_seed(seed, 3))
    order = torch.randperm(len(train), generator=g).numpy()
    return train.subset(np.sort(order[size:])), train.subset(np.sort(order[:size]))


def _test_split(config: TrainConfig, splits: List[str]):
    """The split reported on: ``--test-split``, else the detected one, else None: held out of the training split
    with ``--test-fraction``, or a training run that reports its validation split (a flat ``<class>/<image>``
    folder is one split). ``--eval-only`` on a dataset with no free test split scores its training split when it
    is not the checkpoint's training data (a folder of held-out images)."""
    from ..data.sources import TEST_SPLIT_NAMES, detect_test_split

    name = config.test_split or detect_test_split(splits, exclude=(config.train_split, config.val_split))
    if config.test_fraction is not None:
        if name is not None:
            raise ValueError(f"--test-fraction {config.test_fraction}: dataset {config.dataset!r} has the test split "
                             f"{name!r}; drop --test-fraction")
        return None
    if name is None and config.eval_only:
        if not _checkpoint_trained_on(config):
            return config.train_split  # a folder of held-out images: every image is scored
        raise ValueError(f"no split to score: dataset {config.dataset!r} has splits {splits}, none of "
                         f"{list(TEST_SPLIT_NAMES)} is free, and {config.checkpoint} was trained on it; score a "
                         "folder of held-out images (--dataset), or a split the run held out (--test-split)")
    if name is None and config.val_split is None and config.val_size is None and not config.val_fraction:
        raise ValueError(f"dataset {config.dataset!r} has no test split (its splits are {splits}) and the run holds "
                         "out no validation images: give --val-fraction (or --val-size) to report on those, or "
                         "--test-split")
    return name


def _checkpoint_trained_on(config: TrainConfig) -> bool:
    """Whether ``--dataset`` is the data the ``--checkpoint`` of an eval-only run was trained on (assumed without
    a checkpoint to ask)."""
    from ..data.sources import same_dataset
    from ..io import read_model_meta

    if not config.checkpoint:
        return True
    return same_dataset((read_model_meta(config.checkpoint) or {}).get("dataset"), config.dataset)


def load_data(config: TrainConfig) -> DataSplits:
    """Training / validation / test arrays for ``config`` (seeded subsets; the validation split, ``--val-size`` images
    drawn outside the training subset, or the held-out fraction). The draws use ``--data-seed`` (default: ``--seed``).
    Sets ``config.test_split`` to the split reported on, so that the run records the detected name; a training run
    on a dataset with no free test split has ``test`` None (it reports validation only). With ``--eval-only`` on
    the training split (a flat folder the checkpoint did not train on) no validation images are held out of it:
    they would be scored as test images too."""
    splits = _split_names(config)
    train = _load_split(config, config.train_split)
    config.test_split = _test_split(config, splits)
    test = _load_split(config, config.test_split) if config.test_split is not None else None
    val = _load_split(config, config.val_split) if config.val_split is not None else None
    for name, other in ((config.test_split, test), (config.val_split, val)):
        if other is not None and list(other.class_names) != list(train.class_names):
            raise ValueError(f"the {name!r} split names classes {other.class_names[:10]}, the "
                             f"{config.train_split!r} split {train.class_names[:10]}")
    data_seed = config.seed if config.data_seed is None else config.data_seed
    if config.test_fraction is not None:  # before any other draw: the same images whatever the rest of the run
        from ..data.sources import hold_out_test_split

        train, test = hold_out_test_split(train, config.test_fraction, data_seed)
    if config.eval_only and val is None and config.test_split == config.train_split:
        val = train.subset(np.zeros(0, dtype=np.int64))
    if config.val_size is not None:
        if val is not None:
            raise ValueError("--val-size draws the validation images from the training split; drop --val-split")
        train, val = _draw_validation(train, config.val_size, data_seed)
    train = _subset(train, config.max_train_samples, data_seed, 1)
    if test is not None:
        test = _subset(test, config.max_test_samples, data_seed, 2)
    if val is None:
        train, val = _hold_out(train, config.val_fraction, data_seed)
    if len(train) == 0:
        raise ValueError("no training images left after the validation split")
    return DataSplits(train, val, test, list(train.class_names))


#: the key of a model file's metadata under which its run records its held-out images (:func:`held_out_digests`)
HELD_OUT_DIGESTS = "held_out_digests"


def held_out_digests(data: DataSplits) -> Dict[str, Optional[str]]:
    """The :func:`~timm_csm.data.split_digest` of a run's validation and test images (None: it holds none), which
    its model files record so that :func:`run_held_out_splits` can find the same images again."""
    from ..data import split_digest

    return {"validation": split_digest(data.val) if len(data.val) else None,
            "test": split_digest(data.test) if data.test is not None else None}


def run_held_out_splits(meta: Dict[str, Any], data_dir: Optional[str] = None):
    """``(validation, test, rule)`` of the training run whose model file carries ``meta``: drawn again by
    :func:`load_data` from the run's data options (dataset, splits, held-out fractions, sample limits, data seed:
    its seeded rule, described in ``rule``) and checked against the digests the run recorded. ValueError, one line,
    when the run records no digests (a run of an earlier version), held out no test images, or the images drawn
    are no longer those it held out (the dataset changed since)."""
    from .args import RUN_META_KEYS
    from .config import upgrade_stored_config

    meta = upgrade_stored_config(meta)
    recorded = meta.get(HELD_OUT_DIGESTS)
    if recorded is None:
        raise ValueError("the run records no digest of its held-out images (a run of an earlier version): name the "
                         "images to use (--dataset with --test-split, and --calibration-split or "
                         "--calibration-fraction)")
    if recorded.get("test") is None:
        raise ValueError(f"the run held out no test images of {meta['dataset']} (it reported on its validation "
                         "images): name the images to score (--dataset with --test-split)")
    options = {k: meta[k] for k in RUN_META_KEYS if meta.get(k) is not None}
    data = load_data(TrainConfig.from_dict(dict(options, data_dir=data_dir), "the run's data options"))
    for name, digest in held_out_digests(data).items():
        if digest != recorded.get(name):
            raise ValueError(f"the {name} images drawn from {meta['dataset']} by the run's seeded rule are no longer "
                             f"those it held out (digest {digest}, recorded {recorded.get(name)}): the dataset "
                             "changed since it trained; name the images to use (--test-split)")
    if meta.get("test_fraction") is not None:
        rule = f"held out as a seeded {meta['test_fraction']:g} of {meta['dataset']}"
    else:
        rule = f"its {meta['test_split']!r} split of {meta['dataset']}"
    seed = meta.get("data_seed") if meta.get("data_seed") is not None else meta.get("seed")
    return data.val, data.test, f"{rule}, data seed {seed}"


def load_csm_groups(config: TrainConfig, class_names):
    """The generated dataset of ``--csm-dataset`` (folder, installed name or Hub id), grouped for sampling."""
    from ..data import CSMGroups
    from ..hub import load_csm_dataset

    dd = load_csm_dataset(config.csm_dataset)
    ds = dd["train"] if hasattr(dd, "keys") and "train" in dd else dd
    return CSMGroups.from_dataset(ds, class_names=class_names)



def apply_input_size(config: TrainConfig) -> None:
    """timm's ``--input-size C H W`` as ``--in-chans C --img-size H`` (square inputs); a conflict is an error."""
    if not config.input_size:
        return
    c, h, w = (int(v) for v in config.input_size)
    if h != w:
        raise ValueError(f"--input-size {list(config.input_size)}: only square inputs are supported")
    for flag, given, value in (("--in-chans", config.in_chans, c), ("--img-size", config.img_size, h)):
        if given is not None and int(given) != value:
            raise ValueError(f"--input-size {list(config.input_size)} and {flag} {given} disagree")
    config.in_chans, config.img_size = c, h


def input_channels(config: TrainConfig, data: DataSplits) -> int:
    """``--in-chans``, else the training images': the array's channels in memory; for a lazy split 1 when the
    probed images are all grey, else 3."""
    from ..data import image_geometry

    if config.in_chans:
        return int(config.in_chans)
    return image_geometry(data.train, config.seed)[0]


#: flags of timm's train transform with no counterpart in the pad-crop recipe: any of them given selects timm's
TIMM_TRANSFORM_FLAGS = ("aa", "reprob", "color_jitter", "scale", "ratio", "vflip", "crop_pct", "interpolation",
                        "train_interpolation")
_TIMM_SIDE = 96  # from this input side on, the default is timm's RandomResizedCrop recipe (ImageNet-like images)


def _given(config: TrainConfig) -> set:
    """The options given with a value other than their default (a run's own args.yaml gives every option)."""
    defaults = TrainConfig().options()
    return {k for k in config.explicit if getattr(config, k) != defaults[k]}


def transform_kind(config: TrainConfig, img_size: int) -> str:
    """``--transform``: ``cifar`` (resize, pad-crop, flip: the paper's CIFAR recipe, batched) or ``timm``
    (``timm.data.create_transform``); ``auto`` is timm's when one of its flags is given (with a value other than
    its default) or the input side is at least 96 px. A flag of the other recipe is an error."""
    given = _given(config)
    timm_flags = [f for f in TIMM_TRANSFORM_FLAGS if f in given]
    kind = config.transform
    if kind == "auto":
        kind = "timm" if timm_flags or img_size >= _TIMM_SIDE else "cifar"
    if kind == "cifar" and timm_flags:
        raise ValueError(f"--transform cifar (the pad-crop recipe) has no {', '.join('--' + f.replace('_', '-') for f in timm_flags)}; "
                         "use --transform timm")
    if kind == "timm" and "crop_pad" in given:
        raise ValueError("--crop-pad belongs to the pad-crop recipe (--transform cifar); timm's train transform "
                         "crops with --scale / --ratio")
    return kind


def _image_side(config: TrainConfig, data: DataSplits, pretrained_cfg) -> int:
    from ..data import image_geometry

    side = config.img_size
    fixed, cfg_size = fixed_input_size(config.model)
    if side:
        return int(side)
    if fixed and cfg_size:
        return int(cfg_size[-1])
    data_side = image_geometry(data.train, config.seed)[1]
    if data_side:
        return int(data_side)
    if config.transform != "cifar" and pretrained_cfg and pretrained_cfg.get("input_size"):  # timm's default
        return int(pretrained_cfg["input_size"][-1])
    raise ValueError(f"the images of {config.dataset!r} have different sizes; give the input size (--img-size)")


def _normalisation(config: TrainConfig, data: DataSplits, kind: str, in_chans: int, img_size: int, pretrained_cfg):
    """(mean, std): the flags', else the pretrained config's (``--pretrained``, or timm's transform, which takes the
    model's as timm's ``resolve_data_config``), else the training images' statistics (a sample of a lazy split)."""
    from ..data import sampled_channel_stats
    from ..models._cfg import _fit_channels

    if config.mean is not None or config.std is not None:
        if config.mean is None or config.std is None:
            raise ValueError("give both --mean and --std")
        mean, std = tuple(config.mean), tuple(config.std)
    elif pretrained_cfg is not None and (config.pretrained or kind == "timm"):
        mean = _fit_channels(pretrained_cfg.get("mean", (0.5,)), in_chans)
        std = _fit_channels(pretrained_cfg.get("std", (0.5,)), in_chans)
    else:
        mean, std = sampled_channel_stats(data.train, in_chans, (img_size, img_size), seed=config.seed)
    for what, v in (("mean", mean), ("std", std)):
        if len(v) not in (1, in_chans):
            raise ValueError(f"--{what} has {len(v)} values for {in_chans} input channels")
    return tuple(float(m) for m in mean), tuple(float(v) for v in std)


def _timm_data_config(config: TrainConfig, in_chans: int, img_size: int, mean, std, pretrained_cfg) -> Dict[str, Any]:
    """timm's ``resolve_data_config`` of the model's pretrained config with the run's input size, normalisation and
    ``--interpolation`` / ``--crop-pct`` (flags first, then the model's config, then timm's defaults)."""
    from timm.data import resolve_data_config

    given = {"input_size": (in_chans, img_size, img_size), "mean": mean, "std": std,
             "interpolation": config.interpolation or None, "crop_pct": config.crop_pct}
    return resolve_data_config(given, pretrained_cfg=dict(pretrained_cfg or {}), verbose=False)


def _timm_train_kwargs(config: TrainConfig) -> Dict[str, Any]:
    return dict(scale=tuple(config.scale), ratio=tuple(config.ratio), hflip=config.hflip, vflip=config.vflip,
                color_jitter=config.color_jitter, auto_augment=config.aa, re_prob=config.reprob, re_mode=config.remode,
                re_count=config.recount, train_interpolation=config.train_interpolation)


def build_transforms(config: TrainConfig, data: DataSplits, in_chans: int, pretrained_cfg=None):
    """(train transform, eval transform, data info) of a run: the input size, normalisation and recipe from the
    flags, the model's config and the data. The pad-crop recipe is batched
    (:class:`~timm_csm.data.BatchTransform`; lazily read images of different sizes are resized to the input size as
    they are read); timm's works image by image (:class:`~timm_csm.data.SampleTransform`)."""
    from ..data import LazyImages, create_timm_transforms, create_transforms, pil_mode

    img_size = _image_side(config, data, pretrained_cfg)
    kind = transform_kind(config, img_size)
    mean, std = _normalisation(config, data, kind, in_chans, img_size, pretrained_cfg)
    if kind == "timm":
        cfg = _timm_data_config(config, in_chans, img_size, mean, std, pretrained_cfg)
        train_tf, eval_tf = create_timm_transforms(img_size, mean, std, in_chans, cfg["interpolation"],
                                                   cfg["crop_pct"], no_aug=config.no_aug, **_timm_train_kwargs(config))
        timm_info = {"interpolation": cfg["interpolation"], "crop_pct": cfg["crop_pct"]}
    else:
        timm_info = {}
        pad, hflip = (0, 0.0) if config.no_aug else (config.crop_pad, config.hflip)
        train_tf, eval_tf = create_transforms(img_size, mean, std, in_chans, crop_padding=pad, hflip=hflip)
        for split in (data.train, data.val, data.test, data.ood):
            if split is not None and isinstance(split.images, LazyImages):
                split.images = split.images.with_output(pil_mode(in_chans), (img_size, img_size))
    info = {"in_chans": in_chans, "img_size": img_size, "mean": list(mean), "std": list(std), "transform": kind,
            **timm_info}
    return train_tf, eval_tf, info


def eval_loader(arrays, transform, batch_size: int, config: TrainConfig, accelerator):
    from torch.utils.data import DataLoader

    from ..data import ImageCollator, IndexDataset

    loader = DataLoader(IndexDataset(len(arrays)), batch_size=batch_size, shuffle=False,
                        collate_fn=ImageCollator(arrays.images, arrays.labels, transform, config.seed),
                        num_workers=config.workers, pin_memory=config.pin_mem)
    return accelerator.prepare_data_loader(loader)
