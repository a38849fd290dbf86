"""EDM's deterministic Heun sampler as a diffusers scheduler: :class:`EDMHeunScheduler`.

Karras et al. (2022), Algorithm 1 with S_churn = 0, as the official CSM generation samples the EDM networks: Karras
noise levels from ``sigma_max`` to ``sigma_min`` (``rho`` 7), then 0; an Euler step from each level to the next,
corrected by the slope at the next level (Heun) except on the last step to 0: 2N - 1 model evaluations for N steps,
in float64 as the reference implementation. The model gives the denoised estimate x0 (an EDM-preconditioned
denoiser ``D(x, sigma, class_weights)``); the model is evaluated at ``scheduler.timesteps``, which are noise levels
sigma (each inner level twice, once per order), and the sampling starts from ``noise * scheduler.init_noise_sigma``.

    scheduler.set_timesteps(20, device)
    x = noise.double() * scheduler.init_noise_sigma
    for sigma in scheduler.timesteps:
        x = scheduler.step(denoiser(x, sigma, class_weights), sigma, x).prev_sample
"""
from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.schedulers.scheduling_utils import SchedulerMixin, SchedulerOutput

__all__ = ["EDMHeunScheduler", "edm_sigmas"]


def edm_sigmas(num_steps: int, sigma_min: float = 0.002, sigma_max: float = 80.0, rho: float = 7.0) -> torch.Tensor:
    """Karras time steps ``(s_max^(1/rho) + i/(N-1) (s_min^(1/rho) - s_max^(1/rho)))^rho``, then ``t_N = 0``."""
    if num_steps < 2:
        raise ValueError("the EDM sampler needs at least 2 steps")
    i = torch.arange(num_steps, dtype=torch.float64)
    t = (sigma_max ** (1 / rho) + i / (num_steps - 1) * (sigma_min ** (1 / rho) - sigma_max ** (1 / rho))) ** rho
    return torch.cat([t, torch.zeros(1, dtype=torch.float64)])


class EDMHeunScheduler(SchedulerMixin, ConfigMixin):
    """EDM's deterministic 2nd-order Heun sampler (see the module docstring); ``sigma_min`` / ``sigma_max``: the
    noise range (EDM's 0.002 and 80; clamp them to what a network supports)."""

    order = 2

    @register_to_config
    def __init__(self, sigma_min: float = 0.002, sigma_max: float = 80.0, rho: float = 7.0):
        self.sigmas: Optional[torch.Tensor] = None
        self.timesteps: Optional[torch.Tensor] = None
        self.num_inference_steps: Optional[int] = None
        self._level = 0  # the index in sigmas of the level the current step starts from
        self._euler: Optional[Tuple[torch.Tensor, torch.Tensor]] = None  # (x, slope) awaiting the correction

    def set_timesteps(self, num_inference_steps: int, device: Union[str, torch.device, None] = None) -> None:
        """The noise levels of ``num_inference_steps`` steps; the model is evaluated at ``timesteps``: sigma_0,
        then each inner level twice (the Euler step's end, the next step's start)."""
        self.sigmas = edm_sigmas(num_inference_steps, self.config.sigma_min, self.config.sigma_max,
                                 self.config.rho).to(device)
        self.timesteps = torch.cat([self.sigmas[:1], self.sigmas[1:-1].repeat_interleave(2)])
        self.num_inference_steps = int(num_inference_steps)
        self._level, self._euler = 0, None

    @property
    def init_noise_sigma(self) -> torch.Tensor:
        """The scale of the starting noise: the first noise level."""
        return self.sigmas[0]

    def scale_model_input(self, sample: torch.Tensor, timestep=None) -> torch.Tensor:
        """The sample as it is: an EDM denoiser preconditions its input itself."""
        return sample

    def step(self, model_output: torch.Tensor, timestep, sample: torch.Tensor,
             return_dict: bool = True) -> Union[SchedulerOutput, Tuple[torch.Tensor]]:
        """One model evaluation's update: the Euler step from the current level (``sample`` the state there), or its
        Heun correction (``sample`` the Euler step's end); ``model_output`` is the denoised estimate."""
        t_cur, t_next = self.sigmas[self._level], self.sigmas[self._level + 1]
        denoised = model_output.to(torch.float64)
        if self._euler is None:
            d = (sample - denoised) / t_cur
            x_next = sample + (t_next - t_cur) * d
            if self._level + 1 < self.num_inference_steps:
                self._euler = (sample, d)
            else:  # the last step, to sigma 0: Euler only
                self._level += 1
        else:
            x, d = self._euler
            d_next = (sample - denoised) / t_next
            x_next = x + (t_next - t_cur) * (0.5 * d + 0.5 * d_next)
            self._level, self._euler = self._level + 1, None
        return SchedulerOutput(prev_sample=x_next) if return_dict else (x_next,)

    def __len__(self) -> int:
        return self.num_inference_steps or 0
