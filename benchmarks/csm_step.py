"""The CSM step, two passes against one concatenated forward (``--csm-forward``), and the share of annotation and
the reference encoder in the demo's time (issue 43, items 2 and 3).

    OMP_NUM_THREADS=1 python benchmarks/csm_step.py seeds --csm-dataset DEMO_SET --variant two-pass
    OMP_NUM_THREADS=1 python benchmarks/csm_step.py seeds --csm-dataset DEMO_SET --variant concat
    OMP_NUM_THREADS=1 python benchmarks/csm_step.py step --csm-dataset DEMO_SET
    OMP_NUM_THREADS=1 python benchmarks/csm_step.py encoder --demo-run DEMO_RUN
    python benchmarks/csm_step.py page

``DEMO_SET`` is the CSM dataset the ``demo`` profile builds (``runs/demo/annotated-<key>/csm-fmnist-aug`` after
``timm-csm-pipeline --profile demo``), ``DEMO_RUN`` that run's folder (``runs/demo``). Each part writes its
numbers into ``benchmarks/csm_step.json`` under its own key; ``page`` writes ``benchmarks/csm_step.md`` from them
(``csm_step_page.py``).

* ``seeds``: the demo profile's CSM training run (``timm_csm.recipes.stages.train_config``, the paper's temperature
  rule) at seeds 0, 1, 2 with ``--csm-forward VARIANT``; its validation accuracy and ECE before temperature scaling
  (the test split is not read here). Runs resume in ``runs/csm_step/e<epochs>/<variant>-s<seed>``.
* ``step``: (a) CPU seconds of one optimizer step (forward, backward, clip, SGD) of the demo's model on one demo
  batch, two passes against concat, in interleaved rounds, best of N (``time.process_time``, one thread);
  (c) one epoch of the demo's training loader with the step: CPU time in ``next(loader)`` (reading, decoding and
  transforming the real batch and its companions: the collator) against the step, and the companions' Arrow reads
  and PNG decoding alone.
* ``encoder``: the stage seconds of the demo run (``DONE.json``) and the reference encoder's forward over real
  training images at batch sizes 64 / 256 / 1024, float32 against bfloat16 autocast, interleaved, best of N.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

from csm_step_page import RESULTS, ROOT, VARIANTS, write_page


def record(*scripts: str) -> dict:
    """What a part's numbers depend on besides its options: the code's commit (and whether the package and
    ``scripts``, by default this one, were clean), torch, its threads, the CPU capability it ran with and the
    instruction-set variables in force."""
    from timm_csm.recipes.cells import INSTRUCTION_SET_PINS, git

    return {"commit": git("rev-parse", "--short", "HEAD", repo=ROOT),
            "clean": not git("status", "--porcelain", "--", "timm_csm", *(scripts or ("benchmarks/csm_step.py",)),
                             repo=ROOT.parent),
            "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "pins": {k: os.environ[k] for k in INSTRUCTION_SET_PINS if k in os.environ}}


def _update_results(key: str, value) -> None:
    from timm_csm.io import write_json_atomic

    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    results[key] = dict(value, record=record()) if isinstance(value, dict) else value
    write_json_atomic(RESULTS, results, indent=1)


def demo_options(csm_dataset: str, variant: str, seed: int, epochs=None, profile=None) -> dict:
    """The demo profile's (or ``profile``'s) CSM training options, as its pipeline stage runs them, with
    ``--csm-forward variant``."""
    from timm_csm.recipes import get_profile
    from timm_csm.recipes.profiles import paper_protocol, with_epochs
    from timm_csm.recipes.stages import train_config

    profile = get_profile("demo") if profile is None else profile
    if epochs is not None:
        profile = with_epochs(profile, epochs)
    options = train_config(profile, "csm", Path(csm_dataset))
    return paper_protocol(dict(options, seed=seed, csm_forward=variant, bootstrap=0, progress=False))


def run_seeds(args) -> None:
    from timm_csm.training import run

    rows = {}
    for seed in args.seeds:
        out = Path(args.runs or f"runs/csm_step/e{args.epochs or 60}") / f"{args.variant}-s{seed}"
        results_file = out / "results.json"
        if not results_file.exists():
            run(dict(demo_options(args.csm_dataset, args.variant, seed, args.epochs), output=str(out),
                     auto_resume=True))
        rows[str(seed)] = validation_row(results_file)
        print(args.variant, seed, rows[str(seed)], flush=True)
    _update_results(f"seeds_{args.variant}", {"epochs": args.epochs or 60, "rows": rows})


def validation_row(results_file: Path) -> dict:
    """A run's validation accuracy and ECE before and after temperature scaling, and its checkpoint's epoch."""
    res = json.loads(Path(results_file).read_text())
    val = res["val"]["pre_ts"]
    return {"val_accuracy": val["accuracy"], "val_ece": val["ece"], "val_ece_after_ts": res["val"]["post_ts"]["ece"],
            "best_epoch": res["checkpoint_epoch"]}


def _demo_training(csm_dataset: str):
    """(config, task, loader, optimizer, (training split, transform, accelerator)) of the demo's CSM run as
    ``timm_csm.training.run`` builds them (two passes), seed 0."""
    from accelerate.utils import set_seed

    from timm_csm.training import resolve_config
    from timm_csm.training.loop import train_loader
    from timm_csm.training.optim import create_optimizer
    from timm_csm.training.trackers import make_accelerator
    from timm_csm.training.train import _build

    config = resolve_config(demo_options(csm_dataset, VARIANTS[0], 0))
    set_seed(config.seed)
    accelerator = make_accelerator(config, None)
    data, task, model, train_tf, _, _, _ = _build(config)
    loader, sampler = train_loader(task, data.train, train_tf, config, accelerator)
    sampler.set_epoch(0)
    return config, task, loader, create_optimizer(config, model), (data.train, train_tf, accelerator)


def _step(task, optimizer, batch, clip_grad: float) -> None:
    """One optimizer step as the training loop takes it: forward, backward, gradient-norm clip, SGD."""
    loss = task(batch)["loss"]
    loss.backward()
    torch.nn.utils.clip_grad_norm_(task.model.parameters(), clip_grad)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _cpu_seconds(fn) -> float:
    t = time.process_time()
    fn()
    return time.process_time() - t


def run_step(args) -> None:
    from timm_csm.training import CSMTask

    from timm_csm.training.loop import train_loader

    config, two_pass, loader, optimizer, (train_data, train_tf, accelerator) = _demo_training(args.csm_dataset)
    concat = CSMTask(two_pass.model, two_pass.criterion, two_pass.companions, two_pass.spec, "concat")
    tasks = {"two-pass": two_pass, "concat": concat}
    two_pass.model.train()
    batch = next(iter(loader))
    for _ in range(2):  # warm-up: allocator, oneDNN kernels
        for task in tasks.values():
            _step(task, optimizer, batch, config.clip_grad)
    times = {name: [] for name in tasks}
    for _ in range(args.rounds):  # interleaved: load drift hits both alike
        for name, task in tasks.items():
            times[name].append(_cpu_seconds(lambda: _step(task, optimizer, batch, config.clip_grad)))
    ratios = [c / t for c, t in zip(times["concat"], times["two-pass"])]
    step = {"rounds": args.rounds, "real_batch": len(batch["pixel_values"]),
            "companions": len(batch["mix_pixel_values"]),
            **{f"{name}_best": min(v) for name, v in times.items()},
            **{f"{name}_median": statistics.median(v) for name, v in times.items()},
            "ratio_best": min(times["concat"]) / min(times["two-pass"]), "ratio_median_of_rounds":
                statistics.median(ratios), "ratio_range": [min(ratios), max(ratios)]}
    print(json.dumps(step, indent=1), flush=True)
    _update_results("step", step)
    data = {}
    for workers in (0, 1):  # 0: the demo's (batches built between steps); 1: built beside the step
        config.workers = workers
        loader, _ = train_loader(two_pass, train_data, train_tf, config, accelerator)
        data[str(workers)] = _loader_against_step(config, two_pass, loader, optimizer, args.epochs)
    _update_results("data", data)


def _loader_against_step(config, task, loader, optimizer, epochs: int) -> dict:
    """CPU seconds per step in ``next(loader)`` (the collator: real images, companion rows, their Arrow reads and
    PNG decoding, the transform of both) and in the step, over ``epochs`` epochs of the demo's loader (0 workers:
    the batch is built in the training process, between two steps, as in the demo), with the companions' reads and
    decoding (``LazyImages.pil``) timed inside it where they run in this process. With a worker, the wall time in
    ``next(loader)`` is the step's wait for its batch."""
    images = task.companions.groups.images
    decode = []
    read = images.pil

    def timed_read(indices):
        t = time.process_time()
        out = read(indices)
        decode.append(time.process_time() - t)
        return out

    images.pil = timed_read  # the instance's attribute: LazyImages.__getitem__ calls self.pil
    load, step, wall_load, wall_step = [], [], [], []
    for epoch in range(epochs):
        loader.batch_sampler.set_epoch(epoch + 1)
        it = iter(loader)
        while True:
            t, w = time.process_time(), time.perf_counter()
            batch = next(it, None)
            if batch is None:
                break
            load.append(time.process_time() - t)
            wall_load.append(time.perf_counter() - w)
            t, w = time.process_time(), time.perf_counter()
            _step(task, optimizer, batch, config.clip_grad)
            step.append(time.process_time() - t)
            wall_step.append(time.perf_counter() - w)
    del images.pil
    data = {"workers": config.workers, "steps": len(step), "load_median": statistics.median(load),
            "load_max": max(load), "step_median": statistics.median(step),
            "load_share": sum(load) / (sum(load) + sum(step)),
            "wall_load_median": statistics.median(wall_load), "wall_load_max": max(wall_load),
            "wall_step_median": statistics.median(wall_step)}
    if decode:  # read in this process (0 workers)
        data.update(decode_median=statistics.median(decode), decode_share=sum(decode) / (sum(load) + sum(step)))
    print(json.dumps(data, indent=1), flush=True)
    return data


def _stage_seconds(demo_run: Path) -> dict:
    """``{stage: seconds}`` from the ``DONE.json`` of each stage folder of a pipeline run (``<stage>-<key>``)."""
    seconds = {}
    for done in sorted(demo_run.glob("*/DONE.json")):
        seconds[done.parent.name.rsplit("-", 1)[0]] = json.loads(done.read_text())["seconds"]
    return seconds


def run_encoder(args) -> None:
    import contextlib

    from timm_csm.annotation import load_reference_encoder
    from timm_csm.annotation.encoders import encode_images
    from timm_csm.data import load_fashion_mnist

    demo_run = Path(args.demo_run)
    stages = _stage_seconds(demo_run)
    encoder = load_reference_encoder(next(demo_run.glob("encoder-*/encoder")))
    images = load_fashion_mnist("train").images[:args.images]  # real training images, as the prototypes' pass
    precisions = {"float32": contextlib.nullcontext, "bfloat16": lambda: torch.autocast("cpu", dtype=torch.bfloat16)}

    def encode(batch_size, precision):
        with precisions[precision]():
            return encode_images(encoder, images, batch_size=batch_size)

    reference = encode(256, "float32")
    agreement = {}
    for precision in precisions:
        feats = encode(256, precision)
        same = encoder.logits_from_features(feats).argmax(1) == encoder.logits_from_features(reference).argmax(1)
        agreement[precision] = {"max_relative_error": float(((feats - reference).norm(dim=1) / reference.norm(dim=1))
                                                           .max()), "same_class": float(same.double().mean())}
    settings = [(b, p) for b in args.batch_sizes for p in precisions]
    times = {f"{b}/{p}": [] for b, p in settings}
    for _ in range(args.rounds):  # interleaved rounds, best of N CPU seconds
        for b, p in settings:
            times[f"{b}/{p}"].append(_cpu_seconds(lambda: encode(b, p)))
    best = {k: min(v) for k, v in times.items()}
    base = best["256/float32"]  # the annotation's default batch size and precision
    forward = {"images": len(images), "rounds": args.rounds, "agreement": agreement,
               "rows": [{"batch_size": b, "precision": p, "images_per_cpu_second": len(images) / best[f"{b}/{p}"],
                         "ratio": best[f"{b}/{p}"] / base} for b, p in settings]}
    train_step = _encoder_train_step(encoder, images, precisions, args.rounds * 4)
    print(json.dumps({"stages": stages, "forward": forward, "train_step": train_step}, indent=1), flush=True)
    _update_results("encoder", {"stages": stages, "forward": forward, "train_step": train_step})


def _encoder_train_step(encoder, images, precisions, rounds: int) -> dict:
    """CPU seconds of one training step of the reference encoder as its ``encoder`` stage takes them (batch 64 of
    its configuration, AdamW, cross-entropy, channels-last), float32 against bfloat16 autocast, interleaved."""
    import torch.nn.functional as F

    from timm_csm.annotation.reference import _new_run

    run = _new_run(encoder.config, len(images), "cpu")
    model, optimizer = run["model"].train(), run["optimizer"]
    batch = encoder.config["batch_size"]
    x = encoder.preprocess(images[:batch]).contiguous(memory_format=torch.channels_last)
    y = torch.arange(batch) % len(encoder.class_names)

    def step(precision):
        with precisions[precision]():
            loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    for p in precisions:  # warm-up
        step(p)
    times = {p: [] for p in precisions}
    for _ in range(rounds):
        for p in precisions:
            times[p].append(_cpu_seconds(lambda: step(p)))
    return {"batch_size": batch, "rounds": rounds, **{f"{p}_best": min(v) for p, v in times.items()},
            "ratio": min(times["bfloat16"]) / min(times["float32"])}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="part", required=True)
    seeds = sub.add_parser("seeds", help="the demo's CSM run at 3 seeds with one --csm-forward")
    seeds.add_argument("--csm-dataset", required=True)
    seeds.add_argument("--variant", choices=VARIANTS, required=True)
    seeds.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    seeds.add_argument("--epochs", type=int, default=None, help="default: the demo's 60")
    seeds.add_argument("--runs", default=None, help="default: runs/csm_step/e<epochs>")
    step = sub.add_parser("step", help="seconds per step, two passes against concat; the loader against the step")
    step.add_argument("--csm-dataset", required=True)
    step.add_argument("--rounds", type=int, default=20)
    step.add_argument("--epochs", type=int, default=2, help="loader epochs timed against the step")
    enc = sub.add_parser("encoder", help="the demo's stage seconds; the reference encoder's forward by batch size "
                                        "and precision")
    enc.add_argument("--demo-run", required=True)
    enc.add_argument("--images", type=int, default=8192)
    enc.add_argument("--batch-sizes", type=int, nargs="+", default=[64, 256, 1024])
    enc.add_argument("--rounds", type=int, default=5)
    sub.add_parser("page", help="write benchmarks/csm_step.md from benchmarks/csm_step.json")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    {"seeds": run_seeds, "step": run_step, "encoder": run_encoder, "page": lambda _: write_page()}[args.part](args)


if __name__ == "__main__":
    main()
