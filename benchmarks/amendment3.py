"""PROTOCOL.md amendment 3: amendment 2's decision rows under corruption and against out-of-distribution images.

Each shift cell evaluates one finished amendment-2 cell's kept checkpoint (``<a2 output>/cells/<cell>/
model_best.safetensors``) with ``timm-csm-train --eval-only``: the 23 corruptions at severities 1-5 and the
``mnist5k`` OOD source on a seeded 2 000 of the test images, then the ``digits`` OOD source; it trains and chooses
nothing. Its compact record, ``shift.json``, goes into the committed cell folder ``benchmarks/cells_a2/<cell>/``.

    python benchmarks/amendment3.py --next                 # the shift cells that can run now
    python benchmarks/amendment3.py --run ce-s0            # one shift cell (resumable; its two runs kept apart)
    python benchmarks/amendment3.py --report               # benchmarks/shift_a3.md and its figure

Beside this script: the shift cells (``amendment3_cells.py``) and the page (``amendment3_page.py``); its command line
is also amendment 4's (``amendment4_shift.py``).
"""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Optional, Sequence

from amendment3_cells import A3, ShiftSource, lost_checkpoints, next_cells, run_cell
from amendment3_page import A3_TEXT, PAGE, PageText, write_page


def build_parser(source: ShiftSource = A3, page: Path = PAGE, description: str = __doc__) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--next", action="store_true", help="print the shift cells that can run now, one per line")
    g.add_argument("--remake", action="store_true",
                   help="print the decision cells whose checkpoints are not kept (setting, method, seed): train "
                        "them again before their shift cells")
    g.add_argument("--run", metavar="CELL", help="run the shift cell of this committed cell")
    g.add_argument("--report", action="store_true", help=f"write {page}")
    p.add_argument("--committed", type=Path, default=source.committed, help="the committed cells (default %(default)s)")
    p.add_argument("--checkpoints", type=Path, default=source.checkpoints,
                   help="the training cells' output, their kept checkpoints (default %(default)s)")
    p.add_argument("--output", type=Path, default=source.output, help="the shift cells' run folders (default "
                   "%(default)s)")
    return p


def main(argv: Optional[Sequence[str]] = None, source: ShiftSource = A3, text: PageText = A3_TEXT,
         page: Path = PAGE, description: str = __doc__, remake=None) -> None:
    """The command line of a family of shift cells; ``remake(source)``: the lines ``--remake`` prints (default: the
    cells, one ``setting method seed`` a line)."""
    args = build_parser(source, page, description).parse_args(argv)
    source = dataclasses.replace(source, committed=args.committed, checkpoints=args.checkpoints, output=args.output)
    if args.next:
        print("\n".join(next_cells(source)))
    elif args.remake:
        lines = remake(source) if remake else [" ".join(map(str, cell)) for cell in lost_checkpoints(source)]
        print("\n".join(lines))
    elif args.run:
        path = run_cell(args.run, source)
        print(f"shift cell written: {path} (runs in {source.output / args.run}; the same command resumes)")
    else:
        print(f"wrote {write_page(page, source, text)}")


if __name__ == "__main__":
    main()
