"""Worker for tests/test_train_flags.py: the all-reduce batch norm on 2 gloo processes against ``nn.BatchNorm2d`` on
the concatenated batch.

Each process normalises its half of a batch; process 0 also runs the plain layer on the whole batch, with the same
upstream gradient (``sum(y * r)`` for a fixed random ``r``), and writes the largest differences as JSON: outputs,
input gradients, weight and bias gradients (summed over processes), running statistics after two steps, the eval
output, and the same for a timm ``BatchNormAct2d`` converted by ``convert_sync_batchnorm``.
"""
import copy
import json
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from accelerate import Accelerator

from timm_csm.training.sync_bn import convert_sync_batchnorm


def _batches(step: int, n: int = 8, c: int = 3):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(n, c, 5, 4, generator=g) * 2 + 1, torch.randn(n, c, 5, 4, generator=g)


def _max_diff(a, b) -> float:
    return float((a - b).abs().max())


def compare(reference: nn.Module, rank: int, world: int) -> dict:
    """Two training steps of ``reference`` on the whole batch vs its converted copy on this process's half."""
    synced = convert_sync_batchnorm(copy.deepcopy(reference))
    out = {"converted": type(synced).__name__}
    for step in range(2):
        x, r = _batches(step)
        half = x.shape[0] // world
        xs = x[rank * half:(rank + 1) * half].clone().requires_grad_(True)
        y = synced(xs)
        (y * r[rank * half:(rank + 1) * half]).sum().backward()
        xr = x.clone().requires_grad_(True)
        y_ref = reference(xr)
        (y_ref * r).sum().backward()
        out[f"y_{step}"] = _max_diff(y, y_ref[rank * half:(rank + 1) * half])
        out[f"dx_{step}"] = _max_diff(xs.grad, xr.grad[rank * half:(rank + 1) * half])
        for name in ("weight", "bias"):
            grad = getattr(synced, name).grad.clone()
            dist.all_reduce(grad)
            out[f"d{name}_{step}"] = _max_diff(grad, getattr(reference, name).grad)
            getattr(synced, name).grad = None
            getattr(reference, name).grad = None
    out["running_mean"] = _max_diff(synced.running_mean, reference.running_mean)
    out["running_var"] = _max_diff(synced.running_var, reference.running_var)
    out["num_batches_tracked"] = int(synced.num_batches_tracked)
    x, _ = _batches(5)
    local = x[rank * (x.shape[0] // world):(rank + 1) * (x.shape[0] // world)]
    with torch.no_grad():
        out["eval"] = _max_diff(synced.eval()(local), reference.eval()(local))
    return out


def main(out_path: str):
    accelerator = Accelerator(cpu=True)
    rank, world = accelerator.process_index, accelerator.num_processes
    from timm.layers import BatchNormAct2d

    torch.manual_seed(0)
    plain = nn.BatchNorm2d(3)
    with torch.no_grad():
        plain.weight.uniform_(0.5, 1.5)
        plain.bias.uniform_(-0.5, 0.5)
    act = BatchNormAct2d(3, act_layer=nn.ReLU)
    act.load_state_dict(plain.state_dict())
    results = {"plain": compare(plain, rank, world), "act": compare(act, rank, world)}
    if accelerator.is_main_process:
        with open(out_path, "w") as f:
            json.dump({"num_processes": world, **results}, f)


if __name__ == "__main__":
    from gloo_launch import run_worker

    run_worker(main, sys.argv[1])
