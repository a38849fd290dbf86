"""Post-hoc calibrators side by side: timm_csm against netcal 1.4 and torch-uncertainty 0.13 (the same method in
each library), fit and apply time and the calibration each reaches on held-out logits.

    OMP_NUM_THREADS=1 python benchmarks/calibrators_bench.py [--sizes 1e4x10 5e4x1000] [--repeats 3]
                                                             [--output benchmarks/calibrators.md]

Data (seeded, mis-calibrated in a known way): true logits ``u = randn(N, C)`` with +4 on a random class, labels
drawn from ``softmax(u)`` (Gumbel-max), and observed logits ``2 u + b`` with a per-class bias ``b ~ N(0, 0.5)``:
over-confident by a temperature of 2 and biased per class, so temperature scaling removes most of the error and
vector scaling all of it. A fit set and a held-out set of N rows each are drawn from one generator; the binary
calibrators (Platt, beta) run on N x 2 logits of the same construction. Reported: the best wall time of ``fit``
and of ``apply`` over ``--repeats`` runs (one run where N x C > 1e6) in one process, one thread, every library on the same arrays, and the
held-out top-label ECE (15 bins) and NLL of what each returns (``timm_csm.metrics.calibration_metrics``).

What each library is given: timm_csm float32 logits (its calibrators compute in float64); torch-uncertainty float32
logits through a one-batch ``DataLoader`` (``fit``) and its module's forward (``apply``); netcal float64
probabilities (it takes no logits: the softmax is computed outside the timer). netcal's histogram binning returns
one-vs-rest probabilities that do not sum to one: they are renormalised before scoring (not timed), as timm_csm
and torch-uncertainty do inside their apply. A library that is not installed, or a method it lacks, is a row
saying so. Matrix scaling and Dirichlet calibration fit C (C + 1) parameters: they run at C <= 100 only.
"""
from __future__ import annotations

import argparse
import platform
import shlex
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import torch

BINARY_SIZE_NOTE = "N x 2"
# (our registry name, netcal class and kwargs, torch-uncertainty class and kwargs, the largest C it runs at)
METHODS: List[Tuple[str, Optional[Tuple[str, dict]], Optional[Tuple[str, dict]], int]] = [
    ("temperature_scaling_nll", ("scaling.TemperatureScaling", {}), ("TemperatureScaler", {}), 1000),
    ("vector_scaling", ("scaling.LogisticCalibration", {"temperature_only": False}), ("VectorScaler", {"nc": 1}),
     1000),
    ("matrix_scaling", None, ("MatrixScaler", {"nc": 1}), 100),
    ("dirichlet", None, ("DirichletScaler", {"nc": 1, "lambda_reg": 1e-3, "mu_reg": 1e-3}), 100),
    ("isotonic", ("binning.IsotonicRegression", {}), ("IsotonicRegressionScaler", {}), 1000),
    ("histogram_binning", ("binning.HistogramBinning", {"bins": 15}), ("HistogramBinningScaler", {"num_bins": 15}),
     1000),
    ("platt", ("scaling.LogisticCalibration", {}), None, 2),
    ("beta", ("scaling.BetaCalibration", {}), None, 2),
]
OUR_KWARGS = {"dirichlet": {"reg_lambda": 1e-3, "reg_mu": 1e-3}}


def synthetic_logits(n: int, c: int, seed: int) -> Dict[str, Tuple[torch.Tensor, torch.Tensor]]:
    """{"fit": (logits, labels), "held_out": (logits, labels)}: see the module docstring."""
    g = torch.Generator().manual_seed(seed)
    bias = 0.5 * torch.randn(c, generator=g)
    out = {}
    for part in ("fit", "held_out"):
        u = torch.randn(n, c, generator=g)
        u[torch.arange(n), torch.randint(c, (n,), generator=g)] += 4.0
        gumbel = -torch.log(-torch.log(torch.rand(n, c, generator=g).clamp_min(1e-12)))
        labels = (u + gumbel).argmax(dim=1)
        out[part] = ((2.0 * u + bias).float(), labels)
    return out


def best_time(fn: Callable[[], object], repeats: int):
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def scores(logits: torch.Tensor, labels: torch.Tensor) -> Dict[str, float]:
    from timm_csm.metrics import calibration_metrics

    m = calibration_metrics(logits.double(), labels, n_bins=15)
    return {"ece": float(m["ece"]), "nll": float(m["nll"])}


def probs_to_logits(p: np.ndarray, c: int) -> torch.Tensor:
    """Logits of netcal's output: (N,) P(y = 1) for two classes, else (N, C) rows renormalised."""
    p = np.asarray(p, dtype=np.float64)
    if c == 2 and p.ndim == 1:
        p = np.stack([1.0 - p, p], axis=1)
    p = np.clip(p, 1e-12, None)
    return torch.from_numpy(np.log(p / p.sum(axis=1, keepdims=True)))


def run_ours(name, fit, held_out, repeats):
    from timm_csm.calibration import create_calibrator

    fit_s, calibrator = best_time(lambda: create_calibrator(name, **OUR_KWARGS.get(name, {})).fit(*fit), repeats)
    apply_s, out = best_time(lambda: calibrator.transform(held_out[0]), repeats)
    return fit_s, apply_s, out


def run_netcal(spec, fit, held_out, repeats):
    import importlib

    module, cls = spec[0].rsplit(".", 1)
    factory = getattr(importlib.import_module(f"netcal.{module}"), cls)
    c = fit[0].shape[1]

    def probabilities(logits):
        p = torch.softmax(logits.double(), dim=1).numpy()
        return p[:, 1].copy() if c == 2 else p

    x_fit, x_test, y_fit = probabilities(fit[0]), probabilities(held_out[0]), fit[1].numpy()
    fit_s, model = best_time(lambda: factory(**spec[1]).fit(x_fit, y_fit), repeats)
    apply_s, out = best_time(lambda: model.transform(x_test), repeats)
    return fit_s, apply_s, probs_to_logits(out, c)


def run_tu(spec, fit, held_out, repeats):
    import logging

    import torch_uncertainty.post_processing as tu
    from torch.utils.data import DataLoader, TensorDataset

    logging.getLogger().setLevel(logging.ERROR)  # its "model is None" warning on every fit
    kwargs = dict(spec[1])
    if kwargs.pop("nc", None):
        kwargs["num_classes"] = fit[0].shape[1]
    loader = DataLoader(TensorDataset(*fit), batch_size=len(fit[1]))

    def fitted():
        scaler = getattr(tu, spec[0])(**kwargs)
        scaler.fit(loader, progress=False)
        return scaler

    fit_s, scaler = best_time(fitted, repeats)
    with torch.no_grad():
        apply_s, out = best_time(lambda: scaler(held_out[0]), repeats)
    return fit_s, apply_s, out.detach()


def tu_installed() -> Optional[str]:
    try:
        import torch_uncertainty.post_processing  # noqa: F401
        from importlib.metadata import version

        return version("torch-uncertainty")
    except Exception:  # absent, or a dependency of it absent
        return None


def bench(sizes: List[str], repeats: int, seed: int) -> List[dict]:
    tu_version = tu_installed()
    rows = []
    for size in sizes:
        n, c = (int(float(v)) for v in size.lower().split("x"))
        data = {c: synthetic_logits(n, c, seed), 2: synthetic_logits(n, 2, seed)}
        for name, netcal_spec, tu_spec, max_c in METHODS:
            classes = 2 if max_c == 2 else c
            if classes > max_c or (max_c == 2 and size != sizes[0]):
                continue
            fit, held_out = data[classes]["fit"], data[classes]["held_out"]
            runs = repeats if n * classes <= 1e6 else 1
            row = {"method": name, "size": f"{n} x {classes}", "uncalibrated": scores(*held_out)}
            for lib, spec, runner in (("timm_csm", name, run_ours), ("netcal", netcal_spec, run_netcal),
                                      ("torch-uncertainty", tu_spec, run_tu)):
                if spec is None:
                    row[lib] = "no such method"
                elif lib == "torch-uncertainty" and tu_version is None:
                    row[lib] = "not installed"
                else:
                    fit_s, apply_s, out = runner(spec, fit, held_out, runs)
                    row[lib] = {"fit_s": fit_s, "apply_s": apply_s, **scores(out, held_out[1])}
                print(f"{row['size']:>12} {name:>24} {lib:>18}: {row[lib]}", file=sys.stderr, flush=True)
            rows.append(row)
    return rows


def _cell(r) -> Tuple[str, str, str, str]:
    if isinstance(r, str):
        return (r, "", "", "")
    return (f"{r['fit_s']:.3g}", f"{r['apply_s']:.3g}", f"{100 * r['ece']:.2f}", f"{r['nll']:.4f}")


def _ratio(ours, peer, key) -> str:
    if isinstance(ours, str) or isinstance(peer, str):
        return "-"
    return f"{peer[key] / max(ours[key], 1e-9):.2g}x"


def markdown(rows: List[dict], command: str, repeats: int) -> str:
    lines = ["# Post-hoc calibrators: timm_csm, netcal and torch-uncertainty side by side", "",
             "    " + command, "",
             f"Machine: {platform.machine()}, 2 CPU cores shared with other benchmark jobs, one torch thread, "
             f"torch {torch.__version__}, Python {platform.python_version()}; best of {repeats} (one run where "
             "N x C > 1e6) in one process, "
             "every library on the same arrays in the same run, so the ratios hold while absolute times are "
             "inflated by the load. Data and what each library is given: the script's docstring (logits 2 u + b, "
             "over-confident by T = 2 with a per-class bias; held-out rows as many as the fit rows).", "",
             "Times in seconds; ECE (15 bins) in %, NLL on the held-out rows. Speed-up columns: the peer's time "
             "over ours (> 1: ours faster).", "",
             "| method | N x C | uncalibrated ECE / NLL | library | fit s | apply s | ECE % | NLL | fit: peer / ours | "
             "apply: peer / ours |", "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        base = f"{100 * row['uncalibrated']['ece']:.2f} / {row['uncalibrated']['nll']:.4f}"
        for lib in ("timm_csm", "netcal", "torch-uncertainty"):
            fit_s, apply_s, ece, nll = _cell(row[lib])
            ratios = ("", "") if lib == "timm_csm" else (_ratio(row["timm_csm"], row[lib], "fit_s"),
                                                         _ratio(row["timm_csm"], row[lib], "apply_s"))
            lines.append(f"| {row['method']} | {row['size']} | {base} | {lib} | {fit_s} | {apply_s} | {ece} | "
                         f"{nll} | {ratios[0]} | {ratios[1]} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", nargs="+", default=["1e4x10", "5e4x1000"], help="N x C of the multiclass runs; "
                   "the binary calibrators run at the first size's N x 2")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", default=None, help="write the markdown page here (else print it)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    rows = bench(args.sizes, args.repeats, args.seed)
    command = "OMP_NUM_THREADS=1 python benchmarks/calibrators_bench.py " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    page = markdown(rows, command.strip(), args.repeats)
    if args.output:
        with open(args.output, "w") as f:
            f.write(page)
    print(page)


if __name__ == "__main__":
    main()
