"""The calibration benchmark's pages (``benchmarks/calibration_bench.py``): the earlier benchmark's tables
(``calibration_earlier.md``, ``calibration_demo.md``) and the protocol's page (``calibration.md``, both settings,
per-seed rows, paired 95% intervals, the validation choices and the decision rule's verdicts), with their JSON rows.
The cells, their statistics and the per-seed rows come from the library (:mod:`timm_csm.recipes.cells`,
:mod:`timm_csm.metrics.paired`); this module decides what the pages show."""
from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from calibration_methods import (BOUNDARY_METHODS, BOUNDARY_SETS, COMMITTED_CELLS, CSM_VARIANTS, DERIVED, METHODS,
                                 NON_GENERATED, PROTOCOL_METHODS, PROTOCOL_RECIPES, PROTOCOL_SEEDS, cell_config,
                                 cell_name, every_seed, get_method, plan_cells)
from timm_csm.io import write_json_atomic, write_text_atomic
from timm_csm.metrics import interval_text, mean_std, paired_outcome, paired_t_interval
from timm_csm.recipes.cells import (CELL_META, PREDICTIONS, RESULTS, collect_cells, keyed_options, per_seed_row,
                                   read_json)
from timm_csm.study.decide import values_by_seed
# a study page's pieces, shared with the study report (one implementation)
from timm_csm.study.report_tables import mean_cell, per_seed_json_row

_COLUMNS = (("accuracy", "Acc (%)", 100.0), ("ece", "ECE (%)", 100.0), ("aece", "AECE (%)", 100.0),
            ("cece", "CECE (%)", 100.0), ("nll", "NLL", 1.0))
_HIGHER_IS_BETTER = {"accuracy"}


def _label(method: str) -> str:
    return METHODS[method].label if method in METHODS else method


def matches_recipe(cell: Dict[str, Any], method: str, seed: int, recipe: Dict[str, Any]) -> bool:
    """Whether a finished cell was trained with ``recipe`` (the generated dataset's path aside)."""
    if method not in METHODS:
        return False
    placeholders = dict.fromkeys(("soft", *DERIVED, *BOUNDARY_SETS), "-")
    expected = keyed_options(cell_config(recipe, METHODS[method], seed, cell["dir"], placeholders))
    actual = dict(cell["config"])
    expected.pop("csm_dataset", None)
    actual.pop("csm_dataset", None)
    return expected == actual


def summarize(cells: Dict[str, Dict[int, Dict[str, Any]]]) -> Dict[str, Dict[str, Any]]:
    """Per method: seeds and ``{phase: {metric: (mean, sample std or None)}}`` for phase pre_ts / post_ts, plus the
    temperature and the mean seconds per cell."""
    out: Dict[str, Dict[str, Any]] = {}
    for method in [m for m in METHODS if m in cells] + sorted(m for m in cells if m not in METHODS):
        runs = cells[method]
        seeds = sorted(runs)
        row: Dict[str, Any] = {"seeds": seeds}
        for phase in ("pre_ts", "post_ts"):
            metrics = [runs[s]["results"]["test"].get(phase) for s in seeds]
            metrics = [m for m in metrics if m]
            row[phase] = {k: mean_std([m[k] for m in metrics]) for k, _, _ in _COLUMNS} if metrics else {}
        temps = [runs[s]["results"].get("temperature") for s in seeds]
        temps = [t for t in temps if t is not None]
        row["temperature"] = mean_std(temps) if temps else None
        secs = [runs[s]["seconds"] for s in seeds if runs[s].get("seconds") is not None]
        row["seconds"] = sum(secs) / len(secs) if secs else None
        out[method] = row
    return out


def _fmt(ms: Optional[Tuple[float, Optional[float]]], scale: float, digits: int) -> str:
    if ms is None:
        return "-"
    mean, std = ms
    text = f"{mean * scale:.{digits}f}"
    return text + (f" ± {std * scale:.{digits}f}" if std is not None else "")


def _table(summary: Dict[str, Dict[str, Any]], phase: str, with_temperature: bool) -> List[str]:
    heads = [h for _, h, _ in _COLUMNS] + (["T"] if with_temperature else []) + ["s / cell"]
    lines = ["| method | seeds | " + " | ".join(heads) + " |", "|---|---|" + "---|" * len(heads)]
    best = {}
    for key, _, _ in _COLUMNS:
        vals = [row[phase][key][0] for row in summary.values() if row.get(phase)]
        if vals:
            best[key] = max(vals) if key in _HIGHER_IS_BETTER else min(vals)
    for method, row in summary.items():
        label = _label(method)
        cells = []
        for key, _, scale in _COLUMNS:
            ms = row[phase].get(key) if row.get(phase) else None
            text = _fmt(ms, scale, 4 if scale == 1.0 else 2)
            if ms is not None and len(summary) > 1 and ms[0] == best.get(key):
                text = f"**{text}**"
            cells.append(text)
        if with_temperature:
            cells.append(_fmt(row["temperature"], 1.0, 2))
        cells.append("-" if row["seconds"] is None else f"{row['seconds']:.0f}")
        lines.append(f"| {label} | {len(row['seeds'])} | " + " | ".join(cells) + " |")
    return lines


def machine_description() -> str:
    """CPU model and core count, or the GPU when torch sees one; the load average at report time."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        if names:
            cpu = names[0]
    except OSError:
        pass
    text = f"{os.cpu_count()}-core CPU ({cpu})"
    try:
        import torch

        if torch.cuda.is_available():
            text += f", GPU {torch.cuda.get_device_name(0)}"
    except ImportError:
        pass
    if hasattr(os, "getloadavg"):
        text += f"; load average {os.getloadavg()[0]:.1f} when the report was written"
    return text


def reliability_figure(cells: Dict[str, Dict[int, Dict[str, Any]]], path: Path, n_bins: int = 15,
                       methods: Sequence[str] = ("ce", "csm")) -> Optional[int]:
    """CE against CSM reliability diagrams (test split, before temperature scaling) of the first seed both
    finished with saved test predictions; returns that seed, or None when there is none (or no matplotlib)."""
    from safetensors.torch import load_file

    common = sorted(set.intersection(*[set(cells.get(m, {})) for m in methods]))
    for seed in common:
        files = [cells[m][seed]["dir"] / PREDICTIONS for m in methods]
        if not all(f.exists() for f in files):
            continue
        try:
            from timm_csm.metrics.plots import reliability_diagrams
        except ImportError:
            return None
        runs = {}
        for m, f in zip(methods, files):
            t = load_file(str(f))
            runs[f"{_label(m)} (seed {seed})"] = (t["logits"], t["targets"])
        try:
            reliability_diagrams(runs, path, n_bins=n_bins, title="Test reliability before temperature scaling")
        except ImportError:  # matplotlib is an optional extra
            return None
        return seed
    return None


_JSON_KEYS = {"accuracy": "acc", "ece": "ece", "aece": "aece", "cece": "cece", "nll": "nll"}


def json_rows(summary: Dict[str, Dict[str, Any]], recipe_name: str, recipe: Dict[str, Any]) -> List[Dict[str, Any]]:
    """One row per method: ``method``, ``recipe``, ``seeds``, ``{metric}_{pre|post}_ts`` as ``{"mean", "std"}`` for
    acc / ece / aece / cece / nll (acc and the calibration errors in %), and ``T``."""
    rows = []
    for method, row in summary.items():
        out: Dict[str, Any] = {"method": method, "label": _label(method),
                               "recipe": recipe_name, "recipe_options": recipe, "seeds": row["seeds"]}
        for phase in ("pre_ts", "post_ts"):
            for key, (mean, std) in row[phase].items():
                scale = 1.0 if key == "nll" else 100.0
                out[f"{_JSON_KEYS[key]}_{phase}"] = {"mean": mean * scale, "std": None if std is None else std * scale}
        temp = row.get("temperature")
        out["T"] = None if temp is None else {"mean": temp[0], "std": temp[1]}
        rows.append(out)
    return rows


def write_json_rows(path: Path, recipe_name: str, rows: List[Dict[str, Any]]) -> None:
    """Replace the rows of ``recipe_name`` in the JSON list at ``path``, keeping the other recipes' rows."""
    old = read_json(path) if path.exists() else []
    write_json_atomic(path, [r for r in old if r.get("recipe") != recipe_name] + rows)


def write_report(output: Path, report: Path, recipe: Dict[str, Any], seeds: Sequence[int], command: str,
                 wall_seconds: float, skipped: Optional[Dict[str, str]] = None,
                 methods: Optional[Sequence[str]] = None, recipe_name: str = "augmented",
                 json_path: Optional[Path] = None) -> str:
    """(Re)write this script's section of the markdown ``report`` (other sections of the file are kept) from every
    finished cell under ``output`` trained with ``recipe``; returns the section. With ``json_path`` the summary's
    rows (:func:`json_rows`) replace that recipe's rows there."""
    methods = tuple(METHODS) if methods is None else methods
    cells, excluded = {}, []
    for m, runs in collect_cells(output).items():
        for s, cell in runs.items():
            if matches_recipe(cell, m, s, recipe):
                cells.setdefault(m, {})[s] = cell
            else:
                excluded.append(cell_name(m, s))
    summary = summarize(cells)
    report = Path(report)
    report.parent.mkdir(parents=True, exist_ok=True)
    if json_path is not None and summary:
        write_json_rows(Path(json_path), recipe_name, json_rows(summary, recipe_name, recipe))
    figure = report.with_name(report.stem + "_reliability.png")
    seed = reliability_figure(cells, figure, n_bins=int(recipe.get("n_bins", 15)))
    total = sum(c["seconds"] or 0.0 for runs in cells.values() for c in runs.values())
    n_done = sum(len(r) for r in cells.values())
    pending = [cell_name(m, s) for m, s in plan_cells(methods, seeds) if s not in cells.get(m, {})]
    shown = {k: v for k, v in recipe.items() if k != "progress"}
    lines = ["## Calibration benchmark: CSM against the baselines on Fashion-MNIST", "",
             "Same backbone, recipe, data and seeds for every method; test split; calibration errors with 15 "
             "equal-width bins (AECE: equal-mass bins, CECE: classwise); temperature T fitted on the validation "
             "split (grid search by ECE). Mean ± sample standard deviation over the finished seeds; best mean of "
             "each column in bold. `s / cell`: training and evaluation time of one cell.", "",
             "Command:", "", f"    {command}", "",
             f"Machine: {machine_description()}.", "",
             f"Cells finished: {n_done} ({total / 3600:.2f} h of cell time in all); this invocation: "
             f"{wall_seconds / 60:.1f} min wall time.", "",
             "Recipe (every cell): `" + json.dumps(shown, sort_keys=True) + "`.", "",
             "### Before temperature scaling", ""]
    if summary:
        lines += _table(summary, "pre_ts", with_temperature=False)
        lines += ["", "### After temperature scaling", ""]
        lines += _table(summary, "post_ts", with_temperature=True)
    else:
        lines += ["No cell has finished yet."]
    lines += ["", "Methods (options added to the recipe):", ""]
    for m in methods:
        bm = METHODS[m]
        data = ("; generated data: `--csm-dataset`" if bm.csm == "soft" else
                f"; generated data: the {DERIVED[bm.csm][2]} of `--csm-dataset`" if bm.csm in DERIVED else
                f"; generated data: {BOUNDARY_SETS[bm.csm][1]:.0%} of each class pair's groups of "
                f"{BOUNDARY_SETS[bm.csm][0] or 'the setting'}'s set, the decision row's variant"
                if bm.csm in BOUNDARY_SETS else "; generated data: the real-copies set" if bm.csm else "")
        lines.append(f"* {bm.label}: `{json.dumps(bm.options, sort_keys=True)}`{data}")
    if seed is not None:
        lines += ["", f"![Reliability diagrams, CE against CSM, seed {seed}]({figure.name})"]
    if pending:
        lines += ["", f"Pending cells ({len(pending)}): " + ", ".join(pending) + "."]
    if excluded:
        lines += ["", f"Left out ({len(excluded)}, trained with another recipe): " + ", ".join(excluded) + "."]
    for reason in sorted(set((skipped or {}).values())):
        lines += ["", f"Not run: {reason}."]
    text = "\n".join(lines) + "\n"
    replace_section(report, text)
    return text


_MARKERS = ("<!-- calibration_bench: begin -->", "<!-- calibration_bench: end -->")
_PROTOCOL_MARKERS = ("<!-- calibration_protocol: begin -->", "<!-- calibration_protocol: end -->")


def replace_section(path: Path, section: str, markers: Tuple[str, str] = _MARKERS) -> None:
    """Write ``section`` between ``markers`` in ``path``, keeping whatever else the file holds."""
    begin, end = markers
    block = f"{begin}\n{section}{end}\n"
    old = path.read_text() if path.exists() else ""
    if begin in old and end in old:
        head, rest = old.split(begin, 1)
        tail = rest.split(end, 1)[1].lstrip("\n")
        new = head + block + ("\n" + tail if tail else "")
    else:
        new = old + ("\n" if old and not old.endswith("\n\n") else "") + block
    write_text_atomic(path, new)


# ---------------------------------------------------------------------------------------------------------------
# the protocol's report (benchmarks/PROTOCOL.md): two settings, per-seed rows, paired intervals, the rule's verdicts
# ---------------------------------------------------------------------------------------------------------------


def protocol_cells(output: Path, setting: str, committed: Optional[Path] = COMMITTED_CELLS
                   ) -> Dict[str, Dict[int, Dict[str, Any]]]:
    """``{method: {seed: {"results", "seconds", "dir"}}}`` of the finished protocol cells of ``setting``: the cells
    shared by both settings and the setting's own, committed ones first, then those of the cell cache ``output``."""
    found: Dict[str, Dict[int, Dict[str, Any]]] = {}
    for root in [r for r in (committed, Path(output) / "cells") if r is not None and Path(r).is_dir()]:
        for d in sorted(Path(root).iterdir()):
            if not ((d / CELL_META).exists() and (d / RESULTS).exists()):
                continue
            meta = read_json(d / CELL_META)
            method, seed = meta["method"], int(meta["seed"])
            if method not in METHODS or meta.get("setting") not in (None, setting):
                continue
            if METHODS[method].per_setting != (meta.get("setting") is not None):
                continue
            if METHODS[method].recipes is not None and setting not in METHODS[method].recipes:
                continue
            if seed in found.get(method, {}):
                continue
            local = Path(output) / "cells" / d.name
            found.setdefault(method, {})[seed] = {"results": read_json(d / RESULTS), "seconds": meta.get("seconds"),
                                                  "dir": local if local.is_dir() else d}
    return found


#: ``{seed: value of key}`` of the per-seed rows that have it
by_seed = values_by_seed


def lowest_mean(rows: Dict[str, List[Dict[str, Any]]], candidates: Sequence[str], key: str) -> Optional[str]:
    """The candidate with the lowest mean of ``key`` over its rows (None where none has a row)."""
    means = {m: sum(v.values()) / len(v) for m in candidates if m in rows for v in [by_seed(rows[m], key)] if v}
    return min(means, key=means.get) if means else None


def protocol_summary(cells: Dict[str, Dict[int, Dict[str, Any]]], setting: str) -> Dict[str, Any]:
    """Per-seed rows of every method, the validation choices (the CSM variant; the best other method before and
    after TS), and the paired intervals of the chosen CSM row against every other method."""
    rows = {m: [per_seed_row(s, c) for s, c in sorted(runs.items())] for m, runs in cells.items()}
    csm = lowest_mean(rows, CSM_VARIANTS, "val_ece_pre_ts")
    best = {"pre_ts": lowest_mean(rows, NON_GENERATED, "val_ece_pre_ts"),
            "post_ts": lowest_mean(rows, NON_GENERATED, "val_ece_post_ts")}
    pairs: Dict[str, Dict[str, Any]] = {}
    if csm is not None:
        for other in rows:
            if other == csm:
                continue
            pairs[other] = {f"{key}_{phase}": paired_t_interval(by_seed(rows[csm], f"{key}_{phase}"),
                                                              by_seed(rows[other], f"{key}_{phase}"))
                            for phase in ("pre_ts", "post_ts") for key in ("ece", "acc", "nll")}
    # the methods whose seeds the choices wait for: the CSM variants and the candidates of the best other method
    candidates = [m for m in (*CSM_VARIANTS, *NON_GENERATED)
                  if METHODS[m].recipes is None or setting in METHODS[m].recipes]
    return {"rows": rows, "csm": csm, "best_other": best, "pairs": pairs, "candidates": candidates}


def outcome(interval, n_required: int = len(PROTOCOL_SEEDS),
             choices_final: bool = True) -> Optional[str]:
    """``"lower"`` / ``"higher"`` where the interval of CSM minus the other method excludes 0, ``"none"`` where it
    contains 0, ``None`` while pending (below ``n_required`` seeds, or while the validation choices behind the
    comparison, the CSM row and the best other method, still wait for some method's seeds)."""
    if interval is None or interval[0] < n_required or not choices_final:
        return None
    return paired_outcome(interval)


def verdict(interval, n_required: int = len(PROTOCOL_SEEDS),
             choices_final: bool = True) -> str:
    """The rule's reading of a paired interval (:func:`outcome`) in words."""
    if interval is None:
        return "pending (fewer than 2 paired seeds)"
    n, mean, lo, hi = tuple(interval)[:4]
    text = f"{mean:+.2f} [{lo:+.2f}, {hi:+.2f}] over {n} seeds"
    if n < n_required:
        return text + f": pending ({n} of {n_required} seeds)"
    if not choices_final:
        return text + ": pending (the validation choices wait for every method's seeds)"
    return text + {"lower": ": CSM lower (interval excludes 0)", "higher": ": CSM higher (interval excludes 0)",
                   "none": ": no difference shown (interval contains 0)"}[outcome(interval)]


def statement(outcomes: Sequence[Optional[str]]) -> str:
    """PROTOCOL.md's "CSM calibrates better": CSM lower against CE and against the best other method."""
    if any(o is None for o in outcomes):
        return "pending"
    return "holds" if all(o == "lower" for o in outcomes) else "does not hold"


def protocol_section(setting: str, summary: Dict[str, Any], recipe: Dict[str, Any]) -> List[str]:
    """The markdown of one setting: the before / after TS tables, the validation choices and the paired tests."""
    rows, csm = summary["rows"], summary["csm"]
    title = {"matched": "`matched`: the generator and the encoder learned from the classifier's 2 500 images only",
             "borrowed": "`borrowed`: the shipped generator (60 000 images) and an encoder trained on 54 000"}[setting]
    lines = [f"## {title}", ""]
    order = [m for m in PROTOCOL_METHODS if m in rows]
    if not order:
        return lines + ["No cell of this setting has finished yet.", ""]
    head = "| method | seeds | Acc (%) | ECE (%) | AECE (%) | CECE (%) | NLL | Brier |"
    for phase, extra in (("pre_ts", ""), ("post_ts", " T | epoch | val ECE before / after TS (%) | s / cell |")):
        lines += [f"### {'Before' if phase == 'pre_ts' else 'After'} temperature scaling (test split)", "",
                  head + extra, "|---" * (8 + extra.count("|")) + "|"]
        for m in order:
            r = rows[m]
            cells = [mean_cell(r, f"{k}_{phase}", 4 if k in ("nll", "brier") else 2)
                     for k in ("acc", "ece", "aece", "cece", "nll", "brier")]
            if phase == "post_ts":
                cells += [mean_cell(r, "T", 2), mean_cell(r, "epoch", 0),
                          f"{mean_cell(r, 'val_ece_pre_ts', 2)} / {mean_cell(r, 'val_ece_post_ts', 2)}",
                          mean_cell(r, "seconds", 0)]
            mark = " (decision row)" if m == csm else ""
            lines.append(f"| {METHODS[m].label}{mark} | {len(r)} | " + " | ".join(cells) + " |")
        lines.append("")
    best = summary["best_other"]
    label = lambda m: METHODS[m].label if m else "-"  # noqa: E731
    lines += ["### The protocol's choices (validation split only)", "",
              f"* CSM row of the decision (lower mean validation ECE of {', '.join(CSM_VARIANTS)}): {label(csm)}.",
              f"* Best other method, before TS (lowest mean validation ECE): {label(best['pre_ts'])}; after TS: "
              f"{label(best['post_ts'])}.", "",
              "### Paired differences, CSM minus each method (mean [95% t-interval])", "",
              "| method | ECE before TS (points) | ECE after TS (points) | Acc before TS (points) | NLL before TS |",
              "|---|---|---|---|---|"]
    for m in order:
        if m not in summary["pairs"]:
            continue
        p = summary["pairs"][m]
        lines.append(f"| {METHODS[m].label} | {interval_text(p['ece_pre_ts'])} | {interval_text(p['ece_post_ts'])} | "
                     f"{interval_text(p['acc_pre_ts'])} | {interval_text(p['nll_pre_ts'], 4)} |")
    lines += ["", "### The decision rule's verdicts", ""]
    if csm is None:
        return lines + ["Pending: no CSM cell has finished.", ""]
    final = every_seed(rows, summary["candidates"])
    outcomes = {}
    for what, other, phase in (("against CE, before TS", "ce", "pre_ts"),
                               ("against the best other method, before TS", best["pre_ts"], "pre_ts"),
                               ("against CE, after TS", "ce", "post_ts"),
                               ("against the best other method, after TS", best["post_ts"], "post_ts")):
        iv = summary["pairs"].get(other, {}).get(f"ece_{phase}") if other else None
        outcomes.setdefault(phase, []).append(outcome(iv, choices_final=final))
        lines.append(f"* ECE {what} ({label(other)}): {verdict(iv, choices_final=final)}.")
    acc = summary["pairs"].get("ce", {}).get("acc_pre_ts")
    lines += [f"* Accuracy against CE: {verdict(acc, choices_final=final).replace('CSM lower', 'CSM costs accuracy')}.",
              "",
              f"**\"CSM calibrates better\" in `{setting}` (before TS, against CE and the best other method): "
              f"{statement(outcomes['pre_ts'])}.** The same test after TS: {statement(outcomes['post_ts'])}.", ""]
    return lines + boundary_section(summary)


def boundary_section(summary: Dict[str, Any]) -> List[str]:
    """The boundary study (PROTOCOL.md, amendment 1): the decision row at a quarter, half and all of its groups, and
    with the generator at half its steps, each against CE and the best other method (paired intervals, before TS)."""
    rows, csm = summary["rows"], summary["csm"]
    shown = [m for m in BOUNDARY_METHODS if m in rows]
    if not shown or csm is None:
        return []
    best = summary["best_other"]["pre_ts"]
    lines = ["### Boundary study: generated volume and generator steps (amendment 1)", "",
             f"The decision row ({METHODS[csm].label}) with the first quarter and half of each class pair's groups, "
             "and with its generator stopped at 2 000 of its 4 000 steps; test metrics in %, differences in ECE "
             "points before TS (mean [95% t-interval]). Commands (`make boundary`): `python "
             "benchmarks/matched_setting.py --setting matched-gen2000`, then `python benchmarks/calibration_bench.py "
             "--recipe matched --methods csm_groups25 csm_groups50 csm_gen2000`.", "",
             f"| generated set | seeds | ECE before TS | ECE after TS | Acc | minus CE | minus "
             f"{METHODS[best].label if best else '-'} |", "|---|---|---|---|---|---|---|"]
    names = {"csm_groups25": "25% of the groups", "csm_groups50": "50% of the groups",
             "csm_gen2000": "all groups, generator at 2 000 steps", csm: "all groups, 4 000 steps (decision row)"}
    below = []
    for m in [m for m in ("csm_groups25", "csm_groups50", csm, "csm_gen2000") if m in rows]:
        r = rows[m]
        intervals = [paired_t_interval(by_seed(r, "ece_pre_ts"), by_seed(rows[o], "ece_pre_ts")) if o in rows else None
                     for o in ("ce", best)]
        if outcome(intervals[1]) == "lower":
            below.append(names[m])
        lines.append(f"| {names[m]} | {len(r)} | {mean_cell(r, 'ece_pre_ts', 2)} | {mean_cell(r, 'ece_post_ts', 2)} "
                     f"| {mean_cell(r, 'acc_pre_ts', 2)} | " + " | ".join(map(interval_text, intervals)) + " |")
    return lines + ["", f"Points whose interval against {METHODS[best].label if best else '-'} lies below 0 (5 seeds): "
                    f"{', '.join(below) if below else 'none'}.", ""]


def write_protocol_report(output: Path, report: Path, json_path: Optional[Path], recipe: Dict[str, Any],
                          command: str, committed: Optional[Path] = COMMITTED_CELLS) -> str:
    """(Re)write the protocol's section of ``report`` (both settings) and their rows of ``json_path``."""
    summaries = {s: protocol_summary(protocol_cells(output, s, committed), s) for s in PROTOCOL_RECIPES}
    shown = {k: v for k, v in recipe.items() if k != "progress"}
    n_cells = len({(m, s, METHODS[m].per_setting and st) for st, sm in summaries.items()
                   for m, rs in sm["rows"].items() for s in [r["seed"] for r in rs]})
    lines = ["# Calibration benchmark: CSM against the baselines and controls, under a protocol fixed in advance", "",
             "The protocol ([PROTOCOL.md](PROTOCOL.md)) was committed before any of these cells ran: the settings, "
             "the methods and their fixed hyper-parameters, the seeds, every selection rule (all on the 2 000-image "
             "validation set) and the decision rule. Every method learns from the same 2 500 real images (data seed "
             "0); the 5 training seeds vary initialisation, order and augmentation only, so the intervals below "
             "cover the training's randomness, not the choice of the real subset. The classifier recipe was chosen "
             "in the earlier benchmark by CE's test ECE ([calibration_earlier.md](calibration_earlier.md)) and is "
             "not re-tuned here. Accuracy and calibration errors in %, 15 equal-width bins; the test split (10 000 "
             "images) is read only by each cell's final evaluation.", "",
             "Command (both settings; finished cells are committed under `benchmarks/cells/` and never re-run):", "",
             f"    {command}", "",
             f"Machine: {machine_description()}. Finished cells: {n_cells}.", "",
             "Recipe (every cell, before each method's options): `" + json.dumps(shown, sort_keys=True) + "`.", ""]
    for setting in PROTOCOL_RECIPES:
        lines += protocol_section(setting, summaries[setting], recipe)
    pending = [cell_name(m, s, st) for st in PROTOCOL_RECIPES for s in PROTOCOL_SEEDS for m in PROTOCOL_METHODS
               if (METHODS[m].recipes is None or st in METHODS[m].recipes)
               and s not in {r["seed"] for r in summaries[st]["rows"].get(m, [])}]
    pending = list(dict.fromkeys(pending))
    if pending:
        lines += [f"Pending cells ({len(pending)}): " + ", ".join(pending) + ".", ""]
    text = "\n".join(lines)
    replace_section(Path(report), text, _PROTOCOL_MARKERS)
    if json_path is not None:
        json_rows_out = [per_seed_json_row(m, sm["rows"][m], recipe=setting, recipe_options=recipe,
                                           method_options=METHODS[m].options)
                         for setting, sm in summaries.items()
                         for m in (*PROTOCOL_METHODS, *BOUNDARY_METHODS) if m in sm["rows"]]
        old = read_json(json_path) if Path(json_path).exists() else []
        write_json_atomic(Path(json_path), [r for r in old if r.get("recipe") not in PROTOCOL_RECIPES]
                          + json_rows_out)
    return text


# ---------------------------------------------------------------------------------------------------------------
