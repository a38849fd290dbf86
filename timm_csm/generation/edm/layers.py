"""The building blocks of EDM's networks (Karras et al., "Elucidating the Design Space of Diffusion-Based Generative
Models", NeurIPS 2022; NVlabs/edm ``training/networks.py``), re-implemented so that an EDM checkpoint's state dict
loads into them strictly.

Class names, parameter and buffer names and shapes follow NVlabs' layers: ``Linear`` and ``Conv2d`` hold
``weight`` / ``bias``, a resampling ``Conv2d`` also the buffer ``resample_filter`` (the outer product of the 1-D
filter with itself, divided by its sum squared), ``GroupNorm`` uses ``min(32, C // 4)`` groups, ``UNetBlock`` holds
``norm0, conv0, affine, norm1, conv1`` (+ ``skip``, + ``norm2, qkv, proj`` with attention), ``FourierEmbedding`` the
buffer ``freqs``. Layers cast their weights to the input's dtype, so a network runs in float16 as EDM's
``use_fp16``.

Deviation: the initialisation is a plain uniform fan-in one, not EDM's per-layer schemes: these classes exist to run
trained EDM weights, not to train from scratch.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Linear", "Conv2d", "GroupNorm", "UNetBlock", "PositionalEmbedding", "FourierEmbedding"]


def _uniform(shape, fan_in: int) -> torch.Tensor:
    bound = math.sqrt(3.0 / max(1, fan_in))
    return (torch.rand(*shape) * 2 - 1) * bound


class Linear(nn.Module):
    """``y = x W^T + b`` with W of shape (out, in)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(_uniform([out_features, in_features], in_features))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = self.bias.to(x.dtype) if self.bias is not None else None
        return F.linear(x, self.weight.to(x.dtype), b)


class Conv2d(nn.Module):
    """A same-padded k x k convolution (``kernel=0``: none), optionally after a 2x FIR up- or downsampling.

    Resampling with the 1-D filter f uses the 2-D filter ``f f^T / (sum f)^2`` per channel: a stride-2 transposed
    convolution (times 4) to upsample, a stride-2 convolution to downsample. ``fused_resample`` (NCSN++'s residual
    encoder) convolves first and downsamples after (or upsamples first), with the paddings of the two merged.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel: int, bias: bool = True, up: bool = False,
                 down: bool = False, resample_filter: Sequence[float] = (1, 1), fused_resample: bool = False):
        if up and down:
            raise ValueError("a convolution resamples up or down, not both")
        super().__init__()
        self.in_channels, self.out_channels = in_channels, out_channels
        self.up, self.down, self.fused_resample = up, down, fused_resample
        fan_in = in_channels * kernel * kernel
        self.weight = nn.Parameter(_uniform([out_channels, in_channels, kernel, kernel], fan_in)) if kernel else None
        self.bias = nn.Parameter(torch.zeros(out_channels)) if kernel and bias else None
        f = torch.as_tensor(list(resample_filter), dtype=torch.float32)
        f = torch.outer(f, f)[None, None] / f.sum() ** 2
        self.register_buffer("resample_filter", f if up or down else None)

    def _resample(self, x: torch.Tensor, f: torch.Tensor, channels: int, padding: int) -> torch.Tensor:
        if self.up:
            return F.conv_transpose2d(x, (f * 4).tile([channels, 1, 1, 1]), groups=channels, stride=2,
                                      padding=padding)
        return F.conv2d(x, f.tile([channels, 1, 1, 1]), groups=channels, stride=2, padding=padding)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight.to(x.dtype) if self.weight is not None else None
        f = self.resample_filter.to(x.dtype) if self.resample_filter is not None else None
        w_pad = w.shape[-1] // 2 if w is not None else 0
        f_pad = (f.shape[-1] - 1) // 2 if f is not None else 0
        if self.fused_resample and self.up and w is not None:
            x = self._resample(x, f, self.in_channels, max(f_pad - w_pad, 0))
            x = F.conv2d(x, w, padding=max(w_pad - f_pad, 0))
        elif self.fused_resample and self.down and w is not None:
            x = F.conv2d(x, w, padding=w_pad + f_pad)
            x = self._resample(x, f, self.out_channels, 0)
        else:
            if f is not None:
                x = self._resample(x, f, self.in_channels, f_pad)
            if w is not None:
                x = F.conv2d(x, w, padding=w_pad)
        if self.bias is not None:
            x = x + self.bias.to(x.dtype).reshape(1, -1, 1, 1)
        return x


class GroupNorm(nn.Module):
    """Group normalisation with ``min(num_groups, C // min_channels_per_group)`` groups."""

    def __init__(self, num_channels: int, num_groups: int = 32, min_channels_per_group: int = 4,
                 eps: float = 1e-5):
        super().__init__()
        self.num_groups = min(num_groups, num_channels // min_channels_per_group)
        if self.num_groups < 1:
            raise ValueError(f"GroupNorm over {num_channels} channels needs at least {min_channels_per_group}")
        self.eps = float(eps)
        self.weight = nn.Parameter(torch.ones(num_channels))
        self.bias = nn.Parameter(torch.zeros(num_channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.group_norm(x, self.num_groups, self.weight.to(x.dtype), self.bias.to(x.dtype), self.eps)


class UNetBlock(nn.Module):
    """EDM's residual block: ``x' = s (conv1(drop(act(norm1(conv0(act(norm0 x))) [*] emb))) + skip(x))``, then
    optional self-attention ``x'' = s (proj(softmax(q^T k / sqrt(c)) v) + x')``.

    The embedding enters as a shift (``adaptive_scale=False``, DDPM++ / NCSN++) or a scale and shift
    (``adaptive_scale=True``, ADM); s is ``skip_scale``; ``num_heads=0`` means no attention. The attention runs in
    float32 whatever the input's dtype, as EDM's ``AttentionOp``.
    """

    def __init__(self, in_channels: int, out_channels: int, emb_channels: int, up: bool = False,
                 down: bool = False, num_heads: int = 0, dropout: float = 0.0, skip_scale: float = 1.0,
                 eps: float = 1e-5, resample_filter: Sequence[float] = (1, 1), resample_proj: bool = False,
                 adaptive_scale: bool = True):
        super().__init__()
        self.in_channels, self.out_channels, self.emb_channels = in_channels, out_channels, emb_channels
        self.num_heads, self.dropout = int(num_heads), float(dropout)
        self.skip_scale, self.adaptive_scale = float(skip_scale), adaptive_scale
        self.norm0 = GroupNorm(in_channels, eps=eps)
        self.conv0 = Conv2d(in_channels, out_channels, 3, up=up, down=down, resample_filter=resample_filter)
        self.affine = Linear(emb_channels, out_channels * (2 if adaptive_scale else 1))
        self.norm1 = GroupNorm(out_channels, eps=eps)
        self.conv1 = Conv2d(out_channels, out_channels, 3)
        self.skip = None
        if out_channels != in_channels or up or down:
            kernel = 1 if resample_proj or out_channels != in_channels else 0
            self.skip = Conv2d(in_channels, out_channels, kernel, up=up, down=down, resample_filter=resample_filter)
        if self.num_heads:
            self.norm2 = GroupNorm(out_channels, eps=eps)
            self.qkv = Conv2d(out_channels, out_channels * 3, 1)
            self.proj = Conv2d(out_channels, out_channels, 1)

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        orig = x
        x = self.conv0(F.silu(self.norm0(x)))
        params = self.affine(emb)[:, :, None, None].to(x.dtype)
        if self.adaptive_scale:
            scale, shift = params.chunk(2, dim=1)
            x = F.silu(torch.addcmul(shift, self.norm1(x), scale + 1))
        else:
            x = F.silu(self.norm1(x + params))
        x = self.conv1(F.dropout(x, p=self.dropout, training=self.training))
        x = (x + (self.skip(orig) if self.skip is not None else orig)) * self.skip_scale
        if self.num_heads:
            x = (self.proj(self._attend(self.norm2(x))) + x) * self.skip_scale
        return x

    def _attend(self, h: torch.Tensor) -> torch.Tensor:
        b, c = h.shape[:2]
        # channel layout of qkv: (head, channel within head, q / k / v), as the checkpoints were trained with
        q, k, v = self.qkv(h).reshape(b * self.num_heads, c // self.num_heads, 3, -1).unbind(2)
        scale = 1.0 / math.sqrt(k.shape[1])
        w = torch.einsum("ncq,nck->nqk", q.float(), k.float() * scale).softmax(dim=2).to(q.dtype)
        return torch.einsum("nqk,nck->ncq", w, v).reshape(h.shape)


class PositionalEmbedding(nn.Module):
    """Sinusoidal embedding ``[cos(x w_j), sin(x w_j)]``, ``w_j = (1 / max_positions)^(j / (C/2 - endpoint))``."""

    def __init__(self, num_channels: int, max_positions: int = 10000, endpoint: bool = False):
        super().__init__()
        self.num_channels, self.max_positions, self.endpoint = num_channels, max_positions, endpoint

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        half = self.num_channels // 2
        freqs = torch.arange(half, dtype=torch.float32, device=x.device) / (half - (1 if self.endpoint else 0))
        freqs = (1.0 / self.max_positions) ** freqs
        x = torch.outer(x, freqs.to(x.dtype))
        return torch.cat([x.cos(), x.sin()], dim=1)


class FourierEmbedding(nn.Module):
    """Random Fourier features ``[cos(2 pi x f_j), sin(2 pi x f_j)]`` with ``f ~ N(0, scale^2)`` (NCSN++)."""

    def __init__(self, num_channels: int, scale: float = 16.0):
        super().__init__()
        self.register_buffer("freqs", torch.randn(num_channels // 2) * scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.outer(x, (2 * math.pi * self.freqs).to(x.dtype))
        return torch.cat([x.cos(), x.sin()], dim=1)
