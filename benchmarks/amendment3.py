"""PROTOCOL.md amendment 3: amendment 2's decision rows under corruption and against out-of-distribution images.

Each shift cell evaluates one finished amendment-2 cell's kept checkpoint (``<a2 output>/cells/<cell>/
model_best.safetensors``) with ``timm-csm-train --eval-only``: the 23 corruptions at severities 1-5 and the
``mnist5k`` OOD source on a seeded 2 000 of the test images, then the ``digits`` OOD source; it trains and chooses
nothing. Its compact record, ``shift.json``, goes into the committed cell folder ``benchmarks/cells_a2/<cell>/``.

    python benchmarks/amendment3.py --next                 # the shift cells that can run now
    python benchmarks/amendment3.py --run ce-s0            # one shift cell (resumable; its two runs kept apart)
    python benchmarks/amendment3.py --report               # benchmarks/shift_a3.md and its figure

Beside this script: the shift cells (``amendment3_cells.py``) and the page (``amendment3_page.py``).
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

import calibration_methods as method_table
from amendment3_cells import OUTPUT, next_cells, run_cell
from amendment3_page import PAGE, write_page


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--next", action="store_true", help="print the shift cells that can run now, one per line")
    g.add_argument("--run", metavar="CELL", help="run the shift cell of this amendment-2 cell")
    g.add_argument("--report", action="store_true", help=f"write {PAGE}")
    p.add_argument("--a2-output", default=method_table.A2_OUTPUT, help="amendment 2's output folder (its kept checkpoints)")
    p.add_argument("--output", default=str(OUTPUT), help="the shift cells' run folders")
    return p


def main(argv: Sequence[str] = None) -> None:
    args = build_parser().parse_args(argv)
    if args.next:
        print("\n".join(next_cells(Path(args.a2_output))))
    elif args.run:
        path = run_cell(args.run, Path(args.a2_output), Path(args.output))
        print(f"shift cell written: {path} (runs in {Path(args.output) / args.run}; the same command resumes)")
    else:
        print(f"wrote {write_page(PAGE, Path(args.a2_output))}")


if __name__ == "__main__":
    main()
