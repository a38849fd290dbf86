"""The optimizer and the epoch schedule of a run (timm's ``create_optimizer_v2`` / ``create_scheduler_v2``), and the
schedule of a resumed run whose ``--epochs`` extends it."""
from __future__ import annotations

import dataclasses
from typing import Any, Dict

import torch

from .config import TrainConfig

__all__ = ["create_optimizer", "create_scheduler", "restore_scheduler"]


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


def _probe_schedule(config: TrainConfig, epochs: int) -> Dict[str, Any]:
    """The state of a fresh schedule of ``epochs`` epochs (on a throw-away optimizer)."""
    probe = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=config.lr)
    return create_scheduler(dataclasses.replace(config, epochs=epochs), probe).state_dict()


def restore_scheduler(config: TrainConfig, scheduler, resume_state, start_epoch: int, accelerator) -> None:
    """Load the resumed scheduler state. When ``--epochs`` extends the run, the schedule is rebuilt for the new
    total: the settings that depend on the number of epochs (a cosine's length, ...) are those of a schedule of
    ``--epochs`` epochs, and the next epoch takes that schedule's lr; trained epochs keep the lr they had."""
    planned = int(resume_state["meta"]["config"]["epochs"])
    state = dict(resume_state["scheduler"])
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
