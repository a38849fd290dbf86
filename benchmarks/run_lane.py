"""One lane of the protocol's remaining cells: amendment 2's (``amendment2.py --next``) and amendment 3's shift cells
(``amendment3.py --next``), each run from a worktree of its amendment's recorded commit, one at a time, until none is
left. Two lanes side by side share the work through a claims folder (a cell is claimed by creating its folder there,
which only one process can do), so they never run the same cell.

    git worktree add ../cells-tree <amendment 2's commit>     # its runs/ a link to this tree's runs/
    git worktree add ../shift-tree <amendment 3's commit>
    OMP_NUM_THREADS=1 python benchmarks/run_lane.py --cells-tree ../cells-tree --shift-tree ../shift-tree &
    OMP_NUM_THREADS=1 python benchmarks/run_lane.py --cells-tree ../cells-tree --shift-tree ../shift-tree &

A finished cell is copied into this tree's ``benchmarks/cells_a2/`` (commit it from there); a cell that did not finish
(killed, or its generated set not built yet) releases its claim and is tried again after ``--retry-after`` seconds.
Stop a lane with a kill: its cell resumes from its cache when a lane runs it again, and its claim is released by
``--release CELL`` (or by removing ``<claims>/<key>``).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence

import amendment2 as a2
import amendment3 as a3
import calibration_methods as method_table
from timm_csm.recipes.cells import RESULTS

CLAIMS = Path("runs/claims")


class Cell(NamedTuple):
    """A cell to run: its ``key`` (the committed folder's name, prefixed ``a3--`` for a shift cell), and the
    command that runs it from its worktree."""

    key: str
    command: List[str]


def amendment2_cells(settings: Sequence[str], output: Path) -> List[Cell]:
    """The amendment-2 cells that can run now, in the protocol's order per setting and data seed; a cell shared
    by settings once."""
    all_rows = {st: a2._rows(a2.a2_cells(st, output)) for st in method_table.A2_SETTINGS}
    cells: Dict[str, Cell] = {}
    for setting in settings:
        for data_seed in a2.DATA_SEEDS:
            rows = all_rows[setting] if data_seed == 0 else a2._rows(a2.a2_cells(setting, output, data_seed=data_seed))
            for method, seed in a2.next_cells(setting, rows, all_rows, data_seed):
                key = method_table.cell_name(method, seed, setting, data_seed)
                cells.setdefault(key, Cell(key, [
                    "benchmarks/calibration_bench.py", "--amendment", "2", "--recipe", setting,
                    *(["--data-seed", str(data_seed)] if data_seed else []), "--methods", method, "--seeds", str(seed),
                    "--no-progress"]))
    return list(cells.values())


def amendment3_cells(a2_output: Path, output: Path) -> List[Cell]:
    """The shift cells that can run now (their amendment-2 cell finished and its checkpoint kept)."""
    return [Cell(f"a3--{name}", ["benchmarks/amendment3.py", "--run", name, "--a2-output", str(a2_output),
                                 "--output", str(output)]) for name in a3.next_cells(a2_output)]


def claim(claims: Path, key: str) -> bool:
    """Claim ``key``: True for the one process whose ``mkdir`` creates its folder."""
    claims.mkdir(parents=True, exist_ok=True)
    try:
        (claims / key).mkdir()
    except FileExistsError:
        return False
    return True


def release(claims: Path, key: str) -> None:
    (claims / key).rmdir()


def finished_file(key: str) -> Path:
    """The file, relative to a tree, that a finished cell leaves: the amendment-2 cell's results, or the shift
    cell's ``shift.json`` in the committed cell folder."""
    if key.startswith("a3--"):
        return method_table.COMMITTED_A2 / key[len("a3--"):] / a3.SHIFT_FILE
    return method_table.COMMITTED_A2 / key / RESULTS


def run_in_tree(cell: Cell, tree: Path, here: Path, log_file: Path) -> bool:
    """Run ``cell`` from ``tree`` (its code on the path, one torch thread unless set; its output appended to
    ``log_file``) and copy its committed folder into ``here``; True when it finished. A shift cell first gets its
    amendment-2 folder, which it writes into."""
    folder = finished_file(cell.key).parent
    if cell.key.startswith("a3--"):
        shutil.copytree(here / folder, tree / folder, dirs_exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "a") as out:
        subprocess.run([sys.executable, *cell.command], cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT)
    if not (tree / finished_file(cell.key)).exists():
        return False
    shutil.copytree(tree / folder, here / folder, dirs_exist_ok=True)
    return True


def run_lane(list_cells: Callable[[], List[Cell]], run: Callable[[Cell], bool], claims: Path,
             retry_after: float = 600.0, wait: float = 300.0, once: bool = False,
             log: Callable[[str], None] = print, clock: Callable[[], float] = time.monotonic,
             sleep: Callable[[float], None] = time.sleep) -> int:
    """Claim and run the listed cells until none is left (``once``: until none can run now); a cell that does not
    finish releases its claim and is not tried again for ``retry_after`` seconds. The number of cells finished."""
    failed: Dict[str, float] = {}
    finished = 0
    while True:
        now = clock()
        cell = next((c for c in list_cells() if now - failed.get(c.key, -retry_after) >= retry_after
                     and claim(claims, c.key)), None)
        if cell is None:
            if once:
                return finished
            log(f"{time.strftime('%H:%M:%S')} nothing runnable now; looking again in {wait:.0f} s")
            sleep(wait)
            continue
        log(f"{time.strftime('%H:%M:%S')} start {cell.key}")
        if run(cell):
            finished += 1
            log(f"{time.strftime('%H:%M:%S')} finished {cell.key}")
        else:
            release(claims, cell.key)
            failed[cell.key] = clock()
            log(f"{time.strftime('%H:%M:%S')} {cell.key} did not finish; released, tried again in {retry_after:.0f} s")


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cells-tree", type=Path, default=None,
                   help="the worktree of amendment 2's recorded commit (without it, no amendment-2 cell runs)")
    p.add_argument("--shift-tree", type=Path, default=None,
                   help="the worktree of amendment 3's recorded commit (without it, no shift cell runs)")
    p.add_argument("--settings", nargs="+", default=list(method_table.A2_SETTINGS),
                   choices=method_table.A2_SETTINGS, help="amendment 2's settings, in the order tried")
    p.add_argument("--shift-first", action="store_true",
                   help="run the pending shift cells before amendment 2's (default: after)")
    p.add_argument("--a2-output", type=Path, default=Path(method_table.A2_OUTPUT),
                   help="amendment 2's cell cache, with the kept checkpoints (default %(default)s)")
    p.add_argument("--a3-output", type=Path, default=a3.OUTPUT, help="the shift cells' runs (default %(default)s)")
    p.add_argument("--claims", type=Path, default=CLAIMS, help="the claims folder the lanes share (default "
                   "%(default)s)")
    p.add_argument("--logs", type=Path, default=Path("runs/lane_logs"), help="each cell's output, <logs>/<key>.log "
                   "(default %(default)s)")
    p.add_argument("--retry-after", type=float, default=600.0, help="seconds before a cell that did not finish is "
                   "tried again")
    p.add_argument("--once", action="store_true", help="stop when no cell can run now (default: wait for more)")
    p.add_argument("--release", metavar="KEY", default=None, help="release a killed lane's claim of KEY and exit")
    args = p.parse_args(argv)
    if args.release:
        release(args.claims, args.release)
        print(f"released {args.release}")
        return
    if args.cells_tree is None and args.shift_tree is None:
        p.error("give --cells-tree, --shift-tree or both")
    here = Path.cwd()
    a2_output, a3_output = args.a2_output.resolve(), args.a3_output.resolve()
    # an amendment-2 cell caches its run (and keeps its checkpoint) under its tree's runs/, which --a2-output reads
    if args.cells_tree is not None and (args.cells_tree / method_table.A2_OUTPUT).resolve() != a2_output:
        p.error(f"{args.cells_tree / method_table.A2_OUTPUT} is not --a2-output {a2_output}: link the tree's runs/ "
                f"to this one's (ln -s {here / 'runs'} {args.cells_tree / 'runs'})")

    def list_cells() -> List[Cell]:
        first = amendment2_cells(args.settings, a2_output) if args.cells_tree else []
        shift = amendment3_cells(a2_output, a3_output) if args.shift_tree else []
        return shift + first if args.shift_first else first + shift

    def run(cell: Cell) -> bool:
        tree = args.shift_tree if cell.key.startswith("a3--") else args.cells_tree
        log_file = args.logs.resolve() / f"{cell.key}.log"
        print(f"{cell.key}: output in {log_file}", flush=True)
        return run_in_tree(cell, tree.resolve(), here, log_file)

    done = run_lane(list_cells, run, args.claims.resolve(), args.retry_after, once=args.once,
                    log=lambda m: print(m, flush=True))
    print(f"{done} cell(s) finished, copied into {here / method_table.COMMITTED_A2}")


if __name__ == "__main__":
    main()
