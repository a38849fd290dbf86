"""The calibration benchmark's pages (``benchmarks/calibration_bench.py``): the earlier benchmark's tables
(``calibration_earlier.md``, ``calibration_demo.md``) with their JSON rows, and what every page shares (the machine,
a page's section between markers); the protocol's page is :mod:`calibration_protocol_page`. The cells, their
statistics and the per-seed rows come from the library (:mod:`timm_csm.recipes.cells`, :mod:`timm_csm.metrics.paired`);
these modules decide what the pages show."""
from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from calibration_methods import BOUNDARY_SETS, DERIVED, METHODS, cell_config, cell_name, plan_cells
from timm_csm.io import write_json_atomic, write_text_atomic
from timm_csm.metrics import mean_std, metric_spec, metrics_for
from timm_csm.recipes.cells import PREDICTIONS, collect_cells, keyed_options, read_json

#: the columns of the earlier benchmark's tables: the metric table's ``"page"`` view, with its headings, scales,
#: decimals and directions
_COLUMNS = tuple(metric_spec(name) for name in metrics_for("page"))


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
            row[phase] = {c.name: mean_std([m[c.name] for m in metrics]) for c in _COLUMNS} if metrics else {}
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
    heads = [c.short_heading for c in _COLUMNS] + (["T"] if with_temperature else []) + ["s / cell"]
    lines = ["| method | seeds | " + " | ".join(heads) + " |", "|---|---|" + "---|" * len(heads)]
    best = {}
    for c in _COLUMNS:
        vals = [row[phase][c.name][0] for row in summary.values() if row.get(phase)]
        if vals:
            best[c.name] = max(vals) if c.higher_is_better else min(vals)
    for method, row in summary.items():
        label = _label(method)
        cells = []
        for c in _COLUMNS:
            ms = row[phase].get(c.name) if row.get(phase) else None
            text = _fmt(ms, c.scale, c.digits)
            if ms is not None and len(summary) > 1 and ms[0] == best.get(c.name):
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


def json_rows(summary: Dict[str, Dict[str, Any]], recipe_name: str, recipe: Dict[str, Any]) -> List[Dict[str, Any]]:
    """One row per method: ``method``, ``recipe``, ``seeds``, ``{metric}_{pre|post}_ts`` as ``{"mean", "std"}`` for
    acc / ece / aece / cece / nll (acc and the calibration errors in %), and ``T``."""
    rows = []
    for method, row in summary.items():
        out: Dict[str, Any] = {"method": method, "label": _label(method),
                               "recipe": recipe_name, "recipe_options": recipe, "seeds": row["seeds"]}
        for phase in ("pre_ts", "post_ts"):
            for key, (mean, std) in row[phase].items():
                spec = metric_spec(key)
                out[f"{spec.abbrev}_{phase}"] = {"mean": mean * spec.scale,
                                                 "std": None if std is None else std * spec.scale}
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
