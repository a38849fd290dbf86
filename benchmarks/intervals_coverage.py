"""Coverage study of the bootstrap intervals: how often each interval method's 95% interval covers the true value.

Synthetic classifiers whose population values are known: logits ``z = s g`` with ``g ~ N(0, I_C)`` (``s`` = 3 for
10 classes, 4 for 100), the model's probabilities ``p = softmax(z)``, labels drawn from ``q = softmax(z / T)``:
``T = 1`` calibrated, ``T = 1.5`` over-confident (the model's probabilities are sharper than the truth), ``T = 0.75``
under-confident. Each draw is a fresh sample of ``n`` logits and labels; its intervals (every method of
:mod:`timm_csm.metrics.interval_methods`, from ``--resamples`` resamples of :func:`bootstrap_with_estimates`) are
compared with the population value. OOD metrics: the binormal model, in-distribution scores ``N(mu, 1)`` against
out-of-distribution ``N(0, 1)``, ``n / 2`` of each, ``mu`` giving AUROC 0.9.

Population values (computed once per model, :func:`population`): the expectations over ``x`` are a Monte-Carlo
mean over ``--truth-samples`` logits, with the label's distribution ``q`` used exactly (no labels drawn), so a bin's
accuracy is the mean of ``q`` on its predicted class. A binned metric's truth is its population value at the
estimator's own bins (15 equal-width bins; AECE: the population's equal-mass edges), the quantity the estimator
converges to; the page also shows the unbinned l1 calibration error (``E|E[q_top | p_top] - p_top|``, read off
10,000 equal-mass bins of the Monte-Carlo sample) for comparison. The OOD truths are closed forms (AUROC
``Phi(mu / sqrt 2)``, FPR at 95% TPR) and a numerical integral (the average precisions). In this family the
gap ``q_top - p_top`` has one sign at every confidence (a temperature moves the top probability one way), so every
binning of the top label gives the same l1 truth, the unbinned one; the l2 (``debiased_ce``) and maximum (MCE)
truths, and the classwise ones, still depend on the bins.

    OMP_NUM_THREADS=1 python benchmarks/intervals_coverage.py            # every cell, resumable (appends cells)
    python benchmarks/intervals_coverage.py --report                     # the page from the cells

Cells are appended to ``--cells`` (one JSON record a line) as they finish and skipped on a restart.
"""
from __future__ import annotations

import argparse
import json
import math
import time
import zlib
from pathlib import Path
from typing import Dict, List, Tuple

import torch

from timm_csm.metrics.binning import bin_edges, bin_index, equal_mass_edges
from timm_csm.metrics.table import METRIC_KEYS
from timm_csm.metrics.interval_methods import ONE_SIDED, DEFAULT_INTERVALS, interval_of, list_interval_methods
from timm_csm.metrics.intervals import bootstrap_with_estimates
from timm_csm.metrics.ood import bootstrap_ood_distribution, ood_metrics
from timm_csm.trainer import progress_bar

HERE = Path(__file__).parent
CELLS, PAGE = HERE / "intervals_coverage.jsonl", HERE / "intervals_coverage.md"
MODELS = {"calibrated": 1.0, "over-confident": 1.5, "under-confident": 0.75}
SCALE = {10: 3.0, 100: 4.0}
#: the one pass's metrics (the metric table's "calibration" family)
METRICS = METRIC_KEYS
OOD = ("auroc", "aupr_in", "aupr_out", "fpr95")
OOD_MU = 2.0 ** 0.5 * 1.2815515655446004  # Phi^-1(0.9) sqrt 2: AUROC 0.9
N_BINS, LEVEL = 15, 0.95
_F64 = torch.float64


def grid(draws: int) -> List[Dict]:
    """The cells in running order, so that a stopped run leaves the costliest pending: n = 1,000; the B sub-grid's
    B = 100 (n = 1,000, 10 classes); n = 10,000 with 10 classes and the OOD model; the sub-grid's B = 1,000; n =
    10,000 with 100 classes; n = 50,000 (100 classes last)."""
    def cls(n, c, model, b):
        return {"kind": "classifier", "model": model, "classes": c, "n": n, "resamples": b, "draws": draws}

    def ood(n, b):
        return {"kind": "ood", "model": "binormal", "classes": 0, "n": n, "resamples": b, "draws": draws}

    cells = [cls(1000, c, m, 200) for c in (10, 100) for m in MODELS] + [ood(1000, 200)]
    cells += [cls(1000, 10, m, 100) for m in MODELS]
    cells += [cls(10000, 10, m, 200) for m in MODELS] + [ood(10000, 200)]
    cells += [cls(1000, 10, m, 1000) for m in MODELS]
    cells += [cls(10000, 100, m, 200) for m in MODELS]
    cells += [cls(50000, 10, m, 100) for m in MODELS] + [ood(50000, 100)]
    cells += [cls(50000, 100, m, 100) for m in MODELS]
    return cells


def cell_key(cell: Dict) -> str:
    return f"{cell['kind']}-{cell['model']}-c{cell['classes']}-n{cell['n']}-b{cell['resamples']}-d{cell['draws']}"


def logits_and_labels(n: int, classes: int, temperature: float, generator: torch.Generator
                      ) -> Tuple[torch.Tensor, torch.Tensor]:
    z = torch.randn(n, classes, dtype=_F64, generator=generator) * SCALE[classes]
    labels = torch.multinomial(torch.softmax(z / temperature, 1), 1, generator=generator).view(-1)
    return z, labels


def population(classes: int, temperature: float, samples: int, seed: int = 12345) -> Dict[str, float]:
    """Every metric's population value for the model (see the module docstring), over ``samples`` logits."""
    g = torch.Generator().manual_seed(seed)
    edges = bin_edges(N_BINS)
    sums = torch.zeros(3, N_BINS, dtype=_F64)  # count, sum p_top, sum q_top
    classwise = torch.zeros(classes * N_BINS, dtype=_F64)  # sum (q_k - p_k) per (class, bin)
    top_p, top_q = [], []
    means = torch.zeros(4, dtype=_F64)  # accuracy, confidence, nll, brier
    for start in range(0, samples, 100_000):
        m = min(100_000, samples - start)
        z = torch.randn(m, classes, dtype=_F64, generator=g) * SCALE[classes]
        p, q = torch.softmax(z, 1), torch.softmax(z / temperature, 1)
        conf, top = p.max(1)
        acc = q.gather(1, top[:, None]).view(-1)
        b = bin_index(conf, edges)
        for row, v in enumerate((torch.ones_like(conf), conf, acc)):
            sums[row].index_add_(0, b, v)
        bins = bin_index(p.reshape(-1), edges).view(m, classes) + torch.arange(classes) * N_BINS
        classwise.index_add_(0, bins.view(-1), (q - p).reshape(-1))
        means += torch.stack([acc.sum(), conf.sum(), -(q * torch.log_softmax(z, 1)).sum(),
                              ((p * p).sum(1) - 2 * (q * p).sum(1) + 1).sum()])
        top_p.append(conf)
        top_q.append(acc)
    count, c_sum, a_sum = sums
    w, nonempty = count / samples, count > 0
    c, a = c_sum / count.clamp(min=1), a_sum / count.clamp(min=1)
    gap = (a - c).abs()
    conf, acc = torch.cat(top_p), torch.cat(top_q)
    order = conf.argsort()
    conf, acc = conf[order], acc[order]
    mass_bins = bin_index(conf, equal_mass_edges(conf, N_BINS), equal_width=False)
    adaptive = torch.zeros(N_BINS, dtype=_F64).index_add_(0, mass_bins, acc - conf).abs().sum() / samples
    fine = (acc - conf).view(10_000, -1) if samples % 10_000 == 0 else None  # equal-mass bins of the sorted sample
    unbinned = float(fine.mean(1).abs().mean()) if fine is not None else float("nan")
    return {"accuracy": float(means[0]) / samples, "confidence": float(means[1]) / samples,
            "ece": float((w * gap).sum()), "aece": float(adaptive), "cece": float(classwise.abs().sum() / samples / classes),
            "mce": float(gap[nonempty].max()), "oe": float((w * c * (c - a).clamp(min=0)).sum()),
            "ue": float((w * c * (a - c).clamp(min=0)).sum()), "debiased_ce": float((w * gap * gap).sum().sqrt()),
            "nll": float(means[2]) / samples, "brier": float(means[3]) / samples, "unbinned_ce": unbinned}


def ood_population(mu: float = OOD_MU) -> Dict[str, float]:
    """The binormal model's AUROC, AUPRs (in- and out-of-distribution positives, equal shares) and FPR at 95%
    TPR; the average precisions integrate precision over recall on a fine grid (midpoint rule)."""
    normal = torch.distributions.Normal(torch.tensor(0.0, dtype=_F64), torch.tensor(1.0, dtype=_F64))
    r = (torch.arange(1_000_000, dtype=_F64) + 0.5) / 1_000_000
    t = mu + normal.icdf(1 - r)  # the threshold accepting a share r of the in-distribution scores
    fpr = 1 - normal.cdf(t)
    return {"auroc": float(normal.cdf(torch.tensor(mu / math.sqrt(2.0), dtype=_F64))),
            "aupr_in": float((r / (r + fpr)).mean()), "aupr_out": float((r / (r + fpr)).mean()),  # symmetric model
            "fpr95": float(1 - normal.cdf(torch.tensor(mu + float(normal.icdf(torch.tensor(0.05, dtype=_F64))))))}


def run_cell(cell: Dict, truth: Dict[str, float]) -> Dict:
    """Coverage, mean length and the share of intervals holding their own estimate, per metric and method."""
    metrics = OOD if cell["kind"] == "ood" else METRICS
    methods = list_interval_methods()
    # covered and total length (widened to the estimate, as reported); the method's own interval: holds the
    # estimate, covered
    hits = {k: {m: [0, 0.0, 0, 0] for m in methods} for k in metrics}
    estimate_sum = dict.fromkeys(metrics, 0.0)
    start = time.process_time()
    g = torch.Generator().manual_seed(zlib.crc32(cell_key(cell).encode()))
    for d in progress_bar(cell_key(cell), iterable=range(cell["draws"]), unit="draw", leave=False):
        if cell["kind"] == "ood":
            half = cell["n"] // 2
            s_in = torch.randn(half, dtype=_F64, generator=g) + OOD_MU
            s_out = torch.randn(half, dtype=_F64, generator=g)
            dist = bootstrap_ood_distribution(s_in, s_out, resamples=cell["resamples"], seed=d)
            est = ood_metrics(s_in, s_out)
        else:
            z, y = logits_and_labels(cell["n"], cell["classes"], MODELS[cell["model"]], g)
            dist, est = bootstrap_with_estimates(z, y, N_BINS, resamples=cell["resamples"], seed=d)
        for k in metrics:
            estimate_sum[k] += est[k]
            for m in methods:
                raw = interval_of(k, dist[k], est[k], LEVEL, m, hold_estimate=False)
                held = interval_of(k, dist[k], est[k], LEVEL, m)
                h = hits[k][m]
                h[0] += held["low"] <= truth[k] <= held["high"]
                h[1] += held["high"] - held["low"]
                h[2] += raw["low"] <= est[k] <= raw["high"]
                h[3] += raw["low"] <= truth[k] <= raw["high"]
    n = cell["draws"]
    return {**cell, "key": cell_key(cell), "truth": truth, "cpu_s": round(time.process_time() - start, 1),
            "mean_estimate": {k: v / n for k, v in estimate_sum.items()},
            "coverage": {k: {m: h[0] / n for m, h in by.items()} for k, by in hits.items()},
            "length": {k: {m: h[1] / n for m, h in by.items()} for k, by in hits.items()},
            "holds_estimate": {k: {m: h[2] / n for m, h in by.items()} for k, by in hits.items()},
            "coverage_unwidened": {k: {m: h[3] / n for m, h in by.items()} for k, by in hits.items()}}


def read_cells(path: Path) -> Dict[str, Dict]:
    if not path.exists():
        return {}
    return {r["key"]: r for r in map(json.loads, path.read_text().splitlines()) if r}


def _tolerance(draws: int) -> float:
    """One Monte-Carlo standard error of a coverage of 93% over ``draws`` draws."""
    return math.sqrt(0.93 * 0.07 / draws)


def choose(rows: List[Dict], metric: str) -> Tuple[Dict[str, float], str]:
    """``({method: lowest coverage over the rows}, chosen)``: among the methods whose coverage lies in no row more
    than one Monte-Carlo standard error below 93%, the two-sided one nearest 95% on average, else a one-sided one
    (an upper bound); ``"none"`` if no method."""
    methods = list_interval_methods()
    lowest = {m: min(r["coverage"][metric][m] for r in rows) for m in methods}
    ok = [m for m in methods if all(r["coverage"][metric][m] >= 0.93 - _tolerance(r["draws"]) for r in rows)]
    ok = [m for m in ok if m not in ONE_SIDED] or ok
    if not ok:
        return lowest, "none"
    return lowest, min(ok, key=lambda m: sum(abs(r["coverage"][metric][m] - LEVEL) for r in rows))


def main_rows(rows: List[Dict]) -> List[Dict]:
    """The rows the defaults are chosen on: all but the B sub-grid (n = 1,000 at B = 100 and 1,000)."""
    return [r for r in rows if not (r["n"] == 1000 and r["resamples"] in (100, 1000))]


def chosen_defaults(rows: List[Dict]) -> Dict[str, str]:
    """``{metric: the method the rule picks}`` on :func:`main_rows` of ``rows`` (``"none"``: no method served)."""
    main = main_rows(rows)
    return {k: choose(mine, k)[1] for k in METRICS + OOD if (mine := [r for r in main if k in r["coverage"]])}


def _row_name(r: Dict) -> str:
    return (f"binormal | - | {r['n']:,}" if r["kind"] == "ood" else f"{r['model']} | {r['classes']} | {r['n']:,}")


def _prose(text: str) -> str:
    """A docstring paragraph as the page's markdown (code in single backquotes, roles dropped)."""
    for role in (":func:", ":mod:"):
        text = text.replace(role, "")
    return " ".join(text.split()).replace("``", "`")


def _b_check(rows: List[Dict], methods: List[str]) -> List[str]:
    """Coverage at n = 1,000 and 10 classes for each B: does it move with the number of resamples?"""
    sub = [r for r in rows if r["kind"] == "classifier" and r["n"] == 1000 and r["classes"] == 10]
    by_b = sorted({r["resamples"] for r in sub})
    if len(by_b) < 2:
        return []
    lines = ["## Coverage against the number of resamples", "",
             f"n = 1,000, 10 classes; each cell: the coverage (%) at B = {' / '.join(map(str, by_b))} resamples.", "",
             "| metric | model | " + " | ".join(methods) + " |", "|---|---|" + "---|" * len(methods)]
    spread, spread_default = [], []
    for k in METRICS:
        for model in MODELS:
            cells = {r["resamples"]: r for r in sub if r["model"] == model}
            if len(cells) < len(by_b):
                continue
            vals = {m: [100 * cells[b]["coverage"][k][m] for b in by_b] for m in methods}
            spread += [max(v) - min(v) for v in vals.values()]
            if DEFAULT_INTERVALS.get(k):
                spread_default.append(max(vals[DEFAULT_INTERVALS[k]]) - min(vals[DEFAULT_INTERVALS[k]]))
            lines.append(f"| {k} | {model} | " + " | ".join(" / ".join(f"{x:.1f}" for x in vals[m]) for m in methods)
                         + " |")
    if spread:
        lines += ["", f"Largest difference across B in a row: {max(spread):.1f} points (median "
                      f"{sorted(spread)[len(spread) // 2]:.1f}); for each metric's default method: largest "
                      f"{max(spread_default):.1f}, median {sorted(spread_default)[len(spread_default) // 2]:.1f} (the "
                      "Monte-Carlo standard error of one coverage: about 1 point, of a difference about 1.4). Far tails "
                      "of a skewed distribution move with B (MCE's bias-corrected quantiles); the defaults' coverage "
                      "does not move beyond the Monte-Carlo error.", ""]
    return lines


def write_page(cells: Dict[str, Dict], planned: List[Dict], page: Path, draws: int, truth_samples: int) -> None:
    rows = [cells[cell_key(c)] for c in planned if cell_key(c) in cells]
    pending = [cell_key(c) for c in planned if cell_key(c) not in cells]
    methods = list_interval_methods()
    paragraphs = __doc__.split("\n\n")
    lines = ["# Coverage of the bootstrap intervals", "",
             "How often each interval method's 95% interval covers the true value of each metric, on synthetic "
             "classifiers whose true values are known; the study chose each metric's default interval "
             "(`timm_csm.metrics.interval_methods.DEFAULT_INTERVALS`, the one table the reports read). Command "
             "(one thread, resumable; `--report` writes this page from the cells, `intervals_coverage.jsonl`):", "",
             "    OMP_NUM_THREADS=1 python benchmarks/intervals_coverage.py", "",
             _prose(paragraphs[1]), "", _prose(paragraphs[2].replace("``--truth-samples``", f"{truth_samples:,}")), "",
             f"{draws} draws a cell: a coverage's Monte-Carlo standard error is about "
             f"{100 * math.sqrt(LEVEL * (1 - LEVEL) / draws):.1f} points at 95%. Resamples a draw, B: 200 at n = "
             "1,000 and 10,000, 100 at n = 50,000 (the study's compute: one thread of a shared machine), 1,000 in the "
             "reports; the sub-grid at the end (n = 1,000, 10 classes, B = 100, 200 and 1,000) shows how far the "
             "coverage moves with B. Methods (`timm_csm/metrics/interval_methods.py`): percentile; basic (reflected "
             "about the estimate); bc (bias-corrected percentile); symmetric (the estimate -+ the larger distance "
             "to the two percentile quantiles: the hull of the percentile and the basic interval); upper (one-sided: "
             "from 0 to the 95% quantile, an upper bound, taken only where no two-sided method serves). The basic and "
             "symmetric ones are cut at 0 (every metric here is non-negative), and every interval is widened to "
             "hold its estimate, as the reports print it (`cover` below: the widened interval; `unwidened`: the "
             "method's own; `holds estimate`: how often the default's own interval held the estimate). BCa needs "
             "a jackknife of every metric (n recomputations a draw) and is left out.", "",
             "Published set-ups: Kumar, Liang and Ma (2019)'s debiased estimator is the `debiased_ce` row (its "
             "bootstrap intervals are the ones measured here). Roelofs et al. (2022) found the binned ECE most "
             "biased for a perfectly calibrated model: the calibrated rows, whose true ECE is 0, show it (no "
             "interval reaching below the estimate's noise floor covers 0). Sun, Chaudhari, Barnett and Dobriban "
             "(2024) give asymptotically valid intervals for the debiased l2 error with separate rates for "
             "calibrated and miscalibrated models; their variance formulas were not at hand, so their interval is "
             "not among the methods yet, and the debiased row below is the bar it has to beat.", ""]
    if pending:
        lines += [f"**Pending** ({len(pending)} cells; the same command completes them, skipping the finished "
                  "ones; the defaults below were chosen on the finished rows): " + ", ".join(f"`{k}`" for k in pending) + ".", ""]
    main = main_rows(rows)
    tol = 100 * _tolerance(draws)
    lines += ["## Defaults chosen", "",
              f"Per metric: the lowest coverage (%) of each method over its rows (all but the B sub-grid), the "
              f"method the rule picks (nearest 95% on average among those never more than one Monte-Carlo standard "
              f"error, {tol:.1f} points, below 93%; none: no interval, and the reports say why) and the package's "
              "default.", "",
              "| metric | rows | " + " | ".join(f"lowest {m}" for m in methods) + " | chosen | default |",
              "|---|---|" + "---|" * (len(methods) + 2)]
    for k in METRICS + OOD:
        mine = [r for r in main if k in r["coverage"]]
        if not mine:
            continue
        lowest, chosen = choose(mine, k)
        lines.append(f"| {k} | {len(mine)} | " + " | ".join(f"{100 * lowest[m]:.1f}" for m in methods)
                     + f" | {chosen} | {DEFAULT_INTERVALS.get(k) or 'none'} |")
    lines += ["", "## Coverage by metric", "",
              "Coverage (%) of each method's interval (widened to hold the estimate; in brackets the method's own "
              "where it differs), its mean length (the metric's units), and how often the default method's own "
              "interval held the estimate (%).", ""]
    for k in METRICS + OOD:
        mine = [r for r in rows if k in r["coverage"]]
        if not mine:
            continue
        default = DEFAULT_INTERVALS.get(k)
        lines += [f"### {k} (default: {default or 'none'})", "", "| model | classes | n | B | truth | mean estimate | "
                  + " | ".join(f"cover {m}" for m in methods) + " | " + " | ".join(f"length {m}" for m in methods)
                  + " | holds estimate |", "|---|---|---|---|---|---|" + "---|" * (2 * len(methods) + 1)]
        for r in mine:
            holds = f"{100 * r['holds_estimate'][k][default]:.1f}" if default else "-"

            def cover(m):
                c, u = 100 * r["coverage"][k][m], 100 * r["coverage_unwidened"][k][m]
                return f"{c:.1f}" + (f" ({u:.1f})" if abs(c - u) > 1e-9 else "")
            lines.append(f"| {_row_name(r)} | {r['resamples']} | {r['truth'][k]:.5f} | {r['mean_estimate'][k]:.5f} | "
                         + " | ".join(cover(m) for m in methods) + " | "
                         + " | ".join(f"{r['length'][k][m]:.5f}" for m in methods) + f" | {holds} |")
        lines.append("")
    lines += _b_check(rows, methods)
    lines += ["## Population values", "",
              "Each model's truths (the binned metrics at their own bins) and its unbinned l1 calibration error.", "",
              "| model | classes | " + " | ".join(METRICS) + " | unbinned CE |", "|---|---|" + "---|" * (len(METRICS) + 1)]
    seen = set()
    for r in rows:
        if r["kind"] == "ood" or (r["model"], r["classes"]) in seen:
            continue
        seen.add((r["model"], r["classes"]))
        lines.append(f"| {r['model']} | {r['classes']} | " + " | ".join(f"{r['truth'][k]:.5f}" for k in METRICS)
                     + f" | {r['truth']['unbinned_ce']:.5f} |")
    ood = next((r for r in rows if r["kind"] == "ood"), None)
    if ood:
        lines += ["", "Binormal OOD model: " + ", ".join(f"{k} {ood['truth'][k]:.5f}" for k in OOD) + "."]
    total = sum(r["cpu_s"] for r in rows)
    lines += ["", f"CPU time of the {len(rows)} finished cells: {total / 60:.0f} minutes on one thread.", ""]
    page.write_text("\n".join(lines))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--draws", type=int, default=500, help="draws (samples) per cell")
    ap.add_argument("--truth-samples", type=int, default=4_000_000, help="Monte-Carlo logits of each population")
    ap.add_argument("--cells", type=Path, default=CELLS, help="the cells, one JSON record a line (appended)")
    ap.add_argument("--page", type=Path, default=PAGE, help="the page --report writes")
    ap.add_argument("--report", action="store_true", help="only write the page from the cells")
    args = ap.parse_args(argv)
    if args.draws < 1 or args.truth_samples < 10_000:
        raise SystemExit("--draws must be >= 1 and --truth-samples >= 10000")
    if not args.report:
        done, truths = read_cells(args.cells), {}
        todo = [c for c in grid(args.draws) if cell_key(c) not in done]
        print(f"{len(done)} cells done, {len(todo)} to run; appending to {args.cells}", flush=True)
        for cell in progress_bar("cells", iterable=todo, unit="cell"):
            pop = (cell["kind"], cell["classes"], cell["model"])
            if pop not in truths:
                truths[pop] = ood_population() if cell["kind"] == "ood" else population(
                    cell["classes"], MODELS[cell["model"]], args.truth_samples)
            record = run_cell(cell, truths[pop])
            with args.cells.open("a") as f:
                f.write(json.dumps(record) + "\n")
    write_page(read_cells(args.cells), grid(args.draws), args.page, args.draws, args.truth_samples)
    print(f"page: {args.page}")


if __name__ == "__main__":
    main()
