"""Amendment 2 of ``benchmarks/PROTOCOL.md``: its validation choices, its decisions and its page.

The cells run through ``calibration_bench.py --amendment 2`` (from a worktree of one recorded commit); this script
reads the finished ones (``benchmarks/cells_a2/``, then the cell cache ``runs/protocol_a2``) and

* makes stage 1's choices on validation only: each baseline's grid point, CSM's coordinate-wise steps, the best
  other method before and after TS (:func:`stage1_choices`);
* names the cells that can run next, so that each stage starts once the choices it needs are made (``--next``):
  stage 1, then 2 (a method's stage-2 seeds once its own choice is made), then 3-5, a later stage of a setting once
  the setting its choices come from has finished stage 2;
* writes ``benchmarks/calibration_a2.md``: the grids and choices, stage 2's paired intervals and Holm-corrected
  decisions, stage 3's label variants, stage 4's volume points (and their figure), stage 5's data seeds, and the
  cells' records (commit, threads) (``--report``).

    python benchmarks/amendment2.py --report
    python benchmarks/amendment2.py --next matched      # "<method> <seed>" lines of the runnable cells
    python benchmarks/amendment2.py --next borrowed --data-seed 1   # stage 5's cells of data seed 1

Each line of ``--next SETTING [--data-seed N]`` runs with ``python benchmarks/calibration_bench.py --amendment 2
--recipe SETTING [--data-seed N] --methods METHOD --seeds SEED`` (methods of one seed list together).
"""
from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import calibration_methods as method_table
import calibration_pages as pages
from timm_csm.hub import content_fingerprint, csm_dataset_problem
from timm_csm.io import write_json_atomic, write_text_atomic
from timm_csm.metrics import PairedInterval, detectable_difference, interval_text, paired_t_interval
from timm_csm.recipes.cells import read_json
from timm_csm.study import load_spec
from timm_csm.study.cells import cell_rows, finished_cells
from timm_csm.study.choose import axis_value, seed_mean
from timm_csm.study.decide import Decision, comparison_pairs, decide
from timm_csm.study.plan import setting_plan

__all__ = ["a2_cells", "stage1_choices", "next_cells", "later_stage_cells", "stage3_setting", "stage3_variants",
           "primary_decisions", "label_confidence", "json_rows", "write_page", "main"]

PAGE = Path("benchmarks/calibration_a2.md")
#: stages 1 and 2 of amendment 2 as a study spec (a test holds it to PROTOCOL.md's grids, seeds and decision)
SPEC = load_spec(Path(__file__).resolve().with_name("study_fmnist_a2.toml"))
#: the settings of stage 2's decision, and its family of primary comparisons (Holm over all of them): the CSM row of
#: each decision setting minus CE and minus the best other method (before TS); Holm's strictest level is alpha over
#: their number
DECISION_SETTINGS = SPEC.decision.settings
FAMILY_ALPHA = SPEC.decision.family_alpha
PRIMARY_COMPARISONS = SPEC.decision.comparisons()
#: the training seeds of stages 3 and 5, and stage 5's data seeds (real subsets)
LATER_SEEDS = (0, 1, 2, 3, 4)
DATA_SEEDS = (0, 1, 2)
#: stage 5's generated set: the borrowed one, which does not depend on the real subset
STAGE5_SETTING = "borrowed"
#: stage 4's generated images: 6 750 groups x 4 ratios at volume 1
IMAGES_PER_VOLUME = 27000
#: the settings whose annotator (and KD's teacher) is the borrowed encoder, trained on 54 000 training images; and how
#: many of each data seed's 2 000 validation images it learned from (matched_setting.borrowed_encoder_overlap; a test
#: recomputes them)
BORROWED_ENCODER_SETTINGS = ("annotated", "borrowed")
BORROWED_ENCODER_SAW_VAL = {0: 1787, 1: 1769, 2: 1820}
#: the mean max-probability of each generated set's labels, by the set's fingerprint (committed: the derived sets
#: stay outside git)
LABEL_CACHE = Path("benchmarks/cells_a2_labels.json")


def a2_cells(setting: str, output: Path = Path(method_table.A2_OUTPUT), committed: Path = method_table.COMMITTED_A2,
             data_seed: int = 0, amendment: int = 2) -> Dict[str, Dict[int, Dict[str, Any]]]:
    """``{method: {seed: {"results", "seconds", "dir", "record", "config"}}}`` of the finished cells of
    ``amendment`` (2 by default) of ``setting`` on the real subset of ``data_seed``: those shared by every setting
    and the setting's own; committed ones first (:func:`timm_csm.study.cells.finished_cells`)."""
    return finished_cells([committed, Path(output) / "cells"], setting, data_seed,
                          lambda meta: meta.get("record", {}).get("amendment") == amendment)


#: each method's per-seed rows of :func:`a2_cells` (amendments 3 and 4 read them by this name)
_rows = cell_rows


def stage1_choices(setting: str, rows: Dict[str, List[Dict[str, Any]]]) -> Dict[str, Any]:
    """Stage 1's choices of ``setting`` on the spec's grids and CSM search (:func:`timm_csm.study.plan.setting_plan`),
    each None while pending: every baseline's configuration (KD's too where the setting's annotator is its teacher),
    CSM's steps and row, and the best other method before and after TS."""
    return setting_plan(SPEC, setting, rows).choices


def _done(rows) -> set:
    return {(m, r["seed"]) for m, rs in rows.items() for r in rs}


def _stage12_cells(setting: str, rows: Dict[str, List[Dict[str, Any]]]) -> Tuple[List[Tuple[str, int]], bool]:
    """Stage 1's and 2's cells of ``setting`` still to run (stage 2's once stage 1's choices are made; no choice
    reads a stage-2 cell, so CE, RegMixup and the best other method need not wait for CSM's search), and whether
    stage 2 has finished."""
    plan = setting_plan(SPEC, setting, rows)
    todo, choices = plan.ready(), plan.choices
    return todo, not todo and choices["csm"] is not None and None not in choices["best_other"].values()


def next_cells(setting: str, rows: Dict[str, List[Dict[str, Any]]],
               all_rows: Optional[Dict[str, Dict[str, List[Dict[str, Any]]]]] = None,
               data_seed: int = 0) -> List[Tuple[str, int]]:
    """The cells of ``setting`` (on the real subset of ``data_seed``, whose rows are ``rows``) that can run now, in
    the protocol's order: stage 1's grids and CSM's current step at seeds 0-2, then (once its choices are made)
    stage 2's methods at seeds 3-14, then the cells of stages 3-5 that :func:`later_stage_cells` allows.
    ``all_rows``: every setting's rows on data seed 0, which the later stages' choices read."""
    all_rows = dict(all_rows or {})
    if data_seed == 0:
        all_rows[setting] = rows
    todo = _stage12_cells(setting, rows)[0] if data_seed == 0 else []
    entries = later_stage_cells(all_rows).get((setting, data_seed), [])
    done = _done(rows) | set(todo)
    later = [(m, s) for s in sorted({s for _, seeds in entries for s in seeds}) for m, seeds in entries
             if s in seeds and (m, s) not in done]
    return todo + list(dict.fromkeys(later))


# ---------------------------------------------------------------------------------------------------------------
# stages 3-5: configurations made of stage 1's choices
# ---------------------------------------------------------------------------------------------------------------
def _csm_values(name: str) -> Dict[str, Any]:
    return {axis: axis_value(name, axis) for axis, _ in method_table.CSM_TUNING_STEPS}


def stage3_setting(all_rows: Dict[str, Dict[str, List[Dict[str, Any]]]]) -> Optional[str]:
    """The decision setting whose CSM row has the lower mean validation ECE before TS over seeds 0-2 (stage 3's,
    and stage 4's second); None until both rows are chosen."""
    rows = {s: all_rows.get(s, {}) for s in DECISION_SETTINGS}
    csm = {s: stage1_choices(s, r)["csm"] for s, r in rows.items()}
    if None in csm.values():
        return None
    return min(DECISION_SETTINGS, key=lambda s: seed_mean(rows[s][csm[s]], "val_ece_pre_ts",
                                                          method_table.A2_TUNING_SEEDS))


def stage3_variants(csm_row: str) -> List[Tuple[str, str]]:
    """``(what, configuration)`` of stage 3: the CSM row (its weight, n_aug and filter) at its chosen s, at the
    paper's s = 2.3 and 4, and with hard, lambda and softmax labels; each configuration once."""
    values = _csm_values(csm_row)
    s = values["s"]
    variants = [(f"CSM row (s {s if isinstance(s, str) else format(s, 'g')})", csm_row)]
    variants += [(f"s = {v:g}", method_table.tuned_name("csm", **dict(values, s=v))) for v in (2.3, 4.0)]
    variants += [(f"{label} labels", method_table.tuned_name("csm", **dict(values, s="auto", label=label)))
                 for label in method_table.LABELS[1:]]
    first: Dict[str, str] = {}
    for what, name in variants:
        first.setdefault(name, what)
    return [(what, name) for name, what in first.items()]


def stage4_points(csm_row: str) -> List[Tuple[int, str]]:
    """``(volume, configuration)`` of stage 4: the CSM row on the setting's set and on its 2x and 4x sets."""
    return [(v, method_table.tuned_name("csm", **dict(_csm_values(csm_row), volume=v))) for v in method_table.VOLUMES]


def stage5_methods(choices: Dict[str, Any]) -> Optional[List[Tuple[str, str]]]:
    """``(what, configuration)`` of stage 5 from the ``annotated`` choices: CE, RegMixup and KD at their chosen
    values, the CSM row (read on the borrowed set); None until they are made."""
    picks = [("CE", "ce"), ("RegMixup", choices["chosen"].get("regmixup")), ("KD", choices["chosen"].get("kd")),
             ("CSM", choices["csm"])]
    return None if any(name is None for _, name in picks) else picks


def later_stage_cells(all_rows: Dict[str, Dict[str, List[Dict[str, Any]]]]
                      ) -> Dict[Tuple[str, int], List[Tuple[str, Tuple[int, ...]]]]:
    """Stages 3-5's cells by (setting, data seed), as (configuration, seeds): stage 3's in the setting of
    :func:`stage3_setting`, stage 4's volumes in ``matched`` (and in ``annotated`` when it is stage 3's setting),
    stage 5's in ``borrowed`` at data seeds 0-2 with the ``annotated`` choices; each once the choices it needs are
    made and the setting they come from has finished stage 2 (PROTOCOL.md: stage 1, then 2, then 3-5)."""
    finished = {s: _stage12_cells(s, all_rows.get(s, {}))[1] for s in DECISION_SETTINGS}
    csm = {s: stage1_choices(s, all_rows.get(s, {}))["csm"] for s in DECISION_SETTINGS}
    out: Dict[Tuple[str, int], List[Tuple[str, Tuple[int, ...]]]] = {}
    third = stage3_setting(all_rows)
    if third is not None and finished[third]:
        out.setdefault((third, 0), []).extend((name, LATER_SEEDS) for _, name in stage3_variants(csm[third]))
    for setting in ["matched"] + (["annotated"] if third == "annotated" else []):
        if finished[setting]:
            out.setdefault((setting, 0), []).extend((name, method_table.A2_SEEDS)
                                                    for v, name in stage4_points(csm[setting]) if v != 1)
    fifth = stage5_methods(stage1_choices("annotated", all_rows.get("annotated", {})))
    if fifth is not None and finished["annotated"]:
        for data_seed in DATA_SEEDS:
            out.setdefault((STAGE5_SETTING, data_seed), []).extend((name, LATER_SEEDS) for _, name in fifth)
    return out


def primary_decisions(summaries: Dict[str, Dict[str, Any]], seeds: Sequence[int] = method_table.A2_SEEDS
                      ) -> Decision:
    """Stage 2's four primary comparisons (CSM row minus CE and minus the best other method, test ECE before TS,
    ``matched`` and ``annotated``), Holm-corrected as one family (:func:`timm_csm.study.decide.decide`); per setting
    "holds", "does not hold" or "pending" (below ``len(seeds)`` paired seeds, amendment 2's 15 by default, or a
    choice still open)."""
    choices = {setting: summaries[setting]["choices"] for setting in DECISION_SETTINGS}
    return decide(comparison_pairs(choices, SPEC.decision.others, SPEC.decision.metric),
                  {s: summaries[s]["rows"] for s in DECISION_SETTINGS}, len(seeds), SPEC.decision.metric,
                  FAMILY_ALPHA)


def _fmt(value: Optional[float], digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _grid_lines(rows, names: Sequence[str], pick: Optional[str]) -> List[str]:
    lines = []
    for m in names:
        r = rows.get(m, [])
        seeds = [x["seed"] for x in r if x["seed"] in method_table.A2_TUNING_SEEDS]
        # the means over the seeds finished so far (a choice waits for all three)
        means = [seed_mean(r, k, seeds) if seeds else None for k in ("val_ece_pre_ts", "val_nll_pre_ts",
                                                                      "val_ece_post_ts", "ece_pre_ts", "ece_post_ts")]
        label = method_table.get_method(m).label + (" **(chosen)**" if m == pick else "")
        lines.append(f"| {label} | {len(seeds)} | " + " | ".join(
            _fmt(v, 4 if i == 1 else 2) for i, v in enumerate(means)) + " |")
    return lines


def _test_text(test: Optional[PairedInterval]) -> str:
    return "pending" if test is None else interval_text(test)


def _power_text(test: Optional[PairedInterval]) -> str:
    """The comparison's paired sd and the smallest true difference its seeds detect with 80% power, at alpha 0.05
    and at Holm's strictest level over the family."""
    if test is None:
        return "- | -"
    strictest = FAMILY_ALPHA / PRIMARY_COMPARISONS
    return (f"{test.sd:.2f} | {detectable_difference(test.sd, test.n):.2f} / "
            f"{detectable_difference(test.sd, test.n, strictest):.2f}")


#: stage 2's columns, of its rows and of its secondary comparisons: (column, row key of the per-seed rows)
SECONDARY = (("ECE before TS", "ece_pre_ts"), ("ECE after TS", "ece_post_ts"), ("accuracy", "acc_pre_ts"),
             ("AECE", "aece_pre_ts"), ("classwise ECE", "cece_pre_ts"), ("NLL", "nll_pre_ts"),
             ("Brier", "brier_pre_ts"))


def _digits(key: str) -> int:
    """Decimals of a stage-2 column: NLL and Brier are raw values, the others in %."""
    return 4 if key in ("nll_pre_ts", "brier_pre_ts") else 2


def stage2_rows(choices: Dict[str, Any]) -> List[Tuple[str, str]]:
    """``(label, configuration)`` of a setting's stage-2 rows other than CSM's, each configuration once, its label
    naming the roles beyond its own name (e.g. ``RegMixup (alpha 20), best other after TS``)."""
    roles = [("ce", None), (choices["chosen"].get("regmixup"), None),
             (choices["best_other"]["pre_ts"], "best other before TS"),
             (choices["best_other"]["post_ts"], "best other after TS")]
    named: Dict[str, List[str]] = {}
    for name, role in roles:
        if name is not None:
            named.setdefault(name, []).extend([role] if role else [])
    return [(", ".join([method_table.get_method(name).label, *extra]), name) for name, extra in named.items()]


def stage2_section(summaries: Dict[str, Dict[str, Any]], figure: Path) -> List[str]:
    """Stage 2's rows over their seeds (mean ± sd, test split, in %; NLL and Brier raw), the secondary paired
    intervals of the CSM row against each (no claim unless the interval excludes 0), and the decision figure (of the
    decision settings only; the other settings' rows are secondary)."""
    lines, entries = [], []
    for setting in method_table.A2_SETTINGS:
        sm = summaries[setting]
        rows, csm = sm["rows"], sm["choices"]["csm"]
        if csm is None:
            continue
        others = stage2_rows(sm["choices"])
        columns = " | ".join(col for col, _ in SECONDARY) + " |"
        decided = setting in DECISION_SETTINGS
        lines += [f"### `{setting}`: the stage-2 rows (seeds 0-14, test split; before TS except the after-TS "
                  f"column){'' if decided else '; a secondary setting, no decision'}", "",
                  "| row | seeds | " + columns, "|---|---|" + "---|" * len(SECONDARY)]
        for label, name in [(f"CSM row: {method_table.get_method(csm).label}", csm)] + others:
            r = _seeds(rows.get(name, []), method_table.A2_SEEDS)
            lines.append(f"| {label} | {len(r)} | " + " | ".join(
                pages.mean_cell(r, key, _digits(key)) for _, key in SECONDARY) + " |")
        lines += ["", "Secondary: the CSM row minus each row, paired 95% t-intervals over the common seeds "
                  "(unadjusted; no claim unless the interval excludes 0):", "",
                  "| minus | " + columns, "|---|" + "---|" * len(SECONDARY)]
        for label, name in others:
            tests = {key: _paired(rows, csm, name, key, method_table.A2_SEEDS) for _, key in SECONDARY}
            lines.append(f"| {label} | " + " | ".join(interval_text(tests[key], _digits(key))
                                                      for _, key in SECONDARY) + " |")
            if not decided:  # the figure shows the decision settings only
                continue
            primary = name in ("ce", sm["choices"]["best_other"]["pre_ts"])
            for phase, group in (("pre_ts", "before TS"), ("post_ts", "after TS")):
                entries.append((group, f"{setting}: vs {method_table.get_method(name).label.split(' (')[0]}"
                                + " (P)" * primary, tests[f"ece_{phase}"]))
        lines.append("")
    seeds = sorted({test.n for _, _, test in entries if test is not None})
    if seeds:
        title = f"{seeds[0]}" + (f"-{seeds[-1]}" if len(seeds) > 1 else "")
        decision_figure(entries, figure, f"Amendment 2, stage 2 ({title} of {len(method_table.A2_SEEDS)} seeds): "
                        "CSM row minus each row, test ECE, 95% paired t-intervals (unadjusted);\n(P): a primary "
                        f"comparison before TS, decided under Holm over the {PRIMARY_COMPARISONS} (the table)")
        lines += [f"![Stage 2: the CSM row minus each row, before and after TS]({figure.name})", ""]
    return lines


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
    label = lambda m: method_table.get_method(m).label if m else "pending"  # noqa: E731
    lines += ["", f"Choices: CSM row {label(ch['csm'])}; best other method before TS "
                  f"{label(ch['best_other']['pre_ts'])}, after TS {label(ch['best_other']['post_ts'])}.", ""]
    if setting in BORROWED_ENCODER_SETTINGS:
        lines += [f"The annotator of `{setting}` (and KD's teacher), the borrowed encoder, learned from 54,000 training "
                  f"images, among them {BORROWED_ENCODER_SAW_VAL[0]:,} of the 2,000 validation images these choices "
                  "are made on: a choice on them can favour the methods that use it.", ""]
    return lines


def _differences_text(differences: Sequence[str]) -> str:
    """``N difference(s)``, with the largest relative one among the numbers and the result fields they are in (so
    a reader tells a rounding-level change in the metrics' arithmetic from a different training)."""
    relative, fields = [], set()
    for line in differences:
        match = re.fullmatch(r"(\S+): committed (\S+), now (\S+)", line)
        try:
            before, after = float(match.group(2)), float(match.group(3))
        except (AttributeError, ValueError):
            continue
        relative.append((abs(after - before) / max(abs(before), 1e-12), match.group(1)))
        fields.add(re.sub(r"\[\d+\]", "", match.group(1)).rsplit(".", 1)[-1])
    text = f"{len(differences)} difference(s)"
    if relative:
        size, where = max(relative)
        text += (f", {len(relative)} of them numbers, the largest {size:.2g} relative (`{where}`), in "
                 f"{', '.join(sorted(fields))}")
    return text


#: the verify runs at 7b127d9, whose ``--verify`` printed its verdict but did not yet append to the log: their
#: entries were transcribed from the printed result, and the page says so
TRANSCRIBED_VERIFY_COMMIT = "7b127d9"


def _verify_lines() -> List[str]:
    """The verify runs of committed cells (``calibration_bench.py --verify CELL``), as the protocol asks; a run the
    tool did not log itself is marked as transcribed."""
    runs = read_json(method_table.A2_VERIFY_LOG) if method_table.A2_VERIFY_LOG.exists() else []
    if not runs:
        return ["No cell has been re-run with `--verify` yet.", ""]
    lines = ["Verify runs (a committed cell re-run from its record at a commit):", ""]
    for r in runs:
        what = "reproduced exactly" if r["reproduced"] else _differences_text(r["differences"])
        extra = f"; reported now, not compared: {', '.join(r['not_compared'])}" if r.get("not_compared") else ""
        transcribed = (" (transcribed from the command's printed result: the code at this commit did not write "
                       "the log)" if (r["commit"] or "").startswith(TRANSCRIBED_VERIFY_COMMIT) else "")
        where = f", torch's CPU capability {r['cpu_capability']}" if r.get("cpu_capability") else ""
        lines.append(f"* `{r['cell']}` at {(r['commit'] or '?')[:7]}{'' if r.get('clean') else ' (modified)'}{where}: "
                     f"{what}{extra}{transcribed}.")
    return lines + [""]


def json_rows(cells: Dict[Tuple[str, int], Dict[str, Dict[int, Dict[str, Any]]]]) -> List[Dict[str, Any]]:
    """One row per (setting, data seed, method) with finished cells, in ``calibration.json``'s shape
    (:func:`calibration_pages.per_seed_json_row`) with ``setting`` and ``data_seed``. A cell shared by the settings
    is in each setting's rows."""
    return [pages.per_seed_json_row(method, rows, setting=setting, data_seed=data_seed)
            for (setting, data_seed), found in sorted(cells.items()) for method, rows in sorted(_rows(found).items())]


def write_page(path: Path = PAGE, output: Path = Path(method_table.A2_OUTPUT),
               committed: Path = method_table.COMMITTED_A2, label_cache: Path = LABEL_CACHE) -> str:
    """Write the page (with stage 4's figure, ``<page>_volume.png``, and its rows, ``<page>.json``, beside it) from
    the finished cells."""
    cells = {(st, d): a2_cells(st, output, committed, d) for st in method_table.A2_SETTINGS for d in DATA_SEEDS}
    summaries = {}
    for setting in method_table.A2_SETTINGS:
        rows = _rows(cells[setting, 0])
        summaries[setting] = {"rows": rows, "choices": stage1_choices(setting, rows), "cells": cells[setting, 0]}
    records = list({c["dir"].name: c["record"] for found in cells.values()
                    for runs in found.values() for c in runs.values()}.values())
    commits = sorted({(r.get("commit") or "?")[:7] + ("" if r.get("clean") else " (modified)") for r in records})
    threads = sorted({r.get("torch_threads") for r in records})
    decisions = primary_decisions(summaries)
    lines = ["# Calibration benchmark, amendment 2: the verdict at 15 seeds, every method tuned alike", "",
             "Protocol: [PROTOCOL.md](PROTOCOL.md), amendment 2, committed before its cells. Metrics in %, test split "
             "read only by each cell's final evaluation; every choice on the 2 000 validation images.", "",
             "Commands: `python benchmarks/calibration_bench.py --amendment 2 --recipe SETTING [--data-seed N] "
             "--methods ... --seeds ...` (the cells, from a worktree of the recorded commit), `python "
             "benchmarks/amendment2.py --next SETTING [--data-seed N]` (which cells can run), `python "
             "benchmarks/run_lane.py --cells-tree TREE` (a lane that runs them, two side by side), `python "
             "benchmarks/amendment2.py --report` (this page, and its rows with every seed's numbers, `per_seed`, "
             f"in [{Path(path).with_suffix('.json').name}]({Path(path).with_suffix('.json').name})).", "",
             f"Cells finished: {len(records)}; commits: {', '.join(commits) or '-'}; torch threads: "
             f"{', '.join(map(str, threads)) or '-'}. `python benchmarks/calibration_bench.py --verify CELL` re-runs "
             "one from its record.", "",
             *_verify_lines(),
             "## Stage 2: the decision (CSM row minus the other method, test ECE before TS, paired over 15 seeds, "
             f"Holm over the {PRIMARY_COMPARISONS} primary comparisons)", "",
             "| setting | other method | difference [95% t-interval] | Holm-adjusted p | CSM lower under Holm | "
             f"paired sd | detectable at 80% power (alpha 0.05 / {FAMILY_ALPHA / PRIMARY_COMPARISONS:g}) |",
             "|---|---|---|---|---|---|---|"]
    for c in decisions.comparisons:
        other = method_table.get_method(c.other).label if c.other else "pending"
        lines.append(f"| {c.setting} | {other} | {_test_text(c.test)} | {_fmt(c.p_holm, 4)} | "
                     f"{'-' if c.lower is None else 'yes' if c.lower else 'no'} | {_power_text(c.test)} |")
    lines += [""] + [f"**\"CSM calibrates better\" in `{s}`: {v}.**" for s, v in decisions.verdicts.items()] + [""]
    figure = Path(path).with_name(Path(path).stem + "_decision.png")
    lines += stage2_section(summaries, figure)
    for setting in method_table.A2_SETTINGS:
        lines += setting_section(setting, summaries[setting])
    lines += stage3_section(summaries, label_cache)
    lines += stage4_section(summaries, Path(path).with_name(Path(path).stem + "_volume.png"))
    lines += stage5_section(summaries["annotated"]["choices"],
                            {d: _rows(cells[STAGE5_SETTING, d]) for d in DATA_SEEDS})
    text = "\n".join(lines) + "\n"
    write_json_atomic(Path(path).with_suffix(".json"), json_rows(cells), indent=1)
    write_text_atomic(Path(path), text)
    return text


# ---------------------------------------------------------------------------------------------------------------
# the page's stages 3-5
# ---------------------------------------------------------------------------------------------------------------
def label_confidence(cells: Dict[int, Dict[str, Any]], cache: Path = LABEL_CACHE) -> Optional[float]:
    """The mean max-probability of the labels (``soft_label``) of the generated set ``cells`` read
    (:func:`timm_csm.annotation.soft_label_confidence`), cached in ``cache`` by the set's recorded fingerprint;
    None when no cell records one and no set at the recorded path has it."""
    import numpy as np

    from timm_csm.annotation import soft_label_confidence
    from timm_csm.hub import load_csm_dataset

    cell = next((c for c in cells.values() if c["record"].get("generated_set")), None)
    if cell is None:
        return None
    key = cell["record"]["generated_set"]
    known = read_json(cache) if Path(cache).exists() else {}
    if key not in known:
        path = cell["config"].get("csm_dataset")
        if not path or csm_dataset_problem(path) is not None or content_fingerprint(path) != key:
            return None
        dd = load_csm_dataset(str(path))
        ds = dd["train"] if hasattr(dd, "keys") and "train" in dd else dd
        known[key] = soft_label_confidence(np.asarray(ds["soft_label"]))["mean"]
        write_json_atomic(Path(cache), known, indent=1)
    return known[key]


def _seeds(rows: List[Dict[str, Any]], seeds: Sequence[int]) -> List[Dict[str, Any]]:
    return [r for r in rows if r["seed"] in seeds]


def _paired(rows, a: str, b: str, key: str, seeds: Sequence[int]):
    """The paired interval of ``a`` minus ``b`` over ``seeds`` (``paired_t_interval``), None where either is
    missing."""
    if a not in rows or b not in rows:
        return None
    return paired_t_interval(pages.by_seed(_seeds(rows[a], seeds), key), pages.by_seed(_seeds(rows[b], seeds), key))


def _spread(rows: List[Dict[str, Any]], key: str):
    """The mean of ``key`` and its 95% t-interval over the rows (the one-sample case of a paired interval)."""
    values = pages.by_seed(rows, key)
    return paired_t_interval(values, dict.fromkeys(values, 0.0))


def stage3_section(summaries: Dict[str, Dict[str, Any]], cache: Path = LABEL_CACHE) -> List[str]:
    lines = ["## Stage 3: soft labels with contrast (seeds 0-4; secondary, no Holm)", ""]
    third = stage3_setting({s: sm["rows"] for s, sm in summaries.items()})
    if third is None:
        return lines + ["Pending: the CSM rows of `matched` and `annotated` (stage 1).", ""]
    sm = summaries[third]
    rows, row = sm["rows"], sm["choices"]["csm"]
    lines += [f"Setting `{third}`: its CSM row has the lower mean validation ECE before TS (seeds 0-2). Each "
              "variant keeps the row's weight, n_aug and filter; `max-prob`: the mean over the set's images of "
              "the largest class probability of its label (1: one-hot). Differences: the variant minus the CSM "
              "row, test ECE, paired 95% t-intervals over seeds 0-4.", "",
              "| variant | seeds (of 0-4) | max-prob of labels | test ECE before TS | test ECE after TS | "
              "minus CSM row, before TS | minus CSM row, after TS |", "|---|---|---|---|---|---|---|"]
    for what, name in stage3_variants(row):
        r = _seeds(rows.get(name, []), LATER_SEEDS)
        confidence = label_confidence(sm["cells"].get(name, {}), cache)
        diffs = ["-" if name == row else interval_text(_paired(rows, name, row, f"ece_{phase}", LATER_SEEDS))
                 for phase in ("pre_ts", "post_ts")]
        lines.append(f"| {what}: `{name}` | {len(r)} | {_fmt(confidence, 3)} | "
                     f"{pages.mean_cell(r, 'ece_pre_ts', 2)} | {pages.mean_cell(r, 'ece_post_ts', 2)} | "
                     f"{diffs[0]} | {diffs[1]} |")
    return lines + [""]


def stage4_section(summaries: Dict[str, Dict[str, Any]], figure: Path) -> List[str]:
    lines = ["## Stage 4: volume beyond 27 000 generated images (15 seeds; secondary, unadjusted)", ""]
    third = stage3_setting({s: sm["rows"] for s, sm in summaries.items()})
    series: Dict[str, Dict[str, Any]] = {}
    table = ["| setting | generated images | seeds | test ECE before TS | test ECE after TS | minus RegMixup, before "
             "TS | minus RegMixup, after TS | minus 1x, before TS | minus 1x, after TS |", "|---" * 9 + "|"]
    for setting in ["matched"] + (["annotated"] if third == "annotated" else []):
        sm = summaries[setting]
        row, regmixup = sm["choices"]["csm"], sm["choices"]["chosen"]["regmixup"]
        if row is None or regmixup is None:
            lines.append(f"`{setting}`: pending (the CSM row and RegMixup's alpha, stage 1).")
            continue
        rows = sm["rows"]
        points = stage4_points(row)
        phases = ("pre_ts", "post_ts")
        series[setting] = {"regmixup": {ph: _spread(rows.get(regmixup, []), f"ece_{ph}") for ph in phases},
                           "points": []}
        for volume, name in points:
            r = rows.get(name, [])
            series[setting]["points"].append((IMAGES_PER_VOLUME * volume, {
                ph: _spread(r, f"ece_{ph}") for ph in phases}))
            diffs = [interval_text(_paired(rows, name, other, f"ece_{ph}", method_table.A2_SEEDS))
                     if other != name else "-" for other in (regmixup, row) for ph in phases]
            table.append(f"| {setting} | {IMAGES_PER_VOLUME * volume:,} | {len(r)} | "
                         f"{pages.mean_cell(r, 'ece_pre_ts', 2)} | {pages.mean_cell(r, 'ece_post_ts', 2)} | "
                         + " | ".join(diffs) + " |")
    if not series:
        return lines + [""]
    lines += ["The CSM row's configuration on the setting's set and on 2x and 4x its groups (the first 6 750 the "
              "same images); differences in test ECE points, paired 95% t-intervals over the common seeds of 0-14.",
              "", *table, ""]
    drawn = any(i is not None for sr in series.values() for _, ph in sr["points"] for i in ph.values())
    if drawn:
        volume_figure(series, figure)
        lines += [f"![Test ECE against generated images, 95% intervals, RegMixup's band]({figure.name})", ""]
    return lines


def volume_figure(series: Dict[str, Dict[str, Any]], path: Path) -> Path:
    """Test ECE before and after TS against generated images, one row of panels per setting: each point's mean and
    95% t-interval over its seeds, RegMixup's mean and interval as a band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(series), 2, figsize=(8.4, 3.2 * len(series)), squeeze=False, sharey="row")
    for row, (setting, sr) in zip(axes, series.items()):
        for ax, (phase, name) in zip(row, (("pre_ts", "before TS"), ("post_ts", "after TS"))):
            band = sr["regmixup"][phase]
            if band is not None:
                ax.axhspan(band[2], band[3], color="tab:orange", alpha=0.2, lw=0)
                ax.axhline(band[1], color="tab:orange", lw=1, label=f"RegMixup, 95% interval (n={band[0]})")
            drawn = [(x, i) for x, ph in sr["points"] for i in [ph[phase]] if i is not None]
            if drawn:
                ax.errorbar([x for x, _ in drawn], [i[1] for _, i in drawn],
                            yerr=[[i[1] - i[2] for _, i in drawn], [i[3] - i[1] for _, i in drawn]], fmt="o-",
                            color="tab:blue", capsize=3, label="CSM row")
            xs = [x for x, _ in sr["points"]]
            ax.set_xscale("log")
            ax.set_xlim(min(xs) / 1.3, max(xs) * 1.3)
            ax.set_xticks(xs, [f"{x:,}" for x in xs])
            ax.minorticks_off()
            ax.set_title(f"{setting}: test ECE {name}", fontsize=10)
            ax.set_xlabel("generated images")
            ax.legend(fontsize=8)
        row[0].set_ylabel("ECE (%)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def stage5_section(choices: Dict[str, Any], rows_by_data_seed: Dict[int, Dict[str, List[Dict[str, Any]]]]
                   ) -> List[str]:
    lines = ["## Stage 5: other real subsets (data seeds 0-2, seeds 0-4, the borrowed generated set; secondary, "
             "unadjusted)", ""]
    methods = stage5_methods(choices)
    if methods is None:
        return lines + ["Pending: the `annotated` choices of RegMixup, KD and the CSM row (stage 1).", ""]
    csm = methods[-1][1]
    lines += ["CE, RegMixup and KD at their `annotated` choices, CSM at the `annotated` row's configuration on the "
              "borrowed set. CSM minus each method, test ECE: paired 95% t-intervals over the 3 data-seed means "
              "(first: the interval that also covers the choice of images), per data seed (over seeds 0-4), and over "
              "the 15 (data seed, seed) pairs (which leaves the choice of images out). The borrowed encoder (the "
              "annotator and KD's teacher) learned from 54,000 training images, among them "
              f"{' / '.join(f'{BORROWED_ENCODER_SAW_VAL[d]:,}' for d in DATA_SEEDS)} of the 2,000 validation images of "
              f"data seeds {' / '.join(map(str, DATA_SEEDS))}.", "",
              "| CSM minus | phase | 3 data-seed means | data seed 0 | data seed 1 | data seed 2 | 15 pairs |",
              "|---|---|---|---|---|---|---|"]
    for what, other in methods[:-1]:
        for phase, name in (("pre_ts", "before TS"), ("post_ts", "after TS")):
            key = f"ece_{phase}"
            per = {d: _paired(rows, csm, other, key, LATER_SEEDS) for d, rows in rows_by_data_seed.items()}
            pairs = [{(d, s): v for d, rows in rows_by_data_seed.items() if m in rows
                      for s, v in pages.by_seed(_seeds(rows[m], LATER_SEEDS), key).items()} for m in (csm, other)]
            # a data seed's mean difference once all its seeds are paired
            means = {d: i[1] for d, i in per.items() if i is not None and i[0] == len(LATER_SEEDS)}
            over_means = paired_t_interval(means, dict.fromkeys(means, 0.0))
            cells = [over_means] + [per[d] for d in DATA_SEEDS] + [paired_t_interval(*pairs)]
            lines.append(f"| {what} (`{other}`) | {name} | " + " | ".join(map(interval_text, cells)) + " |")
    return lines + [""]


def decision_figure(entries: Sequence[Tuple[str, str, Optional[Dict[str, float]]]], path: Path,
                    title: str) -> Path:
    """A forest plot of paired differences: one row per ``(group, label, test)`` (a :class:`PairedInterval`), the mean and
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
            below = test.high < 0
            ax.errorbar(test.mean, y, xerr=[[test.mean - test.low], [test.high - test.mean]],
                        fmt="o", color="tab:green" if below else "tab:red" if test.low > 0 else "tab:gray",
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


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--report", action="store_true", help=f"write {PAGE}")
    p.add_argument("--next", choices=method_table.A2_SETTINGS, default=None,
                   help="print the cells of this setting that can run now, one '<method> <seed>' per line")
    p.add_argument("--data-seed", type=int, default=0, choices=DATA_SEEDS,
                   help="with --next: the real subset (stage 5's data seeds 1 and 2; default 0)")
    p.add_argument("--output", default=method_table.A2_OUTPUT, help="the cell cache (default %(default)s)")
    args = p.parse_args(argv)
    if args.next:
        all_rows = {st: _rows(a2_cells(st, Path(args.output))) for st in method_table.A2_SETTINGS}
        rows = _rows(a2_cells(args.next, Path(args.output), data_seed=args.data_seed))
        for m, s in next_cells(args.next, rows, all_rows, args.data_seed):
            print(m, s)
    if args.report:
        write_page(output=Path(args.output))
        print(f"wrote {PAGE}")


if __name__ == "__main__":
    main()
