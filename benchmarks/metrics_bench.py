"""Calibration metrics side by side and against the limit: timm_csm beside torchmetrics, netcal, torch-uncertainty,
probmetrics, scikit-learn and relplot, every time also a multiple of one fused pass over the logits.

    pip install -e ".[bench]"   # the peers
    OMP_NUM_THREADS=1 python benchmarks/metrics_bench.py [--sizes 1e4x10 1e4x100 5e4x1000 1e6x100] [--repeats 3]
                                                         [--output benchmarks/metrics.md]

Each size runs in its own process with one thread: the process builds the inputs (``logits = 2 randn(N, C)``, +4
on the true class, seed 0; float32) and every method's closure (imports and inputs a library needs, such as
probabilities for the libraries that take them, prepared outside the timer), calls each once (its value), then
times one pass (``torch.logsumexp(logits, dim=1)``) and every method in turn, ``--repeats`` rounds interleaved (ten
times as many where N x C <= 1e6), so that a change of the machine's load falls on all of them alike. Reported:
the value, the best CPU time and that time over the best pass. A method whose first call runs past ``--budget``
seconds is stopped and said so.

What each method computes:

* ``ece`` (top-label, 15 equal-width bins): ``timm_csm.metrics.ece`` on logits; ``CalibrationAccumulator`` fed in
  batches of 10 000; torchmetrics ``multiclass_calibration_error`` (functional, logits) and
  ``MulticlassCalibrationError`` (batches of 10 000); torch-uncertainty ``CalibrationError`` (probabilities);
  probmetrics ``ece-15`` (``compute_all_from_labels_logits``); netcal ``ECE(bins=15)`` (probabilities).
* ``all`` (the full metric set): ``timm_csm.metrics.calibration_metrics`` (accuracy, confidence, ECE, adaptive
  ECE, classwise ECE, MCE, over- / under-confidence, NLL, Brier, in one pass); torch-uncertainty's classes for the
  same set (``CalibrationError`` l1 and max, ``AdaptiveCalibrationError``, ``ClasswiseCalibrationError``,
  ``CategoricalNLL``, ``BrierScore``, torchmetrics' accuracy); probmetrics ``accuracy, logloss, brier, ece-15,
  mce-15``; scikit-learn ``accuracy_score, log_loss, brier_score_loss`` (the subset it has); and a yardstick, no
  peer: the same 11 metrics by their textbook formulas in plain NumPy, without timm_csm's checks (``metrics_plain.py``).
* ``cece`` (classwise ECE): timm_csm ``classwise_ece``; torch-uncertainty ``ClasswiseCalibrationError``; run where
  N x C <= 5e7.
* ``smece`` (smooth ECE, C = 100 only): timm_csm ``smooth_ece`` from logits; relplot ``smECE`` and probmetrics
  ``smece`` from the (confidence, accuracy) pairs / probabilities.
* ``evaluate_ece``: the ``evaluate`` module ``ece`` given arrays (``compute(predictions=<array>)``).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time

from metrics_page import LABELS, NOTES, findings, table

SIZES = ["1e4x10", "1e4x100", "5e4x1000", "1e6x100"]
METHODS = {
    "ece": ["timm_csm", "timm_csm_batched", "torchmetrics", "torchmetrics_batched", "torch-uncertainty", "probmetrics",
            "netcal"],
    "all": ["timm_csm", "torch-uncertainty", "probmetrics", "scikit-learn", "plain_numpy"],
    "cece": ["timm_csm", "torch-uncertainty"],
    "smece": ["timm_csm", "relplot", "probmetrics"],
    "evaluate_ece": ["array_route"],
}


def parse_size(text):
    n, c = text.lower().split("x")
    return int(float(n)), int(float(c))


# ----------------------------------------------------------------------------------------------------------------
# worker: every method at one size
# ----------------------------------------------------------------------------------------------------------------


def make_logits(n, c):
    import torch

    g = torch.Generator().manual_seed(0)
    z = torch.empty(n, c)
    z.normal_(generator=g).mul_(2.0)  # in place: no temporary copies inflate the memory baseline
    y = torch.randint(0, c, (n,), generator=g)
    z[torch.arange(n), y] += 4.0
    return z, y


def softmax_copy(z, rows=10_000):
    import torch

    p = torch.empty_like(z)
    for a in range(0, z.shape[0], rows):
        p[a:a + rows] = torch.softmax(z[a:a + rows], dim=1)
    return p


def _batched(metric, z, y, n):
    for a in range(0, n, 10_000):
        metric.update(z[a:a + 10_000], y[a:a + 10_000])
    return metric.compute()


def _tu_set(z, y, c):
    """torch-uncertainty's classes for the full set, fed probabilities (its calibration metrics take them)."""
    import torch
    from torch_uncertainty.metrics.classification import (AdaptiveCalibrationError, BrierScore, CalibrationError,
                                                          CategoricalNLL, ClasswiseCalibrationError)
    from torchmetrics.classification import MulticlassAccuracy

    p = torch.softmax(z, dim=1)
    metrics = {"ece": CalibrationError(task="multiclass", num_classes=c, num_bins=15),
               "mce": CalibrationError(task="multiclass", num_classes=c, num_bins=15, norm="max"),
               "aece": AdaptiveCalibrationError(task="multiclass", num_classes=c, num_bins=15),
               "cece": ClasswiseCalibrationError(num_classes=c, num_bins=15),
               "nll": CategoricalNLL(), "brier": BrierScore(num_classes=c),
               "accuracy": MulticlassAccuracy(num_classes=c, average="micro")}
    out = {}
    for name, metric in metrics.items():
        metric.update(p, y)
        out[name] = float(metric.compute())
    return out["ece"]


def build(metric, method, z, y):
    """Import the method's library, prepare what it is given, and return the closure that computes the value."""
    n, c = z.shape
    if method == "timm_csm":
        from timm_csm import metrics as tm

        run = {"ece": lambda: tm.ece(z, y, 15), "all": lambda: tm.calibration_metrics(z, y, 15)["ece"],
               "cece": lambda: tm.classwise_ece(z, y, 15), "smece": lambda: tm.smooth_ece(z, y)}[metric]
        return run
    if method == "timm_csm_batched":
        from timm_csm.metrics import CalibrationAccumulator

        return (lambda: _batched(CalibrationAccumulator(c, 15, classwise=False, keep_confidences=False, nll=False,
                                                        brier=False), z, y, n)["ece"])
    if method == "torchmetrics":
        from torchmetrics.functional.classification import multiclass_calibration_error

        return (lambda: multiclass_calibration_error(z, y, num_classes=c, n_bins=15))
    if method == "torchmetrics_batched":
        from torchmetrics.classification import MulticlassCalibrationError

        return (lambda: _batched(MulticlassCalibrationError(num_classes=c, n_bins=15), z, y, n))
    if method == "torch-uncertainty":
        from torch_uncertainty.metrics.classification import CalibrationError, ClasswiseCalibrationError

        if metric == "all":
            return (lambda: _tu_set(z, y, c))
        p = softmax_copy(z)

        def run():
            m = CalibrationError(task="multiclass", num_classes=c, num_bins=15) if metric == "ece" else \
                ClasswiseCalibrationError(num_classes=c, num_bins=15)
            m.update(p, y)
            return m.compute()
        return run
    if method == "probmetrics":
        from probmetrics.metrics import Metrics

        names = {"ece": ["ece-15"], "all": ["accuracy", "logloss", "brier", "ece-15", "mce-15"],
                 "smece": ["smece"]}[metric]
        key = "smece" if metric == "smece" else "ece-15"
        return (lambda: Metrics.from_names(names).compute_all_from_labels_logits(y, z)[key])
    if method == "netcal":
        from netcal.metrics import ECE

        p, labels = softmax_copy(z).numpy(), y.numpy()
        return (lambda: ECE(bins=15).measure(p, labels))
    if method == "scikit-learn":
        from sklearn.metrics import accuracy_score, brier_score_loss, log_loss

        p, labels = softmax_copy(z).double().numpy(), y.numpy()
        classes = list(range(c))

        def run():
            accuracy_score(labels, p.argmax(1))
            brier_score_loss(labels, p, labels=classes)
            return log_loss(labels, p, labels=classes)
        return run
    if method == "relplot":
        import relplot

        conf, pred = softmax_copy(z).max(1)
        conf, acc = conf.double().numpy(), (pred == y).double().numpy()
        return (lambda: relplot.smECE(conf, acc))
    if method == "plain_numpy":
        from metrics_plain import plain_metric_set

        zn, yn = z.numpy(), y.numpy()
        return (lambda: plain_metric_set(zn, yn)["ece"])
    if method == "array_route":
        from timm_csm import load_metric

        module = load_metric("ece")
        zn, yn = z.numpy(), y.numpy()
        return (lambda: module.compute(predictions=zn, references=yn)["ece"])
    raise ValueError(f"unknown job {metric}/{method}")


class OverBudget(Exception):
    pass


def first_call(run, budget_s):
    """The value of ``run()``, or ``OverBudget`` after ``budget_s`` wall seconds (checked between bytecodes)."""
    import signal

    def stop(*_):
        raise OverBudget()
    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, budget_s)
    try:
        return float(run())
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def worker(spec):
    import torch

    size, repeats = spec["size"], spec["repeats"]
    n, c = parse_size(size)
    torch.set_num_threads(1)
    logits, labels = make_logits(n, c)
    runs, out = {}, []
    for metric, method in spec["jobs"]:
        row = dict(metric=metric, method=method, size=size)
        try:
            run = build(metric, method, logits, labels)
            row["value"] = first_call(run, spec["budget"])
            runs[(metric, method)] = run
        except OverBudget:
            row["error"] = f"stopped after {spec['budget']:g} s"
        except Exception as e:  # a peer failing on this input: said in its row
            row["error"] = f"{type(e).__name__}: {e}"[:120]
        out.append(row)
    best = {key: float("inf") for key in [("pass", "pass"), *runs]}
    for _ in range(repeats if n * c > 1e6 else 10 * repeats):  # millisecond calls: more rounds
        for key in best:
            fn = (lambda: torch.logsumexp(logits, dim=1)) if key == ("pass", "pass") else runs[key]
            start = time.process_time()
            fn()
            best[key] = min(best[key], time.process_time() - start)
    for row in out:
        if "error" not in row:
            row.update(cpu_s=best[(row["metric"], row["method"])], pass_s=best[("pass", "pass")])
    print(json.dumps(out))


# ----------------------------------------------------------------------------------------------------------------
# driver
# ----------------------------------------------------------------------------------------------------------------


def jobs_for(size):
    n, c = parse_size(size)
    return [(metric, method) for metric, methods in METHODS.items() for method in methods
            if not ((metric == "cece" and n * c > 5e7) or (metric == "smece" and c != 100))]


def run_size(size, repeats, budget):
    spec = json.dumps(dict(size=size, jobs=jobs_for(size), repeats=repeats, budget=budget))
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_EVALUATE_OFFLINE="1", HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", spec], env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return [dict(metric=m, method=k, size=size, error=tail[:120]) for m, k in jobs_for(size)]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--sizes", nargs="*", default=SIZES, help="NxC sizes, e.g. 1e5x100")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budget", type=float, default=900, help="wall seconds a method's first call may take")
    parser.add_argument("--output", help="write the results as a markdown page to this file (and as .json beside it)")
    args = parser.parse_args(argv)
    if args.worker:
        worker(json.loads(args.worker))
        return 0
    start, load_start = time.time(), os.getloadavg()[0]
    results = []
    for size in args.sizes:
        for r in run_size(size, args.repeats, args.budget):
            results.append(r)
            print(json.dumps(r), flush=True)
    elapsed = time.time() - start
    command = "OMP_NUM_THREADS=1 python benchmarks/metrics_bench.py " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    import torch

    load = f"load average (1 min) {load_start:.2f} at the start, {os.getloadavg()[0]:.2f} at the end"
    text = "\n".join([
        "# Calibration metrics: timm_csm beside torchmetrics, netcal, torch-uncertainty, probmetrics, scikit-learn "
        "and relplot, and against one pass over the logits", "",
        f"    {command.strip()}", "",
        f"{os.cpu_count()} CPU cores ({platform.machine()}), 1 thread per method, torch {torch.__version__}; "
        f"{load} (above 1, other jobs shared the cores: absolute times are inflated more than the pass multiples, "
        f"which are taken in the same process); {elapsed:.0f} s in all. "
        f"Best CPU time of {args.repeats} interleaved rounds ({10 * args.repeats} where N x C <= 1e6), all methods of "
        "a size in one process. One pass: "
        "`torch.logsumexp` over the logits, timed in the same rounds; `passes` is the method's time over it. "
        "What each method computes: the script's docstring.", "",
        table(results), "", findings(results), "", NOTES])
    print(text)
    if args.output:
        from timm_csm.io import write_json_atomic, write_text_atomic

        write_text_atomic(args.output, text)
        from csm_step import record

        scripts = ("benchmarks/metrics_bench.py", "benchmarks/metrics_page.py", "benchmarks/metrics_plain.py")
        write_json_atomic(os.path.splitext(args.output)[0] + ".json",
                          {"command": command.strip(), "record": record(*scripts), "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
