"""Forward + backward time of every registered loss against plain cross-entropy, at B=128 and C=100 / 1000.

    OMP_NUM_THREADS=1 python benchmarks/losses_bench.py [--batch 128] [--classes 100 1000] [--repeats 200]
                                                        [--losses NAME ...] [--output benchmarks/losses.md]

Each loss gets the batch its call convention needs: (B, C) logits and hard labels; the CSM losses a real batch of B
and a generated batch of 2B soft-labelled rows (the default sampler, n_aug = 1); MRL one mixed copy and M-NDCG three;
ASLP sample indices (with state updates on); the binary losses a (B, C) multi-label head. Stateful losses first run
their epoch hook once. One thread, with the default input checks on (``validate=True``) and off. Times are the
minimum over ``--repeats`` passes (the estimate least affected by other processes on a shared machine); each
pass of a loss alternates with a pass of our "ce" at the same setting, and "×ce" is the ratio of the two minima.
"""
from __future__ import annotations

import argparse
import os
import platform
import shlex
import sys
import time

import torch

from timm_csm.losses import create_loss, list_losses


def build(name, batch, classes, validate, generator):
    """(leaves, closure) for one loss."""
    loss = create_loss(name, validate=validate) if name not in ("torch_ce", "ce_3b") else None

    def leaf(rows):
        return torch.randn(rows, classes, generator=generator).mul_(3).requires_grad_()

    def soft(rows):
        return torch.softmax(torch.randn(rows, classes, generator=generator) * 2, dim=1)

    labels = torch.randint(0, classes, (batch,), generator=generator)
    if name == "torch_ce":
        z = leaf(batch)
        return [z], lambda: torch.nn.functional.cross_entropy(z, labels)
    if name == "ce_3b":
        z, y3 = leaf(3 * batch), torch.randint(0, classes, (3 * batch,), generator=generator)
        loss = create_loss("ce", validate=validate)
        return [z], lambda: loss(z, y3)
    if loss.is_csm:
        real, gen, q = leaf(batch), leaf(2 * batch), soft(2 * batch)
        return [real, gen], lambda: loss(real, labels, gen, q)
    if loss.needs_mixed:
        copies = loss.num_mixed
        z, mixed = leaf(batch), leaf(copies * batch)
        q = soft(copies * batch)
        return [z, mixed], lambda: loss(z, labels, mixed, q)
    if name in ("bce", "ls_bce", "focal_bce", "aslp_bce"):
        z = leaf(batch)
        target = (torch.rand(batch, classes, generator=generator) > 0.5).float()
        if loss.needs_index:
            loss.warmup_epochs = 0
            loss.on_epoch_end(z.detach(), target)
            index = torch.arange(batch)
            return [z], lambda: loss(z, target, index=index)
        return [z], lambda: loss(z, target)
    z = leaf(batch)
    if loss.needs_index:
        loss.warmup_epochs = 0
    loss.on_epoch_end(torch.randn(4 * batch, classes, generator=generator) * 3,
                      torch.randint(0, classes, (4 * batch,), generator=generator))
    if loss.needs_index:
        index = torch.arange(batch)
        return [z], lambda: loss(z, labels, index=index)
    return [z], lambda: loss(z, labels)


def _one_pass(leaves, closure) -> float:
    for t in leaves:
        t.grad = None
    start = time.perf_counter()
    closure().backward()
    return time.perf_counter() - start


def time_paired(loss_case, ce_case, repeats, warmup=10):
    """Alternate one pass of the loss and one of the cross-entropy baseline, so both run under the same machine
    load, and return (best loss time, best ce time, their ratio). Best-of is used because on a shared machine the
    typical pass is dominated by preemption, which hits longer passes more."""
    loss_times, ce_times = [], []
    for i in range(warmup + repeats):
        a, b = _one_pass(*loss_case), _one_pass(*ce_case)
        if i >= warmup:
            loss_times.append(a)
            ce_times.append(b)
    return min(loss_times), min(ce_times), min(loss_times) / min(ce_times)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--classes", type=int, nargs="+", default=[100, 1000])
    p.add_argument("--repeats", type=int, default=200)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--losses", nargs="+", default=None, metavar="NAME",
                   help="time only these registered losses (torch_ce, ce and ce_3b always run)")
    p.add_argument("--output", default=None, help="write the markdown section to this file")
    p.add_argument("--note", default="", help="a sentence about the machine's conditions, added to the section")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    generator = torch.Generator().manual_seed(0)

    chosen = list_losses() if args.losses is None else args.losses
    unknown = sorted(set(chosen) - set(list_losses()))
    if unknown:
        p.error(f"unknown losses {unknown}; registered: {list_losses()}")
    names = ["torch_ce", "ce", "ce_3b"] + [n for n in chosen if n != "ce"]
    results = {}
    for classes in args.classes:
        for validate in (True, False):
            baseline = build("ce", args.batch, classes, validate, generator)
            for name in names:
                if name == "torch_ce" and not validate:
                    continue
                case = build(name, args.batch, classes, validate, generator)
                results[name, classes, validate] = time_paired(case, baseline, args.repeats)

    labels = {"torch_ce": "torch `F.cross_entropy`", "ce_3b": "ce on 3B rows (CSM's row count)"}
    header = "| loss |" + "".join(f" C={c} µs | ×ce | µs, no checks | ×ce |" for c in args.classes)
    lines = [header, "|---|" + "---:|---:|---:|---:|" * len(args.classes)]
    for name in names:
        row = f"| {labels.get(name, name)} |"
        for c in args.classes:
            best, _, ratio = results[name, c, True]
            row += f" {best * 1e6:.0f} | {ratio:.2f} |"
            if name == "torch_ce":
                row += " | |"
            else:
                best, _, ratio = results[name, c, False]
                row += f" {best * 1e6:.0f} | {ratio:.2f} |"
        lines.append(row)
    table = "\n".join(lines)
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    info = (f"B={args.batch}, float32, {args.threads} thread(s), best (minimum) of {args.repeats} forward+backward "
            f"passes after 10 warm-up passes; torch {torch.__version__}; {os.cpu_count()} CPU cores "
            f"({platform.machine()}), load average at the end {load}; {time.perf_counter() - started:.0f} s in all.")
    print(info)
    print(table)
    if args.output:
        given = list(argv if argv is not None else sys.argv[1:])
        if "--note" in given:  # the note is prose for the section, not part of the command to rerun
            i = given.index("--note")
            del given[i:i + 2]
        command = "OMP_NUM_THREADS=1 python benchmarks/losses_bench.py " + shlex.join(given)
        section = "\n".join([
            "## Losses: forward + backward time against cross-entropy", "",
            f"Command: `{command.strip()}`", "", info + (" " + args.note if args.note else ""), "",
            "µs is the best pass; \"×ce\" divides it by the best pass of our `ce` at the same setting (input "
            "checks on or off), timed alternately with it. The CSM losses see 3B rows "
            "(B real + 2B generated), M-NDCG 4B, MRL 2B; the row \"ce on 3B rows\" is cross-entropy at CSM's row "
            "count. The binary losses run on a (B, C) multi-label head.", "", table, ""])
        from timm_csm.io import write_text_atomic

        write_text_atomic(args.output, section)


if __name__ == "__main__":
    main()
