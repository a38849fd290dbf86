"""The cells a study spec runs, stage by stage, named as the calibration benchmark names them
(:func:`~.methods.cell_name`): ``<configuration>[-<setting>][-d<data seed>]-s<seed>``.

Stage 1 runs every method's grid and the search's steps reached so far at the tuning seeds; a search step's cells are
known once the step before it has chosen. Stage 2 runs, at the decision seeds, the searched row and the methods the
decision compares it with (each as soon as its own choice is made: no choice reads a stage-2 cell, so the order
changes no number) and the secondary methods' choices. Within a stage the cells are in seed-major order (every
configuration's first seed before any second seed), so a partial run covers every row.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from .choose import stage1_choices
from .decide import BEST_OTHER
from .methods import cell_name, get_method
from .spec import StudySpec

__all__ = ["PlannedCell", "SettingPlan", "stage1_grids", "setting_plan", "plan_cells"]

READY, DONE = "ready", "done"
Rows = Mapping[str, Sequence[Mapping[str, Any]]]


@dataclasses.dataclass(frozen=True)
class PlannedCell:
    """One cell: its ``stage`` (1 or 2), the ``setting`` it depends on (None: shared by the settings), its
    configuration and seed, its name, and whether it is ``"done"`` (a row exists) or ``"ready"`` to run."""

    stage: int
    setting: Optional[str]
    method: str
    seed: int
    name: str
    status: str


@dataclasses.dataclass(frozen=True)
class SettingPlan:
    """One setting's cells known so far, what is still ``pending`` (one line each) and stage 1's ``choices``."""

    setting: str
    cells: Tuple[PlannedCell, ...]
    pending: Tuple[str, ...]
    choices: Mapping[str, Any]

    def ready(self) -> List[Tuple[str, int]]:
        """``(configuration, seed)`` of the cells that can run now, in order."""
        return [(c.method, c.seed) for c in self.cells if c.status == READY]


def stage1_grids(spec: StudySpec, setting: str) -> Dict[str, List[str]]:
    """``{method: its configurations}`` of the spec's methods that run in ``setting``."""
    return {m.name: m.configurations() for m in spec.methods if setting in m.settings}


def _stage2_methods(spec: StudySpec, choices: Mapping[str, Any]) -> List[Optional[str]]:
    others = [o for o in spec.decision.others if o != BEST_OTHER]
    secondary = [choices["chosen"].get(name) for name in spec.decision.secondary]
    best = list(choices["best_other"].values()) if BEST_OTHER in spec.decision.others else []
    return list(dict.fromkeys([*others, *secondary, *best, choices["csm"]]))


def setting_plan(spec: StudySpec, setting: str, rows: Optional[Rows] = None) -> SettingPlan:
    """The cells of ``setting`` known from the per-seed ``rows`` of its finished cells (``{configuration: rows}``):
    stage 1's, then stage 2's of each method whose choice is made."""
    rows = rows or {}
    done = {(m, r["seed"]) for m, found in rows.items() for r in found}
    choices = stage1_choices(rows, stage1_grids(spec, setting), spec.search.steps, spec.search.method,
                             spec.seeds.tuning)
    wanted = [m for names in choices["grids"].values() for m in names]
    wanted += [m for step in choices["csm_steps"] for m in step.configurations]
    planned = [(1, m, s) for s in spec.seeds.tuning for m in dict.fromkeys(wanted)]
    pending = [f"{setting}: search step {axis!r} waits for the choice of step "
               f"{choices['csm_steps'][-1].axis!r}" for axis, _ in spec.search.steps[len(choices["csm_steps"]):]]
    stage2 = _stage2_methods(spec, choices)
    listed = {(m, s) for _, m, s in planned}
    planned += [(2, m, s) for s in spec.seeds.decision for m in stage2 if m is not None and (m, s) not in listed]
    if None in stage2:
        pending.append(f"{setting}: stage 2 of the methods whose stage-1 choice is still open")
    data_seed = spec.data.data_seed
    cells = tuple(PlannedCell(stage, setting if get_method(m).per_setting else None, m, s,
                              cell_name(m, s, setting, data_seed), DONE if (m, s) in done else READY)
                  for stage, m, s in planned)
    return SettingPlan(setting, cells, tuple(pending), choices)


def plan_cells(spec: StudySpec, rows: Optional[Mapping[str, Rows]] = None) -> Tuple[List[PlannedCell], List[str]]:
    """Every setting's :func:`setting_plan`, a cell shared by the settings once: ``(cells, pending lines)``, stage 1's
    cells before stage 2's."""
    plans = [setting_plan(spec, setting, (rows or {}).get(setting)) for setting in spec.settings]
    cells = {c.name: c for plan in plans for c in plan.cells}
    return (sorted(cells.values(), key=lambda c: c.stage),
            [line for plan in plans for line in plan.pending])
