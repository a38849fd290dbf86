"""A study's finished cells, read from their folders: each folder's ``cell.json`` (method, seed, setting, options,
record) and ``results.json``, as :func:`timm_csm.recipes.cells.run_cell` writes them; their per-seed rows, what the
choices and the decision read (:func:`timm_csm.recipes.cells.per_seed_row`); and :func:`study_rows`, the rows of a
spec's cells, refusing a cell trained on other data or another model than the spec states.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from ..recipes.cells import CELL_META, RESULTS, per_seed_row, read_json, verify_and_log
from .spec import StudySpec

# the logging verify of one committed cell, as the study command runs it
__all__ = ["finished_cells", "cell_rows", "config_mismatch", "study_rows", "verify_and_log"]

Cells = Dict[str, Dict[int, Dict[str, Any]]]


def finished_cells(roots: Sequence[Path], setting: str, data_seed: int = 0,
                   keep: Optional[Callable[[Dict[str, Any]], bool]] = None) -> Cells:
    """``{method: {seed: {"results", "seconds", "dir", "record", "config", "cpu_seconds"}}}`` of the finished cells
    in the folders ``roots`` (each a folder of cell folders; a missing one holds none) of ``setting`` (its own cells
    and those shared by every setting) on the real subset of ``data_seed``, whose ``cell.json`` passes ``keep``; a
    cell found in an earlier root wins."""
    found: Cells = {}
    for root in [Path(r) for r in roots if Path(r).is_dir()]:
        for d in sorted(root.iterdir()):
            if not ((d / CELL_META).exists() and (d / RESULTS).exists()):
                continue
            meta = read_json(d / CELL_META)
            if meta.get("setting") not in (None, setting) or (meta["config"].get("data_seed") or 0) != data_seed:
                continue
            if keep is not None and not keep(meta):
                continue
            found.setdefault(meta["method"], {}).setdefault(int(meta["seed"]), {
                "results": read_json(d / RESULTS), "seconds": meta.get("seconds"), "dir": d,
                "record": meta.get("record", {}), "config": meta["config"], "cpu_seconds": meta.get("cpu_seconds")})
    return found


def cell_rows(cells: Cells) -> Dict[str, List[Dict[str, Any]]]:
    """``{method: its per-seed rows, by seed}`` of :func:`finished_cells`."""
    return {m: [per_seed_row(s, c) for s, c in sorted(runs.items())] for m, runs in cells.items()}


def config_mismatch(spec: StudySpec, config: Dict[str, Any]) -> Optional[str]:
    """The first training option where a cell's recorded ``config`` differs from what ``spec`` states (the dataset,
    the real-image budget, the validation size, the data seed, the model and the model's options), as ``"<option>:
    the cell has x, the spec states y"``; None when none does."""
    stated = {"dataset": spec.data.dataset, "max_train_samples": spec.data.train_size,
              "val_size": spec.data.val_size, "data_seed": spec.data.data_seed, "model": spec.model.name,
              **dict(spec.model.options)}
    for key, value in stated.items():
        found = config.get(key)
        if found is None and key == "data_seed":  # data seed 0 is recorded as 0 or None
            found = 0
        if (list(found) if isinstance(found, (list, tuple)) else found) != (
                list(value) if isinstance(value, tuple) else value):
            return f"{key}: the cell has {found!r}, the spec states {value!r}"
    return None


def study_rows(spec: StudySpec, roots: Sequence[Path]) -> Dict[str, Dict[str, List[Dict[str, Any]]]]:
    """``{setting: {configuration: per-seed rows}}`` of the finished cells under ``roots`` (folders of cell
    folders), each checked against ``spec`` (:func:`config_mismatch`): a folder that does not exist or holds no
    finished cell, or a cell of another study, is a ``ValueError`` naming it."""
    for root in map(Path, roots):
        if not root.is_dir() or not any((d / CELL_META).exists() and (d / RESULTS).exists() for d in root.iterdir()):
            raise ValueError(f"{root} holds no finished cell folder (cell.json and results.json): give the folder "
                             "of the cell folders, <output>/cells")
    rows = {}
    for setting in spec.settings:
        cells = finished_cells(roots, setting, spec.data.data_seed)
        for runs in cells.values():
            for cell in runs.values():
                problem = config_mismatch(spec, cell["config"])
                if problem is not None:
                    raise ValueError(f"{cell['dir']} is not a cell of study {spec.name!r}: {problem}")
        rows[setting] = cell_rows(cells)
    return rows
