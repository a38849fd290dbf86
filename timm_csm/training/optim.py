"""The optimizer and the epoch schedule of a run (timm's ``create_optimizer_v2`` / ``create_scheduler_v2``), and the
schedule of a resumed run whose ``--epochs`` extends it."""
from __future__ import annotations

import argparse
from typing import Any, Dict

import torch

__all__ = ["create_optimizer", "create_scheduler", "restore_scheduler"]


def create_optimizer(args, model):
    """``--opt`` over the model's parameters (``--filter-bias-and-bn`` exempts biases and norms from decay)."""
    from timm.optim import create_optimizer_v2

    return create_optimizer_v2(model, opt=args.opt, lr=args.lr, weight_decay=args.weight_decay,
                               momentum=args.momentum, filter_bias_and_bn=args.filter_bias_and_bn)


def create_scheduler(args, optimizer):
    """The epoch schedule of ``--sched`` over ``--epochs``, stepped once per epoch."""
    from timm.scheduler import create_scheduler_v2

    scheduler, _ = create_scheduler_v2(
        optimizer, sched=args.sched, num_epochs=args.epochs, decay_epochs=args.decay_epochs,
        decay_milestones=list(args.decay_milestones), decay_rate=args.decay_rate, min_lr=args.min_lr,
        warmup_lr=args.warmup_lr, warmup_epochs=args.warmup_epochs)
    return scheduler


def _probe_schedule(args, epochs: int) -> Dict[str, Any]:
    """The state of a fresh schedule of ``epochs`` epochs (on a throw-away optimizer)."""
    probe = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=args.lr)
    return create_scheduler(argparse.Namespace(**dict(vars(args), epochs=epochs)), probe).state_dict()


def restore_scheduler(args, scheduler, resume_state, start_epoch: int, accelerator) -> None:
    """Load the resumed scheduler state. When ``--epochs`` extends the run, the schedule is rebuilt for the new
    total: the settings that depend on the number of epochs (a cosine's length, ...) are those of a schedule of
    ``--epochs`` epochs, and the next epoch takes that schedule's lr; trained epochs keep the lr they had."""
    planned = int(resume_state["meta"]["config"]["epochs"])
    state = dict(resume_state["scheduler"])
    changed = {}
    if args.epochs != planned:
        old = _probe_schedule(args, planned)
        changed = {k: v for k, v in _probe_schedule(args, args.epochs).items() if k not in old or old[k] != v}
    scheduler.load_state_dict(dict(state, **changed))
    if changed:
        scheduler.step(start_epoch)
        accelerator.print(f"--epochs {args.epochs} extends the run from {planned} epochs: the {args.sched} schedule "
                          f"is rebuilt for {args.epochs} epochs; epoch {start_epoch} starts at lr "
                          f"{scheduler.optimizer.param_groups[0]['lr']:.6g}")
    elif args.epochs != planned:
        accelerator.print(f"--epochs {args.epochs} extends the run from {planned} epochs: the {args.sched} schedule "
                          "does not depend on the number of epochs and continues as it was")
