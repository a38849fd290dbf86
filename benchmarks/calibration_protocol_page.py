"""The calibration benchmark's protocol page (``calibration.md``, from ``benchmarks/calibration_bench.py``): both
settings, per-seed rows, paired 95% intervals, the validation choices, the decision rule's verdicts and the boundary
study, with their JSON rows. The earlier benchmark's tables are :mod:`calibration_pages`."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from calibration_methods import (BOUNDARY_METHODS, COMMITTED_CELLS, CSM_VARIANTS, METHODS, NON_GENERATED,
                                 PROTOCOL_METHODS, PROTOCOL_RECIPES, PROTOCOL_SEEDS, cell_name, every_seed)
from calibration_pages import machine_description, replace_section
from timm_csm.io import write_json_atomic
from timm_csm.metrics import interval_text, metric_spec, metrics_for, paired_outcome, paired_t_interval
from timm_csm.recipes.cells import CELL_META, RESULTS, per_seed_row, read_json
from timm_csm.study.decide import ROW_METRICS, values_by_seed
# a study page's pieces, shared with the study report (one implementation)
from timm_csm.study.report_tables import mean_cell, per_seed_json_row

_PROTOCOL_MARKERS = ("<!-- calibration_protocol: begin -->", "<!-- calibration_protocol: end -->")


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
                            for phase in ("pre_ts", "post_ts") for key in ROW_METRICS}
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
    row_specs = [metric_spec(name) for name in metrics_for("per_seed")]
    head = "| method | seeds | " + " | ".join(c.short_heading for c in row_specs) + " |"
    for phase, extra in (("pre_ts", ""), ("post_ts", " T | epoch | val ECE before / after TS (%) | s / cell |")):
        lines += [f"### {'Before' if phase == 'pre_ts' else 'After'} temperature scaling (test split)", "",
                  head + extra, "|---" * (2 + len(row_specs) + extra.count("|")) + "|"]
        for m in order:
            r = rows[m]
            cells = [mean_cell(r, f"{c.abbrev}_{phase}", c.digits) for c in row_specs]
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
