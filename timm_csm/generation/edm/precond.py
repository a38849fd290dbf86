"""EDM's preconditioned denoisers ``D(x; sigma, c) = c_skip x + c_out F(c_in x; c_noise, c)`` (Karras et al.,
"Elucidating the Design Space of Diffusion-Based Generative Models", NeurIPS 2022, Table 1; NVlabs/edm
``training/networks.py``), re-implemented around :mod:`~timm_csm.generation.edm.networks`:

* ``EDMPrecond``: c_skip = s_d^2 / (sigma^2 + s_d^2), c_out = sigma s_d / sqrt(sigma^2 + s_d^2),
  c_in = 1 / sqrt(sigma^2 + s_d^2), c_noise = ln(sigma) / 4;
* ``VPPrecond``: c_skip = 1, c_out = -sigma, c_in = 1 / sqrt(sigma^2 + 1), c_noise = (M - 1) sigma^-1(sigma);
* ``VEPrecond``: c_skip = 1, c_out = sigma, c_in = 1, c_noise = ln(sigma / 2);

with s_d = ``sigma_data`` (0.5) and, for VP, ``sigma(t) = sqrt(exp(beta_d t^2 / 2 + beta_min t) - 1)``, whose inverse is
``sigma^-1(s) = (sqrt(beta_min^2 + 2 beta_d ln(1 + s^2)) - beta_min) / beta_d``. The supported noise range
(``sigma_min``, ``sigma_max``) is [0, inf) for EDM, [sigma(epsilon_t), sigma(1)] for VP and [0.02, 100] for VE; a
sampler clamps its schedule to it, as EDM's sampler.

``forward(x, sigma, class_labels)`` takes ``class_labels`` (B, K) as real-valued weights, so soft class weights work
directly; ``None`` means all-zero labels, as EDM. The inner network runs in float16 on CUDA when ``use_fp16``.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import nn

from .networks import UNETS

__all__ = ["EDMPrecond", "VPPrecond", "VEPrecond", "PRECONDITIONERS"]

Scalings = Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


class _Preconditioned(nn.Module):
    """The shared part: the inner U-Net (``self.model``), input casting, labels and the D(x) formula."""

    default_model = "SongUNet"

    def __init__(self, img_resolution: int, img_channels: int, label_dim: int = 0, use_fp16: bool = False,
                 model_type: Optional[str] = None, **model_kwargs):
        super().__init__()
        model_type = model_type or self.default_model
        if model_type not in UNETS:
            raise ValueError(f"model_type {model_type!r} is not one of {sorted(UNETS)}")
        self.img_resolution, self.img_channels = int(img_resolution), int(img_channels)
        self.label_dim, self.use_fp16 = int(label_dim), bool(use_fp16)
        self.model = UNETS[model_type](img_resolution=img_resolution, in_channels=img_channels,
                                       out_channels=img_channels, label_dim=label_dim, **model_kwargs)

    def scalings(self, sigma: torch.Tensor) -> Scalings:  # pragma: no cover - abstract
        """(c_skip, c_out, c_in, c_noise) at noise level ``sigma``."""
        raise NotImplementedError

    def _labels(self, class_labels: Optional[torch.Tensor], x: torch.Tensor) -> Optional[torch.Tensor]:
        if self.label_dim == 0:
            return None
        if class_labels is None:
            return torch.zeros([1, self.label_dim], device=x.device)
        labels = torch.as_tensor(class_labels, device=x.device).to(torch.float32)
        if labels.shape[-1] != self.label_dim:
            raise ValueError(f"class_labels must hold {self.label_dim} class weights per row, got shape "
                             f"{tuple(labels.shape)}")
        return labels.reshape(-1, self.label_dim)

    def forward(self, x: torch.Tensor, sigma, class_labels: Optional[torch.Tensor] = None,
                force_fp32: bool = False, **model_kwargs) -> torch.Tensor:
        x = x.to(torch.float32)
        sigma = torch.as_tensor(sigma, device=x.device).to(torch.float32).reshape(-1, 1, 1, 1)
        labels = self._labels(class_labels, x)
        fp16 = self.use_fp16 and not force_fp32 and x.device.type == "cuda"
        dtype = torch.float16 if fp16 else torch.float32
        c_skip, c_out, c_in, c_noise = self.scalings(sigma)
        f_x = self.model((c_in * x).to(dtype), c_noise.flatten(), class_labels=labels, **model_kwargs)
        return c_skip * x + c_out * f_x.to(torch.float32)


class EDMPrecond(_Preconditioned):
    """EDM's own preconditioning (``sigma_data`` 0.5; default inner network ADM, as EDM)."""

    default_model = "DhariwalUNet"

    def __init__(self, img_resolution: int, img_channels: int, label_dim: int = 0, use_fp16: bool = False,
                 sigma_min: float = 0.0, sigma_max: float = float("inf"), sigma_data: float = 0.5,
                 model_type: Optional[str] = None, **model_kwargs):
        super().__init__(img_resolution, img_channels, label_dim, use_fp16, model_type, **model_kwargs)
        self.sigma_min, self.sigma_max, self.sigma_data = float(sigma_min), float(sigma_max), float(sigma_data)

    def scalings(self, sigma: torch.Tensor) -> Scalings:
        sd2 = self.sigma_data ** 2
        c_skip = sd2 / (sigma ** 2 + sd2)
        c_out = sigma * self.sigma_data / (sigma ** 2 + sd2).sqrt()
        c_in = 1 / (sd2 + sigma ** 2).sqrt()
        return c_skip, c_out, c_in, sigma.log() / 4


class VPPrecond(_Preconditioned):
    """The variance-preserving preconditioning (Song et al., ICLR 2021) in EDM's form."""

    def __init__(self, img_resolution: int, img_channels: int, label_dim: int = 0, use_fp16: bool = False,
                 beta_d: float = 19.9, beta_min: float = 0.1, M: int = 1000, epsilon_t: float = 1e-5,
                 model_type: Optional[str] = None, **model_kwargs):
        super().__init__(img_resolution, img_channels, label_dim, use_fp16, model_type, **model_kwargs)
        self.beta_d, self.beta_min, self.M, self.epsilon_t = float(beta_d), float(beta_min), int(M), float(epsilon_t)
        self.sigma_min = float(self.sigma(epsilon_t))
        self.sigma_max = float(self.sigma(1.0))

    def sigma(self, t) -> torch.Tensor:
        t = torch.as_tensor(t, dtype=torch.float64)
        return ((0.5 * self.beta_d * t ** 2 + self.beta_min * t).exp() - 1).sqrt()

    def sigma_inv(self, sigma: torch.Tensor) -> torch.Tensor:
        return ((self.beta_min ** 2 + 2 * self.beta_d * (1 + sigma ** 2).log()).sqrt() - self.beta_min) / self.beta_d

    def scalings(self, sigma: torch.Tensor) -> Scalings:
        one = torch.ones_like(sigma)
        return one, -sigma, 1 / (sigma ** 2 + 1).sqrt(), (self.M - 1) * self.sigma_inv(sigma)


class VEPrecond(_Preconditioned):
    """The variance-exploding preconditioning (Song et al., ICLR 2021) in EDM's form."""

    def __init__(self, img_resolution: int, img_channels: int, label_dim: int = 0, use_fp16: bool = False,
                 sigma_min: float = 0.02, sigma_max: float = 100.0, model_type: Optional[str] = None,
                 **model_kwargs):
        super().__init__(img_resolution, img_channels, label_dim, use_fp16, model_type, **model_kwargs)
        self.sigma_min, self.sigma_max = float(sigma_min), float(sigma_max)

    def scalings(self, sigma: torch.Tensor) -> Scalings:
        one = torch.ones_like(sigma)
        return one, sigma, one, (0.5 * sigma).log()


PRECONDITIONERS = {cls.__name__: cls for cls in (EDMPrecond, VPPrecond, VEPrecond)}
