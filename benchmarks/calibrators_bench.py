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

Beside this script: the library adapters (``calibrators_libraries.py``), the timing harness
(``calibrators_timing.py``) and the page (``calibrators_page.py``).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F

from calibrators_libraries import BINARY, LIBRARIES, METHODS, RUNNERS, installed
from calibrators_page import markdown, merge_rows
from calibrators_timing import OverBudget, apply_repeats, budget, interleaved_times, one_pass


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


def scores(logits: torch.Tensor, labels: torch.Tensor) -> Dict[str, float]:
    from timm_csm.metrics import calibration_metrics

    m = calibration_metrics(logits.double(), labels, n_bins=15)
    return {"ece": float(m["ece"]), "nll": float(m["nll"])}


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
