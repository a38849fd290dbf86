"""Training a class-conditional DDPM generator with accelerate: EMA weights, resumable checkpoints.

The checkpoint (``<output>/last.safetensors``: the training state of :mod:`timm_csm.trainer`, the classifier's
schema) holds the UNet, its EMA, the optimizer and the scheduler, the step, the history of losses and the training
time. A generator is hours of work, not a cache: a checkpoint that does not read or fit (damaged, a pickled one of
earlier versions, one of the earlier schema with its schedule under ``lr_sched``, as every checkpoint folder of the
previous layouts ``<output>/checkpoint`` has) is an error naming it (:func:`~timm_csm.io.read_checkpoint` with
``cache=False``), never a restart that would overwrite it.

Every random draw of step ``i`` (batch indices, flips, timesteps, noise, label dropout) comes from a generator seeded
with ``(seed, i, process index)``, so a run resumed from a checkpoint continues exactly as an uninterrupted run would.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Dict, Optional

import numpy as np
import torch
import torch.nn.functional as F

from ..io import CHECKPOINT_LAST
from ..trainer import ResumableTrainer
from .models import GeneratorConfig, create_class_unet

__all__ = ["train_generator", "to_model_range", "load_checkpoint_ema", "CHECKPOINT_MINUTES", "describe_training"]

#: minutes between two checkpoints at most (besides every ``checkpoint_every`` steps): a CPU run of the fmnist profile
#: takes about 9 minutes for its 250 steps
CHECKPOINT_MINUTES = 2.0

_EARLIER_CHECKPOINT = "checkpoint"  # the folder that held the checkpoint in the previous layouts (converted on read)
_PICKLED_STATE = "training_state.pt"  # EMA, optimizer and schedule, as torch.save wrote them in earlier versions


def to_model_range(images_uint8: torch.Tensor) -> torch.Tensor:
    """uint8 [0, 255] -> float [-1, 1], the range the generator models."""
    return images_uint8.float().div(127.5).sub(1.0)


def _step_generator(seed: int, step: int, rank: int) -> torch.Generator:
    return torch.Generator().manual_seed((seed * 1_000_003 + step) * 4099 + rank)


def _trainer(out: Path, log: Callable[[str], None], config: Optional[GeneratorConfig] = None, accelerator=None,
             progress: bool = False, checkpoint_minutes: Optional[float] = None) -> ResumableTrainer:
    """The resumable trainer of a generator run in ``out``: its unit is the step, a checkpoint every
    ``checkpoint_every`` steps (and ``checkpoint_minutes``) and after the last; not a cache (a checkpoint that does
    not read is an error)."""
    seconds = None if checkpoint_minutes is None else 60.0 * checkpoint_minutes
    return ResumableTrainer(out, "generator checkpoint", unit="step", cache=False,
                            every=config.checkpoint_every if config else 1, every_seconds=seconds,
                            earlier=_EARLIER_CHECKPOINT, pickled=[_PICKLED_STATE], desc="generator", progress=progress,
                            is_main_process=accelerator.is_main_process if accelerator else True,
                            wait_for_everyone=accelerator.wait_for_everyone if accelerator else lambda: None, log=log)


def load_checkpoint_ema(output_dir, num_classes: int, config: GeneratorConfig):
    """The EMA weights of the latest training checkpoint in ``output_dir`` as an eval-mode UNet, and its step: look
    at a generator while it is still training."""
    from diffusers.training_utils import EMAModel

    unet = create_class_unet(config, num_classes)
    ema = EMAModel(unet.parameters(), decay=config.ema_decay)
    resumed = _trainer(Path(output_dir), print).restore({"ema": ema})
    if resumed is None:
        raise FileNotFoundError(f"no training checkpoint in {output_dir}")
    ema.copy_to(unet.parameters())
    return unet.eval(), resumed[0]


def _check_training_data(images, labels, num_classes: int, config: GeneratorConfig):
    images = np.asarray(images)
    labels = np.asarray(labels, dtype=np.int64)
    if images.ndim != 4 or images.dtype != np.uint8:
        raise ValueError(f"images must be uint8 (N, C, H, W), got {images.dtype} {images.shape}")
    if images.shape[1] != config.in_channels or images.shape[2:] != (config.sample_size, config.sample_size):
        raise ValueError(
            f"images are {images.shape[1:]} but the generator profile expects "
            f"({config.in_channels}, {config.sample_size}, {config.sample_size})"
        )
    if labels.min() < 0 or labels.max() >= num_classes:
        raise ValueError(f"labels out of range [0, {num_classes})")
    return images, labels


def _resume(trainer: ResumableTrainer, unet, ema, optimizer, lr_scheduler):
    """Load the latest checkpoint of the run into the training objects; ``(step, losses, train seconds)``."""
    losses, seconds = [], []
    resumed = trainer.restore({"model": unet, "ema": ema, "optimizer": optimizer, "scheduler": lr_scheduler,
                               "history": losses.extend, "train_seconds": seconds.append})
    if resumed is None:
        return 0, [], 0.0
    trainer.log(f"resuming generator training from step {resumed[0]}")
    return resumed[0], losses, seconds[0]


def _noised_batch(data, targets, alphas, num_classes: int, config: GeneratorConfig, step: int, rank: int):
    """The step's batch, drawn from its own seeded generator (so a resumed run draws what the straight run drew):
    noised images x_t, timesteps, class labels (the null class ``num_classes`` with ``cond_drop_prob``), noise."""
    g = _step_generator(config.seed, step, rank)
    idx = torch.randint(0, len(data), (config.batch_size,), generator=g)
    x0 = to_model_range(data[idx])
    if config.hflip:
        flip = torch.rand(config.batch_size, generator=g) < 0.5
        x0 = torch.where(flip[:, None, None, None], x0.flip(-1), x0)
    y = targets[idx].clone()
    y[torch.rand(config.batch_size, generator=g) < config.cond_drop_prob] = num_classes  # null class
    t = torch.randint(0, config.num_train_timesteps, (config.batch_size,), generator=g)
    noise = torch.randn(x0.shape, generator=g)
    a = alphas[t].view(-1, 1, 1, 1)
    return a.sqrt() * x0 + (1 - a).sqrt() * noise, t, y, noise


def describe_training(config: GeneratorConfig, num_images: int, num_classes: int, out: Path,
                      checkpoint_minutes: Optional[float] = None) -> str:
    """The line a generator run starts with: data, network, schedule, EMA and when it checkpoints."""
    every = f"every {config.checkpoint_every} steps"
    if checkpoint_minutes is not None:
        every += f" and every {checkpoint_minutes:g} min"
    size = f"{config.in_channels}x{config.sample_size}x{config.sample_size}"
    return (f"generator: {num_images} images of {num_classes} classes at {size}; UNet "
            f"{list(config.block_out_channels)}; {config.steps} steps of {config.batch_size} "
            f"images, AdamW lr {config.lr:g} (linear warm-up over {config.warmup_steps} steps), EMA decay "
            f"{config.ema_decay:g}, seed {config.seed}; checkpoint {every} ({out / CHECKPOINT_LAST}; the same command "
            "resumes from it)")


def train_generator(
    images: np.ndarray,
    labels: np.ndarray,
    class_names,
    output_dir,
    config: GeneratorConfig,
    meta: Optional[Dict] = None,
    accelerator=None,
    progress: bool = True,
    checkpoint_minutes: Optional[float] = None,
    log: Callable[[str], None] = print,
):
    """Train (or resume training) a class-conditional UNet2DModel on uint8 (N, C, H, W) images.

    Writes ``output_dir/last.safetensors`` every ``config.checkpoint_every`` steps (and ``checkpoint_minutes``; the
    first line logged says when, with the schedule) and, at the end, the EMA weights as a
    generator folder in ``output_dir``: a :class:`~timm_csm.generation.pipeline.SemanticMixingPipeline`'s
    ``save_pretrained`` (``model_index.json`` with the class names, ``meta["recommended_guidance_scale"]`` (default 1)
    and the rest of ``meta`` plus recipe, losses and training time as metadata; ``unet/``, ``scheduler/``).
    Returns ``(unet, scheduler)`` with the EMA weights loaded.
    """
    from accelerate import Accelerator
    from diffusers import DDIMScheduler, DDPMScheduler
    from diffusers.training_utils import EMAModel
    num_classes = len(class_names)
    images, labels = _check_training_data(images, labels, num_classes, config)
    accelerator = accelerator or Accelerator()
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(config.seed)
    unet = create_class_unet(config, num_classes)
    noise_sched = DDPMScheduler(num_train_timesteps=config.num_train_timesteps, beta_schedule=config.beta_schedule,
                                prediction_type="epsilon")
    optimizer = torch.optim.AdamW(unet.parameters(), lr=config.lr, weight_decay=0.0)
    lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer,
                                                     lambda s: min(1.0, (s + 1) / max(1, config.warmup_steps)))
    ema = EMAModel(unet.parameters(), decay=config.ema_decay, use_ema_warmup=True, power=3 / 4)
    trainer = _trainer(out, log, config, accelerator, progress, checkpoint_minutes)
    if accelerator.is_main_process:
        log(describe_training(config, len(images), num_classes, out, checkpoint_minutes))
    start, losses, seconds_before = _resume(trainer, unet, ema, optimizer, lr_scheduler)

    unet, optimizer = accelerator.prepare(unet, optimizer)
    ema.to(accelerator.device)
    data = torch.from_numpy(np.array(images))  # a private, writable copy
    targets = torch.from_numpy(labels)
    t0, window, dev = time.time(), [], accelerator.device

    def train_step(step: int, bar) -> None:
        xt, t, y, noise = _noised_batch(data, targets, noise_sched.alphas_cumprod, num_classes, config, step,
                                        accelerator.process_index)
        pred = unet(xt.to(dev), t.to(dev), class_labels=y.to(dev)).sample
        loss = F.mse_loss(pred.float(), noise.to(dev))
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(unet.parameters(), 1.0)
        optimizer.step()
        lr_scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        ema.step(accelerator.unwrap_model(unet).parameters())
        window.append(loss.item())
        bar.update(1)
        if len(window) == 50 or step + 1 == config.steps:
            losses.append([step + 1, float(np.mean(window))])
            bar.show_loss(losses[-1][1])
            window.clear()

    def training_state() -> Dict:  # the trainer adds the step
        return {"model": accelerator.unwrap_model(unet).state_dict(), "ema": ema.state_dict(),
                "optimizer": optimizer.state_dict(), "scheduler": lr_scheduler.state_dict(), "history": losses,
                "train_seconds": seconds_before + time.time() - t0}

    unet.train()
    trainer.fit(train_step, training_state, start, config.steps)

    model = accelerator.unwrap_model(unet)
    ema.copy_to(model.parameters())
    model.eval()
    scheduler = DDIMScheduler.from_config(noise_sched.config)
    if accelerator.is_main_process:
        info = dict(meta or {}, recipe=config.to_dict(), losses=losses,
                    train_seconds=round(seconds_before + time.time() - t0, 1))
        _save_generator(out, model, scheduler, class_names, info)
    return model, scheduler


def _save_generator(out: Path, model, scheduler, class_names, info: Dict) -> None:
    """The trained generator folder: the pipeline's ``save_pretrained`` with ``info`` as metadata (its
    ``recommended_guidance_scale`` a config entry of its own, default 1)."""
    from .pipeline import SemanticMixingPipeline

    guidance = info.pop("recommended_guidance_scale", 1.0)
    SemanticMixingPipeline(model, scheduler, class_names=list(class_names), recommended_guidance_scale=guidance,
                           metadata=info).save_pretrained(out)
