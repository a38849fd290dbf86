"""Post-hoc calibrators side by side and against the limit: timm_csm, netcal, torch-uncertainty, scikit-learn and
probmetrics (the same method in each library), fit and apply time as multiples of one fused pass over the logits,
the optimisers' iterations, the objective each fit reaches and the calibration on held-out logits.

    OMP_NUM_THREADS=1 python benchmarks/calibrators_bench.py [--sizes 1e4x10 1e4x100 5e4x1000] [--repeats 3]
                                                             [--methods vector_scaling ...] [--budget 1800]
                                                             [--output benchmarks/calibrators.md]
    OMP_NUM_THREADS=1 python benchmarks/calibrators_bench.py --calibrate-run [--output benchmarks/calibrators.md]

Data (seeded, mis-calibrated in a known way): true logits ``u = randn(N, C)`` with +4 on a random class, labels
drawn from ``softmax(u)`` (Gumbel-max), and observed logits ``2 u + b`` with a per-class bias ``b ~ N(0, 0.5)``:
over-confident by a temperature of 2 and biased per class. A fit set and a held-out set of N rows each are drawn
from one generator; the two-class calibrators (Platt, beta) run on N x 2 logits of the same construction.

The limit: one pass is the time of ``torch.logsumexp(logits, dim=1)`` over the fit logits, measured in the same
process; every fit and apply is also given as a multiple of it. Times are process CPU times (one thread for every
library: ``torch.set_num_threads(1)`` and threadpoolctl's limit for NumPy / SciPy), the best of ``--repeats`` runs
for a fit and of ten times as many for an apply and the pass, every library on the same arrays; the fits one
library after the other for each method, then the applies of that method in interleaved rounds (each library's
apply once per round, so that a burst of load on the shared machine falls on all of them); where N x C > 1e6 a
fit runs once and an apply three times. The applies' median over the rounds is kept beside the best: a peer's
apply faster than timm_csm's by less than the larger (median - best) of the two is listed as within the spread,
not as faster (the same matrix product varies by about 10 % from round to round). ``--methods`` re-measures some
rows: with ``--output``, they replace the rows of the same method and size in the .json beside it (a row keeps
the peers measured in its own run), and the page is rendered from all rows, with every command that produced them.

What each library is given: timm_csm float32 logits (its fits accumulate in float64); torch-uncertainty float32
logits through a one-batch ``DataLoader`` (``fit``) and its module's forward (``apply``); probmetrics float32
logits as ``CategoricalLogits`` (``fit_torch`` / ``predict_proba_torch``); scikit-learn the logits as the
``decision_function`` of a frozen identity classifier (``CalibratedClassifierCV``; isotonic: the probabilities as
its ``predict_proba``), or as the features of ``LogisticRegression(C=inf)`` (matrix scaling on the logits, Platt on
the log-odds); netcal float64 probabilities (it takes no logits). Softmaxes a library needs as input are computed
outside the timer. netcal's and torch-uncertainty's one-vs-rest outputs are renormalised (not timed) before
scoring, as timm_csm and scikit-learn do inside their apply. A library that is not installed, or lacks the method,
is a row saying so; a fit that runs past ``--budget`` seconds is stopped and said so.

The fit objective column is the mean NLL on the fit rows of what each library returns, computed here in float64
(plus the ODIR penalty for Dirichlet calibration); it is the quantity every parametric fit minimises, so a lower
value is a better fit of the same model (netcal's vector scaling scales log-probabilities, torch-uncertainty's
has no bias: different models, shown for reference). Where a peer's fit of the same model ends sooner at a worse
objective, timm_csm's time to reach that objective is read off its fit's objective trace (``fit_info["trace"]``:
the CPU seconds and the objective after each evaluation, plus the part of its fit time outside the trace).
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import shlex
import signal
import sys
import time
from contextlib import contextmanager
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F

LIBRARIES = ("timm_csm", "netcal", "torch-uncertainty", "scikit-learn", "probmetrics")
DIRICHLET_REG = {"reg_lambda": 1e-3, "reg_mu": 1e-3}
OBJECTIVE_RTOL = 1e-6  # an objective "at least as good": ours <= peer + 1e-6 |peer|
# per method: the peers' specs (None: the library has no such method) and whether it is a two-class method
METHODS: Dict[str, Dict[str, object]] = {
    "temperature_scaling_nll": {"netcal": ("scaling.TemperatureScaling", {}), "torch-uncertainty":
                                ("TemperatureScaler", {}), "scikit-learn": "temperature", "probmetrics":
                                "TemperatureScalingCalibrator"},
    "vector_scaling": {"netcal": ("scaling.LogisticCalibration", {"temperature_only": False}),
                       "torch-uncertainty": ("VectorScaler", {"num_classes": True}), "probmetrics":
                       "VectorScalingCalibrator"},
    "matrix_scaling": {"torch-uncertainty": ("MatrixScaler", {"num_classes": True}), "scikit-learn": "logistic",
                       "probmetrics": "MatrixScalingCalibrator"},
    "dirichlet": {"torch-uncertainty": ("DirichletScaler", {"num_classes": True, "lambda_reg": 1e-3,
                                                            "mu_reg": 1e-3})},
    "isotonic": {"netcal": ("binning.IsotonicRegression", {}), "torch-uncertainty": ("IsotonicRegressionScaler", {}),
                 "scikit-learn": "isotonic"},
    "histogram_binning": {"netcal": ("binning.HistogramBinning", {"bins": 15}),
                          "torch-uncertainty": ("HistogramBinningScaler", {"num_bins": 15})},
    "platt": {"netcal": ("scaling.LogisticCalibration", {}), "scikit-learn": "logistic"},
    "beta": {"netcal": ("scaling.BetaCalibration", {})},
}
BINARY = ("platt", "beta")


class OverBudget(Exception):
    pass


@contextmanager
def budget(seconds: float):
    """Raise ``OverBudget`` in the main thread after ``seconds`` of wall time (between two Python bytecodes)."""
    def stop(*_):
        raise OverBudget()
    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


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
    """(best process CPU seconds over ``repeats`` calls, the last result)."""
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.process_time()
        result = fn()
        best = min(best, time.process_time() - start)
    return best, result


def apply_repeats(repeats: int) -> int:
    """Applies take micro- to milliseconds where fits repeat: ten times the repeats; three where fits run once
    (N x C > 1e6: a matrix product there varies by about 10 % from run to run)."""
    return 3 if repeats == 1 else 10 * repeats


def one_pass(logits: torch.Tensor, repeats: int) -> float:
    return best_time(lambda: torch.logsumexp(logits, dim=1), apply_repeats(repeats))[0]


def scores(logits: torch.Tensor, labels: torch.Tensor) -> Dict[str, float]:
    from timm_csm.metrics import calibration_metrics

    m = calibration_metrics(logits.double(), labels, n_bins=15)
    return {"ece": float(m["ece"]), "nll": float(m["nll"])}


def as_logits(p) -> torch.Tensor:
    """Logits of a library's probabilities: (N,) P(y = 1) of two classes, else (N, C) rows renormalised."""
    p = np.asarray(p.detach().cpu() if isinstance(p, torch.Tensor) else p, dtype=np.float64)
    if p.ndim == 1:
        p = np.stack([1.0 - p, p], axis=1)
    p = np.clip(p, 1e-12, None)
    return torch.from_numpy(np.log(p / p.sum(axis=1, keepdims=True)))


def softmax64(logits: torch.Tensor) -> np.ndarray:
    return torch.softmax(logits.double(), dim=1).numpy()


# ---------------------------------------------------------------------------------------------------------------
# one runner per library: (fit seconds, the apply as a function of nothing, held-out logits, fit-set logits,
# iterations, penalty, objective trace or None); the applies of one row are timed together, interleaved
# ---------------------------------------------------------------------------------------------------------------


def run_ours(name, spec, fit, held_out, repeats):
    from timm_csm.calibration import create_calibrator

    kwargs = DIRICHLET_REG if name == "dirichlet" else {}
    fit_s, cal = best_time(lambda: create_calibrator(name, **kwargs).fit(*fit), repeats)
    apply = lambda: cal.transform(held_out[0])  # noqa: E731
    out = apply()
    info = getattr(cal, "fit_info", None) or {}
    iterations = info.get("iterations")
    if "warm_start_iterations" in info:
        iterations = f"{info['iterations']} ({info['evaluations']} evaluations) + {info['warm_start_iterations']} TS"
    penalty = float(cal.penalty(cal.weight, cal.bias)) if name == "dirichlet" else 0.0
    trace = info.get("trace")
    if trace:  # the fit time outside the trace (input checks, the final parameters) added to each point
        trace = [(seconds + fit_s - trace[-1][0], value) for seconds, value in trace]
    return fit_s, apply, out, cal.transform(fit[0]), iterations, penalty, trace


def run_netcal(name, spec, fit, held_out, repeats):
    module, cls = spec[0].rsplit(".", 1)
    factory = getattr(importlib.import_module(f"netcal.{module}"), cls)
    two = fit[0].shape[1] == 2
    x_fit, x_test = (softmax64(z)[:, 1].copy() if two else softmax64(z) for z in (fit[0], held_out[0]))
    fit_s, model = best_time(lambda: factory(**spec[1]).fit(x_fit, fit[1].numpy()), repeats)
    apply = lambda: model.transform(x_test)  # noqa: E731
    out = apply()
    return fit_s, apply, as_logits(out), as_logits(model.transform(x_fit)), None, 0.0, None


def run_tu(name, spec, fit, held_out, repeats):
    import logging

    import torch_uncertainty.post_processing as tu
    from torch.utils.data import DataLoader, TensorDataset

    logging.getLogger().setLevel(logging.ERROR)  # its "model is None" warning on every fit
    kwargs = dict(spec[1])
    if kwargs.pop("num_classes", None):
        kwargs["num_classes"] = fit[0].shape[1]
    loader = DataLoader(TensorDataset(*fit), batch_size=len(fit[1]))

    def fitted():
        scaler = getattr(tu, spec[0])(**kwargs)
        scaler.fit(loader, progress=False)
        return scaler

    fit_s, scaler = best_time(fitted, repeats)
    def apply():
        with torch.no_grad():
            return scaler(held_out[0])

    out = apply()
    with torch.no_grad():
        on_fit = scaler(fit[0])
    penalty = 0.0
    if name == "dirichlet":
        from timm_csm.calibration import DirichletCalibration

        weight, bias = scaler.inv_temperature_weight.detach(), scaler.inv_temperature_bias.detach()
        penalty = float(DirichletCalibration(**DIRICHLET_REG).penalty(weight.double(), bias.double()))
    return fit_s, apply, out.detach().double(), on_fit.detach().double(), None, penalty, None


class _Scores:
    """A frozen identity classifier for scikit-learn: its ``decision_function`` (logits) or ``predict_proba`` is
    the array it is given (two classes: the log-odds)."""

    @staticmethod
    def make(kind: str):
        from sklearn.base import BaseEstimator, ClassifierMixin

        class Identity(ClassifierMixin, BaseEstimator):
            def fit(self, x, y):
                self.classes_ = np.unique(y)
                return self

            def predict(self, x):
                return self.classes_[np.argmax(x, axis=1)]

        def predict_proba(self, x):
            return x

        def decision_function(self, x):
            return x[:, 1] - x[:, 0] if x.shape[1] == 2 else x

        if kind == "probabilities":
            Identity.predict_proba = predict_proba
        else:
            Identity.decision_function = decision_function
        return Identity


def run_sklearn(name, spec, fit, held_out, repeats):
    from sklearn.calibration import CalibratedClassifierCV
    from sklearn.frozen import FrozenEstimator
    from sklearn.linear_model import LogisticRegression

    y = fit[1].numpy()
    if spec == "logistic":  # matrix scaling: the logits as features; Platt: the log-odds
        feature = (lambda z: (z[:, 1] - z[:, 0])[:, None].double().numpy()) if name == "platt" else \
            (lambda z: z.double().numpy())
        x_fit, x_test = feature(fit[0]), feature(held_out[0])
        fit_s, model = best_time(lambda: LogisticRegression(C=np.inf).fit(x_fit, y), repeats)
        iterations = int(np.max(model.n_iter_))
    else:
        kind = "probabilities" if spec == "isotonic" else "logits"
        prepare = softmax64 if spec == "isotonic" else (lambda z: z.double().numpy())
        x_fit, x_test = prepare(fit[0]), prepare(held_out[0])
        base = _Scores.make(kind)().fit(x_fit, y)
        fit_s, model = best_time(lambda: CalibratedClassifierCV(FrozenEstimator(base), method=spec)
                                 .fit(x_fit, y), repeats)
        iterations = None
    apply = lambda: model.predict_proba(x_test)  # noqa: E731
    out = apply()
    return fit_s, apply, as_logits(out), as_logits(model.predict_proba(x_fit)), iterations, 0.0, None


def run_probmetrics(name, spec, fit, held_out, repeats):
    import probmetrics.calibrators as pm
    from probmetrics.distributions import CategoricalLogits

    labels = fit[1]
    fit_s, cal = best_time(lambda: getattr(pm, spec)().fit_torch(CategoricalLogits(fit[0]), labels), repeats)
    apply = lambda: cal.predict_proba_torch(CategoricalLogits(held_out[0])).get_logits()  # noqa: E731
    out = apply()
    on_fit = cal.predict_proba_torch(CategoricalLogits(fit[0])).get_logits()
    return fit_s, apply, out.detach().double(), on_fit.detach().double(), None, 0.0, None


RUNNERS = {"timm_csm": run_ours, "netcal": run_netcal, "torch-uncertainty": run_tu, "scikit-learn": run_sklearn,
           "probmetrics": run_probmetrics}
MODULES = {"netcal": "netcal", "torch-uncertainty": "torch_uncertainty.post_processing",
           "scikit-learn": "sklearn.calibration", "probmetrics": "probmetrics.calibrators"}
DISTRIBUTIONS = {"timm_csm": "timm-csm", "netcal": "netcal", "torch-uncertainty": "torch-uncertainty",
                 "scikit-learn": "scikit-learn", "probmetrics": "probmetrics"}


def installed() -> Dict[str, Optional[str]]:
    """{library: version, or None where it (or a dependency of it) does not import}."""
    from importlib.metadata import version

    out = {"timm_csm": version("timm-csm")}
    for lib, module in MODULES.items():
        try:
            importlib.import_module(module)
            out[lib] = version(DISTRIBUTIONS[lib])
        except Exception:  # absent, or a dependency of it absent
            out[lib] = None
    return out


# ---------------------------------------------------------------------------------------------------------------
# the table
# ---------------------------------------------------------------------------------------------------------------


def parse_size(text: str) -> Tuple[int, int]:
    n, c = (int(float(v)) for v in text.lower().split("x"))
    return n, c


def run_library(lib, name, spec, fit, held_out, runs, budget_s):
    """(the row's cell: a dict without ``apply_s``, or why there is none; the apply, or None)."""
    try:
        with budget(budget_s):
            fit_s, apply, out, on_fit, iterations, penalty, trace = RUNNERS[lib](name, spec, fit, held_out, runs)
    except OverBudget:
        return f"stopped after {budget_s:g} s", None
    objective = float(F.cross_entropy(on_fit.double(), fit[1])) + penalty
    result = {"fit_s": fit_s, "iterations": iterations, "objective": objective, **scores(out, held_out[1])}
    if trace:
        result["trace"] = trace
    return result, apply


def interleaved_times(applies: Dict[str, Callable[[], object]], rounds: int) -> Dict[str, Tuple[float, float]]:
    """(best, median) process CPU seconds of each apply over ``rounds`` rounds that call every apply once in turn:
    on a shared machine a burst of load then falls on every library alike."""
    times: Dict[str, List[float]] = {lib: [] for lib in applies}
    for _ in range(rounds):
        for lib, apply in applies.items():
            start = time.process_time()
            apply()
            times[lib].append(time.process_time() - start)
    return {lib: (min(t), sorted(t)[len(t) // 2]) for lib, t in times.items()}


def apply_tie(ours: dict, peer: dict) -> bool:
    """Whether a peer's faster apply lies within the rounds' spread: its best time is above timm_csm's best less
    the larger of the two libraries' (median - best) (the same matrix product in both, for instance, varies by
    about that much from round to round). Rows measured before the medians were kept have no tie."""
    if "apply_median_s" not in ours or "apply_median_s" not in peer:
        return False
    spread = max(ours["apply_median_s"] - ours["apply_s"], peer["apply_median_s"] - peer["apply_s"])
    return peer["apply_s"] >= ours["apply_s"] - spread


def bench(sizes: List[str], repeats: int, seed: int, budget_s: float = 1800.0,
          versions: Optional[Dict[str, Optional[str]]] = None, methods=None) -> List[dict]:
    versions = versions if versions is not None else installed()
    rows, binary_done = [], set()
    for size in sizes:
        n, c = parse_size(size)
        data, passes = {}, {}
        for name, peers in METHODS.items():
            if methods is not None and name not in methods:
                continue
            classes = 2 if name in BINARY else c
            if name in BINARY and n in binary_done:
                continue  # the two-class methods run once per N
            if classes not in data:
                data[classes] = synthetic_logits(n, classes, seed)
                passes[classes] = one_pass(data[classes]["fit"][0], repeats)
            fit, held_out = data[classes]["fit"], data[classes]["held_out"]
            runs = repeats if n * classes <= 1e6 else 1
            row = {"method": name, "size": f"{n} x {classes}", "pass_s": passes[classes],
                   "uncalibrated": scores(*held_out)}
            applies = {}
            for lib in LIBRARIES:
                spec = "ours" if lib == "timm_csm" else peers.get(lib)
                if spec is None:
                    row[lib] = "no such method"
                elif versions.get(lib) is None:
                    row[lib] = "not installed"
                else:
                    row[lib], apply = run_library(lib, name, spec, fit, held_out, runs, budget_s)
                    if apply is not None:
                        applies[lib] = apply
            for lib, (best, median) in interleaved_times(applies, apply_repeats(runs)).items():
                row[lib]["apply_s"], row[lib]["apply_median_s"] = best, median
            for lib in LIBRARIES:
                print(f"{row['size']:>12} {name:>24} {lib:>18}: {row[lib]}", file=sys.stderr, flush=True)
            rows.append(row)
        binary_done.add(n)
    return rows


def _ratio(ours, peer, key) -> str:
    if isinstance(ours, str) or isinstance(peer, str):
        return "-"
    return f"{peer[key] / max(ours[key], 1e-9):.3g}x"


# the peers whose model is timm_csm's or contained in it: the ones whose fit objective is compared
SAME_MODEL = {"temperature_scaling_nll": LIBRARIES[1:], "vector_scaling": ("torch-uncertainty", "probmetrics"),
              "matrix_scaling": LIBRARIES[1:], "dirichlet": LIBRARIES[1:], "platt": LIBRARIES[1:],
              "beta": LIBRARIES[1:]}


def seconds_to_reach(ours: dict, target: float) -> Optional[float]:
    """The fit seconds after which timm_csm's objective trace first comes within the tolerance of ``target``."""
    for seconds, value in ours.get("trace") or ():
        if value <= target + OBJECTIVE_RTOL * abs(target):
            return seconds
    return None


def findings(rows: List[dict]) -> List[str]:
    """Facts read off the table: peers faster than timm_csm (a peer's fit that ends sooner at a worse objective
    compared with the time timm_csm takes to reach that objective), objectives worse than a peer's beyond the
    tolerance, the passes of temperature scaling."""
    slower, worse, reached, ties = [], [], [], []
    for row in rows:
        ours = row["timm_csm"]
        for lib in LIBRARIES[1:]:
            peer = row[lib]
            if isinstance(ours, str) or isinstance(peer, str):
                continue
            same_model = lib in SAME_MODEL.get(row["method"], ())
            for key, what in (("fit_s", "fit"), ("apply_s", "apply")):
                if peer[key] < ours[key] and key == "apply_s" and apply_tie(ours, peer):
                    ties.append(f"{row['method']} at {row['size']}: {lib} {_ratio(ours, peer, key)}")
                    continue
                if peer[key] < ours[key]:
                    worse_fit = key == "fit_s" and same_model and \
                        peer["objective"] > ours["objective"] + OBJECTIVE_RTOL * abs(ours["objective"])
                    reach = seconds_to_reach(ours, peer["objective"]) if worse_fit else None
                    if reach is not None and reach <= peer[key]:
                        reached.append(f"{row['method']} at {row['size']}: {lib} stops at {peer['objective']:.3g} "
                                       f"after {peer[key]:.3g} s, timm_csm reaches it after {reach:.3g} s "
                                       f"({peer[key] / reach:.3g}x) and goes on to {ours['objective']:.3g}")
                        continue
                    slower.append(f"{row['method']} {what} at {row['size']}: {lib} {_ratio(ours, peer, key)}"
                                  + (f" (stopping at a worse objective, {peer['objective']:.3g})" if worse_fit else ""))
            if same_model and ours["objective"] > peer["objective"] + OBJECTIVE_RTOL * abs(peer["objective"]):
                worse.append(f"{row['method']} at {row['size']}: {ours['objective']:.7f} vs {lib} "
                             f"{peer['objective']:.7f}")
    ts = [r for r in rows if r["method"] == "temperature_scaling_nll" and not isinstance(r["timm_csm"], str)]
    out = ["Read off the table above:", ""]
    if ts:
        fit = [r["timm_csm"]["fit_s"] / r["pass_s"] for r in ts]
        apply = [r["timm_csm"]["apply_s"] / r["pass_s"] for r in ts]
        out.append(f"* temperature scaling: fit {min(fit):.1f}-{max(fit):.1f} passes, apply {min(apply):.2f}-"
                   f"{max(apply):.2f} passes over the sizes run (targets: 20 and 2).")
    out.append("* a peer faster than timm_csm: " + ("; ".join(slower) if slower else "none, in fit or apply."))
    if ties:
        out.append("* a peer's apply faster by less than the rounds' spread (the larger median - best of the two "
                   "libraries: not a difference this run resolves): " + "; ".join(ties))
    if reached:
        out.append(f"* a peer's fit ending sooner at a worse objective, against timm_csm's time to that objective "
                   f"(its objective trace within {OBJECTIVE_RTOL:g} of the peer's final one): " + "; ".join(reached))
    out.append(f"* a fit objective above a same-model peer's by more than {OBJECTIVE_RTOL:g} of it: "
               + ("; ".join(worse) if worse else "none."))
    return out


NOTES = """What the table shows beyond its numbers:

* Validation: every timm_csm apply refuses NaN or infinite logits with one reduction per call. The scaling
  methods check their output, which a non-finite logit always reaches with finite parameters (one sum over the
  output for temperature, vector, Platt and beta scaling; the first output column for matrix scaling and
  Dirichlet calibration, whose every output of a row takes every logit of it); only when that fails is the input
  read, to tell NaN or infinite logits from an overflow. Isotonic regression and histogram binning, which could map
  NaN to a finite value, check their input. torch-uncertainty's and probmetrics' scaling applies are a bare
  multiply or matrix product without a check: where one of them is faster, the difference is that one read (an
  elementwise apply with the check moves a third more memory than without it).
* Precision: timm_csm computes float32 logits in float32 blocks with float64 sums over samples (fits) and applies
  them in float32 (isotonic regression interpolates in float64): the held-out ECE and NLL agree with its float64
  results to the digits shown. The fit objectives are evaluated here in float64 for every library alike.
* At 50 000 x 1 000 every fit is a single run, and so is every apply of the rows not re-measured; there, repeated
  applies of the same matrix product (timm_csm's, torch-uncertainty's, probmetrics') vary by about 10 % from run
  to run on this machine.
* ``--budget`` is wall time: on a loaded machine a peer's fit can run past it on far less CPU time (netcal's
  vector scaling at 10 000 x 100 in the re-measured rows, where this process held 7-20 % of a core; the first run
  fitted it in 48 s of CPU).
* At 50 000 x 1 000 matrix scaling fits 1 001 000 parameters to 50 000 rows: the fit rows are separable, the NLL
  has no minimum (it goes to 0 with growing weights) and every optimiser stops on its own tolerance or budget; the
  held-out NLL shows the over-fit. Dirichlet calibration there carries the ODIR penalty (1e-3) of the smaller sizes.
"""


def _cells(r, pass_s) -> str:
    if isinstance(r, str):
        return f"{r} | | | | | | | |"
    iterations = "" if r["iterations"] is None else str(r["iterations"])
    return (f"{r['fit_s']:.3g} | {r['fit_s'] / pass_s:.3g} | {r['apply_s']:.3g} | {r['apply_s'] / pass_s:.3g} | "
            f"{iterations} | {r['objective']:.7f} | {100 * r['ece']:.2f} | {r['nll']:.4f}")


def commands_block(rows: List[dict], command: str) -> List[str]:
    """The commands that measured ``rows`` (a row without one is ``command``'s), each with the rows it re-measured
    when there are several."""
    runs: Dict[str, List[str]] = {command: []}  # the first run first, whichever rows it still holds
    for row in rows:
        runs.setdefault(row.get("command", command), []).append(f"{row['method']} {row['size']}")
    lines = []
    for i, (run, measured) in enumerate(runs.items()):
        lines += ["    " + run, ""]
        if i:
            lines += ["re-measured there, each row with its peers in that run: " + "; ".join(measured) + ".", ""]
    return lines


def markdown(rows: List[dict], command: str, repeats: int, versions: Dict[str, Optional[str]]) -> str:
    libs = ", ".join(f"{lib} {versions.get(lib) or '(not installed)'}" for lib in LIBRARIES)
    lines = ["# Post-hoc calibrators: timm_csm beside netcal, torch-uncertainty, scikit-learn and probmetrics, "
             "and against one pass over the logits", "", *commands_block(rows, command),
             f"Machine: {platform.machine()}, 2 CPU cores shared with other benchmark jobs (a loaded machine: "
             "absolute times are inflated, the ratios and pass multiples taken in one process hold), one thread "
             f"per library, torch {torch.__version__}, Python {platform.python_version()}; {libs}. Times are "
             f"process CPU seconds, best of {repeats} (one run where N x C > 1e6); in the rows a later command "
             "re-measured, a row's applies run in interleaved rounds, one apply of each library per round (best of "
             "3 where N x C > 1e6), their median kept for the spread. Data, what each library is "
             "given and how the objective is computed: the script's docstring.", "",
             "One pass: ``torch.logsumexp`` over the fit logits, timed in the same run; `passes` columns are "
             "time / pass. Iterations: timm_csm's L-BFGS iterations (objective evaluations) plus the Newton "
             "iterations of its temperature-scaling warm start; temperature scaling's Newton iterations (one "
             "fused pass each); scikit-learn's `n_iter_`. Fit objective: mean NLL on the fit rows (+ the ODIR "
             "penalty for Dirichlet), float64. Speed-up columns: the peer's time over timm_csm's (> 1: timm_csm "
             "faster).", "",
             "| method | N x C | pass ms | library | fit s | fit passes | apply s | apply passes | iterations | "
             "fit objective | held-out ECE % | held-out NLL | fit: peer / ours | apply: peer / ours |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        for lib in LIBRARIES:
            ratios = "| |" if lib == "timm_csm" else (f"| {_ratio(row['timm_csm'], row[lib], 'fit_s')} | "
                                                      f"{_ratio(row['timm_csm'], row[lib], 'apply_s')} |")
            head = f"{1e3 * row['pass_s']:.3g}" if lib == "timm_csm" else ""
            lines.append(f"| {row['method']} | {row['size']} | {head} | {lib} | {_cells(row[lib], row['pass_s'])} "
                         + ratios)
    lines += ["", "Uncalibrated held-out ECE % / NLL: " + "; ".join(
        f"{r['size']} {100 * r['uncalibrated']['ece']:.2f} / {r['uncalibrated']['nll']:.4f}"
        for r in rows if r["method"] in ("temperature_scaling_nll", "platt")), ""]
    return "\n".join(lines + findings(rows) + ["", NOTES]) + "\n"


# ---------------------------------------------------------------------------------------------------------------
# the cost of a timm-csm-calibrate run
# ---------------------------------------------------------------------------------------------------------------

RUN_BEGIN, RUN_END = "<!-- calibrate-run -->", "<!-- /calibrate-run -->"
RUN_CALIBRATORS = ("temperature_scaling", "vector_scaling", "dirichlet", "isotonic")
# the phases of calibrate(): (label, ((file suffix, function names), ...)), cumulative profiler times; a suffix
# ending in "/" names a package (the calibrators' "fit", less conformal.py's own)
PHASES = [
    ("reading the data", (("timm_csm/evaluation/calibrate.py", ("_open",)),
                          ("timm_csm/evaluation/checks.py", ("check_splits",)))),
    ("prediction (image transforms and forward passes)", (("timm_csm/evaluation/predict.py", ("predict_split",)),)),
    ("(of which the model's forward passes)", (("torch/nn/modules/module.py", ("_wrapped_call_impl",)),)),
    ("fitting the calibrators", (("timm_csm/calibration/", ("fit",)),)),
    ("conformal prediction sets (fit and evaluate)", (("timm_csm/calibration/conformal.py", ("fit", "evaluate")),)),
    ("metrics, reliability tables, risk-coverage curves",
     (("timm_csm/evaluation/shift.py", ("prediction_scores", "prediction_intervals")),
      ("timm_csm/evaluation/report.py", ("prediction_curves",)))),
    ("plots", (("timm_csm/evaluation/report.py", ("write_plots",)),))]


def _phase_seconds(stats, places) -> float:
    total = 0.0
    for (path, _, function), (_, _, _, cumulative, _) in stats.items():
        path = path.replace("\\", "/")
        for suffix, names in places:
            in_file = path.endswith(suffix) if suffix.endswith(".py") else suffix in path
            if in_file and function in names and not (suffix.endswith("/") and path.endswith("conformal.py")):
                total += cumulative
    return total


def _warm_up(model: torch.nn.Module, steps: int = 200, batch: int = 64) -> None:
    """A few SGD steps on Fashion-MNIST's training images, normalised as calibrate will guess for this model (it
    carries no data config)."""
    from timm_csm.data.embedded import load_fashion_mnist
    from timm_csm.evaluation.classifier import resolve_preprocessing

    pre = resolve_preprocessing({"in_chans": 1, "img_size": 28}, getattr(model, "pretrained_cfg", None),
                                cfg_is_the_weights=False, native_size=28)
    train = load_fashion_mnist("train")
    images = torch.from_numpy(train.images[:steps * batch]).float().div(255)
    images = (images - pre.mean[0]) / pre.std[0]
    labels = torch.from_numpy(train.labels[:steps * batch])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model.train()
    for i in range(steps):
        loss = F.cross_entropy(model(images[i * batch:(i + 1) * batch]), labels[i * batch:(i + 1) * batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()


def calibrate_run(calibrators=RUN_CALIBRATORS) -> str:
    """Profile ``timm-csm-calibrate`` on Fashion-MNIST's 10 000 test images (half held out for fitting) with the
    reference CNN after 200 SGD steps on the training split (the cost does not depend on the weights, but calibrate
    refuses a model at chance); the markdown section of the page."""
    import cProfile
    import pstats
    import tempfile
    from pathlib import Path

    import timm
    from safetensors.torch import save_file

    import timm_csm  # noqa: F401  (registers reference_cnn)
    from timm_csm.evaluation import calibrate

    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        model = timm.create_model("reference_cnn", num_classes=10, in_chans=1)
        _warm_up(model)
        weights = Path(tmp) / "reference_cnn.safetensors"
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(weights))
        profiler = cProfile.Profile()
        wall = time.perf_counter()
        profiler.enable()
        calibrate("reference_cnn", "fashion_mnist", checkpoint=weights, num_classes=10, in_chans=1, img_size=28,
                  calibration_fraction=0.5, test_split="test", output=Path(tmp) / "out",
                  calibrators=list(calibrators), log=lambda m: None)
        profiler.disable()
        wall = time.perf_counter() - wall
    stats = pstats.Stats(profiler).stats
    total = _phase_seconds(stats, (("timm_csm/evaluation/calibrate.py", ("calibrate",)),))
    parameters = sum(p.numel() for p in model.parameters())
    lines = [RUN_BEGIN, "## The cost of a calibrate run", "",
             "    OMP_NUM_THREADS=1 python benchmarks/calibrators_bench.py --calibrate-run", "",
             f"`calibrate()` (what `timm-csm-calibrate` runs) on Fashion-MNIST's 10 000 test images, half held out "
             f"for fitting (`calibration_fraction=0.5`), the reference CNN ({parameters} parameters, 200 SGD "
             f"steps on the training images) on the CPU, one thread, calibrators {', '.join(calibrators)}, the three "
             f"conformal methods on the raw and on every calibrated logits; under cProfile: {wall:.1f} s wall on the "
             "loaded machine. The shares are cumulative profiler times of the functions named in the "
             "script's `PHASES` (a library's import on first use counts in the phase that first needs it, e.g. "
             "matplotlib in the plots), over the whole run:", "", "| phase | seconds | share of the run |", "|---|---|---|"]
    named = 0.0
    for label, places in PHASES:
        seconds = _phase_seconds(stats, places)
        named += 0.0 if label.startswith("(") else seconds
        lines.append(f"| {label} | {seconds:.2f} | {100 * seconds / total:.1f} % |")
    lines += [f"| the rest (writing the outputs, checks) | {total - named:.2f} | "
              f"{100 * (total - named) / total:.1f} % |", f"| the run | {total:.2f} | 100 % |", "", RUN_END]
    return "\n".join(lines)


def replace_section(page: str, section: str) -> str:
    """``page`` with its calibrate-run section replaced by ``section`` (appended when it has none)."""
    if RUN_BEGIN in page and RUN_END in page:
        head, rest = page.split(RUN_BEGIN, 1)
        return head + section + rest.split(RUN_END, 1)[1]
    return page.rstrip("\n") + "\n\n" + section + "\n"


def merge_rows(old: dict, new: dict) -> dict:
    """``old``'s record with ``new``'s rows in place of its rows of the same method and size (new ones appended);
    every row names the command that measured it."""
    for record in (old, new):
        for row in record["rows"]:
            row.setdefault("command", record["command"])
    fresh = {(r["method"], r["size"]): r for r in new["rows"]}
    rows = [fresh.pop((r["method"], r["size"]), r) for r in old["rows"]] + list(fresh.values())
    return {**new, "command": old["command"], "rows": rows}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", nargs="+", default=["1e4x10", "1e4x100", "5e4x1000"],
                   help="N x C of the multiclass runs; the two-class calibrators run at N x 2 for each N")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--budget", type=float, default=1800.0, help="wall seconds a library's fit may take")
    p.add_argument("--methods", nargs="+", choices=list(METHODS), default=None, help="only these methods' rows")
    p.add_argument("--merge", action="store_true", help="replace the rows of the same method and size in the "
                   ".json beside --output and keep its other rows (the page shows every command)")
    p.add_argument("--calibrate-run", action="store_true", help="profile a timm-csm-calibrate run instead")
    p.add_argument("--output", default=None, help="write the markdown page here (else print it), the table's rows "
                   "beside it as .json; the other mode's section of an existing page is kept")
    p.add_argument("--render", action="store_true", help="re-render the page from the .json beside --output")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    from threadpoolctl import threadpool_limits

    page = open(args.output).read() if args.output and os.path.exists(args.output) else ""
    rows_path = os.path.splitext(args.output)[0] + ".json" if args.output else None
    with threadpool_limits(1):
        if args.calibrate_run:
            page = replace_section(page, calibrate_run())
        else:
            if args.render:
                with open(rows_path) as f:
                    record = json.load(f)
            else:
                command = "OMP_NUM_THREADS=1 python benchmarks/calibrators_bench.py " + " ".join(
                    shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
                versions = installed()
                rows = bench(args.sizes, args.repeats, args.seed, args.budget, versions, args.methods)
                record = {"command": command.strip(), "repeats": args.repeats, "versions": versions, "rows": rows}
                if args.merge and rows_path and os.path.exists(rows_path):
                    with open(rows_path) as f:
                        record = merge_rows(json.load(f), record)
                if rows_path:
                    with open(rows_path, "w") as f:
                        json.dump(record, f, indent=1)
            section = RUN_BEGIN + page.split(RUN_BEGIN, 1)[1].split(RUN_END, 1)[0] + RUN_END \
                if RUN_BEGIN in page else None
            page = markdown(record["rows"], record["command"], record["repeats"], record["versions"])
            if section:
                page = replace_section(page, section)
    if args.output:
        with open(args.output, "w") as f:
            f.write(page)
    print(page)


if __name__ == "__main__":
    main()
