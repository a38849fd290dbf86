"""Amendment 3's shift cells: which finished amendment-2 cells a shift cell evaluates, its two ``--eval-only`` runs
(resumable, kept apart) and its compact record, ``shift.json`` (``amendment3.py``'s docstring says what runs)."""
from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import amendment2 as a2
import calibration_methods as method_table
from timm_csm.io import file_sha256, write_json_atomic
from timm_csm.metrics import metrics_for
from timm_csm.recipes.cells import CELL_META, cell_record, read_json

OUTPUT = Path("runs/protocol_a3")
SHIFT_FILE = "shift.json"
#: the amendment-2 cells' data options, and each of a shift cell's two runs (PROTOCOL.md amendment 3)
DATA_OPTIONS = ["--dataset", "fashion_mnist", "--max-train-samples", "2500", "--val-size", "2000", "--data-seed", "0"]
#: the temperature of amendment 2's protocol (the paper's grid by validation ECE; training runs default to NLL)
TS_OPTIONS = ["--ts-method", "grid_ece"]
RUNS = {"shift": ["--max-test-samples", "2000", "--eval-shift", "all", "--ood", "mnist5k"],
        "digits": ["--max-test-samples", "2000", "--ood", "digits"]}


def decision_rows(choices: Dict[str, Any]) -> List[str]:
    """Amendment 2's stage-2 rows of a setting whose choices are made: CE, the chosen RegMixup, the best other
    method before and after TS, the CSM row."""
    names = ["ce", choices["chosen"].get("regmixup"), *choices["best_other"].values(), choices["csm"]]
    return [m for m in dict.fromkeys(names) if m is not None]


def shift_cells(a2_output: Path = Path(method_table.A2_OUTPUT)) -> Dict[str, Dict[str, Dict[int, Path]]]:
    """``{setting: {method: {seed: committed cell folder}}}`` of the finished amendment-2 cells of the decision
    rows that have a committed ``shift.json`` or whose checkpoint is kept in ``a2_output`` (so that the page reads
    the committed records alone, on a machine without the checkpoints)."""
    out: Dict[str, Dict[str, Dict[int, Path]]] = {}
    for setting in a2.DECISION_SETTINGS:
        cells = a2.a2_cells(setting, a2_output)
        choices = a2.stage1_choices(setting, a2._rows(cells))
        for method in decision_rows(choices):
            for seed, cell in sorted(cells.get(method, {}).items()):
                committed = method_table.COMMITTED_A2 / cell["dir"].name
                if committed.is_dir() and ((committed / SHIFT_FILE).exists()
                                           or _checkpoint(a2_output, committed.name).exists()):
                    out.setdefault(setting, {}).setdefault(method, {})[seed] = committed
    return out


def _checkpoint(a2_output: Path, cell: str) -> Path:
    return Path(a2_output) / "cells" / cell / "model_best.safetensors"


def next_cells(a2_output: Path = Path(method_table.A2_OUTPUT)) -> List[str]:
    """The cells of :func:`shift_cells` without a ``shift.json``, seed by seed, each once."""
    todo = [(seed, d.name) for rows in shift_cells(a2_output).values() for seeds in rows.values()
            for seed, d in seeds.items() if not (d / SHIFT_FILE).exists()]
    return list(dict.fromkeys(name for _, name in sorted(todo)))


def _results(folder: Path) -> Dict[str, Any]:
    found = sorted(folder.glob("*/results.json"))
    if len(found) != 1:
        raise SystemExit(f"{folder}: expected one run folder with results.json, found {len(found)}")
    return read_json(found[0])


def run_cell(cell: str, a2_output: Path = Path(method_table.A2_OUTPUT), output: Path = OUTPUT, log=print) -> Path:
    """Run (or finish) the shift cell of amendment-2 cell ``cell``; write its ``shift.json`` beside the committed
    cell record and return that path. Each run writes into ``<run>.partial`` and is renamed when it ends, so a kill
    loses at most the run under way and the next call redoes only that one."""
    committed = method_table.COMMITTED_A2 / cell
    checkpoint = _checkpoint(a2_output, cell)
    if not (committed / CELL_META).exists():
        raise SystemExit(f"{cell}: no committed amendment-2 cell at {committed}")
    if not checkpoint.exists():
        raise SystemExit(f"{cell}: its checkpoint {checkpoint} is not kept; re-run the amendment-2 cell first")
    commands, seconds = {}, {}
    for tag, options in RUNS.items():
        folder = Path(output) / cell / tag
        cmd = [sys.executable, "train.py", "--eval-only", "--checkpoint", str(checkpoint), *DATA_OPTIONS, *TS_OPTIONS,
               *options, "--no-progress"]
        commands[tag] = ["train.py", *cmd[2:]]
        if (folder / "DONE.json").exists():
            seconds[tag] = read_json(folder / "DONE.json")["seconds"]
            continue
        partial = folder.with_name(tag + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        log(f"[{cell}] {tag}: {' '.join(commands[tag])}")
        t0 = time.time()
        subprocess.run(cmd + ["--output", str(partial)], check=True)
        seconds[tag] = round(time.time() - t0, 1)
        write_json_atomic(partial / "DONE.json", {"seconds": seconds[tag]}, indent=1)
        shutil.rmtree(folder, ignore_errors=True)
        partial.rename(folder)
    # the record names the checkpoint by its place under the default output and by its digest, not by this machine
    commands = {tag: [str(Path(method_table.A2_OUTPUT) / "cells" / cell / checkpoint.name) if a == str(checkpoint) else a
                      for a in cmd] for tag, cmd in commands.items()}
    record = dict(cell_record({}, 3), commands=commands, seconds=seconds,
                  checkpoint_digest=file_sha256(checkpoint))
    shift = compact(_results(Path(output) / cell / "shift"), _results(Path(output) / cell / "digits"))
    path = committed / SHIFT_FILE
    write_json_atomic(path, dict(cell=cell, record=record, **shift), indent=1)
    log(f"[{cell}] wrote {path}")
    return path


def _r(v: Optional[float]) -> Optional[float]:
    return None if v is None else float(f"{float(v):.6g}")


def compact(shift_run: Dict[str, Any], digits_run: Dict[str, Any]) -> Dict[str, Any]:
    """What the page reads from a shift cell's two ``results.json``: the clean numbers on the 2 000 images, the seed
    the corruptions were drawn with (``--eval-only`` takes ``--seed`` from the checkpoint: the cell's training
    seed), each severity's mean over corruptions and worst corruption, each corruption's accuracy and ECE, the OOD
    scores."""
    sh = shift_run["shift"]
    keep = metrics_for("shift")
    out = {"n_test": sh["n"], "temperature": shift_run.get("temperature"), "corruptions": sh["corruptions"],
           "corruption_seed": sh.get("seed"),
           "clean": {m: {k: _r(v.get(k)) for k in keep} for m, v in sh["clean"].items()},
           "severity": {str(k): {m: {"mean": {key: _r(v["mean"].get(key)) for key in keep},
                                     "worst": {key: (_r(w) if key != "corruption" else w)
                                               for key, w in v["worst"].items()}}
                                 for m, v in by_method.items()} for k, by_method in sh["summary"].items()},
           "table": {c: {str(k): {m: [_r(v["accuracy"]), _r(v["ece"])] for m, v in cells.items()}
                         for k, cells in by_sev.items()} for c, by_sev in sh["table"].items()}}
    out["ood"] = {}
    for run in (shift_run, digits_run):
        o = run["ood"]
        out["ood"][o["source"]] = {"split": o["split"], "n_in": o["n_in"], "n_out": o["n_out"],
                                   "methods": {m: {score: {k: _r(v) for k, v in vals.items()}
                                                   for score, vals in scores.items()}
                                               for m, scores in o["methods"].items()}}
    return out
