"""Calibration metrics side by side: timm_csm against torchmetrics 1.9, netcal 1.4 and relplot 1.0.3.

    OMP_NUM_THREADS=1 python benchmarks/metrics_bench.py [--goals] [--quick] [--sizes 1e4x10 1e5x100 ...] [--repeats 2]
                                                         [--output benchmarks/metrics.md]

Every (method, N, C) runs in its own process, one after the other, with one thread: the process imports its
library, builds the inputs (``logits = 2 randn(N, C)``, +4 on the true class, seed 0; float32), then runs the
method. Reported: the value, the best wall and CPU time over ``--repeats`` runs (compute only, imports and input
generation excluded) and the extra peak memory (``ru_maxrss`` after the first run minus before it, with the inputs
already resident; the input size is listed for comparison).

Methods (what each computes):

* top-label ECE, 15 bins: ``timm_csm.metrics.ece`` on logits; ``CalibrationAccumulator`` fed in batches of 10 000;
  torchmetrics ``multiclass_calibration_error`` on logits (functional) and ``MulticlassCalibrationError`` in batches
  of 10 000; netcal ``ECE(bins=15).measure`` on probabilities (the softmax is precomputed: netcal takes no logits).
* classwise ECE: ``timm_csm.metrics.classwise_ece``; the approach of TorchUncertainty's ``ClasswiseCalibrationError``
  (one torchmetrics ``binary_calibration_error`` per class on p_k against 1[y = k]); run where C * N <= 5e7.
* smooth ECE: ``timm_csm.metrics.smooth_ece`` from logits; relplot ``smECE`` from the (confidence, accuracy) pairs
  (computing them is not timed for relplot).
* the ``evaluate`` module ``ece``: ``compute(predictions=<array>)`` (array route) and, at small sizes only, the
  list route through evaluate's Arrow cache.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shlex
import subprocess
import sys
import time

MIB = 1024 * 1024
QUICK_SIZES = ["1e4x10", "1e4x100", "1e5x10", "1e5x100"]
FULL_SIZES = ["1e4x10", "1e4x100", "1e4x1000", "1e5x10", "1e5x100", "1e5x1000", "1e6x10", "1e6x100"]
# sizes of the project goals (issue): ECE at 1e6 x 100, classwise at 5e4 x 1000, the evaluate array route at
# 2e5 x 1000
GOAL_JOBS = [("ece", "timm_csm", "1e6x100"), ("ece", "timm_csm_batched", "1e6x100"),
             ("ece", "torchmetrics", "1e6x100"), ("ece", "torchmetrics_batched", "1e6x100"),
             ("ece", "netcal", "1e6x100"), ("cwece", "timm_csm", "5e4x1000"),
             ("cwece", "tu_style_loop", "5e4x1000"), ("smece", "timm_csm", "1e6x100"),
             ("smece", "relplot", "1e6x100"), ("evaluate_ece", "array_route", "2e5x1000")]

METHODS = {
    "ece": ["timm_csm", "timm_csm_batched", "torchmetrics", "torchmetrics_batched", "netcal"],
    "cwece": ["timm_csm", "tu_style_loop"],
    "smece": ["timm_csm", "relplot"],
    "evaluate_ece": ["array_route", "list_route"],
}


def parse_size(text):
    n, c = text.lower().split("x")
    return int(float(n)), int(float(c))


def rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


# ----------------------------------------------------------------------------------------------------------------
# worker: one method at one size
# ----------------------------------------------------------------------------------------------------------------


def make_logits(n, c):
    import torch

    g = torch.Generator().manual_seed(0)
    z = torch.empty(n, c)
    z.normal_(generator=g).mul_(2.0)  # in place: no temporary copies inflate the memory baseline
    y = torch.randint(0, c, (n,), generator=g)
    z[torch.arange(n), y] += 4.0
    return z, y


def softmax_inplace(z, rows=10_000):
    import torch

    for a in range(0, z.shape[0], rows):
        z[a:a + rows] = torch.softmax(z[a:a + rows], dim=1)
    return z


def build(metric, method, n, c):
    """Import, make the inputs, and return (closure, input_bytes)."""
    import torch

    torch.set_num_threads(1)
    z, y = make_logits(n, c)
    size = z.numel() * 4 + y.numel() * 8
    if metric == "ece":
        if method == "timm_csm":
            from timm_csm.metrics import ece
            return (lambda: ece(z, y, 15)), size
        if method == "timm_csm_batched":
            from timm_csm.metrics import CalibrationAccumulator

            def run():
                acc = CalibrationAccumulator(c, 15, classwise=False, keep_confidences=False, nll=False,
                                             brier=False)
                for a in range(0, n, 10_000):
                    acc.update(z[a:a + 10_000], y[a:a + 10_000])
                return acc.compute()["ece"]
            return run, size
        if method == "torchmetrics":
            from torchmetrics.functional.classification import multiclass_calibration_error
            return (lambda: multiclass_calibration_error(z, y, num_classes=c, n_bins=15).item()), size
        if method == "torchmetrics_batched":
            from torchmetrics.classification import MulticlassCalibrationError

            def run():
                m = MulticlassCalibrationError(num_classes=c, n_bins=15)
                for a in range(0, n, 10_000):
                    m.update(z[a:a + 10_000], y[a:a + 10_000])
                return m.compute().item()
            return run, size
        if method == "netcal":
            from netcal.metrics import ECE
            p = softmax_inplace(z).numpy()
            labels = y.numpy()
            return (lambda: ECE(bins=15).measure(p, labels)), size
    if metric == "cwece":
        if method == "timm_csm":
            from timm_csm.metrics import classwise_ece
            return (lambda: classwise_ece(z, y, 15)), size
        if method == "tu_style_loop":
            from torchmetrics.functional.classification import binary_calibration_error
            p = softmax_inplace(z)

            def run():
                return sum(binary_calibration_error(p[:, k], (y == k).long(), n_bins=15).item()
                           for k in range(c)) / c
            return run, size
    if metric == "smece":
        if method == "timm_csm":
            from timm_csm.metrics import smooth_ece
            return (lambda: smooth_ece(z, y)), size
        if method == "relplot":
            import relplot
            p = softmax_inplace(z)
            conf, pred = p.max(1)
            conf, acc = conf.double().numpy(), (pred == y).double().numpy()
            return (lambda: relplot.smECE(conf, acc)), size
    if metric == "evaluate_ece":
        from timm_csm import load_metric
        module = load_metric("ece")
        zn, yn = z.numpy(), y.numpy()
        if method == "array_route":
            return (lambda: module.compute(predictions=zn, references=yn)["ece"]), size
        if method == "list_route":
            return (lambda: module.compute(predictions=zn.tolist(), references=yn.tolist())["ece"]), size
    raise ValueError(f"unknown job {metric}/{method}")


def worker(spec):
    metric, method, size, repeats = spec["metric"], spec["method"], spec["size"], spec["repeats"]
    n, c = parse_size(size)
    run, input_bytes = build(metric, method, n, c)
    before = rss_mib()
    walls, cpus, value = [], [], None
    for i in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        value = float(run())
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
        if i == 0:
            extra = rss_mib() - before
    print(json.dumps(dict(metric=metric, method=method, size=size, value=value, wall_s=min(walls),
                          cpu_s=min(cpus), extra_mib=extra, input_mib=input_bytes / MIB)))


# ----------------------------------------------------------------------------------------------------------------
# driver
# ----------------------------------------------------------------------------------------------------------------


def jobs_for(sizes, quick):
    jobs = []
    for size in sizes:
        n, c = parse_size(size)
        for method in METHODS["ece"]:
            jobs.append(("ece", method, size))
        if n * c <= 5e7:
            jobs.append(("cwece", "timm_csm", size))
            if not quick and n * c <= 1e7:
                jobs.append(("cwece", "tu_style_loop", size))
        if c == 100:
            jobs += [("smece", "timm_csm", size), ("smece", "relplot", size)]
        jobs.append(("evaluate_ece", "array_route", size))
        if n * c <= 1e6:
            jobs.append(("evaluate_ece", "list_route", size))
    return jobs


def run_job(job, repeats, timeout):
    metric, method, size = job
    spec = json.dumps(dict(metric=metric, method=method, size=size, repeats=repeats))
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_EVALUATE_OFFLINE="1", HF_HUB_OFFLINE="1")
    try:
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", spec], env=env,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return dict(metric=metric, method=method, size=size, error=f"timeout {timeout} s")
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return dict(metric=metric, method=method, size=size, error=tail[:120])
    return json.loads(proc.stdout.strip().splitlines()[-1])


LABELS = {
    ("ece", "timm_csm"): "timm_csm `ece` (logits)",
    ("ece", "timm_csm_batched"): "timm_csm `CalibrationAccumulator`, batches of 1e4",
    ("ece", "torchmetrics"): "torchmetrics `multiclass_calibration_error` (logits)",
    ("ece", "torchmetrics_batched"): "torchmetrics `MulticlassCalibrationError`, batches of 1e4",
    ("ece", "netcal"): "netcal `ECE` (probabilities)",
    ("cwece", "timm_csm"): "timm_csm `classwise_ece`",
    ("cwece", "tu_style_loop"): "per-class torchmetrics binary ECE (TorchUncertainty's approach)",
    ("smece", "timm_csm"): "timm_csm `smooth_ece` (logits)",
    ("smece", "relplot"): "relplot `smECE` (from confidence, accuracy)",
    ("evaluate_ece", "array_route"): "evaluate module `ece`, arrays (no Arrow)",
    ("evaluate_ece", "list_route"): "evaluate module `ece`, lists (Arrow cache)",
}


def table(results):
    lines = ["| metric / method | N × C | value | wall s | CPU s | extra peak MiB | input MiB |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in results:
        label = LABELS[(r["metric"], r["method"])]
        n, c = parse_size(r["size"])
        size = f"{n:.0e} × {c}".replace("e+0", "e")
        if "error" in r:
            lines.append(f"| {label} | {size} | failed: {r['error']} | | | | |")
            continue
        lines.append(f"| {label} | {size} | {r['value']:.6f} | {r['wall_s']:.3f} | {r['cpu_s']:.3f} | "
                     f"{r['extra_mib']:.0f} | {r['input_mib']:.0f} |")
    return "\n".join(lines)


def speedups(results):
    """Ratios for the goals, from CPU times (least sensitive to other processes)."""
    by = {(r["metric"], r["method"], r["size"]): r for r in results if "error" not in r}
    out = []
    for size in sorted({r["size"] for r in results}):
        ours, theirs = by.get(("ece", "timm_csm", size)), by.get(("ece", "torchmetrics", size))
        if ours and theirs:
            out.append(f"- top-label ECE at {size}: {theirs['cpu_s'] / ours['cpu_s']:.1f}× less CPU time than "
                       f"torchmetrics' functional call ({ours['cpu_s']:.3f} s vs {theirs['cpu_s']:.3f} s); extra "
                       f"memory {ours['extra_mib']:.0f} MiB vs {theirs['extra_mib']:.0f} MiB for "
                       f"{ours['input_mib']:.0f} MiB of input.")
        ours, theirs = by.get(("cwece", "timm_csm", size)), by.get(("cwece", "tu_style_loop", size))
        if ours and theirs:
            out.append(f"- classwise ECE at {size}: {ours['cpu_s']:.2f} s vs {theirs['cpu_s']:.1f} s for the "
                       f"per-class loop ({theirs['cpu_s'] / ours['cpu_s']:.0f}×).")
        ours, theirs = by.get(("smece", "timm_csm", size)), by.get(("smece", "relplot", size))
        if ours and theirs:
            out.append(f"- smooth ECE at {size}: |timm_csm - relplot| = {abs(ours['value'] - theirs['value']):.1e}.")
    return "\n".join(out)


NOTES = """Notes:

- Values agree to the digits shown; the float64 sums of timm_csm and netcal differ from torchmetrics in the 7th
  digit at most (torchmetrics accumulates in float32). No confidence of these inputs sits on a bin edge or at 1.0,
  where torchmetrics' binning differs (its hidden extra bin for 1.0, torchmetrics#3510).
- "extra peak MiB" includes the first-call allocations of torch (about 8-10 MiB at any size).
- netcal is given probabilities (it takes no logits), so it skips the softmax the others compute.
- Not run here: N x C = 1e6 x 1000 (4 GB of float32 logits, plus 4-8 GB for torchmetrics / netcal, does not fit
  next to the other jobs on this 23 GB machine); the evaluate list route above 1e6 values (a no-op module
  fed 2e5 x 1000 that way took 123 s and +8.7 GB on a similar machine); TorchUncertainty (not installed: it pulls in Lightning), whose
  classwise metric is the per-class torchmetrics loop timed above plus input re-validation per class.
"""


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help=f"sizes {' '.join(QUICK_SIZES)}, no slow peers")
    parser.add_argument("--goals", action="store_true",
                        help="the goal sizes of the issue (alone, or before --quick / --sizes)")
    parser.add_argument("--sizes", nargs="*", help="NxC sizes, e.g. 1e5x100 (default: the full grid)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=900, help="seconds per job")
    parser.add_argument("--output", help="write the results as a markdown section to this file")
    args = parser.parse_args(argv)
    if args.worker:
        worker(json.loads(args.worker))
        return 0
    jobs = list(GOAL_JOBS) if args.goals else []
    if args.sizes or args.quick or not args.goals:
        jobs += jobs_for(args.sizes or (QUICK_SIZES if args.quick else FULL_SIZES), args.quick)
    start = time.time()
    results = []
    for job in jobs:
        r = run_job(job, args.repeats, args.timeout)
        results.append(r)
        print(json.dumps(r), flush=True)
    elapsed = time.time() - start
    command = "OMP_NUM_THREADS=1 python benchmarks/metrics_bench.py " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    import torch

    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    text = "\n".join([
        "## Calibration metrics: timm_csm against torchmetrics, netcal and relplot", "",
        f"Command: `{command.strip()}`", "",
        f"{os.cpu_count()} CPU cores ({platform.machine()}), 1 thread per method, torch {torch.__version__}; "
        f"load average at the end {load}; {elapsed:.0f} s in all. Best of {args.repeats} runs per method, each "
        "method in its own process. The machine was shared with a long training job and other test runs, so "
        "wall times are inflated and noisy; CPU times are the better comparison.", "",
        table(results), "", speedups(results), "", NOTES])
    print(text)
    if args.output:
        from timm_csm.io import write_text_atomic

        write_text_atomic(args.output, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
