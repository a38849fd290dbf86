"""What a study cost and what it still runs, for its page (:mod:`.report`): each method's cell seconds and, for the
methods that read a generated set or a teacher, the time that set took to build and how many images it generated
(``cost``); the cells that can run now (``pending``)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..recipes.cells import read_json
from .cells import cell_rows
from .later_stages import later_stage_cells
from .methods import get_method
from .plan import setting_plan
from .spec import StudySpec

__all__ = ["cell_seconds", "generated_images", "set_costs", "cost_section", "pending_section"]

#: the stages of a generated set's build record, in order, and how the page names them
BUILD_STAGES = (("generator", "generator training"), ("generated", "generation"),
                ("csm", "annotation (with its encoder's training where it trains one)"))


def cell_seconds(cell: Mapping[str, Any]) -> Tuple[Optional[float], str]:
    """A cell's CPU seconds where it recorded them (``cpu_seconds``), else its wall seconds (the cells run one torch
    thread each): ``(seconds, "cpu" or "wall")``."""
    if cell.get("cpu_seconds") is not None:
        return float(cell["cpu_seconds"]), "cpu"
    return (None if cell.get("seconds") is None else float(cell["seconds"])), "wall"


def generated_images(command: Sequence[str]) -> Optional[int]:
    """The images a generation command makes: ``--num-groups`` times ``--num-lambdas`` (None where it names
    neither)."""
    values = {flag: int(command[i + 1]) for i, flag in enumerate(command[:-1])
              if flag in ("--num-groups", "--num-lambdas")}
    return values["--num-groups"] * values["--num-lambdas"] if len(values) == 2 else None


def set_costs(builds: Optional[Path]) -> Dict[str, Dict[str, Any]]:
    """``{setting: {stage: seconds, "images": generated images}}`` of a build record (``{"settings": {setting:
    {stage: {"command", "seconds"}}}}``, as the generated sets' builder writes it); empty without one."""
    if builds is None or not Path(builds).exists():
        return {}
    out = {}
    for setting, stages in read_json(builds).get("settings", {}).items():
        entry = {stage: stages[stage]["seconds"] for stage, _ in BUILD_STAGES if stage in stages}
        command = stages.get("generated", {}).get("command")
        entry["images"] = generated_images(command) if command else None
        out[setting] = entry
    return out


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f}"


def _method_line(method: str, cells: List[Tuple[Optional[float], str]], built: List[Dict[str, Any]]) -> str:
    """A method's cost line: its cells and their seconds; where it reads a generated set (CSM) the images and build
    time of the sets of its settings, where it reads a teacher (KD) the annotation stage that trains it."""
    seconds = [s for s, _ in cells if s is not None]
    base = get_method(method)
    total = f"{_hours(sum(seconds))} | {sum(seconds) / 60 / len(seconds):.1f}" if seconds else "- | -"
    stages = [sum(b.get(stage, 0.0) for b in built) for stage, _ in BUILD_STAGES]
    if base.csm is None:  # KD reads the annotator's encoder, trained in the annotation stage
        stages = [0.0, 0.0, stages[2]] if base.teacher else []
    images = sum(b.get("images") or 0 for b in built) if base.csm else 0
    return (f"| {base.label.split(' (')[0]} | {len(cells)} | {total} | {f'{images:,}' if images else '-'} | "
            + (" / ".join(map(_hours, stages)) if stages and built else "-") + " |")


def _link(target: Path, page_dir: Path) -> str:
    """``target`` as a link from a page in ``page_dir`` (relative, with forward slashes)."""
    return Path(os.path.relpath(Path(target).resolve(), Path(page_dir).resolve())).as_posix()


def cost_section(spec: StudySpec, cells: Mapping[Tuple[str, int], Any], builds: Optional[Path],
                 page_dir: Path = Path(".")) -> List[str]:
    """Per method (its configurations together): its cells, their seconds in all and per cell; for a method that
    reads a generated set or a teacher, the build time of the sets of the settings it runs in (the set's own
    generator, the generation, the annotation that also trains the annotator, KD's teacher) and their images."""
    unique = {c["dir"].name: (m, c) for found in cells.values() for m, runs in found.items() for c in runs.values()}
    per_method: Dict[str, List[Tuple[Optional[float], str]]] = {}
    settings_of: Dict[str, set] = {}
    for (setting, _), found in cells.items():
        for m in found:
            settings_of.setdefault(m.partition("@")[0], set()).add(setting)
    for m, cell in unique.values():
        per_method.setdefault(m.partition("@")[0], []).append(cell_seconds(cell))
    sets = set_costs(builds)
    kinds = {kind for found in per_method.values() for _, kind in found}
    measure = "CPU seconds" if kinds == {"cpu"} else "wall seconds of one-thread cells" if kinds == {"wall"} else \
        "CPU seconds where recorded, else wall seconds (one thread)"
    lines = ["## Cost", "", f"Cells: {measure}. A method that reads a generated set (CSM) or a teacher (KD) also "
             "costs the sets of the settings it ran in, built once and shared by its configurations: "
             + (f"their build times from [{Path(builds).name}]({_link(builds, page_dir)})." if sets else
                "no build record is given (`[report] builds`).")
             + " Sets derived from them (other labels, filtered groups, larger volumes) are not counted.", "",
             "| method | cells | cell hours, all | cell minutes, mean | generated images read | set build hours "
             "(generator / generation / annotation) |", "|---|---|---|---|---|---|"]
    for method in sorted(per_method):
        lines.append(_method_line(method, per_method[method], [sets[s] for s in sorted(settings_of[method])
                                                               if s in sets]))
    if sets:
        lines += ["", "| setting | images generated | " + " | ".join(name for _, name in BUILD_STAGES)
                  + " (hours) |", "|---|---|" + "---|" * len(BUILD_STAGES)]
        for setting, entry in sets.items():
            images = f"{entry['images']:,}" if entry["images"] else "- (another setting's images)"
            lines.append(f"| {setting} | {images} | " + " | ".join(
                _hours(entry[stage]) if stage in entry else "-" for stage, _ in BUILD_STAGES) + " |")
    return lines + [""]


def pending_section(spec: StudySpec, cells: Mapping[Tuple[str, int], Mapping[str, Any]]) -> List[str]:
    """Per setting, the stage-1 and stage-2 cells that can run now and the first of them; then, per setting and
    data seed, the later stages' cells not yet run (:func:`.later_stages.later_stage_cells`)."""
    rows = {key: cell_rows(found) for key, found in cells.items()}
    study_rows = {setting: rows.get((setting, spec.data.data_seed), {}) for setting in spec.settings}
    lines = ["## Pending", ""]
    for setting in spec.settings:
        ready = setting_plan(spec, setting, study_rows[setting]).ready()
        lines.append(f"- `{setting}`: {len(ready)} cell(s) can run now"
                     + (f", next `{ready[0][0]}` seed {ready[0][1]}" if ready else ""))
    for (setting, data_seed), entries in sorted(later_stage_cells(spec, study_rows).items()):
        done = {(m, r["seed"]) for m, found in rows.get((setting, data_seed), {}).items() for r in found}
        todo = [(m, s) for m, seeds in entries for s in seeds if (m, s) not in done]
        if todo:
            lines.append(f"- `{setting}`, data seed {data_seed}, later stages: {len(todo)} cell(s) not yet run, "
                         f"next `{todo[0][0]}` seed {todo[0][1]}")
    return lines + [""]
