"""Samplers that carry a soft class condition.

* :func:`sample_with_scheduler`: a loop over any diffusers scheduler (DDIM with eta 0 by default, DPM-Solver, ...),
  for epsilon / v-prediction UNets; with optional classifier-free guidance (scale 1 = none, as the paper), from pure
  noise or, with ``init_images`` and ``strength < 1``, from real images noised part of the way (SDEdit, Meng et al.,
  ICLR 2022).
* :func:`edm_heun_sample`: EDM's deterministic 2nd-order Heun sampler (Karras et al. 2022, Algorithm 1 with
  S_churn = 0; sigma 0.002..80, rho 7, float64; the diffusers scheduler
  :class:`~timm_csm.generation.scheduling_edm.EDMHeunScheduler`), for EDM-preconditioned denoisers
  ``D(x, sigma, class_weights) -> x0``
  (the official CSM generation). NVlabs EDM pickles load into such denoisers through
  :mod:`timm_csm.generation.edm`; any callable of that signature works.
"""
from __future__ import annotations

import contextlib
from typing import Callable, Iterable, Optional

import torch

from .conditioning import find_soft_class_table
from .scheduling_edm import EDMHeunScheduler, edm_sigmas

__all__ = ["sample_with_scheduler", "edm_sigmas", "edm_heun_sample", "sample_with_edm_scheduler", "to_uint8",
           "DEFAULT_INFERENCE_STEPS"]

#: the steps of a diffusers scheduler's sampling when none are given (a generator folder's default; an EDM network
#: takes the paper's Heun steps)
DEFAULT_INFERENCE_STEPS = 50


def _null_weights(cond: torch.Tensor, num_embeddings: int) -> torch.Tensor:
    null = torch.zeros(cond.shape[0], num_embeddings, dtype=cond.dtype, device=cond.device)
    null[:, -1] = 1.0
    return null


@torch.no_grad()
def sample_with_scheduler(
    model,
    scheduler,
    class_weights: torch.Tensor,
    noise: torch.Tensor,
    num_inference_steps: int = DEFAULT_INFERENCE_STEPS,
    guidance_scale: float = 1.0,
    eta: float = 0.0,
    init_images: Optional[torch.Tensor] = None,
    strength: float = 1.0,
    generator: Optional[torch.Generator] = None,
    progress: Optional[Callable[[Iterable], Iterable]] = None,
    autocast_dtype: Optional[torch.dtype] = None,
) -> torch.Tensor:
    """Denoise ``noise`` (B, C, H, W) under soft conditions ``class_weights`` (B, K); returns x0 in [-1, 1].

    ``model(x, t, class_labels=w).sample`` must take float class weights (see ``enable_soft_class_conditioning``).
    With ``guidance_scale != 1`` the unconditional branch uses the null class (the last embedding row).

    ``init_images`` (B, C, H, W) in [-1, 1] with ``strength`` t in (0, 1) start the chain from the real images noised
    with ``noise`` to the time step reached after the first ``(1 - t) N`` of the N steps (``scheduler.add_noise``),
    then run the last ``round(t N)`` steps (diffusers' img2img convention). ``strength = 1`` ignores ``init_images``
    and starts from pure noise: the paper's mode, bit-identical to calling without them.

    ``generator`` goes to ``scheduler.step`` where the step draws noise (DDPM, DDIM with eta > 0, SDE solvers); DDIM
    with eta 0 and DPM-Solver++ draw nothing. ``progress`` wraps the time steps run (e.g. a pipeline's
    ``progress_bar``).

    ``autocast_dtype`` (``torch.bfloat16``) runs the model under ``torch.autocast`` on the noise's device; its output
    is cast back to float32, so that the scheduler's update and the sample stay float32 (None: all float32).
    """
    if class_weights.ndim != 2 or class_weights.shape[0] != noise.shape[0]:
        raise ValueError(f"class_weights must be (B, K) with B = {noise.shape[0]}, got {tuple(class_weights.shape)}")
    scheduler.set_timesteps(num_inference_steps)
    timesteps, x = _start(scheduler, noise, num_inference_steps, init_images, strength)
    device = noise.device
    w = class_weights.to(device=device, dtype=torch.float32)
    if guidance_scale != 1.0:
        table = find_soft_class_table(model).num_embeddings
        w_full = torch.zeros(w.shape[0], table, device=device)
        w_full[:, : w.shape[1]] = w
        w = torch.cat([w_full, _null_weights(w_full, table)])
    step_args = scheduler.step.__code__.co_varnames
    step_kwargs = {"eta": eta} if "eta" in step_args else {}
    if generator is not None and "generator" in step_args:
        step_kwargs["generator"] = generator
    for t in (progress or iter)(timesteps):
        x_in = torch.cat([x, x]) if guidance_scale != 1.0 else x
        x_in = scheduler.scale_model_input(x_in, t)
        with _autocast(device, autocast_dtype):
            out = model(x_in, t.to(device).expand(x_in.shape[0]), class_labels=w).sample
        out = out[:, : x.shape[1]].float()  # learned-variance models (DiT) return (eps, variance) channels
        if guidance_scale != 1.0:
            cond, uncond = out.chunk(2)
            out = uncond + guidance_scale * (cond - uncond)
        x = scheduler.step(out, t, x, **step_kwargs).prev_sample
    return x.clamp(-1, 1)


def _autocast(device: torch.device, dtype: Optional[torch.dtype]):
    """``torch.autocast`` to ``dtype`` on ``device``; no context for None (float32 throughout)."""
    return contextlib.nullcontext() if dtype is None else torch.autocast(device.type, dtype=dtype)


def _start(scheduler, noise: torch.Tensor, num_steps: int, init_images: Optional[torch.Tensor], strength: float):
    """The time steps to run and the starting sample: pure noise, or ``init_images`` noised to strength t."""
    if not 0.0 < strength <= 1.0:
        raise ValueError(f"strength must lie in (0, 1], got {strength}")
    if strength == 1.0:
        return scheduler.timesteps, noise * scheduler.init_noise_sigma
    if init_images is None:
        raise ValueError(f"strength {strength} < 1 needs init_images (the real images to start from)")
    if init_images.shape != noise.shape:
        raise ValueError(f"init_images must have the noise's shape {tuple(noise.shape)}, got "
                         f"{tuple(init_images.shape)}")
    n_run = min(num_steps, max(1, round(strength * num_steps)))
    begin = num_steps - n_run
    order = getattr(scheduler, "order", 1)
    timesteps = scheduler.timesteps[begin * order:]
    if hasattr(scheduler, "set_begin_index"):  # multistep solvers index their step history from here
        scheduler.set_begin_index(begin * order)
    x0 = init_images.to(device=noise.device, dtype=noise.dtype)
    return timesteps, scheduler.add_noise(x0, noise, timesteps[:1].repeat(noise.shape[0]))


@torch.no_grad()
def edm_heun_sample(
    denoiser: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
    class_weights: torch.Tensor,
    noise: torch.Tensor,
    num_steps: int = 18,
    sigma_min: float = 0.002,
    sigma_max: float = 80.0,
    rho: float = 7.0,
) -> torch.Tensor:
    """EDM deterministic Heun sampling (NFE = 2N - 1) with
    :class:`~timm_csm.generation.scheduling_edm.EDMHeunScheduler`, computed in float64 as the reference
    implementation.

    ``denoiser(x, sigma, class_weights)`` returns the denoised estimate x0; ``noise`` is standard normal and is
    scaled by the first noise level (``sigma_max``) here.
    """
    scheduler = EDMHeunScheduler(sigma_min=sigma_min, sigma_max=sigma_max, rho=rho)
    return sample_with_edm_scheduler(denoiser, scheduler, class_weights, noise, num_steps)


@torch.no_grad()
def sample_with_edm_scheduler(denoiser, scheduler: EDMHeunScheduler, class_weights: torch.Tensor,
                              noise: torch.Tensor, num_steps: int,
                              progress: Optional[Callable[[Iterable], Iterable]] = None) -> torch.Tensor:
    """``num_steps`` of ``scheduler`` (an :class:`~timm_csm.generation.scheduling_edm.EDMHeunScheduler`) from
    standard normal ``noise`` scaled to its first noise level, the denoiser evaluated at each of its ``timesteps``;
    ``progress`` wraps them (a pipeline's ``progress_bar``)."""
    scheduler.set_timesteps(num_steps, noise.device)
    x = noise.to(torch.float64) * scheduler.init_noise_sigma
    for sigma in progress(scheduler.timesteps) if progress is not None else scheduler.timesteps:
        x = scheduler.step(denoiser(x, sigma, class_weights), sigma, x).prev_sample
    return x


def to_uint8(x: torch.Tensor) -> torch.Tensor:
    """[-1, 1] float (B, C, H, W) -> uint8, as EDM: ``clip(x * 127.5 + 128, 0, 255)``."""
    return (x * 127.5 + 128).clamp(0, 255).to(torch.uint8)
