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

Beside this script: the image folders (``data_bench_folders.py``) and one module per measurement
(``data_bench_memory.py``, ``data_bench_loader.py``, ``data_bench_csm.py``).
"""
import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

from data_bench_csm import csm_rows, csm_table, synthetic_csm_set
from data_bench_folders import OFFLINE, REPO, image_folder
from data_bench_loader import loader_rows, loader_table
from data_bench_memory import (allocator_rows, allocator_table, peak_rss, probe_setup, rss_table, saved_copy,
                               setup_memory_table)


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
