"""Cells of a benchmark table: one :func:`timm_csm.training.run` per folder, cached by its options, resumable, with a
record of what its numbers depend on, and re-run on demand to show that they reproduce.

A cell's folder holds ``cell.json`` (a :class:`~timm_csm.recipes.cache.KeyedFolder` marker: the cell's fields and
its options under ``config``, less those that do not change what it computes) and, once finished, the run's
``results.json``. A folder whose ``cell.json`` records other options is refused; a killed cell resumes from its
``last.safetensors``. A copy of ``results.json`` and ``cell.json`` in a folder of committed cells makes the cell
done wherever it runs.
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..io import file_sha256, tensors_sha256, write_json_atomic
from ..metrics.table import metric_spec, metrics_for
from .cache import KeyedFolder
from .profiles import paper_protocol

__all__ = ["RESULTS", "CELL_META", "PREDICTIONS", "INSTRUCTION_SET_PINS", "read_json", "keyed_options",
           "cell_folder", "cell_state", "run_cell", "git", "cpu_model", "real_images_digests",
           "instruction_set_problem",
           "cell_record", "differences", "added_keys", "verify_cell", "verify_and_log", "collect_cells", "per_seed_row"]

RESULTS = "results.json"
CELL_META = "cell.json"
PREDICTIONS = "test_predictions.safetensors"
#: options that do not change what a cell computes (where it writes, how it shows progress)
NOT_KEYED = ("output", "experiment", "progress", "resume")
#: results.json keys that say where and how fast a cell ran, not what it computed
_WHERE = ("checkpoint", "output_dir", "run_id", "epoch_time", "seconds")
#: what the instruction set decides, pinned at one level every x86-64 machine of the last decade has: torch's own
#: vectorised kernels, MKL's code path (its conditional numerical reproducibility) and oneDNN's kernels. Without them
#: a cell computes other numbers on a machine with other vector units (AVX-512 against AVX2 changed a cell's epoch-0
#: loss in the fifth digit and its checkpoint epoch from 59 to 34). Enough between machines of one vendor, not between
#: Intel and AMD, where MKL takes another code path (benchmarks/instruction_sets.md). Read when torch starts: set them
#: in the environment of the process.
INSTRUCTION_SET_PINS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def read_json(path: Path):
    with open(path) as f:
        return json.load(f)


def keyed_options(cfg: Dict[str, Any]) -> Dict[str, Any]:
    """The options of ``cfg`` that key a cell, as its ``cell.json`` records them."""
    return json.loads(json.dumps({k: v for k, v in cfg.items() if k not in NOT_KEYED}, sort_keys=True, default=str))


def cell_folder(cell_dir: Path, cfg: Dict[str, Any]) -> KeyedFolder:
    return KeyedFolder(Path(cell_dir), keyed_options(cfg), CELL_META)


def _check_options(folder: KeyedFolder) -> None:
    if folder.state() == "other":
        raise ValueError(f"{folder.folder} holds a cell trained with other options (they differ in "
                         f"{folder.differences()}); choose another --output for this recipe")


def cell_state(cell_dir: Path, cfg: Dict[str, Any], committed: Optional[Path] = None) -> str:
    """"done", "partial" (a ``last.safetensors`` to resume from) or "new"; ValueError when the folder holds a cell
    trained with other options. ``committed``: the cell's folder among the committed cells (``results.json`` and
    ``cell.json`` only), which makes it done."""
    if committed is not None and (committed / CELL_META).exists() and (committed / RESULTS).exists():
        _check_options(cell_folder(committed, cfg))
        return "done"
    cell_dir = Path(cell_dir)
    if (cell_dir / CELL_META).exists():
        _check_options(cell_folder(cell_dir, cfg))
    elif (cell_dir / RESULTS).exists():
        raise ValueError(f"{cell_dir} has a {RESULTS} but no {CELL_META}: it was not written by this benchmark")
    if (cell_dir / RESULTS).exists():
        return "done"
    if (cell_dir / "last.safetensors").exists():
        return "partial"
    return "new"


def run_cell(cfg: Dict[str, Any], cell_dir: Path, method: str, seed: int, log=print, setting: Optional[str] = None,
             committed: Optional[Path] = None, amendment: Optional[int] = None, repo: Optional[Path] = None,
             spec_digest: Optional[str] = None) -> Dict[str, Any]:
    """Train and evaluate one cell (resuming a killed one); returns its results. With ``committed``, its
    ``results.json`` and ``cell.json`` are copied there once it has finished. With ``amendment`` (a cell of the
    protocol's amendment) or ``spec_digest`` (a cell of a study: the digest of the spec it runs under),
    ``cell.json`` holds the cell's record (:func:`cell_record`, the commit of ``repo``)."""
    from ..io import load_state
    from ..training import run

    state = cell_state(cell_dir, cfg, committed)
    if state == "done":
        return read_json((committed if committed is not None and (committed / RESULTS).exists() else cell_dir)
                         / RESULTS)
    cell_dir = Path(cell_dir)
    cell_dir.mkdir(parents=True, exist_ok=True)
    earlier = 0.0
    cfg = dict(cfg)
    if state == "partial":
        last = cell_dir / "last.safetensors"
        earlier = sum(float(h.get("epoch_time", 0.0)) for h in load_state(last)["history"])
        cfg["resume"] = str(last)
        log(f"[{cell_dir.name}] resuming from {last}")
    folder = cell_folder(cell_dir, cfg)
    meta = {"method": method, "seed": seed, "setting": setting, "config": folder.config}
    recorded = amendment is not None or spec_digest is not None
    if recorded:
        meta["record"] = dict(cell_record(cfg, amendment, repo, spec_digest),
                              **({"resumed": True} if state == "partial" else {}))
    folder.write(dict(meta, finished=False))
    t0, cpu0 = time.time(), time.process_time()
    # auto_resume: also takes over a cell killed before its first epoch ended
    results = run(paper_protocol(dict(cfg, auto_resume=True)))
    meta.update(finished=True, seconds=round(earlier + time.time() - t0, 1))
    if recorded and (amendment is None or amendment >= 4):
        # what a shift cell evaluates is traced to this cell by the digest of the checkpoint it kept; a re-run
        # repeats its weights' digest, not the file's (the header holds the run's id)
        best = cell_dir / "model_best.safetensors"
        meta.update(cpu_seconds=round(time.process_time() - cpu0, 1),
                    checkpoint_sha256=file_sha256(best) if best.exists() else None,
                    checkpoint_tensors_sha256=tensors_sha256(best) if best.exists() else None)
    folder.write(meta)
    if committed is not None:
        write_json_atomic(committed / RESULTS, results, indent=1)
        cell_folder(committed, cfg).write(meta, indent=1)
    return results


def git(*args: str, repo: Optional[Path] = None) -> Optional[str]:
    """``git <args>`` run in ``repo`` (default: this package's folder), its output stripped; None without git."""
    try:
        out = subprocess.run(["git", *args], cwd=Path(repo or Path(__file__).resolve().parent), capture_output=True,
                             text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip()


def cpu_model() -> Optional[str]:
    """The processor's model name (Linux's ``/proc/cpuinfo``), else what the platform module says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def real_images_digests(cfg: Dict[str, Any]) -> Dict[str, str]:
    """sha256 of the pixels and labels of the training and validation images the options ``cfg`` train on."""
    from ..data.arrays import images_labels_hash
    from ..training import TrainConfig, load_data

    keys = ("dataset", "data_dir", "train_split", "val_split", "val_size", "val_fraction", "data_seed",
            "max_train_samples", "seed")
    data = load_data(TrainConfig(**{k: cfg[k] for k in keys if cfg.get(k) is not None}))
    return {name: images_labels_hash(part.images, part.labels, with_shape=False).hexdigest()
            for name, part in (("train", data.train), ("validation", data.val))}


def instruction_set_problem() -> Optional[str]:
    """None when this process runs with :data:`INSTRUCTION_SET_PINS` in force, else one line saying what to set."""
    import torch

    missing = {k: v for k, v in INSTRUCTION_SET_PINS.items() if os.environ.get(k) != v}
    capability = torch.backends.cpu.get_cpu_capability()
    if not missing and capability == INSTRUCTION_SET_PINS["ATEN_CPU_CAPABILITY"].upper():
        return None
    pins = " ".join(f"{k}={v}" for k, v in INSTRUCTION_SET_PINS.items())
    return (f"these cells run with the instruction set pinned (torch's CPU capability is {capability}"
            + (f"; not set: {', '.join(sorted(missing))}" if missing else "") + f"): start the process with {pins}")


def _installed_version(distribution: str) -> Optional[str]:
    """The installed version of ``distribution``; None when it is not installed (an optional extra)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def cell_record(cfg: Dict[str, Any], amendment: Optional[int] = None, repo: Optional[Path] = None,
                spec_digest: Optional[str] = None) -> Dict[str, Any]:
    """What a cell's numbers depend on besides its options: the amendment (a cell of the protocol's; None: a
    study's cell, whose ``spec_digest`` is recorded instead), the commit of ``repo`` and whether its tracked files
    differ from it, the Python / torch / timm versions, the torch thread count, the fingerprint of the generated
    set it reads and the digest of KD's teacher weights; from amendment 4 on, and for every study cell, also the
    numpy and diffusers versions, the device, the processor, torch's CPU capability, the instruction-set pins and
    the digests of the real training and validation images."""
    import timm
    import torch

    from ..hub import content_fingerprint

    status = git("status", "--porcelain", "--untracked-files=no", repo=repo)
    record = {**({"amendment": int(amendment)} if amendment is not None else {}),
              **({"spec_digest": spec_digest} if spec_digest is not None else {}),
              "commit": git("rev-parse", "HEAD", repo=repo),
              "clean": None if status is None else status == "", "python": platform.python_version(),
              "torch": torch.__version__, "timm": timm.__version__, "torch_threads": torch.get_num_threads()}
    if amendment is None or amendment >= 4:
        import numpy

        # where the cell trains: timm_csm.training.run's accelerator takes the GPU when there is one, unless told --cpu
        device = "cpu" if cfg.get("cpu") or not torch.cuda.is_available() else torch.cuda.get_device_name(0)
        record.update(numpy=numpy.__version__, diffusers=_installed_version("diffusers"), device=device,
                      cpu=cpu_model(), cpu_capability=torch.backends.cpu.get_cpu_capability(),
                      pins={k: os.environ.get(k) for k in INSTRUCTION_SET_PINS}, real_images=real_images_digests(cfg))
    if cfg.get("csm_dataset"):
        record["generated_set"] = content_fingerprint(cfg["csm_dataset"])
    if cfg.get("teacher"):
        record["teacher"] = file_sha256(Path(cfg["teacher"]) / "model.safetensors")
    return record


def differences(a: Any, b: Any, where: str = "") -> List[str]:
    """Every leaf where ``a`` (committed) and ``b`` (now) differ, as ``"path: committed x, now y"``, the keys that
    say where and how fast a cell ran left out, and those ``a`` lacks at any depth (a number later code adds, as a
    new metric: :func:`added_keys`, not compared)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(a) if k not in _WHERE
                for d in differences(a[k], b.get(k), f"{where}.{k}" if where else k)]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{where}[{i}]")]
    return [] if a == b else [f"{where}: committed {a!r}, now {b!r}"]


def added_keys(a: Any, b: Any, where: str = "") -> List[str]:
    """The paths of the keys of ``b`` (now) that ``a`` (committed) lacks, at any depth."""
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return []
    paths = {k: f"{where}.{k}" if where else k for k in b if k not in _WHERE}
    return [p for k in sorted(paths) for p in ([paths[k]] if k not in a else added_keys(a[k], b[k], paths[k]))]


def verify_cell(name: str, roots: Sequence[Path], log: Callable[[str], None] = print,
                repo: Optional[Path] = None) -> Dict[str, List[str]]:
    """Re-run the committed cell ``name`` (the first of ``roots`` that holds it) from its recorded options on the
    current code, in a temporary folder. Returns ``{"results": every difference of what it computed, "added": the
    paths of the keys the current code reports that the committed results.json lacks (not compared), "record": how
    its record differs (commit, versions, threads, generated set), where it has one, "ran_at": the commit of
    ``repo`` and whether its tracked files were clean when the run started}``; the cell reproduces when ``results`` is
    empty."""
    from ..training import run

    home = next((Path(r) / name for r in roots if (Path(r) / name / CELL_META).exists()), None)
    if home is None:
        raise SystemExit(f"no committed cell {name!r} under {', '.join(str(r) for r in roots)}")
    meta = read_json(home / CELL_META)
    cfg = dict(meta["config"])
    # the code's commit and state as the run starts: the checkout may move while a cell trains
    ran_at = {"commit": git("rev-parse", "HEAD", repo=repo),
              "clean": git("status", "--porcelain", "--untracked-files=no", repo=repo) == ""}
    now = cell_record(cfg, meta["record"].get("amendment"), repo, meta["record"].get("spec_digest")) \
        if "record" in meta else None
    with tempfile.TemporaryDirectory(prefix=f"verify-{name}-") as tmp:
        log(f"[verify] re-running {name} in {tmp}")
        results = json.loads(json.dumps(run(paper_protocol(dict(cfg, output=tmp, experiment=".", progress=False)))))
    committed = read_json(home / RESULTS)
    out = {"results": differences(committed, results), "added": added_keys(committed, results), "record": [],
           "ran_at": ran_at}
    if now is not None:
        out["record"] = differences({k: v for k, v in meta["record"].items() if k != "resumed"}, now)
    return out


def collect_cells(output: Path) -> Dict[str, Dict[int, Dict[str, Any]]]:
    """``{method: {seed: {"results", "seconds", "dir", "config"}}}`` of every finished cell under
    ``<output>/cells``."""
    found: Dict[str, Dict[int, Dict[str, Any]]] = {}
    cells = Path(output) / "cells"
    if not cells.is_dir():
        return found
    for d in sorted(cells.iterdir()):
        meta_path, res_path = d / CELL_META, d / RESULTS
        if not (meta_path.exists() and res_path.exists()):
            continue
        meta = read_json(meta_path)
        found.setdefault(meta["method"], {})[int(meta["seed"])] = {
            "results": read_json(res_path), "seconds": meta.get("seconds"), "dir": d, "config": meta["config"]}
    return found


def per_seed_row(seed: int, cell: Dict[str, Any]) -> Dict[str, Any]:
    """One seed of a method: test metrics before / after TS (accuracy as ``acc``; it and the calibration errors in
    %), T, the chosen checkpoint's epoch, the validation ECE (%) and NLL before / after TS, the cell's seconds."""
    r = cell["results"]
    row: Dict[str, Any] = {"seed": int(seed)}
    for phase in ("pre_ts", "post_ts"):
        scores = r["test"].get(phase) or {}
        for name in metrics_for("per_seed"):  # by abbreviation, each at its table's scale
            if name in scores:
                spec = metric_spec(name)
                row[f"{spec.abbrev}_{phase}"] = scores[name] * spec.scale
        val = (r.get("val") or {}).get(phase) or {}
        if "ece" in val:
            row[f"val_ece_{phase}"] = val["ece"] * 100.0
        if "nll" in val:
            row[f"val_nll_{phase}"] = val["nll"]
    row["T"] = r.get("temperature")
    row["epoch"] = r.get("checkpoint_epoch")
    row["seconds"] = cell.get("seconds")
    return row


def verify_and_log(name: str, roots: Sequence[Path], log_path: Optional[Path] = None, repo: Optional[Path] = None,
                   log: Callable[[str], None] = print) -> Tuple[str, bool]:
    """:func:`verify_cell`, told in words: ``(text, reproduced)``. With ``log_path``, the run is appended to that
    JSON list (the cell, the commit of ``repo`` and whether its tracked files were clean, the differences)."""
    found = verify_cell(name, roots, log, repo)
    diffs = found["results"]
    text = "\n".join([f"{name}: reproduced exactly" if not diffs else f"{name}: {len(diffs)} difference(s)", *diffs]
                     + [f"reported now, not in the committed results (not compared): {', '.join(found['added'])}"]
                     * bool(found["added"]) + [f"record: {d}" for d in found["record"]])
    if log_path is not None:
        runs = read_json(log_path) if Path(log_path).exists() else []
        import torch

        # the machine's vector units decide the last bits of float64 reductions: a verdict holds on the capability
        # it ran at
        write_json_atomic(Path(log_path), runs + [{
            "cell": name, **found["ran_at"], "reproduced": not diffs,
            "differences": diffs, "not_compared": found["added"], "cpu": cpu_model(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "pins": {k: os.environ.get(k) for k in INSTRUCTION_SET_PINS}}], indent=1)
    return text, not diffs
