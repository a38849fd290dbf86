"""The lazy data route: peak memory against dataset size, loader throughput against timm, CSM step time.

Three measurements on image folders made from real Fashion-MNIST (``train/<class>/<i>.png`` and a small
``test/``, 64 x 64 grey PNGs, written once under ``--root`` and reused):

1. ``rss``: peak memory of a one-epoch ``train.py`` run (``small_cnn``, 64 px, 1 channel, batch 128, one
   DataLoader worker) on a folder of 10k and of 100k training images, offline, each in a fresh ``HF_HOME``. Goal:
   the 100k run's peak RSS at most 1.10x the 10k run's. ``saved`` (not run by default): the same runs on copies of
   the two folders written with ``save_to_disk`` (the same images, their PNG bytes embedded in an Arrow table, read
   through ``ArrowImages``, the route of Hub and saved datasets, instead of the folder's file list). ``alloc`` (not
   run by default): the 10k run in 3 interleaved rounds with glibc's default allocator settings and with its mmap
   threshold fixed (``MALLOC_MMAP_THRESHOLD_=131072``), and with each ``--preload`` allocator library (jemalloc,
   tcmalloc): wall, CPU time and peak RSS. ``setup`` (not run by default): anonymous and file-backed memory of a
   fresh process before and after ``load_data`` and ``build_transforms`` of each folder and its saved copy.
2. ``loader``: images per second of the training loader as ``train.py`` builds it (``load_data``,
   ``build_transforms``, ``ClassificationTask`` and ``train_loader``) with timm's train transform (``--transform
   timm``) against ``timm.data.create_loader`` over ``timm.data.ImageDataset`` of the same folder with the same
   transform settings, workers 0 and 1, best of 3 interleaved rounds; also the batched pad-crop route. Goal: at
   least 0.9x timm's.
3. ``csm``: a CSM training step (collator, ``CSMTask`` forward / backward, SGD update) on in-memory Fashion-MNIST
   with companions read lazily from the generated set's Arrow dataset against the same set decoded into a tensor
   (``CSMGroups.from_arrays``), same seeds (the batches are checked equal). The generated set is synthetic but in
   the published format (PNG-encoded 28 px blends of two real images of the group's class pair, soft labels of
   the calibrated-annotation form), saved with ``timm_csm.hub.save_csm_dataset``. Goal: ratio ~1.0.

    nice -n 10 env OMP_NUM_THREADS=1 .venv/bin/python benchmarks/data_bench.py [--quick]
        [--only rss,loader,csm,saved,alloc,setup] [--env KEY=VALUE ...]

``--env``: extra environment of the ``train.py`` runs of ``rss`` / ``saved``; ``--preload``: the allocator libraries
that ``alloc`` compares.
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_EVALUATE_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
SIDE = 64
BATCH = 128
SEED = 0


# -- the image folders ---------------------------------------------------------------------------------------------
def class_dirs():
    from timm_csm.data import FASHION_MNIST_CLASSES

    return [f"{k}-{name.replace('/', '-')}" for k, name in enumerate(FASHION_MNIST_CLASSES)]  # sorted = label order


def variant_images(images: np.ndarray, rows: np.ndarray, seed: int) -> np.ndarray:
    """uint8 (len(rows), SIDE, SIDE): image ``rows % N`` of ``images`` (N, 1, 28, 28) resized to SIDE px; each
    repetition past the first (``rows >= N``) flipped left-right with probability 1/2 and shifted by up to 4 px
    (zero fill), seeded by (seed, row)."""
    import torch.nn.functional as F

    n = len(images)
    x = torch.from_numpy(images[rows % n]).float()
    x = F.interpolate(x, size=(SIDE, SIDE), mode="bilinear", align_corners=False).round().clamp(0, 255)
    padded = F.pad(x, (4, 4, 4, 4))
    for j, row in enumerate(rows):
        if row < n:
            continue
        rng = np.random.default_rng([seed, int(row)])
        dy, dx = rng.integers(0, 9, size=2)
        img = padded[j, :, dy:dy + SIDE, dx:dx + SIDE]
        x[j] = img.flip(-1) if rng.random() < 0.5 else img
    return x[:, 0].to(torch.uint8).numpy()


def write_split(folder: Path, split: str, arrays, n: int, seed: int) -> None:
    """``folder/split/<class>/<i>.png`` for i < n; files already there are kept (an interrupted run resumes)."""
    from PIL import Image

    names = class_dirs()
    for d in names:
        (folder / split / d).mkdir(parents=True, exist_ok=True)
    for start in range(0, n, 2000):
        rows = np.arange(start, min(n, start + 2000))
        paths = [folder / split / names[arrays.labels[r % len(arrays.labels)]] / f"{r}.png" for r in rows]
        todo = [j for j, p in enumerate(paths) if not p.exists()]
        if not todo:
            continue
        images = variant_images(arrays.images, rows[todo], seed)
        for img, j in zip(images, todo):
            tmp = paths[j].with_suffix(".tmp")
            Image.fromarray(img).save(tmp, format="PNG")
            os.replace(tmp, paths[j])


def image_folder(root: Path, n_train: int, n_test: int, seed: int = SEED) -> Path:
    """The folder of ``n_train`` training and ``n_test`` test images, written unless complete already."""
    from timm_csm.data import load_fashion_mnist

    folder = root / f"fmnist{SIDE}-{n_train}"
    spec = {"n_train": n_train, "n_test": n_test, "side": SIDE, "seed": seed, "source": "fashion_mnist"}
    marker = root / f"{folder.name}.complete.json"  # beside it: a data file inside makes it a datasets data folder
    if marker.is_file() and json.loads(marker.read_text()) == spec:
        return folder
    t = time.time()
    write_split(folder, "train", load_fashion_mnist("train"), n_train, seed)
    write_split(folder, "test", load_fashion_mnist("test"), n_test, seed)
    marker.write_text(json.dumps(spec))
    print(f"wrote {folder} in {time.time() - t:.0f} s", flush=True)
    return folder


# -- 1. peak memory of a training run ------------------------------------------------------------------------------
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
        out = subprocess.run([sys.executable, __file__, "--probe-setup", str(folder)], env=env, cwd=REPO, check=True,
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


# -- 2. loader throughput ------------------------------------------------------------------------------------------
def training_args(folder: Path, transform: str):
    """The configuration of a ``train.py`` run on ``folder`` (small_cnn, 64 px, 1 channel, batch 128)."""
    from timm_csm.training import apply_input_size, parse_args

    args = parse_args(["--dataset", str(folder), "--model", "small_cnn", "--img-size", str(SIDE), "--in-chans", "1",
                       "-b", str(BATCH), "--transform", transform, "--seed", str(SEED)])
    apply_input_size(args)
    return args


def training_data(folder: Path):
    """(args, splits) of a ``train.py`` run on ``folder`` with timm's transform."""
    from timm_csm.training import load_data

    args = training_args(folder, "timm")
    return args, load_data(args)


def our_loader(args, data, transform: str, workers: int):
    """The training loader exactly as ``train.py`` builds it with ``--transform transform --workers workers``, and
    the run's data settings."""
    import copy

    import timm
    from accelerate import Accelerator

    from timm_csm.losses import create_loss
    from timm_csm.training import ClassificationTask, build_transforms, input_channels
    from timm_csm.training.loop import train_loader

    args = copy.copy(args)
    args.transform, args.workers = transform, workers
    in_chans = input_channels(args, data)
    model = timm.create_model("small_cnn", num_classes=len(data.class_names), in_chans=in_chans)
    train_tf, _, info = build_transforms(args, data, in_chans, model.pretrained_cfg)
    loader, _ = train_loader(ClassificationTask(model, create_loss("ce")), data.train, train_tf, args,
                             Accelerator(cpu=True))
    return loader, dict(info, train_interpolation=args.train_interpolation or info["interpolation"])


def timm_loader(folder: Path, info: dict, workers: int):
    """``timm.data.create_loader`` over ``ImageDataset(folder/train)`` with the run's transform settings (the train
    interpolation as timm's train.py passes it)."""
    from timm.data import ImageDataset, create_loader

    dataset = ImageDataset(str(folder / "train"), input_img_mode="L")
    return create_loader(dataset, input_size=(1, SIDE, SIDE), batch_size=BATCH, is_training=True,
                         use_prefetcher=False, num_workers=workers, mean=tuple(info["mean"]), std=tuple(info["std"]),
                         interpolation=info["train_interpolation"], crop_pct=info["crop_pct"], persistent_workers=False)


def images_per_second(loader, batches: int) -> float:
    """Images per second over ``batches`` batches after the first (a fresh iterator: worker start-up and the
    first batch are left out)."""
    it = iter(loader)
    next(it)
    n, t = 0, time.perf_counter()
    for _ in range(batches):
        batch = next(it)
        n += len(batch["pixel_values"] if isinstance(batch, dict) else batch[0])
    rate = n / (time.perf_counter() - t)
    del it
    return rate


def loader_rows(folder: Path, batches: int, rounds: int = 3):
    args, data = training_data(folder)
    ours = {w: our_loader(args, data, "timm", w) for w in (0, 1)}
    padcrop = {w: our_loader(args, data, "cifar", w)[0] for w in (0, 1)}  # after: it resizes the split's output
    rows = []
    for workers in (0, 1):
        loader, info = ours[workers]
        reference = timm_loader(folder, info, workers)
        if repr(loader.collate_fn.transform.transform) != repr(reference.dataset.transform):
            raise AssertionError(f"different transforms:\n{loader.collate_fn.transform.transform}\n"
                                 f"{reference.dataset.transform}")
        loaders = {"timm create_loader": reference, "ours, timm transform": loader,
                   "ours, pad-crop (batched)": padcrop[workers]}
        best = {name: 0.0 for name in loaders}
        for _ in range(rounds):  # interleaved, so that load changes on the shared machine hit every loader alike
            for name, each in loaders.items():
                best[name] = max(best[name], images_per_second(each, batches))
        rows.append((workers, best))
    return rows


def loader_table(rows, batches: int) -> str:
    lines = ["| workers | timm `create_loader` (img/s) | ours, timm transform (img/s) | ours / timm "
             "| ours, pad-crop batched (img/s) |", "|---|---|---|---|---|"]
    verdicts = []
    for workers, best in rows:
        t, o, p = best["timm create_loader"], best["ours, timm transform"], best["ours, pad-crop (batched)"]
        lines.append(f"| {workers} | {t:.0f} | {o:.0f} | {o / t:.2f}x | {p:.0f} |")
        verdicts.append(f"workers {workers}: {'met' if o >= 0.9 * t else 'not met'}")
    lines.append(f"\nbest of 3 interleaved rounds of {batches} batches of {BATCH} (after the first batch of a fresh "
                 f"iterator); goal ours / timm >= 0.9x: {', '.join(verdicts)}")
    return "\n".join(lines)


# -- 3. CSM step time: companions read lazily vs in memory ----------------------------------------------------------
LAMBDAS = np.linspace(0.0, 1.0, 8)


def synthetic_csm_set(folder: Path, seeds_per_pair: int, seed: int = SEED) -> Path:
    """A generated set in the published format (written once): per class pair (a, b) and seed, a group of 8 images
    lam * x_a + (1 - lam) * x_b of two real Fashion-MNIST training images of classes a and b (28 px, PNG), soft
    label q_a = sigmoid(4 (lam - 1/2)), q_b = 1 - q_a."""
    import itertools

    from PIL import Image

    from timm_csm.data import FASHION_MNIST_CLASSES, csm_dataset_from_columns, load_fashion_mnist
    from timm_csm.hub import save_csm_dataset

    if (folder / "README.md").is_file():
        return folder
    real = load_fashion_mnist("train")
    rng = np.random.default_rng(seed)
    by_class = [np.flatnonzero(real.labels == c) for c in range(10)]
    cols = {c: [] for c in ("image", "soft_label", "class_a", "class_b", "lambda_gen", "lambda_hat", "group_id",
                            "seed")}
    pairs = list(itertools.combinations(range(10), 2))
    for g, (s, (a, b)) in enumerate(itertools.product(range(seeds_per_pair), pairs)):
        xa, xb = (real.images[rng.choice(by_class[c]), 0].astype(np.float32) for c in (a, b))
        for lam in LAMBDAS:
            q = np.zeros(10, np.float32)
            q[a] = 1.0 / (1.0 + np.exp(-4.0 * (lam - 0.5)))
            q[b] = 1.0 - q[a]
            cols["image"].append(Image.fromarray(np.round(lam * xa + (1 - lam) * xb).astype(np.uint8)))
            cols["soft_label"].append(q.tolist())
            cols["lambda_gen"].append(float(lam))
            cols["lambda_hat"].append(float(lam))
            for key, v in (("class_a", a), ("class_b", b), ("group_id", g), ("seed", s)):
                cols[key].append(v)
    ds = csm_dataset_from_columns(cols, FASHION_MNIST_CLASSES)
    return save_csm_dataset(ds, folder, provenance={"generator": "synthetic blends of real images (benchmark)"})


def csm_groups_both(folder: Path):
    """(lazy, in-memory, build seconds of each): the set's groups read from its Arrow dataset as ``train.py`` does
    (``CSMGroups.from_dataset``, images decoded in ``L`` at 28 px when drawn), and decoded into a tensor first
    (``CSMGroups.from_arrays``)."""
    from timm_csm.data import FASHION_MNIST_CLASSES, CSMGroups
    from timm_csm.hub import load_csm_dataset

    ds = load_csm_dataset(folder)["train"]
    t = time.perf_counter()
    lazy = CSMGroups.from_dataset(ds, class_names=FASHION_MNIST_CLASSES)
    lazy.images = lazy.images.with_output("L", (28, 28))
    t_lazy = time.perf_counter() - t
    t = time.perf_counter()
    rows = np.arange(len(lazy.images))
    images = torch.cat([lazy.images[rows[i:i + 4096]] for i in range(0, len(rows), 4096)])
    cols = ds.select_columns(["soft_label", "class_a", "class_b", "group_id", "lambda_gen"]).with_format("numpy")[:]
    memory = CSMGroups.from_arrays(images, cols["soft_label"], cols["class_a"], cols["class_b"], cols["group_id"],
                                   FASHION_MNIST_CLASSES, cols["lambda_gen"])
    t_memory = time.perf_counter() - t
    if not torch.equal(lazy.members, memory.members):
        raise AssertionError("the two routes group the generated set differently")
    return lazy, memory, t_lazy, t_memory


def csm_loader(task, real, workers: int):
    """The CSM training loader as ``train.py`` builds it (``train_loader``: the task's collator over global
    batches), on the in-memory real images."""
    from accelerate import Accelerator

    from timm_csm.data import create_transforms
    from timm_csm.training import TrainConfig
    from timm_csm.training.loop import train_loader

    train_tf, _ = create_transforms(28, (0.286,), (0.353,), 1)
    config = TrainConfig(seed=SEED, batch_size=BATCH, workers=workers, pin_mem=False)
    return train_loader(task, real, train_tf, config, Accelerator(cpu=True))[0]


def seconds_per_step(loader, task, opt, steps: int) -> float:
    """Seconds per training step (batch from ``loader``, forward, backward, SGD update) over ``steps`` steps after
    the first of a fresh iterator."""
    it = iter(loader)
    t = None
    for i in range(steps + 1):
        if i == 1:
            t = time.perf_counter()
        loss = task(next(it))["loss"]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    seconds = (time.perf_counter() - t) / steps
    del it
    return seconds


def csm_routes(lazy, memory, n_aug: int):
    """{route: (task, optimizer)}: one CSM task per companion route, sharing one model and optimizer."""
    import timm

    from timm_csm.data import CSMCompanionSampler
    from timm_csm.losses import create_loss
    from timm_csm.training import CSMTask

    model = timm.create_model("small_cnn", num_classes=10, in_chans=1).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return {name: (CSMTask(model, create_loss("csm"), CSMCompanionSampler(groups, n_aug=n_aug)), opt)
            for name, groups in (("in memory", memory), ("lazy", lazy))}


def csm_rows(folder: Path, n_augs, steps: int, rounds: int = 3):
    """Per ``n_aug`` and worker count: seconds per CSM step of each route, best of ``rounds`` interleaved rounds;
    the first batches of the two routes are checked equal."""
    from timm_csm.data import load_fashion_mnist

    real = load_fashion_mnist("train")
    lazy, memory, t_lazy, t_memory = csm_groups_both(folder)
    rows = []
    for n_aug in n_augs:
        routes = csm_routes(lazy, memory, n_aug)
        for workers in (0, 1):
            loaders = {name: csm_loader(task, real, workers) for name, (task, _) in routes.items()}
            first = [next(iter(loader)) for loader in loaders.values()]
            if any(not torch.equal(first[0][k], first[1][k]) for k in first[0]):
                raise AssertionError("the lazy and in-memory routes give different batches at the same seed")
            best = {name: float("inf") for name in loaders}
            for _ in range(rounds):
                for name, loader in loaders.items():
                    best[name] = min(best[name], seconds_per_step(loader, *routes[name], steps))
            rows.append(dict(n_aug=n_aug, workers=workers, **best))
    return rows, dict(images=len(lazy.images), groups=lazy.num_groups, t_lazy=t_lazy, t_memory=t_memory)


def csm_table(rows, setup, steps: int) -> str:
    lines = ["| n_aug | generated images per step | workers | step, in memory (ms) | step, lazy (ms) "
             "| lazy / in memory |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['n_aug']} | {BATCH * (1 + r['n_aug'])} | {r['workers']} | {1e3 * r['in memory']:.0f} | "
                     f"{1e3 * r['lazy']:.0f} | {r['lazy'] / r['in memory']:.3f} |")
    lines.append(f"\ngenerated set: {setup['images']} images in {setup['groups']} groups of {len(LAMBDAS)}; set-up "
                 f"{setup['t_lazy']:.2f} s lazily (CSMGroups.from_dataset), {setup['t_memory']:.2f} s decoding it into "
                 "memory (CSMGroups.from_arrays). Step: a batch from the training loader (real batch "
                 f"{BATCH} of in-memory Fashion-MNIST, pad-crop transform), CSMTask forward and backward, SGD update; "
                 f"best of 3 interleaved rounds of {steps} steps after the first batch of a fresh iterator")
    return "\n".join(lines)


# -- the run -------------------------------------------------------------------------------------------------------
def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small folders and few batches (a smoke run)")
    p.add_argument("--only", default="rss,loader,csm",
                   help="comma-separated parts to run: rss, loader, csm; saved, alloc, setup (these not by default)")
    p.add_argument("--root", default=str(REPO / "runs" / "data_bench"), help="where the folders are written")
    p.add_argument("--env", nargs="*", default=[], metavar="KEY=VALUE",
                   help="environment of the train.py runs of rss / saved (e.g. MALLOC_MMAP_THRESHOLD_=131072)")
    p.add_argument("--preload", nargs="*", default=[], metavar="LIB",
                   help="alloc: allocator libraries to compare through LD_PRELOAD (e.g. Debian's libjemalloc2)")
    p.add_argument("--probe-setup", metavar="FOLDER", help=argparse.SUPPRESS)  # the child process of ``setup``
    args = p.parse_args(argv)
    if args.probe_setup:
        probe_setup(Path(args.probe_setup))
        return 0
    malformed = [kv for kv in args.env if "=" not in kv]
    if malformed:
        p.error(f"--env takes KEY=VALUE pairs, got {malformed}")
    extra_env = dict(kv.split("=", 1) for kv in args.env)
    parts = set(args.only.split(","))
    if parts - {"rss", "loader", "csm", "saved", "alloc", "setup"}:
        raise SystemExit(f"--only takes rss, loader, csm, saved, alloc, setup; got {args.only}")
    torch.set_num_threads(1)
    root = Path(args.root) / ("quick" if args.quick else "full")
    sizes = (1000, 4000) if args.quick else (10_000, 100_000)
    n_test = 200 if args.quick else 1000
    import datasets
    import PIL
    import timm

    print(f"machine: {platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__}, timm "
          f"{timm.__version__}, datasets {datasets.__version__}, Pillow {PIL.__version__}, 1 thread per process; "
          f"command: {' '.join(sys.argv)}\n", flush=True)
    t0 = time.time()
    folders = [image_folder(root, n, n_test) for n in sizes]
    if "rss" in parts:
        rows = [(f"{n:,}", peak_rss(folder, extra_env=extra_env)) for n, folder in zip(sizes, folders)]
        print("## Peak memory of a one-epoch train.py run\n\n" + rss_table(rows) + "\n", flush=True)
    if "saved" in parts:
        rows = [(f"{n:,}", peak_rss(saved_copy(folder), extra_env=extra_env)) for n, folder in zip(sizes, folders)]
        print("## Peak memory of a one-epoch train.py run on the folders saved with save_to_disk\n\n"
              + rss_table(rows) + "\n", flush=True)
    if "setup" in parts:
        print("## Main-process memory of the set-up: load_data, then build_transforms (imports done)\n\n"
              + setup_memory_table([f for folder in folders for f in (folder, saved_copy(folder))]) + "\n",
              flush=True)
    if "alloc" in parts:
        print(f"## One-epoch train.py runs on the {sizes[0]:,}-image folder, by allocator setting\n\n"
              + allocator_table(allocator_rows(folders[0], 1 if args.quick else 3, args.preload)) + "\n", flush=True)
    if "loader" in parts:
        batches = 5 if args.quick else 30
        print("## Loader throughput (timm's train transform at 64 px, batch 128)\n\n"
              + loader_table(loader_rows(folders[0], batches), batches) + "\n", flush=True)
    if "csm" in parts:
        csm_set = synthetic_csm_set(root / "csm-fmnist-bench-aug", 3 if args.quick else 28)
        steps = 4 if args.quick else 20
        rows, setup = csm_rows(csm_set, (1,) if args.quick else (1, 3), steps)
        print("## CSM step: companions read lazily vs in memory\n\n" + csm_table(rows, setup, steps) + "\n",
              flush=True)
    print(f"total wall time {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    os.environ.update(OFFLINE)
    with tempfile.TemporaryDirectory(prefix="data-bench-hf-") as hf_home:  # the Arrow caches of this run only
        os.environ["HF_HOME"] = hf_home
        sys.exit(main())
