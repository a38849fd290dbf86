"""Do the instruction-set pins make a cell reproduce on a machine with other vector units? One study cell (the CE
cell of ``benchmarks/instruction_sets.toml``: small_cnn on scikit-learn's embedded digits, 30 epochs, one thread) is
recorded once with the pins in force, then re-run by ``timm-csm-study verify`` on machines of other instruction sets,
with and without the pins; each verify appends its own record (the CPU capability torch chose, the pins, every
difference) to ``benchmarks/cells_isa_verify.json``, and the page is written from that log alone.

    env ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 OMP_NUM_THREADS=1 \
        python benchmarks/instruction_sets.py --record      # the cell, once
    python benchmarks/instruction_sets.py --check [STEP ...]  # the steps of STEPS in turn (qemu-user for the others)
    python benchmarks/instruction_sets.py --report          # benchmarks/instruction_sets.md

A step re-runs the cell with ``timm-csm-study verify`` and/or logs which kernels give which bits (``--ops``), on this
machine or on a CPU of another instruction set or vendor emulated by QEMU's user mode (``qemu-x86_64 -cpu MODEL``:
the program sees that CPU's vector units and vendor; ``/proc/cpuinfo`` still names this machine's). Run it from the
root of a clean checkout, ``python`` and ``timm-csm-study`` on the PATH.

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
from timm_csm.study.report_tables import differences_text
from timm_csm.study.spec import parse_spec

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "benchmarks" / "instruction_sets.toml"
CELLS = ROOT / "benchmarks" / "cells_isa"
LOG = ROOT / "benchmarks" / "cells_isa_verify.json"
OPS_LOG = ROOT / "benchmarks" / "cells_isa_ops.json"
PAGE = ROOT / "benchmarks" / "instruction_sets.md"
RUNS = ROOT / "runs" / "instruction_sets" / "cells"
CELL, METHOD, SEED = "ce-s0", "ce", 0
AVX2 = dict(INSTRUCTION_SET_PINS)
#: MKL's code path for every vendor alike (its conditional numerical reproducibility's compatible branch)
COMPATIBLE = dict(INSTRUCTION_SET_PINS, MKL_CBWR="COMPATIBLE")
#: the check's steps, in the order their records are logged: (machine: "native" or a QEMU CPU model, the pins,
#: whether the step re-runs the cell besides logging the kernels)
STEPS = ((NATIVE := "native", AVX2, True), (NATIVE, {}, True), ("Haswell", AVX2, True), ("EPYC-Milan", AVX2, True),
         (NATIVE, COMPATIBLE, False), ("Haswell", COMPATIBLE, False), ("EPYC-Milan", COMPATIBLE, False))
MACHINES = {"Haswell": "QEMU `Haswell` (Intel, AVX2)", "EPYC-Milan": "QEMU `EPYC-Milan` (AMD, AVX2)"}


def record_cell() -> Dict[str, Any]:
    """Run the CE cell with the pins in force (refused without them) and commit its ``cell.json`` and
    ``results.json`` under :data:`CELLS`."""
    problem = instruction_set_problem()
    if problem is not None:
        raise SystemExit(problem)
    text = SPEC.read_text(encoding="utf-8")
    os.chdir(ROOT)  # the cell's results name its folder relative to the repository, as every committed cell's do
    folder = RUNS.relative_to(ROOT) / CELL
    options = cell_options(study_recipe(parse_spec(text)), get_method(METHOD), SEED, folder)
    results = run_cell(dict(options, progress=False), folder, METHOD, SEED, committed=CELLS / CELL,
                       spec_digest=spec_digest(text), repo=ROOT)
    print(f"{CELL}: recorded in {CELLS / CELL} (checkpoints in {folder})")
    return results


#: what the committed logs show (the tables above are computed from them; this reads them)
FINDINGS = [
    "", "## What it shows", "",
    "- **The AVX2 pins carry a cell from an AVX-512 machine to an AVX2-only one of the same vendor.** On the "
    "emulated AMD EPYC-Milan (verify 4) the cell re-ran to the same training history, checkpoint epoch and every "
    "test number; its only differences (its row above) are last-bit ones in the validation debiased calibration "
    "error, the one metric that takes the square root of a float64 tensor; the kernel "
    "behind the difference is not isolated (the kernel runs below take no square root).",
    "- **Without the pins** the same machine computes other numbers from the first epoch on (verify 2): oneDNN's "
    "convolutions and torch's softmax take their AVX-512 kernels (kernel runs 1 and 2), and the run keeps another "
    "checkpoint epoch.",
    "- **Across vendors `MKL_CBWR=AVX2` is not enough.** On the emulated Intel Haswell (verify 3) MKL's matrix "
    "products and its exp / log take another code path than on AMD under the same pins (kernel run 3), and the cell "
    "differs from the second epoch on. With `MKL_CBWR=COMPATIBLE` (kernel runs 5-7) every kernel gives the same "
    "bits on the three CPUs, bits other than the AVX2 branch's, so a cell recorded with `MKL_CBWR=AVX2` does not "
    "verify under it; a whole cell under `MKL_CBWR=COMPATIBLE` is not verified here.",
    "- **So** amendment 4's cells, pinned at AVX2 as registered, are expected to reproduce on AMD x86-64 machines "
    "with AVX2 or AVX-512 (shown above for one cell, on an emulated CPU), not on Intel ones; a study that must "
    "reproduce across vendors should pin `MKL_CBWR=COMPATIBLE` from its first cell."]


def run_steps(steps: Sequence[int]) -> None:
    """Run the steps numbered ``steps`` (1-based; all when empty) of :data:`STEPS`, each in a process of its own."""
    import shutil
    import subprocess
    import sys

    study = shutil.which("timm-csm-study")
    if study is None:
        raise SystemExit("timm-csm-study is not on the PATH: install the package (pip install -e .)")
    for number, (machine, pins, verify) in enumerate(STEPS, 1):
        if steps and number not in steps:
            continue
        prefix = [] if machine == NATIVE else ["qemu-x86_64", "-cpu", machine]
        env = {k: v for k, v in os.environ.items() if k not in INSTRUCTION_SET_PINS}
        env.update(pins, OMP_NUM_THREADS="1")
        print(f"== step {number}: {MACHINES.get(machine, NATIVE)}, pins: {_pins({'pins': pins})}", flush=True)
        commands = [[study, "verify", str(SPEC.relative_to(ROOT)), CELL, "--cells", str(CELLS.relative_to(ROOT))]
                    ] * verify + [[str(Path(__file__).relative_to(ROOT)), "--ops"]]
        for command in commands:
            subprocess.run(prefix + [sys.executable] + command, cwd=ROOT, env=env, check=True)


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
    pins = {k: v for k, v in (entry.get("pins") or {}).items() if v}
    if not pins:
        return "none"
    other = {k: v for k, v in pins.items() if AVX2.get(k) != v}
    if not other and len(pins) == len(AVX2):
        return "AVX2"
    return "AVX2, but " + ", ".join(f"{k}={v}" for k, v in other.items())


def machine_label(machine: str, record: Dict[str, Any]) -> str:
    return MACHINES.get(machine) or f"{record.get('cpu')} (this machine, {NATIVE})"


def step_machines(verify: bool) -> List[str]:
    """The machine of each record of the verify log (``verify``) or of the kernel log, in the order STEPS logs them."""
    return [machine for machine, _, verifies in STEPS if verifies or not verify]


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
        "Commands:", "",
        "    env ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 OMP_NUM_THREADS=1 \\",
        "        python benchmarks/instruction_sets.py --record   # the cell, once",
        "    python benchmarks/instruction_sets.py --check        # each step: timm-csm-study verify and/or --ops",
        "    python benchmarks/instruction_sets.py --report", "",
        "The other machines are CPUs emulated by QEMU's user mode (`qemu-x86_64 -cpu MODEL`, QEMU 7.2): the program "
        "sees that model's vector units and vendor (torch's CPU capability below is what torch detected), while "
        "`/proc/cpuinfo` still names this machine.", "",
        f"The cell: `{CELL}` of `benchmarks/instruction_sets.toml` (CE, small_cnn, scikit-learn's digits, "
        f"{cell['config']['epochs']} epochs, one thread), recorded at commit `{record['commit'][:7]}` on "
        f"{record['cpu']} with torch's CPU capability {record['cpu_capability']} and pins "
        f"{_pins(record)}; its checkpoint `{cell.get('checkpoint_sha256', '')[:12]}`. Each verify re-runs it from "
        "its recorded options and compares every number of `results.json` (test and validation metrics, per-epoch "
        "history, the checkpoint's epoch, the temperature) with the recorded ones; the log "
        "`benchmarks/cells_isa_verify.json` is written by the verify command alone.", "",
        "| # | machine | commit | torch's CPU capability | pins | reproduced |",
        "|---:|---|---|---|---|---|"]
    for i, (run, machine) in enumerate(zip(runs, step_machines(verify=True)), 1):
        diffs = run.get("differences") or []
        lines.append(f"| {i} | {machine_label(machine, run)} | `{run['commit'][:7]}`"
                     f"{'' if run.get('clean') else ' (changes)'} | {run.get('cpu_capability')} | {_pins(run)} | "
                     f"{'exactly' if run['reproduced'] else differences_text(diffs)} |")
    return lines


def ops_lines(runs: List[Dict[str, Any]]) -> List[str]:
    """One column per run of ``--ops``: a letter per distinct output of each kernel (``a``: run 1's bits), so that
    the runs that agree read off a row."""
    if not runs:
        return []
    lines = ["", "## Which kernels differ", "",
             "`--ops` runs each kind of kernel a small_cnn training step runs, at the cell's sizes, on inputs of "
             "its own from one fixed seed, and logs the sha256 of its outputs (`benchmarks/cells_isa_ops.json`). "
             "A letter per distinct output: runs with the same letter in a row computed the same bits.", "",
             "| run | machine | torch's CPU capability | pins |", "|---:|---|---|---|"]
    lines += [f"| {i} | {machine_label(m, r)} | {r['cpu_capability']} | {_pins(r)} |"
              for i, (r, m) in enumerate(zip(runs, step_machines(verify=False)), 1)]
    lines += ["", "| kernel | " + " | ".join(str(i) for i in range(1, len(runs) + 1)) + " |",
              "|---|" + "---|" * len(runs)]
    for op in runs[0]["digests"]:
        letters: Dict[str, str] = {}
        for r in runs:
            letters.setdefault(r["digests"].get(op), "abcdefghij"[len(letters)])
        lines.append(f"| {op} | " + " | ".join(letters[r["digests"].get(op)] for r in runs) + " |")
    return lines


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    verb = p.add_mutually_exclusive_group(required=True)
    verb.add_argument("--record", action="store_true", help="run and commit the cell (the pins in force)")
    verb.add_argument("--check", nargs="*", type=int, metavar="STEP", help="run these steps (default: all)")
    verb.add_argument("--ops", action="store_true", help="log which kernels give which bits on this machine")
    verb.add_argument("--report", action="store_true", help=f"write {PAGE.name} from the verify log")
    args = p.parse_args(argv)
    if args.record:
        record_cell()
        return
    if args.ops:
        log_ops()
        return
    if args.check is not None:
        run_steps(args.check)
        return
    if not LOG.exists():
        raise SystemExit(f"no verify log at {LOG}: verify the cell first (see this script's docstring)")
    lines = page_lines(read_json(CELLS / CELL / "cell.json"), read_json(LOG))
    lines += ops_lines(read_json(OPS_LOG) if OPS_LOG.exists() else []) + FINDINGS
    write_text_atomic(PAGE, "\n".join(lines) + "\n")
    print(f"wrote {PAGE}")


if __name__ == "__main__":
    main()
