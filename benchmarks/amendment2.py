"""Amendment 2 of ``benchmarks/PROTOCOL.md``: the study ``benchmarks/study_fmnist_a2.toml`` (stages 1-2, and the
later stages its ``[report]`` table names), over the library (:mod:`timm_csm.study`). The cells run through
``calibration_bench.py --amendment 2`` (from a worktree of one recorded commit); this script reads the finished ones
(``benchmarks/cells_a2/``, then the cell cache ``runs/protocol_a2``) and

* names the cells that can run next (``--next``): stage 1, then 2 (a method's stage-2 seeds once its own choice is
  made), then 3-5 (:mod:`timm_csm.study.later_stages`), a later stage of a setting once the setting its choices come
  from has finished stage 2;
* writes ``benchmarks/calibration_a2.md`` with its rows and figures (``--report``): the study's page
  (:mod:`timm_csm.study.report`), as ``timm-csm-study report benchmarks/study_fmnist_a2.toml --cells
  benchmarks/cells_a2`` writes it.

    python benchmarks/amendment2.py --report
    python benchmarks/amendment2.py --next matched      # "<method> <seed>" lines of the runnable cells
    python benchmarks/amendment2.py --next borrowed --data-seed 1   # stage 5's cells of data seed 1

Each line of ``--next SETTING [--data-seed N]`` runs with ``python benchmarks/calibration_bench.py --amendment 2
--recipe SETTING [--data-seed N] --methods METHOD --seeds SEED`` (methods of one seed list together).
"""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import calibration_methods as method_table
from timm_csm.study import later_stages, load_spec
from timm_csm.study.cells import cell_rows, finished_cells
from timm_csm.study.decide import Decision
from timm_csm.study.plan import setting_plan
from timm_csm.study.report import json_rows, primary_decision, write_page as write_study_page
from timm_csm.study.report_stages import label_confidence
from timm_csm.study.report_tables import differences_text, grid_lines, power_text, test_text

__all__ = ["a2_cells", "stage1_choices", "next_cells", "later_stage_cells", "stage3_setting", "stage3_variants",
           "primary_decisions", "label_confidence", "json_rows", "write_page", "main"]

SPEC_PATH = Path(__file__).resolve().with_name("study_fmnist_a2.toml")
#: amendment 2 as a study spec (a test holds it to PROTOCOL.md's grids, seeds and decision)
SPEC = load_spec(SPEC_PATH)
PAGE = Path("benchmarks") / SPEC.report.page
#: the settings of stage 2's decision, and its family of primary comparisons (Holm over all of them)
DECISION_SETTINGS = SPEC.decision.settings
FAMILY_ALPHA = SPEC.decision.family_alpha
PRIMARY_COMPARISONS = SPEC.decision.comparisons()
#: the training seeds of stages 3 and 5, and stage 5's data seeds (real subsets) in its setting
LATER_SEEDS = SPEC.report.later_seeds
DATA_SEEDS = SPEC.report.data_seeds
STAGE5_SETTING = SPEC.report.data_seed_setting
#: the borrowed encoder's settings, and how many of each data seed's validation images it learned from
#: (matched_setting.borrowed_encoder_overlap; a test recomputes them)
BORROWED_ENCODER_SETTINGS = SPEC.report.encoder_settings
BORROWED_ENCODER_SAW_VAL = {d: SPEC.report.saw_validation(d) for d in DATA_SEEDS}
LABEL_CACHE = Path("benchmarks") / SPEC.report.label_cache


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
    """Stage 1's choices of ``setting`` (:func:`timm_csm.study.plan.setting_plan`), each None while pending."""
    return setting_plan(SPEC, setting, rows).choices


def stage3_setting(all_rows: Dict[str, Dict[str, List[Dict[str, Any]]]]) -> Optional[str]:
    return later_stages.label_setting(SPEC, all_rows)


def stage3_variants(csm_row: str) -> List[Tuple[str, str]]:
    return later_stages.label_variants(SPEC, csm_row)


def later_stage_cells(all_rows: Dict[str, Dict[str, List[Dict[str, Any]]]]
                      ) -> Dict[Tuple[str, int], List[Tuple[str, Tuple[int, ...]]]]:
    return later_stages.later_stage_cells(SPEC, all_rows)


def next_cells(setting: str, rows: Dict[str, List[Dict[str, Any]]],
               all_rows: Optional[Dict[str, Dict[str, List[Dict[str, Any]]]]] = None,
               data_seed: int = 0) -> List[Tuple[str, int]]:
    """The cells of ``setting`` (on the real subset of ``data_seed``, whose rows are ``rows``) that can run now, in
    the protocol's order: stage 1's and 2's (:func:`timm_csm.study.plan.setting_plan`), then the later stages' that
    :func:`later_stage_cells` allows. ``all_rows``: every setting's rows on data seed 0, which their choices read."""
    all_rows = dict(all_rows or {})
    if data_seed == 0:
        all_rows[setting] = rows
    todo = setting_plan(SPEC, setting, rows).ready() if data_seed == 0 else []
    entries = later_stage_cells(all_rows).get((setting, data_seed), [])
    done = {(m, r["seed"]) for m, rs in rows.items() for r in rs} | set(todo)
    later = [(m, s) for s in sorted({s for _, seeds in entries for s in seeds}) for m, seeds in entries
             if s in seeds and (m, s) not in done]
    return todo + list(dict.fromkeys(later))


def primary_decisions(summaries: Dict[str, Dict[str, Any]], seeds: Sequence[int] = method_table.A2_SEEDS
                      ) -> Decision:
    """Stage 2's primary comparisons, Holm-corrected as one family (:func:`timm_csm.study.report.primary_decision`),
    pending below ``len(seeds)`` paired seeds."""
    return primary_decision(SPEC, summaries, len(seeds))


def _grid_lines(rows, names: Sequence[str], pick: Optional[str]) -> List[str]:
    return grid_lines(rows, names, pick, SPEC.seeds.tuning)


_test_text = test_text
_differences_text = differences_text


def _power_text(test) -> str:
    return power_text(test, FAMILY_ALPHA, PRIMARY_COMPARISONS)


def write_page(path: Path = PAGE, output: Path = Path(method_table.A2_OUTPUT),
               committed: Path = method_table.COMMITTED_A2, label_cache: Path = LABEL_CACHE) -> str:
    """The study's page (:func:`timm_csm.study.report.write_page`) of amendment 2's cells (committed, then the cell
    cache ``output``), with the labels' confidence cached in ``label_cache``."""
    cells = {(st, d): a2_cells(st, output, committed, d) for st in SPEC.settings for d in DATA_SEEDS}
    spec = dataclasses.replace(SPEC, report=dataclasses.replace(SPEC.report,
                                                                   label_cache=str(Path(label_cache).resolve())))
    return write_study_page(spec, cells, Path(path), base=SPEC_PATH.parent)


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
