"""The model of a training run on its accelerator, as timm's ``train.py`` sets it up: ``--sync-bn``,
``--channels-last``, the distributed wrapper (``accelerate.prepare``), ``--model-ema`` and ``--torchcompile``, in
timm's order (synchronised batch norm and memory layout before the wrapper; the EMA copies the unwrapped model on
its device; ``torch.compile`` goes over the wrapped training forward, as timm compiles after DDP).

:func:`check_training_options` raises on a bad value of these flags (and of ``--grad-accum-steps`` and the
trackers) before anything is loaded.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from ..trainer import load_training_state
from .config import TrainConfig
from .sync_bn import convert_sync_batchnorm
from .trackers import tracker_names

__all__ = ["check_training_options", "prepare_training", "updates_per_epoch"]


def check_training_options(config: TrainConfig) -> None:
    """``ValueError`` for ``--grad-accum-steps`` below 1, ``--model-ema-decay`` outside [0, 1), a
    ``--torchcompile`` backend torch does not have, or a tracker that is unknown or not installed."""
    if config.grad_accum_steps is None or config.grad_accum_steps < 1:
        raise ValueError(f"--grad-accum-steps must be >= 1 (1: an update per batch), got {config.grad_accum_steps}")
    if not 0.0 <= config.model_ema_decay < 1.0:
        raise ValueError(f"--model-ema-decay must lie in [0, 1) (timm's default 0.9998), got {config.model_ema_decay}")
    if config.torchcompile:
        backends = torch.compiler.list_backends(exclude_tags=())
        if config.torchcompile not in backends:
            raise ValueError(f"--torchcompile {config.torchcompile!r}: torch has no such backend; its backends are "
                             f"{', '.join(backends)}")
    tracker_names(config)


def updates_per_epoch(num_batches: int, accum_steps: int) -> int:
    """Optimizer updates of an epoch of ``num_batches`` batches: one per ``accum_steps``, and one for a last,
    shorter group (as timm)."""
    return -(-num_batches // accum_steps)


def _sync_batch_norm(task, accelerator) -> None:
    """``--sync-bn``: the task's batch norms synchronised over the processes (a note and no change on one)."""
    n = sum(isinstance(m, _BatchNorm) for m in task.model.modules())
    if accelerator.num_processes == 1:
        accelerator.print("--sync-bn: one process, batch-norm statistics are already those of the whole batch; "
                          "nothing converted")
        return
    task.model = task.forward_module.model = convert_sync_batchnorm(task.model, device=accelerator.device)
    accelerator.print(f"--sync-bn: {n} batch norms synchronised over {accelerator.num_processes} processes")


def prepare_training(config: TrainConfig, task, optimizer, accelerator, resume_state: Optional[Dict[str, Any]] = None):
    """Set up ``task`` for training on ``accelerator``: ``--sync-bn``, ``--channels-last``, ``task.prepare`` (device
    and distributed wrapper), the EMA of ``--model-ema`` (``timm.utils.ModelEmaV3`` with ``--model-ema-decay`` and
    ``--model-ema-warmup``; a resumed state's ``ema`` weights when it has them, else a copy of the model) and
    ``--torchcompile`` (``torch.compile(backend, mode)`` of the training forward; prediction runs the model
    itself). Returns (prepared optimizer, EMA or None)."""
    if config.sync_bn:
        _sync_batch_norm(task, accelerator)
    if config.channels_last:
        task.model.to(memory_format=torch.channels_last)
    optimizer = task.prepare(accelerator, optimizer)
    ema = None
    if config.model_ema:
        from timm.utils import ModelEmaV3

        ema = ModelEmaV3(task.model, decay=config.model_ema_decay, use_warmup=config.model_ema_warmup)
        if resume_state is not None and "ema" in resume_state:
            load_training_state(resume_state, {"ema": ema.module})
    if config.torchcompile:
        task.forward_module = torch.compile(task.forward_module, backend=config.torchcompile,
                                            mode=config.torchcompile_mode)
    return optimizer, ema
