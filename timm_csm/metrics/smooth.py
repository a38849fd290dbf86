"""Smooth ECE (smECE) of Błasiok & Nakkiran, "Smooth ECE: Principled Reliability Diagrams via Kernel Smoothing"
(ICLR 2024), with the definition and discretisation of their reference package ``relplot`` (1.0.3, default
reflected Gaussian kernel), re-implemented in torch float64.

For confidences ``f_i`` in [0, 1] and (expected) accuracies ``y_i``, residuals ``r_i = f_i - y_i``:

* both ``r`` and the constant 1 are spread onto a uniform grid of ``M = max(2000, round(20 / σ)) // 2 + 1`` points
  on [0, 1] by linear interpolation ("smooth rounding");
* each grid signal is convolved with a Gaussian of width σ sampled on the same grid and reflected at 0 and 1, which
  gives the Nadaraya-Watson numerator ``R(t)`` and the kernel density ``D(t)``;
* both are interpolated linearly to ``E = max(round(10 / σ), 200)`` evaluation points ``t`` and

      smECE_σ = Σ_t |R(t)| / Σ_t (D(t) + 1e-4),

  i.e. the integral of the absolute smoothed residual ``|R / D|`` against the smoothed density ``D``.
* The bandwidth σ* is the fixed point ``smECE_σ = σ``: σ = 1 if ``smECE_1 >= 1``, otherwise a 10-step bisection on
  (0, 1] for the smallest σ with ``σ >= smECE_σ`` (or σ < 1e-3); smECE is reported at that σ*.
"""
from __future__ import annotations

import math
from typing import Dict, Tuple

import torch

__all__ = ["smooth_calibration_error", "smooth_calibration_error_sigma"]

_F64 = torch.float64
_DENSITY_EPS = 1e-4
_MIN_EVAL_POINTS = 200
_MIN_GRID_POINTS = 2000


class _SmoothECE:
    """Evaluates smECE_σ for one data set; grid splats are cached per grid size."""

    def __init__(self, conf: torch.Tensor, acc: torch.Tensor):
        self.f = conf.to(_F64).clamp(0.0, 1.0)
        self.r = self.f - acc.to(_F64)
        self._splats: Dict[int, Tuple[torch.Tensor, torch.Tensor]] = {}

    def _splat(self, M: int, block: int = 1 << 18):
        """Spread r and 1 onto M grid points by linear interpolation (in blocks: O(block) temporary memory)."""
        if M not in self._splats:
            res = torch.zeros(M, dtype=_F64, device=self.f.device)
            den = torch.zeros(M, dtype=_F64, device=self.f.device)
            for a in range(0, self.f.numel(), block):
                f, r = self.f[a:a + block], self.r[a:a + block]
                pos = f * (M - 1)
                lo = pos.long().clamp_(0, M - 2)  # truncation == floor for f >= 0
                frac = pos.sub_(lo.to(_F64))
                upper = lo + 1
                res.index_add_(0, lo, r - frac * r).index_add_(0, upper, frac * r)
                den.index_add_(0, lo, 1.0 - frac).index_add_(0, upper, frac)
            self._splats[M] = (res, den)
        return self._splats[M]

    @staticmethod
    def _smooth(values: torch.Tensor, sigma: float) -> torch.Tensor:
        """Convolve each row of grid values (S, M) with the reflected, grid-sampled Gaussian (same length out): one
        batched FFT for all rows, the kernel transformed once."""
        M = values.shape[-1]
        t = torch.linspace(0.0, 1.0, M, dtype=_F64, device=values.device)
        kernel = torch.exp(-(t - 0.5) ** 2 / (2 * sigma * sigma)) / (math.sqrt(2 * math.pi) * sigma)
        mirrored = values.flip(-1)
        ext = torch.cat([mirrored[:, :-1], values, mirrored[:, 1:]], dim=-1)  # mirror at both ends, 3M - 2
        n_full = ext.shape[-1] + M - 1
        n_fft = 1 << (n_full - 1).bit_length()
        full = torch.fft.irfft(torch.fft.rfft(ext, n_fft) * torch.fft.rfft(kernel, n_fft), n_fft)[:, :n_full]
        start = (M - 1) + M // 2  # "valid" part starts at M - 1; the centred window starts M // 2 into it
        return full[:, start:start + M]

    @staticmethod
    def _interpolate(grid_values: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        M = grid_values.shape[-1]
        step = 1.0 / (M - 1)
        idx = (t * (M - 1)).long().clamp(0, M - 2)
        w = (t - idx.to(_F64) * step) / step
        return grid_values[:, idx] * (1.0 - w) + grid_values[:, idx + 1] * w

    def at(self, sigma: float) -> float:
        M = max(_MIN_GRID_POINTS, round(20 / sigma)) // 2 + 1
        E = max(round(10 / sigma), _MIN_EVAL_POINTS)
        res, den = self._splat(M)
        t = torch.linspace(0.0, 1.0, E, dtype=_F64, device=res.device)
        r_s, d_s = self._interpolate(self._smooth(torch.stack([res, den]), sigma), t)
        return float(r_s.abs().sum() / (d_s + _DENSITY_EPS).sum())


def smooth_calibration_error_sigma(confidences: torch.Tensor, accuracies: torch.Tensor, sigma: float) -> float:
    """smECE at a fixed bandwidth ``sigma`` (relplot's ``smECE_sigma``)."""
    if not sigma > 0:
        raise ValueError(f"sigma must be > 0, got {sigma}")
    _check_points(confidences, accuracies)
    return _SmoothECE(confidences, accuracies).at(float(sigma))


def smooth_calibration_error(confidences: torch.Tensor, accuracies: torch.Tensor, eps: float = 1e-3,
                             return_sigma: bool = False):
    """smECE with the automatic bandwidth σ* (relplot's ``smECE``). Returns ``value`` or ``(value, sigma)``."""
    _check_points(confidences, accuracies)
    est = _SmoothECE(confidences, accuracies)
    cache: Dict[float, float] = {}

    def value(sigma):
        if sigma not in cache:
            cache[sigma] = est.at(sigma)
        return cache[sigma]

    def too_small(sigma):  # σ below the fixed point
        return sigma < eps or sigma < value(sigma)

    if too_small(1.0):
        sigma = 1.0
    else:
        hi, lo = 1.0, 0.0
        for _ in range(10):
            mid = (hi + lo) / 2
            if too_small(mid):
                lo = mid
            else:
                hi = mid
        sigma = hi
    out = value(sigma)
    return (out, sigma) if return_sigma else out


def _check_points(conf, acc):
    if conf.shape != acc.shape or conf.ndim != 1:
        raise ValueError(f"confidences and accuracies must be two (N,) tensors, got {tuple(conf.shape)} and "
                         f"{tuple(acc.shape)}")
    if conf.numel() == 0:
        raise ValueError("no samples: smooth ECE of an empty set is undefined")
