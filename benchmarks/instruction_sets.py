"""Do the instruction-set pins make a cell reproduce on a machine with other vector units? One study cell (the CE
cell of ``benchmarks/instruction_sets.toml``: small_cnn on scikit-learn's embedded digits, 30 epochs, one thread) is
recorded once with the pins in force, then re-run by ``timm-csm-study verify`` on machines of other instruction sets,
with and without the pins; each verify appends its own record (the CPU capability torch chose, the pins, every
difference) to ``benchmarks/cells_isa_verify.json``, and the page is written from that log alone.

    PINS="ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2 ONEDNN_MAX_CPU_ISA=AVX2"
    env $PINS OMP_NUM_THREADS=1 python benchmarks/instruction_sets.py --record        # the cell, once
    VERIFY="timm-csm-study verify benchmarks/instruction_sets.toml ce-s0 --cells benchmarks/cells_isa"
    env $PINS OMP_NUM_THREADS=1 $VERIFY                                               # pinned, on this machine
    OMP_NUM_THREADS=1 $VERIFY                                                         # unpinned: the control
    env $PINS OMP_NUM_THREADS=1 qemu-x86_64 -cpu Haswell $(which python) $(which timm-csm-study) verify ...
    python benchmarks/instruction_sets.py --report                                    # benchmarks/instruction_sets.md

The cell's checkpoints stay under ``runs/instruction_sets/`` (outside git); ``benchmarks/cells_isa/ce-s0`` holds its
``cell.json`` and ``results.json``.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from timm_csm.io import write_text_atomic
from timm_csm.recipes.cells import INSTRUCTION_SET_PINS, instruction_set_problem, read_json, run_cell
from timm_csm.study.amendments import spec_digest
from timm_csm.study.methods import get_method
from timm_csm.study.options import cell_options, study_recipe
from timm_csm.study.spec import parse_spec

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "benchmarks" / "instruction_sets.toml"
CELLS = ROOT / "benchmarks" / "cells_isa"
LOG = ROOT / "benchmarks" / "cells_isa_verify.json"
PAGE = ROOT / "benchmarks" / "instruction_sets.md"
RUNS = ROOT / "runs" / "instruction_sets" / "cells"
CELL, METHOD, SEED = "ce-s0", "ce", 0


def record_cell() -> Dict[str, Any]:
    """Run the CE cell with the pins in force (refused without them) and commit its ``cell.json`` and
    ``results.json`` under :data:`CELLS`."""
    problem = instruction_set_problem()
    if problem is not None:
        raise SystemExit(problem)
    text = SPEC.read_text(encoding="utf-8")
    folder = RUNS / CELL
    options = cell_options(study_recipe(parse_spec(text)), get_method(METHOD), SEED, folder)
    results = run_cell(dict(options, progress=False), folder, METHOD, SEED, committed=CELLS / CELL,
                       spec_digest=spec_digest(text), repo=ROOT)
    print(f"{CELL}: recorded in {CELLS / CELL} (checkpoints in {folder})")
    return results


def _pins(entry: Dict[str, Any]) -> str:
    pins = entry.get("pins") or {}
    if all(pins.get(k) == v for k, v in INSTRUCTION_SET_PINS.items()):
        return "pinned"
    if not any(pins.values()):
        return "none"
    return ", ".join(f"{k}={v}" for k, v in pins.items() if v)


def page_lines(cell: Dict[str, Any], runs: List[Dict[str, Any]]) -> List[str]:
    """The page: the recorded cell, then one row per verify run of the log, in the order they ran."""
    record = cell["record"]
    lines = [
        "# Instruction-set check: one cell, machines with other vector units", "",
        "Does a cell computed here reproduce exactly on a machine with other vector units? torch, MKL and oneDNN "
        "choose their kernels by the instruction set, and the last bits of a float sum depend on the kernel. Every "
        "amendment-4 cell and every cell of `timm-csm-study run --pin-instruction-set` runs with "
        + ", ".join(f"`{k}={v}`" for k, v in INSTRUCTION_SET_PINS.items())
        + ". This page re-runs one such cell on machines of other instruction sets, with and without the pins.", "",
        "Commands (the script's docstring has them in full):", "",
        "    env ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 OMP_NUM_THREADS=1 \\",
        "        python benchmarks/instruction_sets.py --record",
        "    [env PINS] OMP_NUM_THREADS=1 [qemu-x86_64 -cpu MODEL python] timm-csm-study verify \\",
        "        benchmarks/instruction_sets.toml ce-s0 --cells benchmarks/cells_isa",
        "    python benchmarks/instruction_sets.py --report", "",
        f"The cell: `{CELL}` of `benchmarks/instruction_sets.toml` (CE, small_cnn, scikit-learn's digits, "
        f"{cell['config']['epochs']} epochs, one thread), recorded at commit `{record['commit'][:7]}` on "
        f"{record['cpu']} with torch's CPU capability {record['cpu_capability']} and pins "
        f"{_pins(record)}; its checkpoint `{cell.get('checkpoint_sha256', '')[:12]}`. Each verify re-runs it from "
        "its recorded options and compares every number of `results.json` (test and validation metrics, per-epoch "
        "history, the checkpoint's epoch, the temperature) with the recorded ones; the log "
        "`benchmarks/cells_isa_verify.json` is written by the verify command alone.", "",
        "| # | commit | CPU (`/proc/cpuinfo`) | torch's CPU capability | pins | reproduced | differences | first "
        "difference |",
        "|---:|---|---|---|---|---|---:|---|"]
    for i, run in enumerate(runs, 1):
        diffs = run.get("differences") or []
        first = diffs[0].replace("|", "/") if diffs else ""
        lines.append(f"| {i} | `{run['commit'][:7]}`{'' if run.get('clean') else ' (changes)'} | {run.get('cpu')} | "
                     f"{run.get('cpu_capability')} | {_pins(run)} | {'exactly' if run['reproduced'] else 'no'} | "
                     f"{len(diffs)} | {first[:110]} |")
    return lines


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    verb = p.add_mutually_exclusive_group(required=True)
    verb.add_argument("--record", action="store_true", help="run and commit the cell (the pins in force)")
    verb.add_argument("--report", action="store_true", help=f"write {PAGE.name} from the verify log")
    args = p.parse_args(argv)
    if args.record:
        record_cell()
        return
    if not LOG.exists():
        raise SystemExit(f"no verify log at {LOG}: verify the cell first (see this script's docstring)")
    lines = page_lines(read_json(CELLS / CELL / "cell.json"), read_json(LOG))
    write_text_atomic(PAGE, "\n".join(lines) + "\n")
    print(f"wrote {PAGE}")


if __name__ == "__main__":
    main()
