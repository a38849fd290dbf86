"""The data benchmark's part 1: peak memory of one-epoch ``train.py`` runs (``rss``, ``saved``), by allocator setting
(``alloc``), and of the set-up in a fresh process (``setup``); see ``data_bench.py``."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from data_bench_folders import BATCH, OFFLINE, REPO, SEED, SIDE, training_args

#: the script whose ``--probe-setup`` runs the set-up in a fresh process
DATA_BENCH = Path(__file__).with_name("data_bench.py")


def _proc_kib(pid: int, name: str, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/{name}").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def watch_tree(pid: int, peaks: dict, stop: threading.Event, every: float = 0.25) -> None:
    """Record, until ``stop``, the peak RSS (VmHWM) of process ``pid`` and of its descendants (the DataLoader
    workers), the peak of the tree's summed PSS (shared pages counted once over the tree), and three phases of the
    main process: its peak before the first worker starts (``setup``: data listing, model, statistics), its largest
    sampled RSS while the training loader's workers are the only ones (``steps``), and from the first other worker
    on (``evaluation``: validation and the test evaluation)."""
    import psutil

    root, first = psutil.Process(pid), None
    while not stop.is_set():
        try:
            kids = {p.pid for p in root.children(recursive=True)}
        except psutil.Error:
            break
        peaks["main"] = max(peaks.get("main", 0), _proc_kib(pid, "status", "VmHWM"))
        if kids and first is None:
            first, peaks["setup"], peaks["setup_s"] = kids, peaks["main"], time.time() - peaks["start"]
        if first is not None:
            phase = "steps" if kids and kids <= first else "evaluation"
            first = first if phase == "steps" else set()
            peaks[phase] = max(peaks.get(phase, 0), _proc_kib(pid, "status", "VmRSS"))
        for k in kids:
            peaks["worker"] = max(peaks.get("worker", 0), _proc_kib(k, "status", "VmHWM"))
        pss = sum(_proc_kib(p, "smaps_rollup", "Pss") for p in [pid, *kids])
        peaks["tree_pss"] = max(peaks.get("tree_pss", 0), pss)
        stop.wait(every)


def train_command(folder: Path, out: Path, workers: int):
    return [sys.executable, str(REPO / "train.py"), "--dataset", str(folder), "--model", "small_cnn",
            "--img-size", str(SIDE), "--in-chans", "1", "-b", str(BATCH), "--workers", str(workers), "--epochs", "1",
            "--lr", "0.05", "--seed", str(SEED), "--no-progress", "--output", str(out), "--experiment", folder.name]


def peak_rss(folder: Path, workers: int = 1, extra_env=None) -> dict:
    """Peak memory of one ``train.py`` epoch on ``folder`` (a fresh ``HF_HOME``, offline, one thread, and
    ``extra_env``)."""
    with tempfile.TemporaryDirectory(prefix="data-bench-") as tmp:
        env = dict(os.environ, **OFFLINE, **(extra_env or {}), HF_HOME=str(Path(tmp) / "hf"))
        cmd = train_command(folder, Path(tmp) / "runs", workers)
        t = time.time()
        proc = subprocess.Popen(cmd, env=env, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        peaks, stop = {"start": t}, threading.Event()
        watcher = threading.Thread(target=watch_tree, args=(proc.pid, peaks, stop), daemon=True)
        watcher.start()
        output = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        stop.set()
        watcher.join()
        if proc.returncode != 0:
            raise RuntimeError(f"train.py failed ({proc.returncode}):\n{output[-3000:]}")
        run_dir = next((Path(tmp) / "runs" / folder.name).glob("**/results.json")).parent
        results = json.loads((run_dir / "results.json").read_text())
        epoch = json.loads((run_dir / "log.json").read_text())[0]["epoch_time"]
    return dict(n_train=results["n_train"], n_val=results["n_val"], n_test=results["n_test"],
                wall=time.time() - t, setup_s=peaks.get("setup_s", 0.0), epoch_s=epoch, maxrss=usage.ru_maxrss / 1024,
                user_s=usage.ru_utime, sys_s=usage.ru_stime,
                **{k: peaks.get(k, 0) / 1024 for k in ("main", "setup", "steps", "evaluation", "worker", "tree_pss")})


def saved_copy(folder: Path) -> Path:
    """``folder`` read once through ``datasets``' ``imagefolder`` and written with ``save_to_disk`` (which embeds
    each file's PNG bytes in the Arrow file; written once): a dataset ``train.py`` opens with ``load_from_disk``."""
    import datasets

    saved = folder.with_name(folder.name + "-saved")
    if not (saved / "dataset_dict.json").is_file():
        tmp = saved.with_name(saved.name + ".tmp")
        datasets.load_dataset(str(folder)).save_to_disk(str(tmp))
        os.replace(tmp, saved)
    return saved


def _rss_kinds() -> dict:
    """This process's anonymous and file-backed RSS (MiB)."""
    return {k: _proc_kib(os.getpid(), "status", k) / 1024 for k in ("RssAnon", "RssFile")}


def probe_setup(folder: Path) -> None:
    """Print (JSON) this process's :func:`_rss_kinds` before and after ``load_data`` of ``folder`` and after
    ``build_transforms``, the set-up of a ``train.py`` run with the default transform (run in a fresh process)."""
    from timm_csm.training import build_transforms, input_channels, load_data

    before = _rss_kinds()
    args = training_args(folder, "auto")
    data = load_data(args)
    loaded = _rss_kinds()
    build_transforms(args, data, input_channels(args, data))  # reads a sample of the images for the normalisation
    print(json.dumps({"before": before, "after": loaded, "transforms": _rss_kinds()}))


def setup_memory(folder: Path) -> dict:
    """Anonymous and file-backed RSS (MiB) of a fresh process before and after ``load_data`` of ``folder``, and after
    ``build_transforms`` (which reads a sample of the training images for the normalisation)."""
    with tempfile.TemporaryDirectory(prefix="data-bench-") as tmp:
        env = dict(os.environ, **OFFLINE, HF_HOME=str(Path(tmp) / "hf"))
        out = subprocess.run([sys.executable, str(DATA_BENCH), "--probe-setup", str(folder)], env=env, cwd=REPO, check=True,
                             capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def setup_memory_table(folders) -> str:
    lines = ["| dataset | Arrow files (MiB) | anonymous: before / after load_data / after build_transforms (MiB) | "
             "file-backed: before / after load_data / after build_transforms (MiB) |", "|---|---|---|---|"]
    for folder in folders:
        m = setup_memory(folder)
        arrow = sum(f.stat().st_size for f in folder.rglob("*.arrow")) / 2 ** 20
        phases = [" / ".join(f"{m[k][kind]:.0f}" for k in ("before", "after", "transforms"))
                  for kind in ("RssAnon", "RssFile")]
        lines.append(f"| {folder.name} | {arrow:.0f} | " + " | ".join(phases) + " |")
    return "\n".join(lines)


def rss_table(rows) -> str:
    lines = ["| training images | train / val / test | wall (s) | to the first worker (s) | epoch + validation (s) "
             "| peak RSS, largest process (MiB) | main: peak before training (MiB) | main: training steps (MiB) "
             "| main: validation and evaluation (MiB) | worker peak RSS (MiB) | peak PSS, main + workers (MiB) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for n, r in rows:
        lines.append(f"| {n} | {r['n_train']} / {r['n_val']} / {r['n_test']} | {r['wall']:.0f} | {r['setup_s']:.0f} | "
                     f"{r['epoch_s']:.0f} | {r['maxrss']:.0f} | {r['setup']:.0f} | {r['steps']:.0f} | "
                     f"{r['evaluation']:.0f} | {r['worker']:.0f} | {r['tree_pss']:.0f} |")
    (small_n, small), (large_n, large) = rows[0], rows[-1]
    ratio = large["maxrss"] / small["maxrss"]
    verdict = "met" if ratio <= 1.10 else "not met"
    lines.append(f"\npeak RSS {large_n} / {small_n}: {ratio:.3f} (goal <= 1.10: {verdict}); main process during the "
                 f"training steps {large['steps'] / small['steps']:.3f}, during validation and evaluation "
                 f"{large['evaluation'] / small['evaluation']:.3f}; peak PSS "
                 f"{large['tree_pss'] / small['tree_pss']:.3f}. "
                 "Phases of the main process: sampled RSS every 0.25 s (the peak before training is its VmHWM)")
    return "\n".join(lines)


def allocator_rows(folder: Path, rounds: int, preload=(), threshold: str = "131072"):
    """``rounds`` interleaved rounds of :func:`peak_rss` runs on ``folder``: glibc's default allocator settings, its
    mmap threshold fixed at ``threshold`` bytes, and each allocator library of ``preload`` (``LD_PRELOAD``)."""
    settings = [("glibc default", {}), (f"MALLOC_MMAP_THRESHOLD_={threshold}", {"MALLOC_MMAP_THRESHOLD_": threshold})]
    for lib in preload:
        if not Path(lib).is_file():
            raise SystemExit(f"--preload {lib}: no such file")
        settings.append((f"LD_PRELOAD {Path(lib).name}", {"LD_PRELOAD": str(lib)}))
    return [(name, r, peak_rss(folder, extra_env=env)) for r in range(rounds) for name, env in settings]


def allocator_table(rows) -> str:
    lines = ["| allocator | round | wall (s) | epoch + validation (s) | user CPU (s) | system CPU (s) | "
             "peak RSS, largest process (MiB) |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {name} | {r + 1} | {x['wall']:.1f} | {x['epoch_s']:.1f} | {x['user_s']:.1f} | {x['sys_s']:.1f} | "
              f"{x['maxrss']:.0f} |" for name, r, x in rows]
    names = list(dict.fromkeys(name for name, _, _ in rows))
    walls = {n: [x["wall"] for name, _, x in rows if name == n] for n in names}
    lines.append("")
    lines += [f"wall {n} / {names[0]}, round by round: "
              + ", ".join(f"{b / a:.3f}" for a, b in zip(walls[names[0]], walls[n])) for n in names[1:]]
    return "\n".join(lines)
