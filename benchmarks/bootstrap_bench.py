"""Bootstrap intervals of the calibration metrics: the vectorised bootstrap against a loop over the resamples.

    OMP_NUM_THREADS=1 python benchmarks/bootstrap_bench.py [--sizes 1e4x10 1e4x100 5e4x10] [--resamples 1000]
                                                           [--repeats 3] [--loop-resamples 20]
                                                           [--output benchmarks/bootstrap.md]

Inputs: ``logits = 2 randn(N, C)``, +4 on the true class (seed 0; float32), the metric set of ``results.json``
(:func:`timm_csm.metrics.calibration_metrics`: accuracy, confidence, ECE, AECE, classwise ECE, MCE, OE, UE, NLL,
Brier) and, in a second row, with AURC / E-AURC / AUGRC too (``timm-csm-calibrate``'s report). Timed:
:func:`timm_csm.metrics.bootstrap_metrics` with ``--resamples`` resamples, best wall and CPU time over ``--repeats``
runs with one torch thread; the loop (:func:`calibration_metrics` and the selective metrics of each resample's
``(logits[idx], labels[idx])``) over ``--loop-resamples`` resamples, scaled to ``--resamples``. The goal (issue
30): 1 000 resamples of 10 000 x 10 well under a second.
"""
from __future__ import annotations

import argparse
import os
import platform
import shlex
import sys
import time
from pathlib import Path

import torch


def inputs(n: int, c: int):
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, c, (n,), generator=g)
    logits = 2 * torch.randn(n, c, generator=g)
    logits[torch.arange(n), labels] += 4
    return logits, labels


def best(fn, repeats: int):
    """(best wall seconds, best CPU seconds) of ``repeats`` calls."""
    walls, cpus = [], []
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return min(walls), min(cpus)


def loop(logits, labels, resamples: int, selective: bool):
    from timm_csm.metrics import calibration_metrics, resample_indices
    from timm_csm.metrics.selective import selective_metrics_from_points

    for idx in resample_indices(len(labels), resamples, seed=0):
        calibration_metrics(logits[idx], labels[idx])
        if selective:
            conf, pred = torch.softmax(logits[idx].double(), 1).max(1)
            selective_metrics_from_points(conf, (pred == labels[idx]).double())


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    load = f"; load average {os.getloadavg()[0]:.1f} at the end" if hasattr(os, "getloadavg") else ""
    return f"{os.cpu_count()}-core CPU ({cpu}), torch {torch.__version__}, 1 torch thread{load}"


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", nargs="+", default=["1e4x10", "1e4x100", "5e4x10"], help="N x C of the inputs")
    p.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples")
    p.add_argument("--repeats", type=int, default=3, help="timed runs of the bootstrap (best reported)")
    p.add_argument("--loop-resamples", type=int, default=20, help="resamples the loop is timed on")
    p.add_argument("--output", default="benchmarks/bootstrap.md", help="the page to write ('' for none)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    from timm_csm.metrics import bootstrap_metrics

    rows = []
    for size in args.sizes:
        n, c = (int(float(v)) for v in size.lower().split("x"))
        logits, labels = inputs(n, c)
        for selective in (False, True):
            wall, cpu = best(lambda: bootstrap_metrics(logits, labels, resamples=args.resamples,
                                                       selective=selective), args.repeats)
            loop_wall, loop_cpu = best(lambda: loop(logits, labels, args.loop_resamples, selective), 1)
            scale = args.resamples / args.loop_resamples
            rows.append(f"| {n} x {c} | {'+ AURC, E-AURC, AUGRC' if selective else 'results.json set'} | "
                        f"{wall:.3f} | {cpu:.3f} | {loop_wall * scale:.1f} | {loop_cpu * scale / cpu:.0f}x |")
            print(rows[-1], flush=True)
    command = "OMP_NUM_THREADS=1 python benchmarks/bootstrap_bench.py" + "".join(
        " " + shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    text = "\n".join([
        "# Bootstrap intervals of the calibration metrics", "",
        "Every metric of a report, each with its percentile interval over B resamples of the scored samples "
        "(`timm_csm.metrics.bootstrap_metrics`), computed for all resamples at once; against a loop that scores "
        "each resample with the metric functions (timed on a few resamples, scaled to B). Inputs: logits = 2 "
        "randn(N, C), +4 on the true class, float32, seed 0. Goal: 1 000 resamples of 10 000 x 10 well under a "
        "second.", "", "Command:", "", f"    {command}", "", f"Machine: {machine()}.", "",
        f"| N x C | metrics | bootstrap wall (s), B = {args.resamples} | bootstrap CPU (s) | loop wall (s), scaled | "
        "loop CPU / bootstrap CPU |", "|---|---|---|---|---|---|", *rows, ""])
    if args.output:
        Path(args.output).write_text(text)
    return text


if __name__ == "__main__":
    main()
