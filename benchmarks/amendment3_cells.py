"""The shift cells of a set of training cells (amendment 3: amendment 2's; amendment 4: its own): which finished
cells of the decision rows a shift cell evaluates, its two ``--eval-only`` runs (resumable, kept apart) and its
compact record, ``shift.json``, beside the committed cell (``amendment3.py``'s docstring says what runs)."""
from __future__ import annotations

import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import amendment2 as a2
import calibration_methods as method_table
from timm_csm.io import file_sha256, read_model_meta, tensors_sha256, write_json_atomic
from timm_csm.metrics import metrics_for
from timm_csm.recipes.cells import CELL_META, RESULTS, cell_record, differences, instruction_set_problem, read_json

SHIFT_FILE = "shift.json"
#: the amendment-2 cells' data options, and each of a shift cell's two runs (PROTOCOL.md amendment 3)
DATA_OPTIONS = ["--dataset", "fashion_mnist", "--max-train-samples", "2500", "--val-size", "2000", "--data-seed", "0"]
#: the temperature of amendment 2's protocol (the paper's grid by validation ECE; training runs default to NLL)
TS_OPTIONS = ["--ts-method", "grid_ece"]
RUNS = {"shift": ["--max-test-samples", "2000", "--eval-shift", "all", "--ood", "mnist5k"],
        "digits": ["--max-test-samples", "2000", "--ood", "digits"]}
CHECKPOINT = "model_best.safetensors"


@dataclass(frozen=True)
class ShiftSource:
    """The training cells a family of shift cells evaluates, and where everything lies.

    ``amendment``: the amendment recorded in each ``shift.json``; ``settings``, ``seeds``: the decision settings
    and seeds; ``committed``: the committed cell folders (``shift.json`` is written beside their ``cell.json``);
    ``checkpoints``: the training cells' output, whose ``cells/<cell>/`` keeps each best checkpoint;
    ``checkpoints_shown``: its default place, which the record shows; ``output``: the shift cells' run folders;
    ``cells(setting, checkpoints, committed)``: the finished cells ``{method: {seed: cell}}``;
    ``choices(setting, cells)``: stage 1's choices."""

    amendment: int
    settings: Tuple[str, ...]
    seeds: Tuple[int, ...]
    committed: Path
    checkpoints: Path
    checkpoints_shown: Path
    output: Path
    cells: Callable[[str, Path, Path], Dict[str, Dict[int, Dict[str, Any]]]]
    choices: Callable[[str, Dict[str, Dict[int, Dict[str, Any]]]], Dict[str, Any]]

    def checkpoint(self, cell: str, shown: bool = False) -> Path:
        return Path(self.checkpoints_shown if shown else self.checkpoints) / "cells" / cell / CHECKPOINT

    def kept(self, cell: str) -> bool:
        """Whether ``cell``'s checkpoint is kept: the file, and its run finished (its folder holds ``results.json``:
        a cell trained again writes its best checkpoint long before it ends, and re-running it resumes the run)."""
        checkpoint = self.checkpoint(cell)
        return checkpoint.exists() and (checkpoint.parent / RESULTS).exists()

    def setting_choices(self, setting: str) -> Dict[str, Any]:
        return self.choices(setting, self.cells(setting, self.checkpoints, self.committed))


#: amendment 3: amendment 2's decision rows
A3 = ShiftSource(3, tuple(a2.DECISION_SETTINGS), tuple(method_table.A2_SEEDS), method_table.COMMITTED_A2,
                 Path(method_table.A2_OUTPUT), Path(method_table.A2_OUTPUT), Path("runs/protocol_a3"),
                 cells=lambda setting, checkpoints, committed: a2.a2_cells(setting, checkpoints, committed),
                 choices=lambda setting, cells: a2.stage1_choices(setting, a2._rows(cells)))


def decision_rows(choices: Dict[str, Any]) -> List[str]:
    """The stage-2 rows of a setting whose choices are made: CE, the chosen RegMixup, the best other method before
    and after TS, the CSM row."""
    names = ["ce", choices["chosen"].get("regmixup"), *choices["best_other"].values(), choices["csm"]]
    return [m for m in dict.fromkeys(names) if m is not None]


def decision_cells(source: ShiftSource = A3) -> Dict[str, Dict[str, Dict[int, Path]]]:
    """``{setting: {method: {seed: committed cell folder}}}`` of every finished cell of the decision rows."""
    out: Dict[str, Dict[str, Dict[int, Path]]] = {}
    for setting in source.settings:
        cells = source.cells(setting, source.checkpoints, source.committed)
        choices = source.choices(setting, cells)
        for method in decision_rows(choices):
            for seed, cell in sorted(cells.get(method, {}).items()):
                committed = Path(source.committed) / cell["dir"].name
                if committed.is_dir():
                    out.setdefault(setting, {}).setdefault(method, {})[seed] = committed
    return out


def shift_cells(source: ShiftSource = A3) -> Dict[str, Dict[str, Dict[int, Path]]]:
    """:func:`decision_cells` that have a committed ``shift.json`` or a kept checkpoint (so that the page reads the
    committed records alone, on a machine without the checkpoints)."""
    out: Dict[str, Dict[str, Dict[int, Path]]] = {}
    for setting, rows in decision_cells(source).items():
        for method, seeds in rows.items():
            for seed, d in seeds.items():
                if (d / SHIFT_FILE).exists() or source.checkpoint(d.name).exists():
                    out.setdefault(setting, {}).setdefault(method, {})[seed] = d
    return out


def next_cells(source: ShiftSource = A3) -> List[str]:
    """The cells of :func:`shift_cells` without a ``shift.json`` whose checkpoint is kept (:meth:`ShiftSource.kept`),
    seed by seed, each once."""
    todo = [(seed, d.name) for rows in shift_cells(source).values() for seeds in rows.values()
            for seed, d in seeds.items() if not (d / SHIFT_FILE).exists() and source.kept(d.name)]
    return list(dict.fromkeys(name for _, name in sorted(todo)))


def lost_checkpoints(source: ShiftSource = A3) -> List[Tuple[str, str, int]]:
    """``(setting, method, seed)`` of the decision cells without a ``shift.json`` whose checkpoint is not kept, seed
    by seed, each once (a cell the settings share, under the first): a shift cell evaluates the checkpoint that
    re-running the training cell makes, which must be the committed one (its recorded sha256; PROTOCOL.md,
    amendment 4's clarification of 2026-12-07); kept as :meth:`ShiftSource.kept` says."""
    lost: Dict[str, Tuple[str, str, int]] = {}
    for setting, rows in decision_cells(source).items():
        for method, seeds in rows.items():
            for seed, d in seeds.items():
                if not (d / SHIFT_FILE).exists() and not source.kept(d.name):
                    lost.setdefault(d.name, (setting, method, seed))
    return sorted(lost.values(), key=lambda cell: (cell[2], source.settings.index(cell[0]), cell[1]))


def _check_checkpoint(cell: str, committed: Path, checkpoint: Path) -> Tuple[str, str]:
    """The kept checkpoint's sha256 and how it was found to be the committed cell's: ``"sha256"``, the file the
    committed cell recorded (or none recorded); ``"tensors"``, the same weights in another file (a re-made
    checkpoint of a cell that recorded its weights' digest); or ``"re-run"``, a checkpoint re-made by running the
    cell again (PROTOCOL.md, amendment 4's clarifications of 2026-12-07), for a cell that recorded the file's digest
    alone, which cannot repeat across runs (the header holds the run's id, and safetensors writes the header's
    metadata in an order that changes from one process to the next): it counts when its header names the run
    whose folder holds it and that run reproduced the committed results, every number but where and how fast it
    ran. Where the run folder holds results, they must be the committed ones in every case."""
    digest = file_sha256(checkpoint)
    record = read_json(committed / CELL_META)
    recorded, recorded_tensors = record.get("checkpoint_sha256"), record.get("checkpoint_tensors_sha256")
    run_results = checkpoint.parent / RESULTS
    how = "sha256"
    if recorded is not None and recorded != digest and recorded_tensors is not None:
        if tensors_sha256(checkpoint) != recorded_tensors:
            raise SystemExit(f"{cell}: the kept checkpoint {checkpoint} holds other weights than the committed "
                             f"cell's (their sha256 differs from the recorded {recorded_tensors[:12]}): it did not "
                             "reproduce; no shift cell evaluates it")
        how = "tensors"
    elif recorded is not None and recorded != digest:
        run = read_json(run_results) if run_results.exists() else {}
        meta = (read_model_meta(checkpoint) or {}) if run else {}
        if not run or (meta.get("run_id"), meta.get("epoch")) != (run.get("run_id"), run.get("checkpoint_epoch")):
            raise SystemExit(f"{cell}: the kept checkpoint {checkpoint} is not the committed cell's (sha256 "
                             f"{digest[:12]}, recorded {recorded[:12]}) and no run beside it re-made it: it did not "
                             "reproduce; no shift cell evaluates it")
        how = "re-run"
    if run_results.exists():
        # the committed copy adds the training history (with its epoch times, which no re-run repeats)
        run = read_json(run_results)
        committed_results = read_json(committed / RESULTS)
        changed = differences({k: committed_results.get(k) for k in run}, run)
        if changed:
            raise SystemExit(f"{cell}: the run that kept {checkpoint} did not reproduce the committed results "
                             f"({len(changed)} differences, first: {changed[0][:200]}); no shift cell evaluates it")
    return digest, how


def _results(folder: Path) -> Dict[str, Any]:
    found = sorted(folder.glob("*/results.json"))
    if len(found) != 1:
        raise SystemExit(f"{folder}: expected one run folder with results.json, found {len(found)}")
    return read_json(found[0])


def run_cell(cell: str, source: ShiftSource = A3, log=print) -> Path:
    """Run (or finish) the shift cell of the committed cell ``cell``; write its ``shift.json`` beside the committed
    cell record and return that path. Each run writes into ``<run>.partial`` and is renamed when it ends, so a kill
    loses at most the run under way and the next call redoes only that one."""
    committed = Path(source.committed) / cell
    checkpoint = source.checkpoint(cell)
    if not (committed / CELL_META).exists():
        raise SystemExit(f"{cell}: no committed cell at {committed}")
    if not checkpoint.exists():
        raise SystemExit(f"{cell}: its checkpoint {checkpoint} is not kept; re-run the training cell first")
    digest, found_by = _check_checkpoint(cell, committed, checkpoint)
    # from amendment 4 on, a cell runs with the instruction set pinned, so that it reproduces on another machine
    problem = instruction_set_problem() if source.amendment >= 4 else None
    if problem:
        raise SystemExit(f"{cell}: {problem}")
    commands, seconds = {}, {}
    for tag, options in RUNS.items():
        folder = Path(source.output) / cell / tag
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
    shown = str(source.checkpoint(cell, shown=True))
    commands = {tag: [shown if a == str(checkpoint) else a for a in cmd] for tag, cmd in commands.items()}
    record = shift_record(committed, source.amendment, commands=commands, seconds=seconds, checkpoint_digest=digest,
                          checkpoint_tensors_digest=tensors_sha256(checkpoint), checkpoint_found_by=found_by)
    shift = compact(_results(Path(source.output) / cell / "shift"), _results(Path(source.output) / cell / "digits"))
    path = committed / SHIFT_FILE
    write_json_atomic(path, dict(cell=cell, record=record, **shift), indent=1)
    log(f"[{cell}] wrote {path}")
    return path


def shift_record(committed: Path, amendment: int, **fields) -> Dict[str, Any]:
    """The record of the shift cell of ``committed`` (:func:`cell_record`, and ``fields``): from amendment 4 on, with
    the digests of the real images of the training cell's data options; not its generated set or teacher, which a
    shift cell does not read."""
    data = {k: v for k, v in read_json(committed / CELL_META).get("config", {}).items()
            if k not in ("csm_dataset", "teacher")}
    return dict(cell_record(data, amendment), **fields)


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
