"""The training loop: one epoch of a :class:`~timm_csm.training.tasks.TrainingTask` and
the epochs of a run (validation, the loss's epoch-end hooks, the schedule, the log and the checkpoints).

The loop knows no method: every batch is ``out = task(batch)`` and ``accelerator.backward(out["loss"])``; every
``--grad-accum-steps`` batches an update: gradient clipping (``--clip-grad``, by norm or value),
``optimizer.step()``, the ``--model-ema`` update and the per-update tracker log. After each epoch: the criterion's
``sync``, validation logits gathered over processes (of the EMA, when there is one, and of the model), its
``on_epoch_end``, the scheduler step, the per-epoch log (``log.json``, timm's ``summary.csv``, the trackers) and
the checkpoints of :class:`~timm_csm.training.checkpoint.CheckpointSaver`. The model's set-up (``--sync-bn``,
``--channels-last``, ``--torchcompile``) is :mod:`~timm_csm.training.prepare`'s.
"""
from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import torch
from torch.utils.data import DataLoader

from ..data import GlobalBatchSampler, IndexDataset
from ..evaluation.predict import predict
from ..evaluation.scores import metric_row
from ..metrics import calibration_metrics
from ..trainer import ResumableTrainer, progress_bar
from .checkpoint import CheckpointSaver, rng_state, set_rng_state
from .config import TrainConfig
from .optim import create_optimizer, create_scheduler, restore_scheduler
from .prepare import prepare_training, updates_per_epoch
from .reporting import SUMMARY_FILE, write_log, write_summary
from .trackers import numeric, tracker_names

__all__ = ["train_one_epoch", "train_loader", "fit"]

_SHOWN = ("epoch", "lr", "train_loss", "val_accuracy", "val_ece", "val_nll", "epoch_time")


def _device_batch(batch: Dict[str, torch.Tensor], device, channels_last: bool) -> Dict[str, torch.Tensor]:
    """``batch`` on ``device``; with ``channels_last`` its image tensors (4-D) in ``torch.channels_last``."""
    out = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
    if channels_last:
        out = {k: v.contiguous(memory_format=torch.channels_last) if v.dim() == 4 else v for k, v in out.items()}
    return out


def _optimizer_step(optimizer, accelerator, params, clip_grad: float, clip_mode: str) -> None:
    """Clip the accumulated gradients (``--clip-grad``, by norm or value), step and clear them."""
    if clip_grad and clip_grad > 0:
        if clip_mode == "norm":
            accelerator.clip_grad_norm_(params, clip_grad)
        else:
            accelerator.clip_grad_value_(params, clip_grad)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def train_one_epoch(task, optimizer, loader, accelerator, epoch: int, config: TrainConfig, ema=None,
                    num_updates: int = 0, log_steps: bool = False) -> Tuple[Dict[str, float], int]:
    """One pass over ``loader``; returns (``{"train_loss": mean batch loss over processes, "train_<term>": mean of
    each logged loss term over processes}``, the optimizer update count after the epoch).

    Options of ``config``: ``grad_accum_steps`` (N: the gradients of N batches, each loss divided by N, add up before
    one optimizer update; the epoch's last group of ``len(loader) % N`` batches divides by its own size, as timm; the
    distributed gradient all-reduce runs on the update's batch only, ``accelerator.no_sync`` on the others),
    ``clip_grad`` / ``clip_mode`` (on the update's gradients), ``channels_last``, ``progress``. After each update:
    ``ema.update(model, step=num_updates)`` and, with ``log_steps``, ``train/loss`` (the update's loss averaged over
    processes) to the trackers. A non-finite loss raises ``FloatingPointError``."""
    task.forward_module.train()
    device, accum, n = accelerator.device, config.grad_accum_steps, len(loader)
    short_from = n - n % accum  # batches from here form the epoch's last, shorter group
    total = torch.zeros((), dtype=torch.float64, device=device)
    group_loss = torch.zeros_like(total)
    steps, terms_sum = 0, {}
    params = [p for p in task.model.parameters() if p.requires_grad]
    bar = progress_bar(f"epoch {epoch}", iterable=loader, unit="batch", leave=False,
                       enabled=config.progress and accelerator.is_main_process)
    optimizer.zero_grad(set_to_none=True)
    for i, batch in enumerate(bar):
        group = accum if i < short_from else n - short_from
        update = (i + 1) % accum == 0 or i == n - 1
        with contextlib.nullcontext() if update else accelerator.no_sync(task.forward_module):
            out = task(_device_batch(batch, device, config.channels_last))
            loss = out["loss"]
            if not torch.isfinite(loss):
                raise FloatingPointError(f"non-finite training loss {float(loss)} at epoch {epoch}, step {steps}")
            accelerator.backward(loss / group if group > 1 else loss)
        total += loss.detach().double()
        group_loss += loss.detach().double()
        steps += 1
        for k, v in (out["terms"] or {}).items():
            terms_sum[k] = terms_sum.get(k, 0.0) + float(v)
        if update:
            _optimizer_step(optimizer, accelerator, params, config.clip_grad, config.clip_mode)
            num_updates += 1
            if ema is not None:
                ema.update(task.model, step=num_updates)
            if log_steps:
                loss_value = float(accelerator.reduce(group_loss / group, reduction="mean"))
                accelerator.log({"train/loss": loss_value}, step=num_updates)
            group_loss.zero_()
        if steps % 10 == 0:
            bar.show_loss(float(total) / steps)
    bar.close()
    row = {"train_loss": float(accelerator.reduce(total / max(steps, 1), reduction="mean"))}
    if terms_sum:  # every process logs the same terms (one loss): their means over processes, as the loss's
        means = torch.tensor([v / max(steps, 1) for v in terms_sum.values()], dtype=torch.float64, device=device)
        row.update(zip((f"train_{k}" for k in terms_sum), accelerator.reduce(means, reduction="mean").tolist()))
    return row, num_updates


def train_loader(task, arrays, transform, config: TrainConfig, accelerator):
    """(loader, sampler) of the training split: ``task``'s collator over global batches of ``num_processes x
    --batch-size`` samples (:class:`~timm_csm.data.GlobalBatchSampler`, dropping the last partial batch)."""
    collator = task.create_collator(arrays.images, arrays.labels, transform, seed=config.seed)
    sampler = GlobalBatchSampler(len(arrays.images), config.batch_size, accelerator.num_processes,
                                 accelerator.process_index, shuffle=True, seed=config.seed, drop_last=True)
    loader = DataLoader(IndexDataset(len(arrays.images)), batch_sampler=sampler, collate_fn=collator,
                        num_workers=config.workers, pin_memory=config.pin_mem,
                        generator=torch.Generator().manual_seed(config.seed))
    return loader, sampler


def _resume(trainer: ResumableTrainer, config: TrainConfig, task, optimizer, scheduler, resume_state,
            accelerator) -> tuple:
    """Load a resumed run's training state (its EMA is loaded once the EMA is built: ``prepare_training``);
    (first epoch, history, best)."""
    start_epoch = trainer.first_unit(resume_state)

    def load_scheduler(state: Dict[str, Any]) -> None:
        restore_scheduler(config, scheduler, state, int(resume_state["meta"]["config"]["epochs"]), start_epoch,
                          accelerator)

    trainer.resume(resume_state, {"model": task.model, "optimizer": optimizer, "scheduler": load_scheduler,
                                  "loss": task.criterion, "rng": set_rng_state})
    return start_epoch, list(resume_state["history"]), dict(resume_state["best"])


def _validate(task, ema, val_loader, accelerator, config: TrainConfig) -> Tuple[Dict[str, float], tuple, tuple]:
    """(log entries, the model's validation predictions, the validated weights' predictions). With an EMA the
    validated weights are the EMA's (``val_*``; the model's own metrics are ``val_online_*``); the loss's epoch-end
    hooks take the model's predictions, since they adapt the loss to the model being trained."""
    if val_loader is None:
        return {}, (), ()
    online = predict(task.model, val_loader, accelerator, channels_last=config.channels_last)
    if ema is None:
        return metric_row("val", calibration_metrics(*online, n_bins=config.n_bins)), online, online
    validated = predict(ema.module, val_loader, accelerator, channels_last=config.channels_last)
    entries = metric_row("val", calibration_metrics(*validated, n_bins=config.n_bins))
    entries.update(metric_row("val_online", calibration_metrics(*online, n_bins=config.n_bins)))
    return entries, online, validated


def _training_state(task, optimizer, scheduler, ema, saver, history, meta) -> Dict[str, Any]:
    """The training state (:mod:`timm_csm.trainer`'s schema; the trainer adds the epoch) with the classifier's own
    entries: the loss's state, the best epoch and the run's metadata."""
    state = {"model": task.model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
             "loss": task.criterion.state_dict(), "rng": rng_state(), "best": saver.best, "history": history,
             "meta": meta}
    if ema is not None:
        state["ema"] = ema.module.state_dict()
    return state


def fit(config: TrainConfig, task, train_arrays, train_tf, accelerator, out_dir: Path, meta: Dict[str, Any], val_loader,
        resume_state: Optional[Dict[str, Any]] = None):
    """Train ``task`` for epochs ``[start, --epochs)`` on the resumable trainer (its unit the epoch, each one
    checkpointed by the :class:`~timm_csm.training.checkpoint.CheckpointSaver`); returns (history, best). Each epoch's
    row also records ``step``, the optimizer update count (the step axis of the trackers)."""
    trainer = ResumableTrainer(out_dir, "training state", unit="epoch", cache=False,
                               is_main_process=accelerator.is_main_process,
                               wait_for_everyone=accelerator.wait_for_everyone)
    optimizer = create_optimizer(config, task.model)
    scheduler = create_scheduler(config, optimizer)
    start_epoch, history, best = 0, [], None
    if resume_state is not None:  # read before the run was built, its configuration restored (training.run_dir)
        start_epoch, history, best = _resume(trainer, config, task, optimizer, scheduler, resume_state, accelerator)
    saver = CheckpointSaver(out_dir, config.select_by, config.checkpoint_hist, best)
    optimizer, ema = prepare_training(config, task, optimizer, accelerator, resume_state)
    loader, sampler = train_loader(task, train_arrays, train_tf, config, accelerator)
    num_updates = start_epoch * updates_per_epoch(len(loader), config.grad_accum_steps)
    log_steps = bool(tracker_names(config))
    if accelerator.is_main_process:
        from timm.utils import trim_summary

        trim_summary(str(out_dir / SUMMARY_FILE), start_epoch)
    improved, validated = False, ()

    def train_epoch(epoch: int, _bar) -> None:  # each epoch shows its own bar of batches
        nonlocal num_updates, improved, validated
        t0 = time.time()
        sampler.set_epoch(epoch)
        row: Dict[str, Any] = {"epoch": epoch, "lr": optimizer.param_groups[0]["lr"]}
        train_row, num_updates = train_one_epoch(task, optimizer, loader, accelerator, epoch, config, ema, num_updates,
                                                 log_steps)
        row.update(train_row, step=num_updates)
        entries, online, validated = _validate(task, ema, val_loader, accelerator, config)
        row.update(entries)
        task.end_epoch(accelerator, *online)
        scheduler.step(epoch + 1, row.get(saver.metric_key))
        row["epoch_time"] = round(time.time() - t0, 3)
        history.append(row)
        improved = saver.update(epoch, row, validated=val_loader is not None)

    def save_and_log(epoch: int, state: Dict[str, Any]) -> None:
        """The saver's files (last, best, history), then the epoch's log, summary row, line and tracker entry."""
        row = history[-1]
        saver.save(epoch, state, improved)
        write_log(out_dir, history)
        write_summary(out_dir, row, validated)
        accelerator.print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()
                                      if k in _SHOWN}))
        if log_steps:  # the trackers log on the main process only
            accelerator.log(numeric(row), step=num_updates)

    def training_state() -> Dict[str, Any]:
        return _training_state(task, optimizer, scheduler, ema, saver, history, meta)

    trainer.fit(train_epoch, training_state, start_epoch, config.epochs, save=save_and_log)
    return history, saver.best
