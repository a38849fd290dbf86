"""The calibrators benchmark's page: the table of fit and apply times, pass multiples, objectives and held-out
calibration; the findings read off it; the notes; the commands that measured its rows (``merge_rows``)."""
from __future__ import annotations

import platform
from typing import Dict, List, Optional

import torch

from calibrators_libraries import LIBRARIES
from calibrators_timing import apply_tie

OBJECTIVE_RTOL = 1e-6  # an objective "at least as good": ours <= peer + 1e-6 |peer|


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


def merge_rows(old: dict, new: dict) -> dict:
    """``old``'s record with ``new``'s rows in place of its rows of the same method and size (new ones appended);
    every row names the command that measured it."""
    for record in (old, new):
        for row in record["rows"]:
            row.setdefault("command", record["command"])
    fresh = {(r["method"], r["size"]): r for r in new["rows"]}
    rows = [fresh.pop((r["method"], r["size"]), r) for r in old["rows"]] + list(fresh.values())
    return {**new, "command": old["command"], "rows": rows}
