"""Synchronised batch normalisation for ``--sync-bn``: batch statistics over the global batch of every process.

``torch.nn.SyncBatchNorm`` computes them with CUDA kernels and refuses CPU tensors, so CPU runs over gloo (and any
other device) use :class:`AllReduceBatchNorm`, which gets the same statistics from ``torch.distributed.all_reduce``:

* forward: each process sums, per channel ``c``, its ``x`` and ``x^2`` (float64) and counts its values; one
  all-reduce gives the global ``n``, ``mean = sum / n`` and the biased ``var = sum_sq / n - mean^2``, and
  ``y = (x - mean) / sqrt(var + eps) * weight + bias``;
* backward (Ioffe & Szegedy 2015, eq. of the gradient of the normalised input), with ``x_hat`` the normalised input
  and ``g`` the incoming gradient: one all-reduce of ``sum(g)`` and ``sum(g * x_hat)`` per channel, then
  ``dx = weight / sqrt(var + eps) * (g - sum(g) / n - x_hat * sum(g * x_hat) / n)``; the weight and bias gradients
  are this process's ``sum(g * x_hat)`` and ``sum(g)``, which data-parallel training averages over processes like
  every other gradient;
* running statistics as ``nn.BatchNorm``: ``running = (1 - momentum) * running + momentum * batch`` with the
  unbiased variance ``var * n / (n - 1)`` (a cumulative average when ``momentum`` is None).

Outside training, or with one process, the layer is a plain batch norm (no communication), as torch's layer.
:func:`convert_sync_batchnorm` swaps a model's batch norms (timm's ``BatchNormAct2d`` included) for synchronised
ones: torch's / timm's CUDA layers (``timm.layers.convert_sync_batchnorm``, what timm's ``train.py`` uses) on CUDA,
:class:`AllReduceBatchNorm` elsewhere. The parameters and buffers are the original module's, under the same names,
so state dicts and the optimizer's parameter list stay valid.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm

__all__ = ["AllReduceBatchNorm", "AllReduceBatchNormAct", "convert_sync_batchnorm", "sync_batch_norm"]

#: device types whose synchronised batch norm is torch's own (``nn.SyncBatchNorm`` supports these)
_TORCH_SYNC_DEVICES = ("cuda",)


def _channel_dims(x: torch.Tensor):
    return [0] + list(range(2, x.dim()))


def _per_channel(v: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return v.to(x.dtype).view((1, -1) + (1,) * (x.dim() - 2))


class _SyncBatchNormFunction(torch.autograd.Function):
    """Forward and backward of the module docstring; returns (y, batch mean, unbiased batch variance)."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps: float, group):
        channels, dims = x.shape[1], _channel_dims(x)
        count = torch.tensor([x.numel() // max(channels, 1)], dtype=torch.float64, device=x.device)
        stats = torch.cat([x.sum(dims, dtype=torch.float64), (x * x).sum(dims, dtype=torch.float64), count])
        dist.all_reduce(stats, group=group)
        n = stats[-1]
        if float(n) < 2:
            raise ValueError(f"synchronised batch norm needs more than 1 value per channel over all processes, got "
                             f"{int(n)} (input {tuple(x.shape)}); raise the batch size")
        mean = stats[:channels] / n
        var = (stats[channels:2 * channels] / n - mean * mean).clamp_min(0)
        invstd = (var + eps).rsqrt()
        x_hat = (x - _per_channel(mean, x)) * _per_channel(invstd, x)
        y = x_hat if weight is None else x_hat * _per_channel(weight, x) + _per_channel(bias, x)
        ctx.save_for_backward(x_hat, invstd, weight)
        ctx.group, ctx.n = group, n
        unbiased = var * (n / (n - 1))
        ctx.mark_non_differentiable(mean, unbiased)
        return y, mean.to(x.dtype), unbiased.to(x.dtype)

    @staticmethod
    def backward(ctx, grad_y, _grad_mean, _grad_var):
        x_hat, invstd, weight = ctx.saved_tensors
        dims, channels = _channel_dims(grad_y), grad_y.shape[1]
        sums = torch.cat([grad_y.sum(dims, dtype=torch.float64), (grad_y * x_hat).sum(dims, dtype=torch.float64)])
        grad_weight = sums[channels:].to(grad_y.dtype) if weight is not None and ctx.needs_input_grad[1] else None
        grad_bias = sums[:channels].to(grad_y.dtype) if weight is not None and ctx.needs_input_grad[2] else None
        grad_x = None
        if ctx.needs_input_grad[0]:
            dist.all_reduce(sums, group=ctx.group)
            mean_g, mean_gx = sums[:channels] / ctx.n, sums[channels:] / ctx.n
            scale = invstd if weight is None else invstd * weight.double()
            grad_x = (grad_y - _per_channel(mean_g, grad_y) - x_hat * _per_channel(mean_gx, grad_y)) \
                * _per_channel(scale, grad_y)
        return grad_x, grad_weight, grad_bias, None, None


def sync_batch_norm(x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], eps: float = 1e-5,
                    group=None):
    """Batch norm of ``x`` (N, C, ...) with the statistics of the concatenated batch of every process of ``group``
    (default: all); returns (y, batch mean, unbiased batch variance). Differentiable in ``x``, ``weight``, ``bias``."""
    return _SyncBatchNormFunction.apply(x, weight, bias, eps, group)


class AllReduceBatchNorm(_BatchNorm):
    """Batch norm with statistics synchronised over the processes of ``process_group`` (all when None) while
    training on more than one process; a plain batch norm otherwise. Any device and backend (see the module
    docstring); same parameters, buffers and arguments as ``nn.SyncBatchNorm``."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: Optional[float] = 0.1, affine: bool = True,
                 track_running_stats: bool = True, process_group=None, device=None, dtype=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device=device, dtype=dtype)
        self.process_group = process_group

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2-D input (N, C, ...), got {input.dim()}-D")

    def _syncs(self) -> bool:
        return (self.training and dist.is_available() and dist.is_initialized()
                and dist.get_world_size(self.process_group) > 1)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not self._syncs():
            return super().forward(input)
        self._check_input_dim(input)
        y, mean, var = sync_batch_norm(input, self.weight, self.bias, self.eps, self.process_group)
        if self.track_running_stats and self.running_mean is not None:
            self.num_batches_tracked.add_(1)
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
            with torch.no_grad():
                self.running_mean.lerp_(mean.to(self.running_mean.dtype), factor)
                self.running_var.lerp_(var.to(self.running_var.dtype), factor)
        return y


class AllReduceBatchNormAct(AllReduceBatchNorm):
    """:class:`AllReduceBatchNorm` followed by the ``drop`` and ``act`` modules of the timm ``BatchNormAct2d`` it
    replaces (set by :func:`convert_sync_batchnorm`), as timm's ``SyncBatchNormAct``."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        x = super().forward(input)
        return self.act(self.drop(x))


def _all_reduce_copy(module: _BatchNorm, process_group) -> AllReduceBatchNorm:
    """An :class:`AllReduceBatchNorm` (``...Act`` for timm's norm-act layers) holding ``module``'s tensors."""
    from timm.layers import BatchNormAct2d

    act = isinstance(module, BatchNormAct2d)
    cls = AllReduceBatchNormAct if act else AllReduceBatchNorm
    out = cls(module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats,
              process_group=process_group)
    for name in ("weight", "bias"):
        setattr(out, name, getattr(module, name))
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        out.register_buffer(name, getattr(module, name))
    if act:
        out.drop, out.act = module.drop, module.act
    out.train(module.training)
    return out


def convert_sync_batchnorm(module: nn.Module, process_group=None, device=None) -> nn.Module:
    """``module`` with every batch norm (``nn.BatchNorm*d``, timm's ``BatchNormAct2d``) replaced by a synchronised
    one sharing its parameters and buffers: timm's conversion (``nn.SyncBatchNorm`` / ``SyncBatchNormAct``) when
    ``device`` is CUDA, :class:`AllReduceBatchNorm` otherwise (CPU / gloo). Returns ``module`` itself, with its
    children replaced, unless ``module`` is a batch norm (then its replacement), as
    ``nn.SyncBatchNorm.convert_sync_batchnorm``."""
    if device is not None and torch.device(device).type in _TORCH_SYNC_DEVICES:
        from timm.layers import convert_sync_batchnorm as timm_convert

        return timm_convert(module, process_group)
    if isinstance(module, _BatchNorm) and not isinstance(module, (AllReduceBatchNorm, nn.SyncBatchNorm)):
        return _all_reduce_copy(module, process_group)
    for name, child in module.named_children():
        module.add_module(name, convert_sync_batchnorm(child, process_group))
    return module
