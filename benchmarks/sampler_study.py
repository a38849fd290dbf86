"""Sampler study: how many recognisable pure-class images a generator makes per second, by sampler, steps and guidance.

For each (scheduler, steps, guidance scale) the shipped Fashion-MNIST generator makes the two pure endpoints
(lambda = 0 and 1) of ``--num-groups`` groups (seeds disjoint from any dataset's), and a reference classifier trained
on real images says how many show their intended class. The figure of merit is recognised images per second of
generation (accuracy x images per CPU-second), on one CPU thread, 64 groups (128 images) per forward batch. Time is
the process's CPU time (so other jobs on the machine do not inflate it), the classifier's own time excluded.

    OMP_NUM_THREADS=1 python benchmarks/sampler_study.py                  # every cell (about 15 min on one thread)
    python benchmarks/sampler_study.py --report-only                      # re-assemble the page from the cells

Cells are cached in ``<output>/cells/<scheduler>-<steps>-g<scale>.json``; the page goes to ``--report`` and its rows to
``--json``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Dict, List

import torch

DEFAULT_OUTPUT = "runs/sampler_study"


def reference_classifier(output: Path, dataset: str, seed: int = 0):
    """The pipeline's reference encoder (4 epochs on the full training split), trained once into ``output``."""
    from timm_csm.annotation import train_reference_encoder
    from timm_csm.data import load_image_arrays

    train, test = load_image_arrays(dataset, "train"), load_image_arrays(dataset, "test")
    return train_reference_encoder(train, output / "encoder", seed=seed, test=test, log=lambda *_: None,
                                   progress=False)


def measure_cell(generator, scheduler: str, steps: int, guidance: float, classify, num_groups: int) -> Dict:
    """Pure-class accuracy and generation throughput of one sampler setting."""
    from timm_csm.generation import SemanticMixingPipeline, create_scheduler, pure_class_accuracy

    pipe = SemanticMixingPipeline.from_pretrained(generator, num_inference_steps=steps, guidance_scale=guidance)
    pipe.scheduler = create_scheduler(scheduler, pipe.scheduler.config)
    spent = {"classify": 0.0}

    def timed_classify(images):
        t0 = time.process_time()
        out = classify(images)
        spent["classify"] += time.process_time() - t0
        return out

    t0 = time.process_time()
    quality = pure_class_accuracy(pipe, timed_classify, num_groups=num_groups, batch_groups=64)
    seconds = time.process_time() - t0 - spent["classify"]
    ips = quality["num_images"] / seconds
    return {"scheduler": scheduler, "steps": steps, "guidance_scale": guidance, "accuracy": quality["accuracy"],
            "num_images": quality["num_images"], "seconds": round(seconds, 2), "images_per_s": ips,
            "recognised_per_s": quality["accuracy"] * ips, "per_class": quality["per_class"]}


def to_markdown(rows: List[Dict], real_acc: float, command: str) -> str:
    best = max(rows, key=lambda r: r["recognised_per_s"])
    lines = [
        "# Sampler study: recognisable pure-class images per second", "",
        "The shipped Fashion-MNIST generator (`timm_csm/assets/generator-fmnist`) makes the two pure endpoints of "
        f"{rows[0]['num_images'] // 2} groups per setting; the reference classifier (accuracy on real test images: "
        f"{100 * real_acc:.1f}%) reads their class. One CPU thread "
        f"({platform.processor() or platform.machine()}); CPU time of generation only.", "",
        "Command:", "", f"    {command}", "",
        "| scheduler | steps | guidance | recognised (%) | images / CPU-s | recognised / CPU-s |",
        "|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: (r["scheduler"], r["guidance_scale"], r["steps"])):
        mark = "**" if r is best else ""
        lines.append(f"| {r['scheduler']} | {r['steps']} | {r['guidance_scale']:g} | {100 * r['accuracy']:.1f} | "
                     f"{r['images_per_s']:.2f} | {mark}{r['recognised_per_s']:.2f}{mark} |")
    lines += ["", f"Best by recognised images per second: {best['scheduler']}, {best['steps']} steps, guidance "
              f"{best['guidance_scale']:g} ({100 * best['accuracy']:.1f}% recognised, {best['images_per_s']:.2f} "
              "images per CPU-second).", ""]
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--generator", default=None, help="generator folder (default: the shipped Fashion-MNIST one)")
    p.add_argument("--dataset", default="fashion_mnist")
    p.add_argument("--schedulers", nargs="+", default=["ddim", "dpm"])
    p.add_argument("--steps", nargs="+", type=int, default=[8, 10, 15, 20])
    p.add_argument("--guidance", nargs="+", type=float, default=[1.0, 1.5])
    p.add_argument("--num-groups", type=int, default=200, help="groups per setting (2 pure images each)")
    p.add_argument("--output", default=DEFAULT_OUTPUT)
    p.add_argument("--report", default="benchmarks/sampler_study.md")
    p.add_argument("--json", default="benchmarks/sampler_study.json")
    p.add_argument("--report-only", action="store_true")
    args = p.parse_args(argv)

    from timm_csm.io import write_text_atomic
    from timm_csm.recipes.steps import shipped_generator

    generator = args.generator or shipped_generator("fmnist")
    if generator is None:
        raise SystemExit("no generator: pass --generator (the shipped one is for Fashion-MNIST)")
    output = Path(args.output)
    (output / "cells").mkdir(parents=True, exist_ok=True)
    classifier = reference_classifier(output, args.dataset)
    rows = []
    for scheduler in args.schedulers:
        for guidance in args.guidance:
            for steps in args.steps:
                path = output / "cells" / f"{scheduler}-{steps}-g{guidance:g}.json"
                if not path.exists():
                    if args.report_only:
                        continue
                    cell = measure_cell(generator, scheduler, steps, guidance, classifier.classify, args.num_groups)
                    write_text_atomic(path, json.dumps(cell, indent=1))
                    print(json.dumps({k: v for k, v in cell.items() if k != "per_class"}), flush=True)
                rows.append(json.loads(path.read_text()))
    if not rows:
        raise SystemExit("no finished cell")
    command = "OMP_NUM_THREADS=1 python benchmarks/sampler_study.py"
    write_text_atomic(Path(args.report), to_markdown(rows, classifier.test_accuracy, command))
    write_text_atomic(Path(args.json), json.dumps(rows, indent=1))
    print(Path(args.report).read_text())


if __name__ == "__main__":
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    main()
