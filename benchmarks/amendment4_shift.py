"""PROTOCOL.md amendment 4, shift and out of distribution: amendment 3's evaluation of amendment 4's decision rows.

Each shift cell evaluates one finished amendment-4 cell's kept checkpoint (``runs/protocol_a4/cells/<cell>/
model_best.safetensors``, which must be the one the committed cell recorded: its sha256) with ``timm-csm-train
--eval-only``, as amendment 3 did (``amendment3_cells.py``): the 23 corruptions at severities 1-5 and ``mnist5k`` on a
seeded 2 000 of the test images, then ``digits``; the corruptions drawn with the cell's training seed (recorded in its
``shift.json``, written beside the committed cell in ``benchmarks/cells_a4/<cell>/``). A decision cell whose checkpoint
is gone (the cells of the first machine) is trained again first (PROTOCOL.md, amendment 4's clarification of
2026-12-07): ``--remake`` lists those training cells' commands.

    python benchmarks/amendment4_shift.py --next          # the shift cells that can run now
    python benchmarks/amendment4_shift.py --remake        # the training cells to re-run for their checkpoints
    python benchmarks/amendment4_shift.py --run ce-s3     # one shift cell (resumable; its two runs kept apart)
    python benchmarks/amendment4_shift.py --report        # benchmarks/shift_a4.md

A shift cell runs from a worktree of a fixed commit; ``--committed`` and ``--checkpoints`` then name the checkout whose
committed cells it evaluates and the training cells' output.
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Sequence

import amendment3
import amendment4 as a4
import calibration_methods as method_table
from amendment3_cells import ShiftSource, lost_checkpoints
from amendment3_page import PageText
from timm_csm.study.cells import cell_rows

PAGE = Path("benchmarks/shift_a4.md")
A4 = ShiftSource(4, tuple(method_table.A4_SETTINGS), tuple(method_table.A4_SEEDS), method_table.COMMITTED_A4,
                 Path(method_table.A4_OUTPUT), Path(method_table.A4_OUTPUT), Path("runs/protocol_a4_shift"),
                 cells=lambda setting, checkpoints, committed: a4.a4_cells(setting, checkpoints, committed),
                 choices=lambda setting, cells: a4.stage1_choices(setting, cell_rows(cells)))
TEXT = PageText(
    f"Calibration under shift and out of distribution on {method_table.A4_BACKBONE['model']} (PROTOCOL.md amendment 4)",
    "Amendment 4's decision rows", "benchmarks/amendment4_shift.py",
    "each cell's training seed, as PROTOCOL.md amendment 4 states (the `--eval-only` run takes `--seed` from the "
    "checkpoint)")


def remake_commands(source: ShiftSource = A4) -> List[str]:
    """The command of each decision cell to train again because its checkpoint is not kept."""
    return [f"{a4.cell_command(setting, method)} {seed}" for setting, method, seed in lost_checkpoints(source)]


def main(argv: Optional[Sequence[str]] = None) -> None:
    amendment3.main(argv, A4, TEXT, PAGE, __doc__, remake=remake_commands)


if __name__ == "__main__":
    main()
