"""A study's page from its spec and its finished cells (``timm-csm-study report``): markdown, its rows as JSON with
every seed's numbers, and the decision figure. Nothing is re-run: the page reads ``cell.json`` and
``results.json`` of each cell folder (:mod:`.cells`), makes stage 1's choices and stage 2's decision as the study
does (:mod:`.plan`, :mod:`.decide`), and shows what the spec's ``[report]`` table names (:mod:`.report_spec`):

* ``verify``: the verify runs of committed cells (``timm-csm-study verify``'s log), a record the tool did not write
  marked as transcribed;
* ``decision``: the primary comparisons' paired intervals, Holm-adjusted p-values, power and each setting's verdict;
* ``stage2``: each setting's stage-2 rows, the secondary intervals and the decision figure (:mod:`.report_figures`);
* ``stage1``: each setting's grids, search steps and choices, on validation;
* ``labels``, ``volume``, ``data_seeds``: the later stages (:mod:`.report_stages`);
* ``cost`` and ``pending``: :mod:`.report_cost`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..io import write_json_atomic, write_text_atomic
from ..metrics import interval_text, metric_of_abbrev, metric_spec, metrics_for
from ..recipes.cells import read_json
from .cells import Cells, cell_rows, config_mismatch, finished_cells
from .decide import BEST_OTHER, Comparison, Decision, comparison_pairs, decide, metric_phase
from .methods import get_method
from .plan import setting_plan
from .report_cost import cost_section, pending_section
from .report_figures import decision_figure
from .report_stages import data_seeds_section, labels_section, volume_section
from .report_tables import differences_text, grid_lines, mean_cell, only_seeds, paired, per_seed_json_row, \
    power_text, seed_range, test_text
from .spec import StudySpec

__all__ = ["study_cells", "setting_summaries", "primary_decision", "verify_lines", "json_rows", "render_page",
           "write_page", "write_report"]

#: stage 2's columns, of its rows and of its secondary comparisons: (column, row key of the per-seed rows): ECE
#: before and after TS, then the rest of the metric table's ``"per_seed"`` view before TS
SECONDARY = (("ECE before TS", "ece_pre_ts"), ("ECE after TS", "ece_post_ts"),
             *((metric_spec(name).in_text, f"{metric_spec(name).abbrev}_pre_ts")
               for name in metrics_for("per_seed") if name != "ece"))


def _digits(key: str) -> int:
    """Decimals of a stage-2 column ``<abbrev>_<phase>``: NLL and Brier are raw values, the others in %."""
    return metric_of_abbrev(key.partition("_")[0]).digits


def metric_text(metric: str) -> str:
    """``test ECE before TS`` of ``ece_pre_ts``."""
    phase = metric_phase(metric)
    return f"test {metric_of_abbrev(metric.partition('_')[0]).in_text} {'before' if phase == 'pre_ts' else 'after'} TS"


def study_cells(spec: StudySpec, roots: Sequence[Path]) -> Dict[Tuple[str, int], Cells]:
    """``{(setting, data seed): cells}`` of the spec's settings and data seeds (the study's, and the ``data_seeds``
    of its report) from the folders of cell folders ``roots``, earlier ones first; a missing folder, or a cell
    trained on other data or another model than the spec states, is a ``ValueError`` naming it."""
    for root in map(Path, roots):
        if not root.is_dir():
            raise ValueError(f"{root} is not a folder of cell folders (give <output>/cells or a committed cells "
                             "folder)")
    data_seeds = spec.report.data_seeds or (spec.data.data_seed,)
    out = {}
    for setting in spec.settings:
        for data_seed in data_seeds:
            found = finished_cells(roots, setting, data_seed)
            for runs in found.values():
                for cell in runs.values():
                    problem = config_mismatch(spec, dict(cell["config"], data_seed=spec.data.data_seed))
                    if problem is not None:
                        raise ValueError(f"{cell['dir']} is not a cell of study {spec.name!r}: {problem}")
            out[setting, data_seed] = found
    return out


def setting_summaries(spec: StudySpec, cells: Mapping[Tuple[str, int], Cells]) -> Dict[str, Dict[str, Any]]:
    """Per setting, on the study's data seed: ``{"rows", "choices", "cells"}`` (stage 1's choices on its rows)."""
    out = {}
    for setting in spec.settings:
        found = cells.get((setting, spec.data.data_seed), {})
        rows = cell_rows(found)
        out[setting] = {"rows": rows, "choices": setting_plan(spec, setting, rows).choices, "cells": found}
    return out


def primary_decision(spec: StudySpec, summaries: Mapping[str, Mapping[str, Any]],
                     required_seeds: Optional[int] = None) -> Decision:
    """The primary comparisons (the searched row minus each of ``decision.others`` in each decision setting),
    Holm-corrected as one family (:func:`timm_csm.study.decide.decide`), pending below ``required_seeds`` paired
    seeds (default: the spec's decision seeds)."""
    d = spec.decision
    choices = {setting: summaries[setting]["choices"] for setting in d.settings}
    return decide(comparison_pairs(choices, d.others, d.metric), {s: summaries[s]["rows"] for s in d.settings},
                  required_seeds or len(spec.seeds.decision), d.metric, d.family_alpha)


def verify_lines(log: Optional[Path], command: str = "timm-csm-study verify") -> List[str]:
    """The verify runs of committed cells, from the log ``command`` appends to; a record marked ``transcribed``
    (copied from a command's printed result, not written by the tool) says so."""
    runs = read_json(log) if log is not None and Path(log).exists() else []
    if not runs:
        return [f"No cell has been re-run with `{command}` yet.", ""]
    lines = ["Verify runs (a committed cell re-run from its record at a commit):", ""]
    for r in runs:
        what = "reproduced exactly" if r["reproduced"] else differences_text(r["differences"])
        extra = f"; reported now, not compared: {', '.join(r['not_compared'])}" if r.get("not_compared") else ""
        transcribed = (" (transcribed from the command's printed result: the code at this commit did not write "
                       "the log)" if r.get("transcribed") else "")
        # a verdict holds at the capability it ran at: an older record that lacks it says so
        where = f", torch's CPU capability {r.get('cpu_capability') or 'not recorded'}"
        lines.append(f"* `{r['cell']}` at {(r['commit'] or '?')[:7]}{'' if r.get('clean') else ' (modified)'}{where}: "
                     f"{what}{extra}{transcribed}.")
    return lines + [""]


def decision_lines(spec: StudySpec, decision: Decision, claim: str = "CSM calibrates better") -> List[str]:
    """The decision's table and each setting's verdict on ``claim``. Where the best other method is one of the
    fixed others (e.g. CE), its comparison is shown once and named so; Holm's family still counts it as often as
    the spec lists it, as registered (the conservative side)."""
    d = spec.decision
    n = d.comparisons()
    lines = [f"## Stage 2: the decision (CSM row minus the other method, {metric_text(d.metric)}, paired over "
             f"{len(spec.seeds.decision)} seeds, Holm over the {n} primary comparisons)", "",
             "| setting | other method | difference [95% t-interval] | Holm-adjusted p | CSM lower under Holm | "
             f"paired sd | detectable at 80% power (alpha 0.05 / {d.family_alpha / n:g}) |",
             "|---|---|---|---|---|---|---|"]
    groups: Dict[Tuple[Any, ...], List[Comparison]] = {}
    for i, c in enumerate(decision.comparisons):  # a pending comparison is a row of its own
        groups.setdefault((c.setting, c.method, c.other) if c.other else (i,), []).append(c)
    for c, *repeats in groups.values():
        other = get_method(c.other).label if c.other else "pending"
        if repeats:
            other += f" (also the best other method; counted {1 + len(repeats)} times in Holm's family, as registered)"
        p = "-" if c.p_holm is None else f"{c.p_holm:.4f}"
        lines.append(f"| {c.setting} | {other} | {test_text(c.test)} | {p} | "
                     f"{'-' if c.lower is None else 'yes' if c.lower else 'no'} | "
                     f"{power_text(c.test, d.family_alpha, n)} |")
    return lines + [""] + [f"**\"{claim}\" in `{s}`: {v}.**" for s, v in decision.verdicts.items()] + [""]


def stage2_others(spec: StudySpec, choices: Mapping[str, Any]) -> List[Tuple[str, str]]:
    """``(label, configuration)`` of a setting's stage-2 rows other than the searched one, each configuration once,
    its label naming the roles beyond its own name (e.g. ``RegMixup (alpha 20), best other after TS``)."""
    roles = [(o, None) for o in spec.decision.others if o != BEST_OTHER]
    roles += [(choices["chosen"].get(m), None) for m in spec.decision.secondary]
    if BEST_OTHER in spec.decision.others:
        roles += [(choices["best_other"]["pre_ts"], "best other before TS"),
                  (choices["best_other"]["post_ts"], "best other after TS")]
    named: Dict[str, List[str]] = {}
    for name, role in roles:
        if name is not None:
            named.setdefault(name, []).extend([role] if role else [])
    return [(", ".join([get_method(name).label, *extra]), name) for name, extra in named.items()]


def stage2_lines(spec: StudySpec, summaries: Mapping[str, Mapping[str, Any]], figure: Path) -> List[str]:
    """Stage 2's rows over their seeds (mean ± sd, test split, in %; NLL and Brier raw), the secondary paired
    intervals of the searched row against each (no claim unless the interval excludes 0), and the decision figure
    (of the decision settings only; the other settings' rows are secondary)."""
    seeds, phase = spec.seeds.decision, metric_phase(spec.decision.metric)
    lines, entries = [], []
    columns = " | ".join(col for col, _ in SECONDARY) + " |"
    for setting in spec.settings:
        sm = summaries[setting]
        rows, csm = sm["rows"], sm["choices"]["csm"]
        if csm is None:
            continue
        others = stage2_others(spec, sm["choices"])
        decided = setting in spec.decision.settings
        lines += [f"### `{setting}`: the stage-2 rows (seeds {seed_range(seeds)}, test split; before TS except the "
                  f"after-TS column){'' if decided else '; a secondary setting, no decision'}", "",
                  "| row | seeds | " + columns, "|---|---|" + "---|" * len(SECONDARY)]
        for label, name in [(f"CSM row: {get_method(csm).label}", csm)] + others:
            r = only_seeds(rows.get(name, []), seeds)
            lines.append(f"| {label} | {len(r)} | " + " | ".join(mean_cell(r, key, _digits(key))
                                                                for _, key in SECONDARY) + " |")
        lines += ["", "Secondary: the CSM row minus each row, paired 95% t-intervals over the common seeds "
                  "(unadjusted; no claim unless the interval excludes 0):", "",
                  "| minus | " + columns, "|---|" + "---|" * len(SECONDARY)]
        primary_others = {o for o in spec.decision.others if o != BEST_OTHER}
        primary_others |= {sm["choices"]["best_other"][phase]} if BEST_OTHER in spec.decision.others else set()
        for label, name in others:
            tests = {key: paired(rows, csm, name, key, seeds) for _, key in SECONDARY}
            lines.append(f"| {label} | " + " | ".join(interval_text(tests[key], _digits(key))
                                                      for _, key in SECONDARY) + " |")
            if not decided:  # the figure shows the decision settings only
                continue
            for ph, group in (("pre_ts", "before TS"), ("post_ts", "after TS")):
                test = tests[f"ece_{ph}"]  # "(P)" marks a primary comparison once all its seeds are in
                primary = name in primary_others and test is not None and test.n >= len(seeds)
                entries.append((group, f"{setting}: vs {get_method(name).label.split(' (')[0]}" + " (P)" * primary,
                                test))
        lines.append("")
    found = sorted({test.n for _, _, test in entries if test is not None})
    if found:
        n = spec.decision.comparisons()
        span = f"{found[0]}" + (f"-{found[-1]}" if len(found) > 1 else "")
        label = spec.report.figure_label or spec.name
        decision_figure(entries, figure, f"{label}, stage 2 ({span} of {len(seeds)} seeds): CSM row minus each row, "
                        "test ECE, 95% paired t-intervals (unadjusted);\n(P): a primary comparison before TS, "
                        f"decided under Holm over the {n} (the table)", len(seeds))
        lines += [f"![Stage 2: the CSM row minus each row, before and after TS]({figure.name})", ""]
    return lines


def stage1_lines(spec: StudySpec, setting: str, sm: Mapping[str, Any]) -> List[str]:
    rows, ch, tuning = sm["rows"], sm["choices"], spec.seeds.tuning
    head = [f"| configuration | seeds (of {seed_range(tuning)}) | val ECE before TS | val NLL before TS | val ECE "
            "after TS | test ECE before TS (reported only) | test ECE after TS (reported only) |",
            "|---|---|---|---|---|---|---|"]
    lines = [f"### `{setting}`: stage 1 (seeds {seed_range(tuning)}, chosen on validation)", ""] + head
    for base, names in ch["grids"].items():
        lines += grid_lines(rows, names, ch["chosen"][base] if len(names) > 1 else None, tuning)
    lines += ["", "CSM's coordinate-wise search:", ""] + head
    for axis, names, pick in ch["csm_steps"]:
        lines += [f"| *step: {axis}* | | | | | | |"] + grid_lines(rows, names, pick, tuning)
    label = lambda m: get_method(m).label if m else "pending"  # noqa: E731
    lines += ["", f"Choices: CSM row {label(ch['csm'])}; best other method before TS "
                  f"{label(ch['best_other']['pre_ts'])}, after TS {label(ch['best_other']['post_ts'])}.", ""]
    report = spec.report
    if setting in report.encoder_settings:
        lines += [f"The annotator of `{setting}` (and KD's teacher), {report.encoder_name}, learned from "
                  f"{report.encoder_train_images:,} training images, among them "
                  f"{report.saw_validation(spec.data.data_seed):,} of the {spec.data.val_size:,} validation images "
                  "these choices are made on: a choice on them can favour the methods that use it.", ""]
    return lines


def json_rows(cells: Mapping[Tuple[str, int], Cells]) -> List[Dict[str, Any]]:
    """One row per (setting, data seed, method) with finished cells (:func:`.report_tables.per_seed_json_row`)
    with ``setting`` and ``data_seed``. A cell shared by the settings is in each setting's rows."""
    return [per_seed_json_row(method, rows, setting=setting, data_seed=data_seed)
            for (setting, data_seed), found in sorted(cells.items())
            for method, rows in sorted(cell_rows(found).items())]


def _records_line(cells: Mapping[Tuple[str, int], Cells]) -> str:
    records = list({c["dir"].name: c["record"] for found in cells.values()
                    for runs in found.values() for c in runs.values()}.values())
    commits = sorted({(r.get("commit") or "?")[:7] + ("" if r.get("clean") else " (modified)") for r in records})
    threads = sorted({r.get("torch_threads") for r in records})
    return (f"Cells finished: {len(records)}; commits: {', '.join(commits) or '-'}; torch threads: "
            f"{', '.join(map(str, threads)) or '-'}. `timm-csm-study verify SPEC CELL --cells DIR` re-runs one from "
            "its record and appends what differs to the verify log.")


def render_page(spec: StudySpec, cells: Mapping[Tuple[str, int], Cells], page: Path,
                base: Optional[Path] = None) -> str:
    """The page's markdown (figures written beside ``page`` as ``<page>_decision.png`` and ``<page>_volume.png``);
    ``base``: the folder the report table's paths are relative to (the spec's)."""
    report = spec.report
    where = (lambda p: None if p is None else Path(base or ".") / p)
    summaries = setting_summaries(spec, cells)
    stem = Path(page).stem
    lines = [f"# {report.title or spec.name}", ""]
    for paragraph in report.intro:
        lines += [paragraph.replace("{json}", Path(page).with_suffix(".json").name), ""]
    lines += [_records_line(cells), ""]
    for section in report.sections:
        if section == "verify":
            lines += verify_lines(where(report.verify_log))
        elif section == "decision":
            lines += decision_lines(spec, primary_decision(spec, summaries))
        elif section == "stage2":
            lines += stage2_lines(spec, summaries, Path(page).with_name(f"{stem}_decision.png"))
        elif section == "stage1":
            for setting in spec.settings:
                lines += stage1_lines(spec, setting, summaries[setting])
        elif section == "labels":
            lines += labels_section(spec, summaries, where(report.label_cache))
        elif section == "volume":
            lines += volume_section(spec, summaries, Path(page).with_name(f"{stem}_volume.png"))
        elif section == "data_seeds":
            lines += data_seeds_section(spec, summaries[report.data_seed_choices]["choices"],
                                        {d: cell_rows(cells[report.data_seed_setting, d]) for d in report.data_seeds})
        elif section == "cost":
            lines += cost_section(spec, cells, where(report.builds), Path(page).parent)
        elif section == "pending":
            lines += pending_section(spec, cells)
    return "\n".join(lines) + "\n"


def write_page(spec: StudySpec, cells: Mapping[Tuple[str, int], Cells], page: Path,
               base: Optional[Path] = None) -> str:
    """Write the page of ``cells`` (:func:`study_cells`) at ``page`` and its rows at ``<page>.json``, the figures
    beside them; returns the page's text."""
    text = render_page(spec, cells, page, base)
    write_json_atomic(Path(page).with_suffix(".json"), json_rows(cells), indent=1)
    write_text_atomic(Path(page), text)
    return text


def write_report(spec: StudySpec, roots: Sequence[Path], page: Path, base: Optional[Path] = None) -> str:
    """:func:`write_page` of the finished cells under ``roots`` (folders of cell folders, earlier ones first)."""
    return write_page(spec, study_cells(spec, roots), page, base)
