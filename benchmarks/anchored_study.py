"""Real-anchored semantic mixing, measured: realism, endpoints, cost and CSM's calibration against the SDEdit strength t.

For each strength t (1 = the paper's pure-noise start) the committed command line generates ``--num-groups`` groups
(anchors: the training images of the benchmark's seed-0 classifier), annotates them with the reference encoder, and
trains one CSM cell of the augmented benchmark recipe on them. Measured per t:

* generation cost: CPU seconds of ``hub_scripts/generate.py`` and images per CPU-second;
* two-sample accuracy: a small_cnn tells ``--num-groups`` x 8 generated images from as many real training images
  that are not anchors (0.5 = indistinguishable);
* endpoint recognition by the reference encoder: the pure endpoint of the anchor's own class ("near") and of the
  other class ("far": does the lambda = 0 member of an a-anchored group become class b?);
* the annotation checks (:func:`timm_csm.annotation.annotation_report`), and CSM's test accuracy and ECE.

    OMP_NUM_THREADS=1 python benchmarks/anchored_study.py --steps 10 --scheduler ddim

Every stage is cached under ``--output`` (generation and cells resume after a kill); a rerun only re-assembles the
page.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
# the augmented recipe of benchmarks/calibration_earlier.md, on which CE is over-confident
RECIPE = ["--max-train-samples", "2500", "--epochs", "60", "--lr", "0.1", "--weight-decay", "5e-4", "--sched",
          "multistep", "--train-opt", "hflip=0.5", "crop_pad=2", "decay_milestones=[30,45]"]
ANCHOR_ARGS = ["--anchor-dataset", "fashion_mnist", "--anchor-max-train-samples", "2500", "--anchor-seed", "0"]


def _run(cmd: List[str]) -> float:
    """Run a committed command line; returns its CPU seconds (user + system of the child)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    print("+ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _stage(path: Path, fn) -> Dict:
    """Cached JSON result of ``fn()`` at ``path``."""
    if path.exists():
        return json.loads(path.read_text())
    from timm_csm.io import write_text_atomic

    out = fn()
    write_text_atomic(path, json.dumps(out, indent=1))
    return out


def generated_arrays(folder: Path):
    """uint8 images and the provenance columns of a generation folder."""
    import datasets

    from timm_csm.annotation import decode_images
    from timm_csm.generation import load_generated

    ds, _ = load_generated(folder)
    cols = ds.select_columns(["class_a", "class_b", "lambda_gen", "anchor_index"]).with_format("numpy")[:]
    encoded = ds.cast_column("image", datasets.Image(decode=False))["image"]
    return torch.as_tensor(decode_images(encoded)), cols


def endpoint_recognition(images, cols, classify, anchor_labels) -> Dict:
    """Share of pure endpoints the classifier reads as their intended class: all, and by the anchor's class."""
    ends = np.flatnonzero(np.isin(cols["lambda_gen"], (0.0, 1.0)))
    intended = np.where(cols["lambda_gen"][ends] == 1.0, cols["class_a"][ends], cols["class_b"][ends])
    pred = torch.cat([classify(images[torch.as_tensor(b)]).argmax(1) for b in np.array_split(ends, 20)]).numpy()
    ok = pred == intended
    out = {"all": float(ok.mean())}
    anchor = cols["anchor_index"][ends]
    if (anchor >= 0).all():
        near = anchor_labels[anchor] == intended
        out.update(near=float(ok[near].mean()), far=float(ok[~near].mean()))
    return out


def study_strength(args, t: float, classifier, real_pool, anchor_labels) -> Dict:
    out = Path(args.output) / f"t{t:g}"
    out.mkdir(parents=True, exist_ok=True)
    gen = out / "generated"
    cmd = [sys.executable, "hub_scripts/generate.py", "--generator", args.generator, "--num-groups",
           str(args.num_groups), "--output", str(gen), "--steps", str(args.steps), "--scheduler", args.scheduler,
           "--guidance-scale", str(args.guidance), "--groups-per-shard", "32", "--batch-groups", "16"]
    if t < 1.0:
        cmd += ["--strength", str(t)] + ANCHOR_ARGS
    cost = _stage(out / "generate.json", lambda: {"cpu_seconds": _run(cmd)})

    def measure():
        from timm_csm.generation import two_sample_accuracy

        images, cols = generated_arrays(gen)
        return {"num_images": len(images), "images_per_cpu_s": len(images) / cost["cpu_seconds"],
                "two_sample_accuracy": two_sample_accuracy(real_pool, images, epochs=5),
                "endpoint_recognition": endpoint_recognition(images, cols, classifier.classify, anchor_labels)}

    quality = _stage(out / "quality.json", measure)
    hub = out / "hub"
    ann = [sys.executable, "hub_scripts/annotate.py", "--generated", str(gen), "--dataset", "fashion_mnist",
           "--output", str(hub), "--reference-dir", args.reference_dir or str(Path(args.output) / "reference-holdout"),
           "--s", "auto", "--accept-poor-generator"]  # the study measures sets whose groups stop morphing
    _stage(out / "annotate.json", lambda: {"cpu_seconds": _run(ann)})
    csm_dataset = next(hub.glob("csm-*-aug"))
    cell = [sys.executable, "benchmarks/calibration_bench.py", "--methods", "csm", "--seeds", "0", "--no-progress",
            "--output", str(out / "bench"), "--csm-dataset", str(csm_dataset)] + RECIPE + ["--epochs", str(args.epochs)]
    _stage(out / "cell.json", lambda: {"cpu_seconds": _run(cell)})
    results = json.loads((out / "bench" / "cells" / "csm-s0" / "results.json").read_text())

    def checks():
        from timm_csm.annotation import annotation_report
        from timm_csm.hub import load_csm_dataset

        report = annotation_report(load_csm_dataset(str(csm_dataset), split="train"))
        return {k: v for k, v in report.items() if k != "flagged_group_ids"}

    return {"strength": t, **cost, **quality, "annotation_checks": _stage(out / "checks.json", checks),
            "csm_test": results["test"]["pre_ts"], "csm_test_post_ts": results["test"]["post_ts"]}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--strengths", nargs="+", type=float, default=[1.0, 0.8, 0.6, 0.4])
    p.add_argument("--num-groups", type=int, default=900, help="groups per strength (8 images each)")
    p.add_argument("--generator", default="timm_csm/assets/generator-fmnist")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--scheduler", default="ddim", choices=["ddim", "dpm"])
    p.add_argument("--guidance", type=float, default=1.0)
    p.add_argument("--encoder", default="runs/sampler_study/encoder", help="reference classifier of the recognition")
    p.add_argument("--reference-dir", default=None,
                   help="annotation encoder, trained on first use (default: <output>/reference-holdout)")
    p.add_argument("--epochs", type=int, default=60, help="epochs of the CSM cell (the recipe's 60)")
    p.add_argument("--output", default="runs/anchored_study")
    p.add_argument("--report", default="benchmarks/anchored_study.md")
    args = p.parse_args(argv)

    from timm_csm.annotation import load_reference_encoder
    from timm_csm.data import load_image_arrays
    from timm_csm.training import TrainConfig, load_data

    classifier = load_reference_encoder(args.encoder)
    anchors = load_data(TrainConfig(dataset="fashion_mnist", max_train_samples=2500, seed=0)).train
    full = load_image_arrays("fashion_mnist", "train")
    anchor_set = {bytes(x) for x in np.asarray(anchors.images).reshape(len(anchors), -1)}
    others = [i for i in range(len(full)) if bytes(np.asarray(full.images[i]).reshape(-1)) not in anchor_set]
    g = np.random.default_rng(0)
    real_pool = torch.as_tensor(np.asarray(full.images)[g.choice(others, 8 * args.num_groups, replace=False)])
    rows = []
    for t in args.strengths:  # the page grows with every finished strength
        rows.append(study_strength(args, t, classifier, real_pool, np.asarray(anchors.labels)))
        Path(args.report).with_suffix(".json").write_text(json.dumps(rows, indent=1))
        Path(args.report).write_text(to_markdown(rows, args))
    print(Path(args.report).read_text())


def to_markdown(rows: List[Dict], args) -> str:
    lines = ["# Real-anchored semantic mixing against the SDEdit strength t", "",
             f"{args.num_groups} groups x 8 lambdas per strength, {args.scheduler} {args.steps} steps, guidance "
             f"{args.guidance:g}; anchors: the 2 250 training images of the seed-0 classifier of the augmented "
             "recipe; CSM: one cell (seed 0) of that recipe. t = 1 is the paper's pure-noise start.", "",
             "Command:", "", "    OMP_NUM_THREADS=1 python benchmarks/anchored_study.py " + " ".join(sys.argv[1:]), "",
             "| t | images / CPU-s | two-sample acc (%) | endpoints recognised (%) all / near / far | flagged groups "
             "| mean max q | CSM acc (%) | CSM ECE (%) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        rec = r["endpoint_recognition"]
        near_far = f"{100 * rec['near']:.1f} / {100 * rec['far']:.1f}" if "near" in rec else "- / -"
        chk = r["annotation_checks"]
        test = r["csm_test"]
        lines.append(f"| {r['strength']:g} | {r['images_per_cpu_s']:.2f} | {100 * r['two_sample_accuracy']:.1f} | "
                     f"{100 * rec['all']:.1f} / {near_far} | {chk.get('flagged', '-')} / {chk.get('num_groups', '-')} "
                     f"| {chk.get('max_soft_label', {}).get('mean', float('nan')):.3f} | "
                     f"{100 * test['accuracy']:.2f} | {100 * test['ece']:.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
