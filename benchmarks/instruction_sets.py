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
    [env $PINS] [qemu-x86_64 -cpu MODEL] python benchmarks/instruction_sets.py --ops  # which kernels differ
    python benchmarks/instruction_sets.py --report                                    # benchmarks/instruction_sets.md

The cell's checkpoints stay under ``runs/instruction_sets/`` (outside git); ``benchmarks/cells_isa/ce-s0`` holds its
``cell.json`` and ``results.json``.
"""
from __future__ import annotations

import argparse
import os
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
OPS_LOG = ROOT / "benchmarks" / "cells_isa_ops.json"
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


def op_digests() -> Dict[str, str]:
    """sha256 (16 hex digits) of the outputs of each kind of kernel a small_cnn training step runs, at the cell's
    sizes, on inputs drawn from one fixed seed: which kernels give other bits on this machine."""
    import hashlib

    import torch
    import torch.nn.functional as F

    def digest(*tensors) -> str:
        h = hashlib.sha256()
        for t in tensors:
            h.update(t.detach().contiguous().numpy().tobytes())
        return h.hexdigest()[:16]

    g = torch.Generator().manual_seed(0)
    out: Dict[str, str] = {"rand": digest(torch.rand(4096, generator=g)),
                           "randn": digest(torch.randn(4096, generator=g))}
    x = torch.randn(128, 16, 8, 8, generator=g, requires_grad=True)
    w = torch.randn(32, 16, 3, 3, generator=g, requires_grad=True)
    y = F.conv2d(x, w, padding=1)
    out["conv2d"] = digest(y)
    gx, gw = torch.autograd.grad(y, (x, w), torch.randn(y.shape, generator=g))
    out["conv2d backward"] = digest(gx, gw)
    # each kernel on inputs of its own: a difference is the kernel's, not one carried from the kernel before
    z = torch.randn(y.shape, generator=g, requires_grad=True)
    b = F.batch_norm(z, None, None, torch.ones(32), torch.zeros(32), training=True)
    out["batch_norm"] = digest(b)
    out["batch_norm backward"] = digest(torch.autograd.grad(b.square().sum(), z)[0])
    p = F.max_pool2d(torch.relu(z), 2)
    out["relu, max_pool2d"] = digest(p, torch.autograd.grad(p.sum(), z)[0])
    a = torch.randn(128, 64, generator=g, requires_grad=True)
    lw = torch.randn(10, 64, generator=g, requires_grad=True)
    logits = F.linear(a, lw)
    out["linear"] = digest(logits)
    labels = torch.randint(0, 10, (128,), generator=g)
    loss = F.cross_entropy(logits, labels)
    out["cross_entropy"] = digest(loss, *torch.autograd.grad(loss, (a, lw)))
    v = torch.randn(100_000, generator=g)
    out["exp, log, tanh, sigmoid"] = digest(v.exp(), v.abs().log(), v.tanh(), v.sigmoid())
    t = torch.randn(128, 10, generator=g)
    out["softmax, log_softmax"] = digest(t.softmax(1), t.log_softmax(1))
    out["sum (float32), sum (float64)"] = digest(v.sum(), v.double().sum())
    m = torch.randn(256, 256, generator=g)
    out["matmul 256"] = digest(m @ m)
    params = [torch.randn(32, 16, 3, 3, generator=g), torch.randn(10, 64, generator=g)]
    for param in params:
        param.grad = torch.randn(param.shape, generator=g)
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=5e-4)
    for _ in range(3):
        opt.step()
    out["SGD (momentum, weight decay)"] = digest(*params)
    return out


def log_ops() -> None:
    """Append this machine's :func:`op_digests` to :data:`OPS_LOG`, with its CPU capability and pins."""
    import torch

    from timm_csm.io import write_json_atomic
    from timm_csm.recipes.cells import cpu_model

    runs = read_json(OPS_LOG) if OPS_LOG.exists() else []
    entry = {"cpu": cpu_model(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
             "pins": {k: os.environ.get(k) for k in INSTRUCTION_SET_PINS}, "torch": torch.__version__,
             "digests": op_digests()}
    write_json_atomic(OPS_LOG, runs + [entry], indent=1)
    print(f"appended to {OPS_LOG}: {entry['cpu_capability']}, pins {_pins(entry)}")


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


def ops_lines(runs: List[Dict[str, Any]]) -> List[str]:
    """One column per run of ``--ops``: whether each kernel gave the bits of the first run (the recording machine's,
    pinned)."""
    if not runs:
        return []
    reference = runs[0]["digests"]
    lines = ["", "## Which kernels differ", "",
             "`--ops` runs each kind of kernel a small_cnn training step runs, at the cell's sizes, on inputs of "
             "its own from one fixed seed, and logs the sha256 of its outputs (`benchmarks/cells_isa_ops.json`). "
             "`=`: the same bits as run 1; `x`: other bits.", "",
             "| kernel | " + " | ".join(f"{i}: {r['cpu_capability']}, {_pins(r)}" for i, r in enumerate(runs, 1)) + " |",
             "|---|" + "---|" * len(runs)]
    for op, digest in reference.items():
        lines.append(f"| {op} | " + " | ".join("=" if r["digests"].get(op) == digest else "x" for r in runs) + " |")
    return lines


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    verb = p.add_mutually_exclusive_group(required=True)
    verb.add_argument("--record", action="store_true", help="run and commit the cell (the pins in force)")
    verb.add_argument("--ops", action="store_true", help="log which kernels give which bits on this machine")
    verb.add_argument("--report", action="store_true", help=f"write {PAGE.name} from the verify log")
    args = p.parse_args(argv)
    if args.record:
        record_cell()
        return
    if args.ops:
        log_ops()
        return
    if not LOG.exists():
        raise SystemExit(f"no verify log at {LOG}: verify the cell first (see this script's docstring)")
    lines = page_lines(read_json(CELLS / CELL / "cell.json"), read_json(LOG))
    lines += ops_lines(read_json(OPS_LOG) if OPS_LOG.exists() else [])
    write_text_atomic(PAGE, "\n".join(lines) + "\n")
    print(f"wrote {PAGE}")


if __name__ == "__main__":
    main()
