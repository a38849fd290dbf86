"""Worker for tests/test_metrics_stream.py: each process accumulates its own uneven share, then ``sync``.

Run under ``accelerate launch --num_processes 2``; the main process writes the synced metrics as JSON.
"""
import json
import sys

import torch
from accelerate import Accelerator

from timm_csm.metrics import CalibrationAccumulator


def shared_data(n: int = 1000, k: int = 7):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, k, generator=g) * 3, torch.randint(0, k, (n,), generator=g)


def main(out_path: str):
    accelerator = Accelerator(cpu=True)
    logits, target = shared_data()
    # uneven shares (process 0 takes 3x the rows of process 1) and several updates per process
    cut = 750 if accelerator.num_processes == 2 else logits.shape[0]
    lo, hi = (0, cut) if accelerator.process_index == 0 else (cut, logits.shape[0])
    acc = CalibrationAccumulator(num_classes=logits.shape[1])
    for start in range(lo, hi, 128):
        stop = min(start + 128, hi)
        acc.update(logits[start:stop], target[start:stop])
    metrics = acc.sync(accelerator).compute(smooth=True)
    if accelerator.is_main_process:
        with open(out_path, "w") as f:
            json.dump({"num_processes": accelerator.num_processes, "metrics": metrics}, f)


if __name__ == "__main__":
    from gloo_launch import run_worker

    run_worker(main, sys.argv[1])
