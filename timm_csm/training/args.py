"""The command line of ``train.py``: the grouped argument parser built from the fields of
:class:`~timm_csm.training.config.TrainConfig`, ``-c FILE`` YAML defaults, and the configurations a run completes.

Flag names follow timm's ``train.py`` where they overlap. A YAML file gives defaults (see
:mod:`~timm_csm.training.config`); flags override it. :func:`parse_args` returns a
:class:`~timm_csm.training.config.TrainConfig` whose ``explicit`` holds the options given as flags or file keys;
:func:`resolve_config` turns a dict, an ``argparse.Namespace`` or a ``TrainConfig`` into a ``TrainConfig`` of its own;
:func:`prepare_config` completes and checks it before a run builds anything (a checkpoint's options for
``--eval-only``, a resumed run's configuration).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import Any, Dict, Optional, Sequence

from ..cli import HelpFormatter
from ..evaluation.calibrators import check_calibrators
from ..io import CHECKPOINT_LAST, read_model_meta, safetensors_metadata
from ..options import add_options
from .config import CONFIG_MARKER, PAPER_SEED, TrainConfig, read_yaml_options, upgrade_stored_config
from .prepare import check_training_options
from .run_dir import experiment_dir, load_resumed
from .timm_args import TIMM_TRAIN_KEYS

__all__ = ["PAPER_SEED", "CONFIG_MARKER", "TIMM_TRAIN_KEYS", "build_parser", "parse_args",
           "resolve_config", "fill_from_checkpoint", "upgrade_stored_config", "model_meta", "prepare_config"]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of :class:`~timm_csm.training.config.TrainConfig`'s fields, grouped as the fields are;
    flag names follow timm's train.py where they overlap."""
    p = argparse.ArgumentParser(
        formatter_class=HelpFormatter,
        description="Train a timm classifier with a calibration loss (CSM and baselines); evaluate its calibration\n"
                    "before and after temperature scaling. Several processes:\n"
                    "accelerate launch -m timm_csm.commands.train ...")
    add_options(p, TrainConfig)
    return p


def parse_args(argv: Optional[Sequence[str]] = None) -> TrainConfig:
    """Parse the command line: ``-c FILE`` sets defaults from YAML, then flags override them; the options given
    either way are the configuration's ``explicit``."""
    parser = build_parser()
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("-c", "--config", default=None)
    known, _ = pre.parse_known_args(argv)
    from_file = read_yaml_options(known.config) if known.config else {}
    parser.set_defaults(**from_file)
    namespace = parser.parse_args(argv)
    # which options were given explicitly (flags or config): eval-only lets a checkpoint's metadata fill the rest
    probe = build_parser()
    for action in probe._actions:
        action.default = argparse.SUPPRESS
    explicit = set(vars(probe.parse_args(argv)).keys()) | set(from_file)
    return TrainConfig.from_namespace(namespace, explicit=frozenset(explicit - {"config"}))


def resolve_config(config) -> TrainConfig:
    """A :class:`~timm_csm.training.config.TrainConfig` of the run's own from a ``TrainConfig`` (copied: the run
    completes it), an ``argparse.Namespace`` or a dict of option names (missing ones take the defaults)."""
    if isinstance(config, TrainConfig):
        return dataclasses.replace(config)
    if isinstance(config, argparse.Namespace):
        return TrainConfig.from_namespace(config)
    if not isinstance(config, dict):
        raise TypeError(f"config must be a TrainConfig, an argparse.Namespace or a dict, got {type(config).__name__}")
    return TrainConfig.from_dict(config, "run() config")


# the run options stored with every model file and training state (``model_kwargs`` besides), which an eval-only
# run takes from its checkpoint when they are not given
RUN_META_KEYS = ("model", "dataset", "image_column", "label_column", "train_split", "test_split", "val_split",
                 "val_fraction", "val_size", "max_train_samples", "max_test_samples", "seed", "data_seed", "loss",
                 "test_fraction")


def fill_from_checkpoint(config: TrainConfig) -> Dict[str, Any]:
    """For --eval-only: fill options the user did not give from the checkpoint's metadata; returns the run-data
    options so taken (``RUN_META_KEYS`` that were set), for the log."""
    from ..data.sources import same_dataset

    state = upgrade_stored_config(read_model_meta(config.checkpoint) or {})
    other_data = "dataset" in config.explicit and not same_dataset(state.get("dataset"), config.dataset)
    taken = {}
    for k, v in state.items():
        if other_data and k == "test_fraction":  # a share of the checkpoint's data: not of another folder's
            continue
        if k in RUN_META_KEYS or k in ("num_classes", "in_chans", "img_size"):
            if k not in config.explicit:
                setattr(config, k, v)
                if k in RUN_META_KEYS and v is not None:
                    taken[k] = v
        if k == "model_kwargs" and "model_kwargs" not in config.explicit:
            config.model_kwargs = [tuple(kv) for kv in v]
        if k in ("mean", "std") and k not in config.explicit:
            setattr(config, k, list(v))
    return taken


def model_meta(config: TrainConfig, data_info: Dict[str, Any]) -> Dict[str, Any]:
    """The run metadata stored with every model file and training state (what eval-only and loaders read)."""
    meta = {k: getattr(config, k) for k in RUN_META_KEYS}
    meta["model_kwargs"] = [list(kv) for kv in (config.model_kwargs or [])]
    meta.update(data_info)
    return meta


def prepare_config(config: TrainConfig) -> Optional[Dict[str, Any]]:
    """Complete and check ``config`` before anything is built: a checkpoint's metadata (eval-only), the configuration
    of a resumed run (``--resume``, or ``--auto-resume`` finding one); returns the resumed state (None: new run)."""
    if config.eval_only:
        if not config.checkpoint:
            raise ValueError("--eval-only needs --checkpoint PATH")
        if not os.path.isfile(config.checkpoint):
            raise FileNotFoundError(f"--checkpoint {config.checkpoint} does not exist or is not a file")
        if safetensors_metadata(config.checkpoint) is None:
            raise ValueError(f"--checkpoint {config.checkpoint} is not a safetensors file (a pickle or JSON?); "
                             "--eval-only reads the model files train.py writes, never unpickles")
        taken = fill_from_checkpoint(config)
        if taken:
            print("train.py: --eval-only takes from the checkpoint's run: " + ", ".join(
                f"--{k.replace('_', '-')} {v}" for k, v in taken.items()) + " (give a flag to override)",
                  file=sys.stderr)
        _refuse_training_split(config)
        _require_preprocessing(config)
    elif config.auto_resume and not config.resume and (experiment_dir(config) / CHECKPOINT_LAST).exists():
        config.resume = str(experiment_dir(config) / CHECKPOINT_LAST)
    resume_state = load_resumed(config) if config.resume and not config.eval_only else None
    for name, least in (("batch_size", 1), ("epochs", 0), ("n_bins", 1), ("bootstrap", 0)):
        value = getattr(config, name)
        if value is None or value < least:
            raise ValueError(f"--{name.replace('_', '-')} must be at least {least}, got {value}")
    check_training_options(config)
    check_calibrators(config.calibrators, None, {"ts_method": config.ts_method, "n_bins": config.n_bins},
                      allow_auto=False)
    return resume_state


def _require_preprocessing(config: TrainConfig) -> None:
    """--eval-shift / --ood corrupt or score images as the model sees them: an evaluated checkpoint must record its
    normalisation (or the flags give it), else the shift would be measured through a guessed transform."""
    if (config.eval_shift or config.ood) and (config.mean is None or config.std is None):
        raise ValueError(f"--eval-shift / --ood need the model's preprocessing and {config.checkpoint} records no "
                         "normalisation (not a model file of train.py): give --mean and --std (and --img-size)")


def _refuse_training_split(config: TrainConfig) -> None:
    """--eval-only never scores the split the checkpoint trained on (a flat folder's only split, ``train``, is
    scored when it is another folder than the training run's)."""
    from ..data.sources import same_dataset

    meta = read_model_meta(config.checkpoint) or {}
    trained = meta.get("train_split") or "train"
    if config.test_split == trained and same_dataset(meta.get("dataset"), config.dataset):
        raise ValueError(f"--test-split {config.test_split!r} of {config.dataset} is the split {config.checkpoint} was "
                         "trained on; score a held-out split or folder")
