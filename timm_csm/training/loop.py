"""The training loop: one epoch of a :class:`~timm_csm.training.tasks.TrainingTask`, prediction over a loader, and
the epochs of a run (validation, the loss's epoch-end hooks, the schedule, the log and the checkpoints).

The loop knows no method: every step is ``out = task(batch)``, ``accelerator.backward(out["loss"])``, gradient
clipping (``--clip-grad``, by norm or value) and ``optimizer.step()``. After each epoch: the criterion's ``sync``,
validation logits gathered over processes, its ``on_epoch_end``, the scheduler step, the per-epoch log and the
checkpoints of :class:`~timm_csm.training.checkpoint.CheckpointSaver`.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Dict, Optional

import torch
import torch.nn as nn
from torch.utils.data import DataLoader

from ..data import GlobalBatchSampler, IndexDataset
from ..metrics import calibration_metrics
from .checkpoint import CheckpointSaver, rng_state, set_rng_state
from .evaluation import metric_row
from .optim import create_optimizer, create_scheduler, restore_scheduler
from .reporting import write_log

__all__ = ["train_one_epoch", "predict", "train_loader", "fit"]

_SHOWN = ("epoch", "lr", "train_loss", "val_accuracy", "val_ece", "val_nll", "epoch_time")


def train_one_epoch(task, optimizer, loader, accelerator, epoch: int, clip_grad: float = 0.0,
                    clip_mode: str = "norm", progress: bool = False) -> Dict[str, float]:
    """One pass over ``loader``; returns ``{"train_loss": mean step loss over processes, "train_<term>": mean of
    each logged loss term on this process}``. A non-finite loss raises ``FloatingPointError``."""
    from tqdm.auto import tqdm

    task.forward_module.train()
    device = accelerator.device
    total = torch.zeros((), dtype=torch.float64, device=device)
    steps = 0
    terms_sum: Dict[str, float] = {}
    params = [p for p in task.model.parameters() if p.requires_grad]
    bar = tqdm(loader, desc=f"epoch {epoch}", leave=False, dynamic_ncols=True,
               disable=not (progress and accelerator.is_main_process))
    for batch in bar:
        out = task({k: v.to(device, non_blocking=True) for k, v in batch.items()})
        loss = out["loss"]
        if not torch.isfinite(loss):
            raise FloatingPointError(f"non-finite training loss {float(loss)} at epoch {epoch}, step {steps}")
        optimizer.zero_grad(set_to_none=True)
        accelerator.backward(loss)
        if clip_grad and clip_grad > 0:
            if clip_mode == "norm":
                accelerator.clip_grad_norm_(params, clip_grad)
            else:
                accelerator.clip_grad_value_(params, clip_grad)
        optimizer.step()
        total += loss.detach().double()
        steps += 1
        for k, v in (out["terms"] or {}).items():
            terms_sum[k] = terms_sum.get(k, 0.0) + float(v)
        if steps % 10 == 0:
            bar.set_postfix(loss=f"{float(total) / steps:.4f}")
    bar.close()
    row = {"train_loss": float(accelerator.reduce(total / max(steps, 1), reduction="mean"))}
    row.update({f"train_{k}": v / max(steps, 1) for k, v in terms_sum.items()})
    return row


@torch.no_grad()
def predict(model: nn.Module, loader, accelerator, features: bool = False):
    """Logits (N, K), labels (N,) and optionally penultimate features (N, D) over ``loader``, gathered from
    every process in dataset order (float32 on the CPU)."""
    was_training = model.training
    model.eval()
    logits_all, labels_all, feats_all = [], [], []
    for batch in loader:
        x = batch["pixel_values"].to(accelerator.device)
        y = batch["labels"].to(accelerator.device)
        with accelerator.autocast():
            if features:
                fmap = model.forward_features(x)
                feats = model.forward_head(fmap, pre_logits=True)
                logits = model.forward_head(fmap)
            else:
                logits = model(x)
        gathered = accelerator.gather_for_metrics((logits.float(), y) + ((feats.float(),) if features else ()))
        logits_all.append(gathered[0].cpu())
        labels_all.append(gathered[1].cpu())
        if features:
            feats_all.append(gathered[2].cpu())
    model.train(was_training)
    out = (torch.cat(logits_all), torch.cat(labels_all))
    return out + ((torch.cat(feats_all),) if features else ())


def train_loader(task, arrays, transform, args, accelerator):
    """(loader, sampler) of the training split: ``task``'s collator over global batches of ``num_processes x
    --batch-size`` samples (:class:`~timm_csm.data.GlobalBatchSampler`, dropping the last partial batch)."""
    collator = task.create_collator(arrays.images, arrays.labels, transform, seed=args.seed)
    sampler = GlobalBatchSampler(len(arrays.images), args.batch_size, accelerator.num_processes,
                                 accelerator.process_index, shuffle=True, seed=args.seed, drop_last=True)
    loader = DataLoader(IndexDataset(len(arrays.images)), batch_sampler=sampler, collate_fn=collator,
                        num_workers=args.workers, pin_memory=args.pin_mem,
                        generator=torch.Generator().manual_seed(args.seed))
    return loader, sampler


def _resume(args, task, optimizer, scheduler, resume_state, accelerator) -> tuple:
    """Load a resumed run's training state; (first epoch, history, best)."""
    task.model.load_state_dict(resume_state["model"])
    optimizer.load_state_dict(resume_state["optimizer"])
    start_epoch = int(resume_state["epoch"]) + 1
    restore_scheduler(args, scheduler, resume_state, start_epoch, accelerator)
    task.criterion.load_state_dict(resume_state["loss"])
    set_rng_state(resume_state["rng"])
    return start_epoch, list(resume_state["history"]), dict(resume_state["best"])


def fit(args, task, train_arrays, train_tf, accelerator, out_dir: Path, meta: Dict[str, Any], val_loader,
        resume_state: Optional[Dict[str, Any]] = None):
    """Train ``task`` for epochs ``[start, --epochs)``; returns (history, best)."""
    optimizer = create_optimizer(args, task.model)
    scheduler = create_scheduler(args, optimizer)
    start_epoch, history, best = 0, [], None
    if resume_state is not None:
        start_epoch, history, best = _resume(args, task, optimizer, scheduler, resume_state, accelerator)
    saver = CheckpointSaver(out_dir, args.select_by, args.checkpoint_hist, best)
    optimizer = task.prepare(accelerator, optimizer)
    loader, sampler = train_loader(task, train_arrays, train_tf, args, accelerator)
    if args.log_with:
        accelerator.init_trackers(out_dir.name, config={k: v for k, v in vars(args).items() if not k.startswith("_")
                                                        and isinstance(v, (int, float, str, bool))})
    for epoch in range(start_epoch, args.epochs):
        t0 = time.time()
        sampler.set_epoch(epoch)
        row: Dict[str, Any] = {"epoch": epoch, "lr": optimizer.param_groups[0]["lr"]}
        row.update(train_one_epoch(task, optimizer, loader, accelerator, epoch, args.clip_grad, args.clip_mode,
                                   args.progress))
        val = predict(task.model, val_loader, accelerator) if val_loader is not None else ()
        if val:
            row.update(metric_row("val", calibration_metrics(*val, n_bins=args.n_bins)))
        task.end_epoch(accelerator, *val)
        scheduler.step(epoch + 1, row.get(saver.metric_key))
        row["epoch_time"] = round(time.time() - t0, 3)
        history.append(row)
        improved = saver.update(epoch, row, validated=val_loader is not None)
        if accelerator.is_main_process:
            saver.save(epoch, {"model": task.model.state_dict(), "optimizer": optimizer.state_dict(),
                               "scheduler": scheduler.state_dict(), "loss": task.criterion.state_dict(),
                               "rng": rng_state(), "epoch": epoch, "best": saver.best, "history": history,
                               "meta": meta}, improved)
            write_log(out_dir, history)
            accelerator.print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()
                                          if k in _SHOWN}))
        if args.log_with:
            accelerator.log({k: v for k, v in row.items() if isinstance(v, (int, float))}, step=epoch)
        accelerator.wait_for_everyone()
    return history, saver.best
