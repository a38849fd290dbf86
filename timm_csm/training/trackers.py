"""Experiment trackers of a run (``--log-with``, ``--log-wandb``), through accelerate's ``Accelerator`` trackers.

``--log-with`` names accelerate trackers, comma-separated (``tensorboard``, ``wandb``, ..., or ``all`` for every
installed one); ``--log-wandb`` is timm's flag for ``wandb``. accelerate skips a named tracker whose package is
missing without a word, so :func:`tracker_names` refuses it instead. What a run logs, on one step axis (the optimizer
update count, so that every tracker sees increasing steps):

* ``train/loss`` after every optimizer update: the update's loss, averaged over processes and accumulated batches;
* the per-epoch row of ``log.json`` (numbers only) at the epoch's last update;
* at the end (:func:`log_results`): the test metrics before and after temperature scaling
  (``test/pre_ts/<metric>``, ``test/post_ts/<metric>``) and the ``temperature``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional

from .config import TrainConfig

__all__ = ["tracker_names", "start_trackers", "numeric", "log_results", "make_accelerator"]


def tracker_names(config: TrainConfig) -> List[str]:
    """The accelerate trackers of ``--log-with`` and ``--log-wandb``; a name accelerate does not know, or whose
    package is not installed, is a ``ValueError`` saying what to install."""
    from accelerate.tracking import get_available_trackers
    from accelerate.utils import LoggerType

    names = [n.strip() for n in str(config.log_with or "").split(",") if n.strip()]
    if getattr(config, "log_wandb", False) and "wandb" not in names:
        names.append("wandb")
    available = {getattr(t, "value", t) for t in get_available_trackers()}
    for name in names:
        flag = "--log-wandb" if name == "wandb" and config.log_wandb else f"--log-with {name}"
        if name not in LoggerType.list():
            raise ValueError(f"{flag}: unknown tracker {name!r}; accelerate's trackers are {LoggerType.list()}")
        if name != "all" and name not in available:
            raise ValueError(f"{flag}: the {name} package is not installed (pip install {name}), so accelerate "
                             "cannot log to it; install it or drop the flag")
    return names


def numeric(row: Dict[str, Any]) -> Dict[str, float]:
    """The int / float entries of ``row`` (what trackers take)."""
    return {k: v for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def start_trackers(accelerator, config: TrainConfig, project: str) -> None:
    """Start the trackers' run ``project`` with the run's scalar options as its configuration (main process)."""
    scalars = {k: v for k, v in config.options().items() if isinstance(v, (int, float, str, bool))}
    accelerator.init_trackers(project, config=scalars)


def log_results(accelerator, results: Dict[str, Any], step: int) -> None:
    """The final test metrics of ``results`` (results.json) before and after temperature scaling, at ``step``
    (the validation metrics, under ``val/``, when the dataset has no test split)."""
    values: Dict[str, float] = {}
    split = "test" if results["test"] else "val"
    for phase, metrics in (results[split] or {}).items():
        values.update({f"{split}/{phase}/{k}": v for k, v in numeric(metrics or {}).items()})
    if results.get("temperature") is not None:
        values["temperature"] = float(results["temperature"])
    accelerator.log(values, step=step)


def make_accelerator(config: TrainConfig, out_dir: Optional[Path]):
    """An ``Accelerator`` for ``config``; its trackers (``--log-with``, ``--log-wandb``) only with the run folder
    ``out_dir``."""
    from accelerate import Accelerator

    kwargs = {}
    if config.amp:
        kwargs["mixed_precision"] = "bf16" if config.amp_dtype == "bfloat16" else "fp16"
    if config.cpu:
        kwargs["cpu"] = True
    if tracker_names(config) and out_dir is not None:
        kwargs["log_with"] = tracker_names(config)
        kwargs["project_dir"] = str(out_dir)
    return Accelerator(**kwargs)
