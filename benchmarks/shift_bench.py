"""Speed of the shift evaluation: a test set under every corruption at five severities against its clean evaluation.

The Fashion-MNIST test set (the first ``--n`` images; 10 000: all of it) is evaluated as ``timm-csm-train
--eval-shift`` evaluates it: :class:`timm_csm.evaluation.shift.ShiftEvaluation` with the training loop's
``predict`` over ``eval_loader`` (the batched eval transform, ``--batch-size`` images a batch, no worker process),
temperature scaling and the three conformal methods fitted on 1 000 training images. The model is ``--model``
(default the protocol's ``small_cnn``) with random weights: the time does not depend on them. Measured:

* ``clean``: one prediction of the clean test set (loading, transform, forward passes);
* ``shift``: the whole shift evaluation (the probe behind its projected time, then every corruption x severity:
  corruption, loading, transform, forward passes, every metric before and after temperature scaling, conformal
  sets);
* ``forward``: the model alone on the transformed clean batches, once (the shift evaluation makes this pass once per
  corruption x severity);
* ``corrupt``: each corruption alone at each severity on the whole test set, in the same batches.

The shares of the shift evaluation's time: forward passes (cells x ``forward``), corruptions (``corrupt``), the rest
(reading batches, the transform, metrics, conformal sets). Times are CPU seconds of the process (one torch thread,
no worker process), so that other jobs on the machine do not count.

    nice -n 10 env OMP_NUM_THREADS=1 .venv/bin/python benchmarks/shift_bench.py [--n 10000] [--model small_cnn]
        [--batch-size 256] [--corruptions all] [--out benchmarks/shift]

writes ``<out>.json`` and ``<out>.md`` (the command, the machine and the table).

``--cost`` measures instead what a corruption costs per image at the model's input, where it is applied: each
corruption at each severity on ``--cost-n`` Fashion-MNIST test images resized to each input size of
:data:`COST_INPUTS` (grey 28 px; RGB 64 and 224 px, the grey image tinted by a seeded colour per image), in the same
batches; default output ``benchmarks/shift_cost``.

    nice -n 10 env OMP_NUM_THREADS=1 .venv/bin/python benchmarks/shift_bench.py --cost [--cost-n 256]
"""
import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]


def _timed(fn):
    """(result, CPU seconds of this process): on a machine shared with other jobs the CPU time is the work done,
    where the wall time also counts the waits for a core."""
    start = time.process_time()
    out = fn()
    return out, time.process_time() - start


def measure(n: int, model_name: str, batch_size: int, corruptions: str, log=print) -> dict:
    import timm
    from accelerate import Accelerator

    import timm_csm  # noqa: F401  (registers small_cnn)
    from timm_csm.calibration import TemperatureScaling
    from timm_csm.data import create_transforms, load_fashion_mnist
    from timm_csm.data.corruptions import SEVERITIES, create_corruption
    from timm_csm.training import TrainConfig, eval_loader, predict
    from timm_csm.evaluation.shift import ShiftEvaluation, resolve_corruptions

    names = resolve_corruptions(corruptions)
    test = load_fashion_mnist("test")
    test = test.subset(np.arange(min(n, len(test))))
    cal = load_fashion_mnist("train").subset(np.arange(1000))
    torch.manual_seed(0)
    model = timm.create_model(model_name, num_classes=10, in_chans=1).eval()
    _, eval_tf = create_transforms(28, (0.286,), (0.353,), 1)
    config, accelerator = TrainConfig(workers=0, pin_mem=False, seed=0), Accelerator(cpu=True)

    def predict_split(split):
        return predict(model, eval_loader(split, eval_tf, batch_size, config, accelerator), accelerator)[:2]

    predict_split(test.subset(np.arange(batch_size)))  # warm-up
    clean, t_clean = _timed(lambda: predict_split(test))
    batches = [eval_tf.apply(torch.from_numpy(test.images[i:i + batch_size])) for i in range(0, len(test), batch_size)]
    with torch.no_grad():
        _, t_forward = _timed(lambda: [model(x) for x in batches])
    calibration = predict_split(cal)
    scaler = TemperatureScaling().fit(*calibration)
    shift = ShiftEvaluation.create(names, SEVERITIES, seed=0)
    report, t_shift = _timed(lambda: shift.run(predict_split, test, clean, calibration,
                                               {"temperature_scaling": scaler}, log=lambda m: None,
                                               transform=eval_tf, progress=False))
    images = torch.from_numpy(test.images)
    per_corruption = {}
    for name in names:
        total = 0.0
        for s in SEVERITIES:
            c = create_corruption(name, s, seed=0)
            _, t = _timed(lambda: [c.batch(images[i:i + batch_size], np.arange(i, min(i + batch_size, len(images))))
                                   for i in range(0, len(images), batch_size)])
            total += t
        per_corruption[name] = total
        log(f"{name}: {1e6 * total / (len(SEVERITIES) * len(images)):.1f} us per image")
    cells = len(names) * len(SEVERITIES)
    t_corrupt = sum(per_corruption.values())
    return {"n": len(test), "model": model_name, "batch_size": batch_size, "corruptions": len(names),
            "severities": len(SEVERITIES), "cells": cells, "clean_s": t_clean, "forward_s": t_forward,
            "shift_s": t_shift, "corrupt_s": t_corrupt, "shift_over_clean": t_shift / t_clean,
            "share_forward": cells * t_forward / t_shift, "share_corrupt": t_corrupt / t_shift,
            "corrupt_us_per_image": {k: 1e6 * v / (len(SEVERITIES) * len(test)) for k, v in per_corruption.items()},
            "shift_summary_accuracy": {s: report["shift"]["summary"][s]["uncalibrated"]["mean"]["accuracy"]
                                       for s in report["shift"]["summary"]}}


#: the model inputs (side, channels) the corruption cost is measured at, and the model whose forward pass is timed
#: beside it (random weights: the time does not depend on them)
COST_INPUTS = ((28, 1), (64, 3), (224, 3))
COST_MODELS = {1: "small_cnn", 3: "resnet18"}


def cost_images(n: int, side: int, channels: int) -> torch.Tensor:
    """uint8 (n, channels, side, side): the first ``n`` Fashion-MNIST test images resized to ``side``; in RGB each
    channel scaled by a seeded tint in [0.5, 1]."""
    from timm_csm.data import load_fashion_mnist
    from timm_csm.data.transforms import resize_images

    grey = torch.from_numpy(load_fashion_mnist("test").images[:n]).float()
    x = resize_images(grey, (side, side)) if side != grey.shape[-1] else grey
    if channels == 3:
        tint = torch.rand(len(x), 3, 1, 1, generator=torch.Generator().manual_seed(0)) * 0.5 + 0.5
        x = x * tint
    return x.round_().clamp_(0, 255).to(torch.uint8)


def corruption_cost(n: int, batch_size: int, corruptions: str, inputs=COST_INPUTS, log=print) -> dict:
    """CPU microseconds per image of each corruption at each severity, at each model input of ``inputs``."""
    from timm_csm.data.corruptions import SEVERITIES, create_corruption
    from timm_csm.evaluation.shift import resolve_corruptions

    names = resolve_corruptions(corruptions)
    out = {"n": n, "batch_size": batch_size, "severities": len(SEVERITIES), "cpu_count": os.cpu_count(), "inputs": {}}
    for side, channels in inputs:
        images = cost_images(n, side, channels)
        table = {}
        for name in names:
            table[name] = []
            for s in SEVERITIES:
                c = create_corruption(name, s, seed=0)
                _, t = _timed(lambda: [c.batch(images[i:i + batch_size], np.arange(i, min(i + batch_size, len(images))))
                                       for i in range(0, len(images), batch_size)])
                table[name].append(1e6 * t / len(images))
        total = sum(sum(v) for v in table.values())
        forward = _forward_ms_per_image(COST_MODELS[channels], images, batch_size)
        log(f"{side} px, {channels} channel(s): {total / 1000:.1f} ms per image for every corruption x severity, "
            f"{COST_MODELS[channels]}'s forward pass {forward:.2f} ms per image")
        out["inputs"][f"{side}x{side}x{channels}"] = {"side": side, "channels": channels, "us_per_image": table,
                                                      "all_cells_ms_per_image": total / 1000,
                                                      "model": COST_MODELS[channels], "forward_ms_per_image": forward}
    return out


def _forward_ms_per_image(model_name: str, images: torch.Tensor, batch_size: int) -> float:
    """CPU milliseconds per image of ``model_name``'s forward pass (random weights, eval mode) on ``images``."""
    import timm

    import timm_csm  # noqa: F401  (registers small_cnn)

    torch.manual_seed(0)
    model = timm.create_model(model_name, num_classes=10, in_chans=images.shape[1]).eval()
    batches = [images[i:i + batch_size].float().div(255) for i in range(0, len(images), batch_size)]
    with torch.no_grad():
        model(batches[0][:2])  # warm-up
        _, t = _timed(lambda: [model(x) for x in batches])
    return 1000 * t / len(images)


def cost_markdown(r: dict, command: str) -> str:
    inputs = list(r["inputs"].values())
    head = [f"{i['side']} px {'RGB' if i['channels'] == 3 else 'grey'}" for i in inputs]
    lines = [
        "# Shift evaluation: the cost of a corruption per image", "",
        f"Command: `{command}`", "",
        f"Machine: {platform.machine()}, {r.get('cpu_count', os.cpu_count())} CPU cores, "
        f"{torch.get_num_threads()} torch thread(s), torch {torch.__version__}. Times "
        "are CPU seconds of the process, so that other jobs sharing the machine do not count.", "",
        f"Each corruption at each of its {r['severities']} severities on {r['n']} Fashion-MNIST test images resized to "
        f"the model's input size (RGB: tinted), in batches of {r['batch_size']}. Corruptions are applied at the "
        "model's input, so their cost depends on the input size, not on the size the images are stored at.", "",
        "| corruption (us per image, mean over the severities) | " + " | ".join(head) + " |",
        "|---|" + "---|" * len(inputs)]
    names = sorted(inputs[0]["us_per_image"], key=lambda k: -sum(inputs[-1]["us_per_image"][k]))
    for name in names:
        lines.append(f"| {name} | " + " | ".join(f"{sum(i['us_per_image'][name]) / len(i['us_per_image'][name]):.0f}"
                                                  for i in inputs) + " |")
    lines.append("| **every corruption x severity (ms per image)** | "
                 + " | ".join(f"**{i['all_cells_ms_per_image']:.1f}**" for i in inputs) + " |")
    lines.append("| a forward pass, once (ms per image) | "
                 + " | ".join(f"{i['forward_ms_per_image']:.2f} (`{i['model']}`)" for i in inputs) + " |")
    cells = len(inputs[0]["us_per_image"]) * r["severities"]
    lines += ["", f"The shift evaluation of one image costs its corruptions (the bold row) and {cells} forward passes "
              "of the model (plus reading and resizing the image once a cell, and the metrics): "
              + "; ".join(f"{i['side']} px, `{i['model']}`: {i['all_cells_ms_per_image']:.0f} ms + {cells} x "
                          f"{i['forward_ms_per_image']:.2f} ms = "
                          f"{(i['all_cells_ms_per_image'] + cells * i['forward_ms_per_image']) / 1000:.2f} s"
                          for i in inputs) + " per image."]
    return "\n".join(lines) + "\n"


def markdown(r: dict, command: str) -> str:
    rest = 1 - r["share_forward"] - r["share_corrupt"]
    lines = [
        "# Shift evaluation: speed", "",
        f"Command: `{command}`", "",
        f"Machine: {platform.machine()}, {torch.get_num_threads()} torch thread(s), torch {torch.__version__}. Times "
        "are CPU seconds of the process, so that other jobs sharing the machine do not count.",
        "",
        f"{r['n']} Fashion-MNIST test images, `{r['model']}` (random weights), batches of {r['batch_size']}: "
        f"{r['corruptions']} corruptions x {r['severities']} severities = {r['cells']} corrupted copies of the test "
        "set, each predicted and scored before and after temperature scaling with three conformal methods.", "",
        "| measure | CPU seconds |", "|---|---|",
        f"| clean evaluation (one prediction of the test set) | {r['clean_s']:.2f} |",
        f"| shift evaluation (all {r['cells']} cells) | {r['shift_s']:.2f} |",
        f"| forward passes alone, one clean pass | {r['forward_s']:.2f} |",
        f"| corruptions alone, all cells | {r['corrupt_s']:.2f} |", "",
        f"The shift evaluation takes {r['shift_over_clean']:.1f}x the clean evaluation for {r['cells']}x its images. "
        f"Of its time, the forward passes take {100 * r['share_forward']:.0f} %, the corruptions "
        f"{100 * r['share_corrupt']:.0f} %, and reading batches, the transform, the metrics and the conformal sets "
        f"the remaining {100 * rest:.0f} %.", "",
        *([f"This run is at toy size ({r['n']} of the 10 000 test images); the full-size numbers are pending: "
           "the same command with `--n 10000`.", ""] if r["n"] < 10000 else []),
        "Corruption time per image (mean over the five severities):", "",
        "| corruption | us / image |", "|---|---|"]
    for name, us in sorted(r["corrupt_us_per_image"].items(), key=lambda kv: -kv[1]):
        lines.append(f"| {name} | {us:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=10000, help="test images (at most the 10 000 of Fashion-MNIST)")
    p.add_argument("--model", default="small_cnn")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--corruptions", default="all")
    p.add_argument("--cost", action="store_true", help="the cost of each corruption per image at the input sizes "
                   "of COST_INPUTS instead")
    p.add_argument("--cost-n", type=int, default=256, help="test images of --cost")
    p.add_argument("--out", default=None, help="<out>.json and <out>.md (default benchmarks/shift, with --cost "
                   "benchmarks/shift_cost)")
    args = p.parse_args(argv)
    out = args.out or str(REPO / "benchmarks" / ("shift_cost" if args.cost else "shift"))
    command = ("python benchmarks/shift_bench.py " + " ".join(sys.argv[1:] if argv is None else argv)).strip()
    if args.cost:
        result = corruption_cost(args.cost_n, args.batch_size, args.corruptions)
        page = cost_markdown(result, command)
    else:
        result = measure(args.n, args.model, args.batch_size, args.corruptions)
        page = markdown(result, command)
    Path(f"{out}.json").write_text(json.dumps(dict(result, command=command), indent=1))
    Path(f"{out}.md").write_text(page)
    print(page)


if __name__ == "__main__":
    main()
