"""Amendment 4 (``benchmarks/PROTOCOL.md``): CSM on the pilot's timm backbone (``benchmarks/pilot_a4.md``), with
amendment 2's data, settings, generated sets and choice rules (:mod:`amendment2`), every method at most 4
configurations, 10 decision seeds. Its design is the study spec ``benchmarks/study_fmnist_a4.toml``: the choices and
the cells that can run come from it through :mod:`timm_csm.study`.

    python benchmarks/amendment4.py --next      # the cells that can run now, each as its command, in order
    python benchmarks/amendment4.py --report    # benchmarks/calibration_a4.md, calibration_a4.json and, once
                                                # stage 2 has CSM rows, calibration_a4_decision.png

A cell runs with ``python benchmarks/calibration_bench.py --amendment 4 ...`` (the instruction-set pins in its
environment) from a worktree of the amendment's commit; finished cells are committed under
``benchmarks/cells_a4/``, their checkpoints kept under ``runs/protocol_a4/cells/``.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import amendment2 as a2
import calibration_methods as method_table
from timm_csm.io import write_json_atomic, write_text_atomic
from timm_csm.recipes.cells import INSTRUCTION_SET_PINS
from timm_csm.study import load_spec
from timm_csm.study.cells import cell_rows, finished_cells
from timm_csm.study.plan import setting_plan
from timm_csm.study.report import (decision_lines, primary_decision, setting_summaries, stage1_lines, stage2_lines,
                                   verify_lines)
from timm_csm.study.report_cost import pending_section
from timm_csm.study.report_tables import grid_lines, per_seed_json_row

__all__ = ["a4_rows", "stage1_choices", "next_cells", "cell_command", "write_page", "main"]

PAGE = Path("benchmarks/calibration_a4.md")
JSON = Path("benchmarks/calibration_a4.json")
OUTPUT = Path(method_table.A4_OUTPUT)
#: amendment-4 cells that read amendment 2's sets before the machine change (PROTOCOL.md, amendment 4's clarification
#: of 2026-12-07): the page reports them apart; they enter no choice and no test
EARLIER_SETS = Path("benchmarks/cells_a4_set_a2")
EARLIER_SET_NOTE = "read amendment 2's set before the machine change; in no choice and no test"
#: amendment 4's design as a study spec (a test holds it to PROTOCOL.md's grids, seeds and backbone)
SPEC = load_spec(Path(__file__).resolve().with_name("study_fmnist_a4.toml"))


def a4_cells(setting: str, output: Path = OUTPUT, committed: Path = method_table.COMMITTED_A4
             ) -> Dict[str, Dict[int, Dict[str, Any]]]:
    """The finished amendment-4 cells of ``setting`` (shared and its own), committed ones first."""
    return a2.a2_cells(setting, output, committed, amendment=4)


def a4_rows(setting: str, output: Path = OUTPUT) -> Dict[str, List[Dict[str, Any]]]:
    return cell_rows(a4_cells(setting, output))


def stage1_choices(setting: str, rows: Dict[str, List[Dict[str, Any]]]) -> Dict[str, Any]:
    """Amendment 2's choices (validation ECE over seeds 0-2, ties by NLL) over the spec's grids and CSM search."""
    return setting_plan(SPEC, setting, rows).choices


def next_cells(setting: str, rows: Dict[str, List[Dict[str, Any]]]) -> List[Tuple[str, int]]:
    """The cells of ``setting`` that can run now (:func:`timm_csm.study.plan.setting_plan`): stage 1's grids and
    CSM's current step at seeds 0-2, then each stage-2 method's seeds 3-9 once its own choice is made (no choice reads
    a stage-2 cell)."""
    return setting_plan(SPEC, setting, rows).ready()


def cell_command(setting: str, method: str) -> str:
    pins = " ".join(f"{k}={v}" for k, v in INSTRUCTION_SET_PINS.items())
    return (f"{pins} OMP_NUM_THREADS=1 python benchmarks/calibration_bench.py --amendment 4 --recipe {setting} "
            f"--methods '{method}' --seeds")


def _cost_lines(cells: Dict[str, Dict[int, Dict[str, Any]]]) -> List[str]:
    """CPU minutes per method family, one thread each, over the cells that ran in one go: a resumed cell records
    the CPU time from its resume only (its epochs before the stop ran in an earlier process), so it is counted
    apart and left out of the mean."""
    families: Dict[str, List[float]] = {}
    resumed: Dict[str, int] = {}
    for method, runs in cells.items():
        label = method_table.get_method(method).label.split(" (")[0]
        for cell in runs.values():
            if cell.get("record", {}).get("resumed"):
                resumed[label] = resumed.get(label, 0) + 1
            elif cell.get("cpu_seconds") is not None:
                families.setdefault(label, []).append(cell["cpu_seconds"])
    mean = {label: sum(cpu) / len(cpu) / 60 for label, cpu in families.items()}
    lines = ["| method | cells run in one go | CPU minutes per cell (mean) | range | mean / CE's | cells resumed after "
             "a stop (left out) |", "|---|---|---|---|---|---|"]
    for label in sorted(set(families) | set(resumed)):
        cpu = [c / 60 for c in families.get(label, [])]
        timed = f"{mean[label]:.1f} | {min(cpu):.1f}-{max(cpu):.1f}" if cpu else "- | -"
        ratio = f"{mean[label] / mean['CE']:.2f}x" if cpu and "CE" in mean else "-"
        lines.append(f"| {label} | {len(cpu)} | {timed} | {ratio} | {resumed.get(label, 0)} |")
    return lines


def _set_lines(cells: Dict[str, Dict[int, Dict[str, Any]]], setting: str) -> List[str]:
    """Each generated set and teacher the setting's cells read, beside the fingerprint amendment 2's cells of the
    same configuration recorded (the sets are rebuilt at amendment 2's build commit); every fingerprint where a
    configuration's cells read more than one (the protocol wants one), and where one differs, the rule that makes it
    amendment 4's."""
    earlier = a2.a2_cells(setting)
    lines, differs = [], False
    for method, runs in sorted(cells.items()):
        for key, what in (("generated_set", "generated set"), ("teacher", "teacher")):
            read = sorted({c["record"][key] for c in runs.values() if key in c["record"]})
            if not read:
                continue
            before = {c["record"].get(key) for c in earlier.get(method, {}).values()} - {None}
            shown = ", ".join(f"`{v[:12]}`" for v in read)
            if len(read) > 1:
                lines.append(f"- `{method}`: its cells read {len(read)} {what}s, {shown} (the protocol wants "
                             "one)")
                continue
            if not before:
                verdict = "no amendment-2 cell of this configuration"
            elif before == set(read):
                verdict = "byte-identical to amendment 2's"
            else:
                differs, verdict = True, "differs from amendment 2's " + ", ".join(sorted(v[:12] for v in before))
            lines.append(f"- `{method}`: {what} {shown}, {verdict}")
    if differs:
        lines.append("- a set or teacher that differs was rebuilt after the machine change and is amendment 4's from "
                     "then on (PROTOCOL.md, amendment 4's clarification of 2026-12-07)")
    return lines


def earlier_cells(setting: str, committed: Path = EARLIER_SETS) -> Dict[str, Dict[int, Dict[str, Any]]]:
    """``setting``'s cells on amendment 2's sets (:data:`EARLIER_SETS`)."""
    return finished_cells([committed], setting, keep=lambda meta: meta.get("record", {}).get("amendment") == 4)


def earlier_set_lines(setting: str, cells: Dict[str, Dict[int, Dict[str, Any]]]) -> List[str]:
    """The table of :func:`earlier_cells` with the set each read; no lines where there are none."""
    if not cells:
        return []
    rows = cell_rows(cells)
    header = ("| configuration | seeds | val ECE before TS | val NLL before TS | val ECE after TS | "
              "test ECE before TS (reported only) | test ECE after TS (reported only) |")
    return (["", f"Cells of `{setting}` on amendment 2's sets, run before the machine change (PROTOCOL.md, amendment "
             "4's clarification of 2026-12-07): re-run on the rebuilt sets; these enter no choice and no "
             f"test (`{EARLIER_SETS.as_posix()}/`).", "", header, "|---|---|---|---|---|---|---|"]
            + grid_lines(rows, sorted(rows), None, SPEC.seeds.tuning) + [""] + _set_lines(cells, setting))


def setting_lines(setting: str, summary: Dict[str, Any], earlier=None) -> List[str]:
    """``setting``'s stage-1 tables and choices (the study's, :func:`stage1_lines`), the sets its cells read, then
    the table of ``earlier``, its cells on amendment 2's sets (:func:`earlier_cells`)."""
    sets = _set_lines(summary.get("cells", {}), setting) or ["- no cell reads a generated set or a teacher yet"]
    return stage1_lines(SPEC, setting, summary) + sets + earlier_set_lines(setting, earlier or {}) + [""]


def body_lines(summaries: Dict[str, Dict[str, Any]], figure: Path, superseded=None) -> List[str]:
    """The page below its heading, from each setting's ``{"rows", "choices", "cells"}``: the decision, stage 2's rows
    with the decision figure (written at ``figure`` once a CSM row has paired seeds), each setting's stage 1."""
    lines = decision_lines(SPEC, primary_decision(SPEC, summaries),
                           claim=f"CSM calibrates better on {method_table.A4_BACKBONE['model']}")
    lines += stage2_lines(SPEC, summaries, figure)
    for setting in method_table.A4_SETTINGS:
        lines += setting_lines(setting, summaries[setting], (superseded or {}).get(setting))
    return lines


def write_page(path: Path = PAGE, json_path: Path = JSON, output: Path = OUTPUT,
               committed: Path = method_table.COMMITTED_A4, earlier: Path = EARLIER_SETS,
               verify_log: Path = method_table.A4_VERIFY_LOG) -> str:
    cells = {s: a4_cells(s, output, committed) for s in method_table.A4_SETTINGS}
    keyed = {(s, SPEC.data.data_seed): found for s, found in cells.items()}
    summaries = setting_summaries(SPEC, keyed)
    rows = {s: summaries[s]["rows"] for s in method_table.A4_SETTINGS}
    superseded = {s: earlier_cells(s, earlier) for s in method_table.A4_SETTINGS}
    # a cell the settings share is found under each; counted once
    records = list({str(c["dir"]): c["record"] for found in cells.values() for runs in found.values()
                    for c in runs.values()}.values())
    commits = sorted({r["commit"][:7] for r in records})
    capabilities = sorted({r.get("cpu_capability") for r in records} - {None})
    backbone = method_table.A4_BACKBONE
    lines = ["# Calibration benchmark, amendment 4: CSM on a timm backbone", "",
             f"Protocol: [PROTOCOL.md](PROTOCOL.md), amendment 4, committed before its cells; backbone chosen by "
             f"[the pilot](pilot_a4.md) on validation only: `{backbone['model']}`, {backbone['epochs']} epochs "
             f"(lr x0.1 at {' and '.join(map(str, backbone['decay_milestones']))}), amendment 2's recipe otherwise. "
             "Metrics in %, the test split read only by each cell's final evaluation; every choice on the 2 000 "
             "validation images.", "",
             f"Cells: {len(records)} finished, at commit(s) {', '.join(commits) or '-'}, one torch thread, torch's "
             f"CPU capability {', '.join(capabilities) or '-'} (pinned). Command: `python benchmarks/amendment4.py "
             "--report`.", ""]
    lines += body_lines(summaries, path.with_name(f"{path.stem}_decision.png"), superseded)
    lines += ["Under shift and out of distribution: [shift_a4.md](shift_a4.md) (`python benchmarks/amendment4_shift.py "
              "--report`).", ""]
    verify = "python benchmarks/calibration_bench.py --verify CELL --amendment 4"
    lines += [f"## Cells re-run (`{verify}`, with the pins)", ""] + verify_lines(verify_log, verify)
    shared = {m: runs for found in cells.values() for m, runs in found.items()}
    lines += ["## Cost (CPU minutes, one thread; the machine ran two cells side by side, from 2026-12-07 with a shift "
              "cell beside them)", "", "Training cells only: CSM's generated sets and annotators and KD's teacher "
              "were built before them, by amendment 2's commands (the `matched` set's stages: [cost.md](cost.md)).",
              ""] + _cost_lines(shared)
    lines += [""] + pending_section(SPEC, keyed)
    text = "\n".join(lines).rstrip("\n") + "\n"
    write_text_atomic(path, text)
    write_json_atomic(json_path, [per_seed_json_row(m, r, setting=s) for s in method_table.A4_SETTINGS
                                  for m, r in sorted(rows[s].items())]
                      + [per_seed_json_row(m, r, setting=s, superseded=EARLIER_SET_NOTE)
                         for s in method_table.A4_SETTINGS for m, r in sorted(cell_rows(superseded[s]).items())],
                      indent=1)
    return text


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--next", action="store_true", help="list the cells that can run now, with their commands")
    p.add_argument("--report", action="store_true", help=f"write {PAGE} and {JSON}")
    p.add_argument("--output", type=Path, default=OUTPUT, help="the cell cache (default %(default)s)")
    args = p.parse_args(argv)
    if not (args.next or args.report):
        p.error("give --next, --report or both")
    if args.next:
        for setting in method_table.A4_SETTINGS:
            for method, seed in next_cells(setting, a4_rows(setting, args.output)):
                print(f"{cell_command(setting, method)} {seed}")
    if args.report:
        print(write_page(output=args.output))


if __name__ == "__main__":
    main()
