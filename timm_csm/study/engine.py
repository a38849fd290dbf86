"""A study run from its spec: stage 1's cells, each choice made on validation, then stage 2's, until nothing is left
that can run (:func:`run_study`, ``timm-csm-study run``).

The loop: plan the cells known from the finished ones (:func:`~.plan.plan_cells`, whose choices read the rows cut to
their validation keys, :func:`~.choose.validation_rows`), run the ready ones through an executor
(:mod:`.executors`), read the finished rows, plan again. Each cell is a keyed folder ``<output>/cells/<cell>/``
(:func:`timm_csm.recipes.cells.run_cell`): a run killed at any point and started again skips the finished cells and
resumes the interrupted one from its ``last.safetensors``; checkpoints stay in that folder, outside any repository.

Pre-registration: every cell records the digest of the spec file it ran under, and ``<output>/study.json`` keeps the
text of the spec its first cell ran under. A spec file that is neither that text nor that text with dated amendments
appended (:func:`~.amendments.spec_status`) is refused before anything runs, in one line.

Methods that read a generated set or a teacher take them per setting (``sources``: ``{setting: {"soft": CSM
dataset, "teacher": reference encoder folder, "annotator": the annotation's encoder}}``); the sets a configuration
derives from the setting's (filtered, hard labels, another scale or labels, :mod:`timm_csm.recipes.derive`) are
written once under ``<output>``. Where the study runs CSM or KD in ``matched`` and neither set nor teacher is given
for it, the engine builds that setting from the cells' own training images first (:mod:`.settings`: generator,
generation, annotation, each stage resumable; given paths win). A cell whose set is not given is listed as not run,
with the reason.
"""
from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

from ..io import write_json_atomic
from ..trainer import progress_bar
from ..recipes import derive
from ..recipes.cells import CELL_META, INSTRUCTION_SET_PINS, RESULTS, instruction_set_problem, read_json, run_cell
from .amendments import SpecError, spec_digest, spec_status
from .cells import study_rows
from .choose import validation_rows
from .executors import create_executor
from .methods import BenchMethod, get_method
from .options import cell_options, study_recipe
from .plan import READY, plan_cells, setting_plan
from .settings import MATCHED, build_matched_setting, needs_matched_setting
from .spec import StudySpec, parse_spec

__all__ = ["STUDY_FILE", "CELLS", "CELL_LOG", "StudyCell", "StudyRun", "check_spec", "choice_rows", "study_choices",
           "setting_data", "run_study_cell", "run_study"]

#: the spec its first cell ran under, kept beside the cells
STUDY_FILE = "study.json"
CELLS = "cells"
#: what a cell prints, in its folder
CELL_LOG = "cell.log"
Sources = Mapping[str, Mapping[str, str]]


@dataclasses.dataclass(frozen=True)
class StudyCell:
    """One cell handed to an executor: everything it needs, picklable."""

    name: str
    method: str
    seed: int
    setting: Optional[str]
    folder: str
    options: Dict[str, Any]
    spec_digest: str
    #: run only with the instruction-set pins in force (refused otherwise)
    pinned: bool = False


@dataclasses.dataclass(frozen=True)
class StudyRun:
    """What a :func:`run_study` did: the cells it ran, those finished of those known, what still waits (``pending``)
    and the cells it could not run, with why (``blocked``)."""

    output: Path
    ran: int
    done: int
    known: int
    pending: Tuple[str, ...]
    blocked: Mapping[str, str]


def _recorded_digests(cells: Path) -> List[Tuple[str, str]]:
    """``(cell, spec digest)`` of every cell under ``cells`` whose record holds one."""
    found = []
    for meta_path in sorted(cells.glob(f"*/{CELL_META}")) if cells.is_dir() else ():
        digest = read_json(meta_path).get("record", {}).get("spec_digest")
        if digest is not None:
            found.append((meta_path.parent.name, digest))
    return found


def check_spec(text: str, output: Path) -> str:
    """The digest of the spec file's ``text``, once it is the spec the study's first cell ran under (or that spec
    with dated amendments appended) and every cell's recorded digest is one of its stages; a one-line
    :class:`~.amendments.SpecError` otherwise."""
    output = Path(output)
    if (output / STUDY_FILE).exists():
        first = read_json(output / STUDY_FILE)
        status = spec_status(first["spec_digest"], text, first.get("spec"))
        if not status.allowed:
            raise SpecError(status.message)
    for cell, digest in _recorded_digests(output / CELLS):
        status = spec_status(digest, text)
        if not status.allowed:
            raise SpecError(f"cell {cell}: {status.message}")
    return spec_digest(text)


def choice_rows(spec: StudySpec, output: Path) -> Dict[str, Dict[str, List[Dict[str, Any]]]]:
    """``{setting: {configuration: per-seed rows}}`` of the finished cells under ``<output>/cells``, each row cut to
    its seed and validation keys: all that the plan's choices are given."""
    cells = Path(output) / CELLS
    finished = cells.is_dir() and any((d / RESULTS).exists() for d in cells.iterdir())
    rows = study_rows(spec, [cells]) if finished else {setting: {} for setting in spec.settings}
    return {setting: validation_rows(found) for setting, found in rows.items()}


def study_choices(spec: StudySpec, output: Path) -> Dict[str, Dict[str, Any]]:
    """Stage 1's choices in each setting (:func:`~.choose.stage1_choices`), made on :func:`choice_rows`."""
    rows = choice_rows(spec, output)
    return {setting: setting_plan(spec, setting, rows[setting]).choices for setting in spec.settings}


def setting_data(method: BenchMethod, setting: Optional[str], sources: Sources, output: Path,
                 recipe: Mapping[str, Any]) -> Tuple[Dict[str, str], Optional[str]]:
    """``(paths, None)``: the generated set (by data key) and teacher ``method`` reads in ``setting``, each derived
    set written once under ``output``; ``({}, why)`` where one is not given or cannot be derived."""
    given = dict(sources.get(setting, {})) if setting is not None else {}
    paths: Dict[str, str] = {}
    if method.teacher:
        if not given.get("teacher"):
            return {}, f"{setting}: no teacher given (--teacher {setting}=DIR)"
        paths["teacher"] = str(given["teacher"])
    key = method.data_key
    if key is None:
        return paths, None
    if key == "real_copies":
        data_seed = recipe.get("data_seed")
        paths[key] = str(derive.derive_real_copies_dataset(
            dict(recipe), Path(output) / ("csm-real-copies" + (f"-d{data_seed}" if data_seed else ""))))
        return paths, None
    if not given.get("soft"):
        return {}, f"{setting}: no generated set given (--generated {setting}=DIR)"
    known, blocked = {"soft": str(given["soft"])}, {}
    base, output = derive.split_data_key(key)[0], Path(output)
    # the benchmark's folder names of the derived sets (benchmarks/calibration_methods.py's DERIVED)
    if base == "hard":
        known["hard"] = str(derive.derive_hard_label_dataset(known["soft"], output / f"csm-hard-labels-{setting}"))
    elif base == "filtered":
        known["filtered"] = str(derive.derive_filtered_dataset(known["soft"], output / f"csm-filtered-{setting}"))
    elif base != "soft":
        return {}, f"{method.name}: its set {base!r} is not one a study derives from the setting's"
    derive.resolve_data_key(key, output, setting, known, blocked, {}, given.get("annotator"))
    if key in blocked:
        return {}, f"{setting}: {blocked[key]}"
    paths[key] = known[key]
    return paths, None


def run_study_cell(cell: StudyCell) -> str:
    """Run one cell (resuming it where it was killed), its output into its folder's ``cell.log``; its name."""
    problem = instruction_set_problem() if cell.pinned else None
    if problem is not None:
        raise RuntimeError(f"cell {cell.name}: {problem}")
    folder = Path(cell.folder)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / CELL_LOG, "a") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        run_cell(dict(cell.options, progress=False), folder, cell.method, cell.seed, log=print, setting=cell.setting,
                 spec_digest=cell.spec_digest)
    return cell.name


def _ready_cells(spec: StudySpec, output: Path, digest: str, recipe: Mapping[str, Any], sources: Sources,
                 blocked: Dict[str, str], pinned: bool) -> Tuple[List[StudyCell], int, int, Tuple[str, ...]]:
    """``(the cells that can run now, cells done, cells known, pending lines)``; a ready cell that cannot run is
    added to ``blocked``."""
    planned, pending = plan_cells(spec, choice_rows(spec, output))
    ready = []
    for c in planned:
        if c.status != READY or c.name in blocked:
            continue
        method = get_method(c.method)
        paths, why = setting_data(method, c.setting, sources, output, recipe)
        if why is not None:
            blocked[c.name] = why
            continue
        folder = Path(output) / CELLS / c.name
        ready.append(StudyCell(c.name, c.method, c.seed, c.setting, str(folder),
                               cell_options(recipe, method, c.seed, folder, paths), digest, pinned))
    return ready, sum(c.status != READY for c in planned), len(planned), tuple(pending)


def _record_first_spec(output: Path, text: str, digest: str, name: str) -> None:
    if not (output / STUDY_FILE).exists():
        write_json_atomic(output / STUDY_FILE, {"study": name, "spec_digest": digest, "spec": text}, indent=1)


def run_study(spec_path: Union[str, Path], output: Union[str, Path], executor: str = "local",
              executor_options: Optional[Mapping[str, Any]] = None, sources: Optional[Sources] = None,
              log: Callable[[str], None] = print, progress: bool = True, pin_instruction_set: bool = False
              ) -> StudyRun:
    """Run the study of the spec file ``spec_path`` into ``output``: round by round, the cells that can run, on
    ``executor`` (:func:`~.executors.create_executor` with ``executor_options``), until none is left. With
    ``pin_instruction_set``, each cell runs with :data:`~timm_csm.recipes.cells.INSTRUCTION_SET_PINS` in its
    worker's environment (amendment 4's cells did: the same numbers on machines with other vector units)."""
    spec_path, output = Path(spec_path), Path(output)
    if not spec_path.is_file():
        raise FileNotFoundError(f"no study spec at {spec_path}")
    text = spec_path.read_text(encoding="utf-8")
    spec = parse_spec(text)
    digest = check_spec(text, output)
    recipe = study_recipe(spec)
    sources = dict(sources or {})
    if needs_matched_setting(spec, sources.get(MATCHED, {})):
        _record_first_spec(output, text, digest, spec.name)
        built = build_matched_setting(spec, output, recipe, log)
        sources[MATCHED] = {**built, **{k: v for k, v in sources.get(MATCHED, {}).items() if v}}
    blocked: Dict[str, str] = {}
    ran, round_ = 0, 0
    options = dict(executor_options or {})
    if pin_instruction_set:
        options["env"] = {**options.get("env", {}), **INSTRUCTION_SET_PINS}
    with create_executor(executor, **options) as runner:
        while True:
            ready, done, known, _ = _ready_cells(spec, output, digest, recipe, sources or {}, blocked,
                                                 pin_instruction_set)
            if not ready:
                break
            round_ += 1
            log(f"round {round_}: {len(ready)} cell(s) to run, {done} of {known} known done ({runner.describe()})")
            _record_first_spec(output, text, digest, spec.name)
            bar = progress_bar(f"round {round_}", total=len(ready), unit="cell", enabled=progress)
            for _ in runner.map_unordered(run_study_cell, ready):
                ran += 1
                bar.update(1)
            bar.close()
    _, done, known, pending = _ready_cells(spec, output, digest, recipe, sources or {}, blocked, pin_instruction_set)
    return StudyRun(output, ran, done, known, pending, dict(blocked))
