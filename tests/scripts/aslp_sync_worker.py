"""Worker for tests/test_losses.py: ASLP levels updated on 2 processes, synced after each epoch.

Each process takes every other sample (sample 0 on both, as a distributed sampler's padding does) for two epochs;
every process writes its table to ``<out>.<rank>.json``. Run with ``accelerate launch --num_processes 2``.
"""
import json
import sys

import torch
from accelerate import Accelerator

from timm_csm.losses import create_loss

NUM_SAMPLES, NUM_CLASSES, EPOCHS = 40, 5, 2


def shared_data():
    g = torch.Generator().manual_seed(0)
    return torch.randn(NUM_SAMPLES, NUM_CLASSES, generator=g) * 2, torch.randint(0, NUM_CLASSES, (NUM_SAMPLES,),
                                                                                  generator=g)


def run_epochs(loss, indices_of_epoch, accelerator=None):
    logits, target = shared_data()
    for epoch in range(EPOCHS):
        idx = indices_of_epoch(epoch)
        for start in range(0, len(idx), 8):
            batch = idx[start:start + 8]
            loss(logits[batch] * (1 + epoch), target[batch], index=batch)
        if accelerator is not None:
            loss.sync(accelerator)
    return loss.level


def new_loss():
    return create_loss("aslp", num_samples=NUM_SAMPLES, warmup_epochs=0, lr=0.05)


def main(out_prefix: str):
    accelerator = Accelerator(cpu=True)
    rank, world = accelerator.process_index, accelerator.num_processes
    mine = torch.arange(rank, NUM_SAMPLES, world)
    if rank:
        mine = torch.cat([torch.tensor([0]), mine])
    level = run_epochs(new_loss(), lambda epoch: mine, accelerator)
    with open(f"{out_prefix}.{rank}.json", "w") as f:
        json.dump({"world": world, "level": level.tolist()}, f)


if __name__ == "__main__":
    from gloo_launch import run_worker

    run_worker(main, sys.argv[1])
