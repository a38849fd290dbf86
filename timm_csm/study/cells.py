"""A study's finished cells, read from their folders: each folder's ``cell.json`` (method, seed, setting, options,
record) and ``results.json``, as :func:`timm_csm.recipes.cells.run_cell` writes them; and their per-seed rows, what
the choices and the decision read (:func:`timm_csm.recipes.cells.per_seed_row`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from ..recipes.cells import CELL_META, RESULTS, per_seed_row, read_json

__all__ = ["finished_cells", "cell_rows"]

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
