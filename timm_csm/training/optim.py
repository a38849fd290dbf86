"""The optimizer and the epoch schedule of a run (timm's ``create_optimizer_v2`` / ``create_scheduler_v2``), a
schedule's decay fitted to the run's ``--epochs``, and the schedule of a resumed run whose ``--epochs`` extends it."""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, List, Optional, Sequence

import torch

from .config import TrainConfig

__all__ = ["create_optimizer", "create_scheduler", "restore_scheduler", "scale_milestones", "fit_decay_to_epochs"]

#: the option holding the epochs where ``--sched`` decays the learning rate
_DECAY_OPTION = {"multistep": "decay_milestones", "step": "decay_epochs"}


def create_optimizer(config: TrainConfig, model):
    """``--opt`` over the model's parameters (``--filter-bias-and-bn`` exempts biases and norms from decay)."""
    from timm.optim import create_optimizer_v2

    return create_optimizer_v2(model, opt=config.opt, lr=config.lr, weight_decay=config.weight_decay,
                               momentum=config.momentum, filter_bias_and_bn=config.filter_bias_and_bn)


def create_scheduler(config: TrainConfig, optimizer):
    """The epoch schedule of ``--sched`` over ``--epochs``, stepped once per epoch."""
    from timm.scheduler import create_scheduler_v2

    scheduler, _ = create_scheduler_v2(
        optimizer, sched=config.sched, num_epochs=config.epochs, decay_epochs=config.decay_epochs,
        decay_milestones=list(config.decay_milestones), decay_rate=config.decay_rate, min_lr=config.min_lr,
        warmup_lr=config.warmup_lr, warmup_epochs=config.warmup_epochs)
    return scheduler


def scale_milestones(milestones: Sequence[float], from_epochs: int, to_epochs: int) -> List[int]:
    """Epochs of a schedule of ``from_epochs`` epochs at the same share of ``to_epochs``: ``ceil(m * to / from)``
    (80 and 120 of 200 are 24 and 36 of 60, both 1 of 1)."""
    return [math.ceil(m * to_epochs / from_epochs) for m in milestones]


def fit_decay_to_epochs(config: TrainConfig) -> Optional[str]:
    """Keep the decay of ``--sched`` inside the run: multistep milestones (``--decay-milestones``) or a step period
    (``--decay-epochs``) beyond ``--epochs`` would never decay the learning rate. Given explicitly, that is a
    ``ValueError``; left at their defaults (the paper's 80 and 120 of 200 epochs, a period of 100), they are scaled
    to ``--epochs`` (:func:`scale_milestones`) in ``config``, and the returned line says so. None when the decay
    lies inside the run, ``--sched`` has none, or nothing trains (``--epochs 0`` evaluates the initial model)."""
    option = _DECAY_OPTION.get(config.sched)
    if option is None or config.epochs == 0:
        return None
    value = getattr(config, option)
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    if all(v <= config.epochs for v in values):
        return None
    flag, shown = f"--{option.replace('_', '-')}", " ".join(f"{v:g}" for v in values)
    if option in config.explicit:
        raise ValueError(f"{flag} {shown} lies beyond --epochs {config.epochs}: the learning rate would never decay "
                         f"there; give epochs up to {config.epochs}")
    default_epochs = TrainConfig.__dataclass_fields__["epochs"].default
    scaled = scale_milestones(values, default_epochs, config.epochs)
    setattr(config, option, scaled if isinstance(value, (list, tuple)) else scaled[0])
    return (f"the default {flag} {shown} (of {default_epochs} epochs) lies beyond --epochs {config.epochs}: scaled "
            f"to {' '.join(map(str, scaled))}, the same share of the run (give {flag} to choose)")


def _probe_schedule(config: TrainConfig, epochs: int) -> Dict[str, Any]:
    """The state of a fresh schedule of ``epochs`` epochs (on a throw-away optimizer)."""
    probe = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=config.lr)
    return create_scheduler(dataclasses.replace(config, epochs=epochs), probe).state_dict()


def restore_scheduler(config: TrainConfig, scheduler, scheduler_state, planned: int, start_epoch: int,
                      accelerator) -> None:
    """Load the resumed scheduler state ``scheduler_state`` of a run set to ``planned`` epochs. When ``--epochs``
    extends the run, the schedule is rebuilt for the new total: the settings that depend on the number of epochs (a
    cosine's length, ...) are those of a schedule of ``--epochs`` epochs, and the next epoch takes that schedule's
    lr; trained epochs keep the lr they had."""
    state = dict(scheduler_state)
    changed = {}
    if config.epochs != planned:
        old = _probe_schedule(config, planned)
        changed = {k: v for k, v in _probe_schedule(config, config.epochs).items() if k not in old or old[k] != v}
    scheduler.load_state_dict(dict(state, **changed))
    if changed:
        scheduler.step(start_epoch)
        accelerator.print(f"--epochs {config.epochs} extends the run from {planned} epochs: the {config.sched} "
                          f"schedule is rebuilt for {config.epochs} epochs; epoch {start_epoch} starts at lr "
                          f"{scheduler.optimizer.param_groups[0]['lr']:.6g}")
    elif config.epochs != planned:
        accelerator.print(f"--epochs {config.epochs} extends the run from {planned} epochs: the {config.sched} "
                          "schedule does not depend on the number of epochs and continues as it was")
