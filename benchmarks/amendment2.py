"""Amendment 2 of ``benchmarks/PROTOCOL.md``: its validation choices, its decisions and its page.

The cells run through ``calibration_bench.py --amendment 2`` (from a worktree of one recorded commit); this script
reads the finished ones (``benchmarks/cells_a2/``, then the cell cache ``runs/protocol_a2``) and

* makes stage 1's choices on validation only: each baseline's grid point, CSM's coordinate-wise steps, the best
  other method before and after TS (:func:`stage1_choices`);
* names the cells that can run next, so that each stage starts once the choices it needs are made (``--next``);
* writes ``benchmarks/calibration_a2.md``: the grids and choices, stage 2's paired intervals and Holm-corrected
  decisions, and the cells' records (commit, threads) (``--report``).

    python benchmarks/amendment2.py --report
    python benchmarks/amendment2.py --next matched      # "<method> <seed>" lines of the runnable cells
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import calibration_bench as bench
from timm_csm.io import write_text_atomic

__all__ = ["a2_cells", "stage1_choices", "next_cells", "primary_decisions", "write_page", "main"]

PAGE = Path("benchmarks/calibration_a2.md")
#: means of validation ECE (in points) closer than this are a tie, broken by validation NLL (PROTOCOL.md)
TIE = 0.01
BASELINES = ("ce", "brier", "ls", "mbls", "mixup", "regmixup")
#: the settings of stage 2's decision, and its family of primary comparisons (Holm over all of them)
DECISION_SETTINGS = ("matched", "annotated")
FAMILY_ALPHA = 0.05


def a2_cells(setting: str, output: Path = Path(bench.A2_OUTPUT), committed: Path = bench.COMMITTED_A2
             ) -> Dict[str, Dict[int, Dict[str, Any]]]:
    """``{method: {seed: {"results", "seconds", "dir", "record"}}}`` of the finished amendment-2 cells of
    ``setting``: those shared by every setting and the setting's own; committed ones first."""
    found: Dict[str, Dict[int, Dict[str, Any]]] = {}
    for root in [r for r in (committed, Path(output) / "cells") if Path(r).is_dir()]:
        for d in sorted(Path(root).iterdir()):
            if not ((d / bench.CELL_META).exists() and (d / bench.RESULTS).exists()):
                continue
            meta = bench._read_json(d / bench.CELL_META)
            if meta.get("record", {}).get("amendment") != 2 or meta.get("setting") not in (None, setting):
                continue
            found.setdefault(meta["method"], {}).setdefault(int(meta["seed"]), {
                "results": bench._read_json(d / bench.RESULTS), "seconds": meta.get("seconds"), "dir": d,
                "record": meta["record"]})
    return found


def _rows(cells) -> Dict[str, List[Dict[str, Any]]]:
    return {m: [bench.per_seed_row(s, c) for s, c in sorted(runs.items())] for m, runs in cells.items()}


def _mean(rows: List[Dict[str, Any]], key: str, seeds: Sequence[int]) -> Optional[float]:
    values = [r[key] for r in rows if r["seed"] in seeds and r.get(key) is not None]
    return sum(values) / len(values) if len(values) == len(seeds) else None


def choose(rows: Dict[str, List[Dict[str, Any]]], candidates: Sequence[str], phase: str = "pre_ts",
           seeds: Sequence[int] = bench.A2_TUNING_SEEDS) -> Optional[str]:
    """The candidate with the lowest mean validation ECE over ``seeds``; means within :data:`TIE` points are
    broken by the lower mean validation NLL. None while any candidate lacks one of the seeds."""
    ece = {m: _mean(rows.get(m, []), f"val_ece_{phase}", seeds) for m in candidates}
    if not candidates or any(v is None for v in ece.values()):
        return None
    lowest = min(ece.values())
    tied = [m for m in candidates if ece[m] - lowest < TIE]
    return min(tied, key=lambda m: (_mean(rows[m], f"val_nll_{phase}", seeds), candidates.index(m)))


def _csm_search(rows, method: str = "csm") -> Tuple[Dict[str, Any], List[Tuple[str, List[str], Optional[str]]]]:
    """CSM's coordinate-wise search: the values chosen so far and, per step, (axis, configurations, choice)."""
    chosen: Dict[str, Any] = {}
    steps = []
    for i, (axis, _) in enumerate(bench.CSM_TUNING_STEPS):
        names = bench.csm_step_methods(i, chosen, method)
        pick = choose(rows, names)
        steps.append((axis, names, pick))
        if pick is None:
            break
        chosen[axis] = axis_value(pick, axis)
    return chosen, steps


def axis_value(name: str, axis: str) -> Any:
    """The value of ``axis`` in the configuration ``name`` (the inverse of :func:`calibration_bench.tuned_name`)."""
    method = bench.get_method(name)
    kind = bench.TUNING_AXES[axis]
    if kind == "data":
        return dict(method.derive).get(axis, bench._AXIS_DEFAULTS[axis])
    options = method.options.get("loss_kwargs", {}) if kind == "loss" else method.options
    return options.get(axis, bench._AXIS_DEFAULTS.get(axis))


def stage1_choices(setting: str, rows: Dict[str, List[Dict[str, Any]]]) -> Dict[str, Any]:
    """Stage 1's choices of ``setting``, each None while pending: every baseline's configuration, CSM's steps and
    row, and the best other method before and after TS."""
    families = list(BASELINES) + (["kd"] if setting in bench.METHODS["kd"].recipes else [])
    grids = {base: bench.grid_methods(base) for base in families}
    chosen = {base: choose(rows, names) for base, names in grids.items()}
    values, steps = _csm_search(rows)
    csm_row = steps[-1][2] if len(steps) == len(bench.CSM_TUNING_STEPS) else None
    ready = [chosen[b] for b in families]
    best = {phase: (choose(rows, ready, phase) if all(ready) else None) for phase in ("pre_ts", "post_ts")}
    return {"grids": grids, "chosen": chosen, "csm_steps": steps, "csm": csm_row, "best_other": best}


def next_cells(setting: str, rows: Dict[str, List[Dict[str, Any]]]) -> List[Tuple[str, int]]:
    """The cells of ``setting`` that can run now, in the protocol's order: stage 1's grids and CSM's current step
    at seeds 0-2, then (once its choices are made) stage 2's methods at seeds 3-14."""
    done = {(m, r["seed"]) for m, rs in rows.items() for r in rs}
    choices = stage1_choices(setting, rows)
    wanted = [m for names in choices["grids"].values() for m in names] + choices["csm_steps"][-1][1]
    todo = [(m, s) for s in bench.A2_TUNING_SEEDS for m in dict.fromkeys(wanted) if (m, s) not in done]
    if todo or choices["csm"] is None or None in choices["best_other"].values():
        return todo
    stage2 = dict.fromkeys(["ce", choices["chosen"]["regmixup"], *choices["best_other"].values(), choices["csm"]])
    return [(m, s) for s in bench.A2_SEEDS for m in stage2 if (m, s) not in done]


def paired_test(a: Dict[int, float], b: Dict[int, float]) -> Optional[Dict[str, float]]:
    """Mean difference ``a - b`` over common seeds, its 95% t-interval and the two-sided paired t-test's p-value."""
    from scipy.stats import t as student_t

    interval = bench.paired_interval(a, b)
    if interval is None:
        return None
    n, mean, lo, hi = interval
    sd = (hi - mean) / float(student_t.ppf(0.975, n - 1)) * math.sqrt(n)
    p = 0.0 if sd == 0 else float(2 * student_t.sf(abs(mean) / (sd / math.sqrt(n)), n - 1))
    return {"n": n, "mean": mean, "low": lo, "high": hi, "p": p}


def holm(p_values: Sequence[float], alpha: float = FAMILY_ALPHA) -> List[Tuple[float, bool]]:
    """Holm's step-down correction: (adjusted p-value, rejected at family-wise ``alpha``) for each p-value."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted = [0.0] * len(p_values)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[i]))
        adjusted[i] = running
    return [(a, a <= alpha) for a in adjusted]


def primary_decisions(summaries: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
    """Stage 2's four primary comparisons (CSM row minus CE and minus the best other method, test ECE before TS,
    ``matched`` and ``annotated``), Holm-corrected as one family; per setting "holds", "does not hold" or
    "pending" (below 15 paired seeds, or a choice still open)."""
    tests, keys = [], []
    for setting in DECISION_SETTINGS:
        sm = summaries[setting]
        csm, best = sm["choices"]["csm"], sm["choices"]["best_other"]["pre_ts"]
        for other in ("ce", best):
            test = None
            if csm and other:
                test = paired_test(bench._by_seed(sm["rows"].get(csm, []), "ece_pre_ts"),
                                   bench._by_seed(sm["rows"].get(other, []), "ece_pre_ts"))
            keys.append((setting, other))
            tests.append(test if test is not None and test["n"] >= len(bench.A2_SEEDS) else None)
    out: Dict[str, Any] = {"comparisons": [], "verdicts": {}}
    if any(t is None for t in tests):
        out["verdicts"] = dict.fromkeys(DECISION_SETTINGS, "pending")
        out["comparisons"] = [{"setting": s, "other": o, "test": t} for (s, o), t in zip(keys, tests)]
        return out
    corrected = holm([t["p"] for t in tests])
    for (setting, other), test, (p_adj, rejected) in zip(keys, tests, corrected):
        out["comparisons"].append({"setting": setting, "other": other, "test": test, "p_holm": p_adj,
                                   "lower": rejected and test["mean"] < 0})
    for setting in DECISION_SETTINGS:
        both = [c["lower"] for c in out["comparisons"] if c["setting"] == setting]
        out["verdicts"][setting] = "holds" if all(both) else "does not hold"
    return out


def _fmt(value: Optional[float], digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _grid_lines(rows, names: Sequence[str], pick: Optional[str]) -> List[str]:
    lines = []
    for m in names:
        r = rows.get(m, [])
        seeds = [x["seed"] for x in r if x["seed"] in bench.A2_TUNING_SEEDS]
        # the means over the seeds finished so far (a choice waits for all three)
        means = [_mean(r, k, seeds) if seeds else None for k in ("val_ece_pre_ts", "val_nll_pre_ts",
                                                                  "val_ece_post_ts", "ece_pre_ts", "ece_post_ts")]
        label = bench.get_method(m).label + (" **(chosen)**" if m == pick else "")
        lines.append(f"| {label} | {len(seeds)} | " + " | ".join(
            _fmt(v, 4 if i == 1 else 2) for i, v in enumerate(means)) + " |")
    return lines


def _test_text(test: Optional[Dict[str, float]]) -> str:
    if test is None:
        return "pending"
    return f"{test['mean']:+.2f} [{test['low']:+.2f}, {test['high']:+.2f}] (n={test['n']})"


def setting_section(setting: str, sm: Dict[str, Any]) -> List[str]:
    rows, ch = sm["rows"], sm["choices"]
    head = ["| configuration | seeds (of 0-2) | val ECE before TS | val NLL before TS | val ECE after TS | "
            "test ECE before TS (reported only) | test ECE after TS (reported only) |", "|---|---|---|---|---|---|---|"]
    lines = [f"### `{setting}`: stage 1 (seeds 0-2, chosen on validation)", ""] + head
    for base, names in ch["grids"].items():
        lines += _grid_lines(rows, names, ch["chosen"][base] if len(names) > 1 else None)
    lines += ["", "CSM's coordinate-wise search:", ""] + head
    for axis, names, pick in ch["csm_steps"]:
        lines += [f"| *step: {axis}* | | | | | | |"] + _grid_lines(rows, names, pick)
    label = lambda m: bench.get_method(m).label if m else "pending"  # noqa: E731
    lines += ["", f"Choices: CSM row {label(ch['csm'])}; best other method before TS "
                  f"{label(ch['best_other']['pre_ts'])}, after TS {label(ch['best_other']['post_ts'])}.", ""]
    return lines


def write_page(path: Path = PAGE, output: Path = Path(bench.A2_OUTPUT), committed: Path = bench.COMMITTED_A2) -> str:
    summaries = {}
    for setting in bench.A2_SETTINGS:
        rows = _rows(a2_cells(setting, output, committed))
        summaries[setting] = {"rows": rows, "choices": stage1_choices(setting, rows)}
    records = list({c["dir"].name: c["record"] for st in bench.A2_SETTINGS
                    for runs in a2_cells(st, output, committed).values() for c in runs.values()}.values())
    commits = sorted({(r.get("commit") or "?")[:7] + ("" if r.get("clean") else " (modified)") for r in records})
    threads = sorted({r.get("torch_threads") for r in records})
    decisions = primary_decisions(summaries)
    lines = ["# Calibration benchmark, amendment 2: the verdict at 15 seeds, every method tuned alike", "",
             "Protocol: [PROTOCOL.md](PROTOCOL.md), amendment 2, committed before its cells. Metrics in %, test split "
             "read only by each cell's final evaluation; every choice on the 2 000 validation images.", "",
             "Commands: `python benchmarks/calibration_bench.py --amendment 2 --recipe SETTING --methods ... --seeds "
             "...` (the cells, from a worktree of the recorded commit), `python benchmarks/amendment2.py --next "
             "SETTING` (which cells can run), `python benchmarks/amendment2.py --report` (this page).", "",
             f"Cells finished: {len(records)}; commits: {', '.join(commits) or '-'}; torch threads: "
             f"{', '.join(map(str, threads)) or '-'}. `python benchmarks/calibration_bench.py --verify CELL` re-runs "
             "one from its record.", "",
             "## Stage 2: the decision (CSM row minus the other method, test ECE before TS, paired over 15 seeds, "
             "Holm over the 4 primary comparisons)", "",
             "| setting | other method | difference [95% t-interval] | Holm-adjusted p | CSM lower under Holm |",
             "|---|---|---|---|---|"]
    for c in decisions["comparisons"]:
        other = bench.get_method(c["other"]).label if c["other"] else "pending"
        lines.append(f"| {c['setting']} | {other} | {_test_text(c['test'])} | {_fmt(c.get('p_holm'), 4)} | "
                     f"{'-' if 'lower' not in c else 'yes' if c['lower'] else 'no'} |")
    lines += [""] + [f"**\"CSM calibrates better\" in `{s}`: {v}.**" for s, v in decisions["verdicts"].items()] + [""]
    for setting in bench.A2_SETTINGS:
        lines += setting_section(setting, summaries[setting])
    text = "\n".join(lines) + "\n"
    write_text_atomic(Path(path), text)
    return text


def decision_figure(entries: Sequence[Tuple[str, str, Optional[Dict[str, float]]]], path: Path,
                    title: str) -> Path:
    """A forest plot of paired differences: one row per ``(group, label, test)`` (:func:`paired_test`), the mean and
    its 95% t-interval in ECE points, 0 marked; groups (e.g. before / after TS) side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(dict.fromkeys(g for g, _, _ in entries))
    labels = list(dict.fromkeys(lab for _, lab, _ in entries))
    fig, axes = plt.subplots(1, len(groups), figsize=(4.2 * len(groups), 0.45 * len(labels) + 1.4), sharey=True,
                             squeeze=False)
    for ax, group in zip(axes[0], groups):
        for y, label in enumerate(labels):
            test = next((t for g, lab, t in entries if g == group and lab == label), None)
            if test is None:
                continue
            below = test["high"] < 0
            ax.errorbar(test["mean"], y, xerr=[[test["mean"] - test["low"]], [test["high"] - test["mean"]]],
                        fmt="o", color="tab:green" if below else "tab:red" if test["low"] > 0 else "tab:gray",
                        capsize=3)
        ax.axvline(0.0, color="black", lw=0.8)
        ax.set_title(group, fontsize=10)
    axes[0][0].set_yticks(range(len(labels)), labels)
    axes[0][0].invert_yaxis()  # the axes share y: once inverts them all
    fig.supxlabel("CSM minus the other method, test ECE (points); green: interval below 0, red: above", fontsize=9)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def protocol_decision_entries(rows: Sequence[Dict[str, Any]]) -> List[Tuple[str, str, Optional[Dict[str, float]]]]:
    """The protocol's (amendment 0) decision comparisons from ``benchmarks/calibration.json``'s rows: the CSM row
    of each setting against CE and the best other method, before and after TS."""
    by = {(r["recipe"], r["method"]): r for r in rows if r.get("per_seed") and r.get("recipe") in bench.PROTOCOL_RECIPES}
    out = []
    for setting in bench.PROTOCOL_RECIPES:
        per = {m: r["per_seed"] for (st, m), r in by.items() if st == setting}
        csm = bench._lowest_mean(per, bench.CSM_VARIANTS, "val_ece_pre_ts")
        for phase, name in (("pre_ts", "before TS"), ("post_ts", "after TS")):
            best = bench._lowest_mean(per, bench.NON_GENERATED, f"val_ece_{phase}")
            for other in ("ce", best):
                test = paired_test(bench._by_seed(per[csm], f"ece_{phase}"), bench._by_seed(per[other], f"ece_{phase}"))
                out.append((name, f"{setting}: vs {bench.METHODS[other].label.split(' (')[0]}", test))
    return out


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--report", action="store_true", help=f"write {PAGE}")
    p.add_argument("--next", choices=bench.A2_SETTINGS, default=None,
                   help="print the cells of this setting that can run now, one '<method> <seed>' per line")
    p.add_argument("--output", default=bench.A2_OUTPUT, help="the cell cache (default %(default)s)")
    p.add_argument("--protocol-figure", default=None, metavar="PNG",
                   help="draw the protocol's (amendment 0) decision comparisons from benchmarks/calibration.json")
    args = p.parse_args(argv)
    if args.protocol_figure:
        entries = protocol_decision_entries(bench._read_json(bench.DEFAULT_JSON))
        decision_figure(entries, Path(args.protocol_figure), "Protocol (5 seeds): CSM row minus CE and minus the "
                        "best other method (validation), 95% paired t-intervals")
        print(f"wrote {args.protocol_figure}")
    if args.next:
        rows = _rows(a2_cells(args.next, Path(args.output)))
        for m, s in next_cells(args.next, rows):
            print(m, s)
    if args.report:
        write_page(output=Path(args.output))
        print(f"wrote {PAGE}")


if __name__ == "__main__":
    main()
