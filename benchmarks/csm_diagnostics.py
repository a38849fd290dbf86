"""Why does (or doesn't) CSM calibrate? Fit of trained classifiers on real and on generated images.

For each trained run (a folder with ``model_best.safetensors``, e.g. a cell of ``calibration_bench.py``) this reports,
with the checkpoint the benchmark evaluates:

* real test images: accuracy, mean confidence, ECE;
* generated images of the groups the run trained on ("seen") and of groups it never saw ("unseen", same generator,
  same annotation): the squared error sum_k (p_k - q_k)^2 against the annotated soft labels, and mean confidence
  against the mean of max_k q_k over the interior members (soft labels with max_k q_k < 0.9).

A run that fits seen generated images but not unseen ones memorised the generated set (too few groups); one that
fits unseen generated images but stays over-confident on real test images separates the two domains (the
generator's images are told apart from real ones, so their soft labels do not transfer).

    python benchmarks/csm_diagnostics.py \\
        --runs runs/calibration_bench/cells/ce-s0 runs/calibration_bench/cells/csm-s0 \\
        --seen runs/demo/annotated-<key>/csm-fmnist-aug --heldout runs/csm_heldout/csm-fmnist-aug --output diag.md
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Dict, List

for _var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HF_EVALUATE_OFFLINE"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

INTERIOR = 0.9  # soft labels with max_k q_k below this are "interior" (not an endpoint-like member)


@torch.no_grad()
def probabilities(model, transform, images: torch.Tensor, batch: int = 500) -> torch.Tensor:
    """Softmax of ``model`` on uint8 images, through the run's evaluation ``transform``."""
    return torch.cat([model(transform.apply(images[i:i + batch])).float().softmax(1)
                      for i in range(0, len(images), batch)])


def generated_fit(p: torch.Tensor, q: torch.Tensor) -> Dict[str, float]:
    interior = q.max(1).values < INTERIOR
    return {
        "sq_err": float(((p - q) ** 2).sum(1).mean()),
        "interior_sq_err": float(((p[interior] - q[interior]) ** 2).sum(1).mean()),
        "interior_conf": float(p[interior].max(1).values.mean()),
        "interior_target_conf": float(q[interior].max(1).values.mean()),
        "n": int(len(q)), "n_interior": int(interior.sum()),
    }


def load_generated_rows(folders):
    """Images (M, C, H, W), soft labels (M, K) and group keys (seed, class_a, class_b) of the datasets in
    ``folders``: the key names a generated group in any plan (a plan's seeds are ``seed_offset + g``)."""
    from timm_csm.data import CSMGroups
    from timm_csm.hub import load_csm_dataset

    images, q, keys = [], [], []
    for folder in folders:
        ds = load_csm_dataset(str(folder), split="train")
        if "seed" not in ds.column_names:
            raise ValueError(f"{folder} has no 'seed' column: cannot tell its groups from other datasets' groups")
        groups = CSMGroups.from_dataset(ds)
        rows = groups.members.reshape(-1)
        seeds = np.asarray(ds["seed"], dtype=np.int64)[rows.numpy()]
        a = groups.class_a.repeat_interleave(groups.group_size).numpy()
        b = groups.class_b.repeat_interleave(groups.group_size).numpy()
        images.append(groups.images[rows])
        q.append(groups.soft_labels[rows])
        keys += list(zip(seeds.tolist(), a.tolist(), b.tolist()))
    return torch.cat(images), torch.cat(q), keys


def diagnose(runs: List[Path], seen, heldout) -> List[Dict]:
    """Rows of the table: every run scored on the real test split, on ``seen`` (the generated dataset the runs trained
    on) and on the groups of ``heldout`` that are not in ``seen``; both as returned by :func:`load_generated_rows`."""
    from timm_csm.data import load_image_arrays
    from timm_csm.metrics import calibration_metrics, metrics_for
    from timm_csm.training import load_trained_classifier

    seen_images, seen_q, seen_keys = seen
    images, q, keys = heldout
    seen_keys = set(seen_keys)
    unseen = torch.tensor([k not in seen_keys for k in keys])
    if not unseen.any():
        raise ValueError("every held-out group is also in the training set: nothing unseen to score")
    images, q = images[unseen], q[unseen]
    rows = []
    tests = {}  # the whole test split of each dataset, loaded once
    for folder in runs:
        model, transform, meta = load_trained_classifier(folder)
        if meta["dataset"] not in tests:
            tests[meta["dataset"]] = load_image_arrays(meta["dataset"], "test")
        test = tests[meta["dataset"]]
        p_test = probabilities(model, transform, torch.as_tensor(test.images))
        real = calibration_metrics(p_test, torch.as_tensor(test.labels), input_type="probs")
        rows.append({"run": str(folder), "loss": meta["loss"],
                     "real": {k: real[k] for k in metrics_for("diagnostics")},
                     "seen": generated_fit(probabilities(model, transform, seen_images), seen_q),
                     "unseen": generated_fit(probabilities(model, transform, images), q)})
    return rows


def to_markdown(rows: List[Dict]) -> str:
    lines = ["| run | loss | real acc | real conf | real ECE | gen seen sq.err | gen unseen sq.err | "
             "interior conf seen / unseen / target |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        s, u = r["seen"], r["unseen"]
        lines.append(f"| {r['run']} | {r['loss']} | {100 * r['real']['accuracy']:.2f} | "
                     f"{100 * r['real']['confidence']:.2f} | {100 * r['real']['ece']:.2f} | {s['sq_err']:.4f} | "
                     f"{u['sq_err']:.4f} | {100 * s['interior_conf']:.1f} / {100 * u['interior_conf']:.1f} / "
                     f"{100 * u['interior_target_conf']:.1f} |")
    return "\n".join(lines)


def _short_name(run: str) -> str:
    path = Path(run)
    return f"{path.parent.parent.name}/{path.name}" if path.parent.name == "cells" else path.name


def save_figure(rows: List[Dict], path: Path) -> Path:
    """Two panels: squared error against the soft labels on seen and held-out generated groups, and real-test ECE."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    names = [_short_name(r["run"]) for r in rows]
    x = np.arange(len(rows))
    fig = Figure(figsize=(4 + 1.1 * len(rows), 4.2))
    FigureCanvasAgg(fig)
    ax_fit, ax_real = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    ax_fit.bar(x - 0.2, [r["seen"]["sq_err"] for r in rows], 0.4, label="generated set of the CSM runs")
    ax_fit.bar(x + 0.2, [r["unseen"]["sq_err"] for r in rows], 0.4, label="held-out generated groups")
    ax_fit.set_ylabel("sum_k (p_k - q_k)^2 on generated images")
    ax_fit.set_title("fit of the soft labels")
    ax_fit.legend(fontsize=8)
    ax_real.bar(x, [100 * r["real"]["ece"] for r in rows], 0.6, color="tab:red")
    ax_real.set_ylabel("ECE on real test images (%)")
    ax_real.set_title("calibration on real images")
    for ax in (ax_fit, ax_real):
        ax.set_xticks(x)
        ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", nargs="+", required=True, type=Path, help="run folders with model_best.safetensors")
    p.add_argument("--seen", required=True, type=Path, help="the CSM dataset the runs trained on")
    p.add_argument("--heldout", required=True, nargs="+", type=Path,
                   help="CSM datasets of the same generator and annotation with groups the runs did not see "
                        "(groups of --seen among them are left out)")
    p.add_argument("--output", type=Path, default=None,
                   help="write the table (markdown) here, the rows beside it (.json) and a figure (.png)")
    p.add_argument("--dataset", default="fashion_mnist", help="real images of the two-sample test")
    args = p.parse_args(argv)
    seen = load_generated_rows([args.seen])
    rows = diagnose(args.runs, seen, load_generated_rows(args.heldout))
    table = to_markdown(rows)
    from timm_csm.data import load_image_arrays
    from timm_csm.generation import two_sample_accuracy

    c2st = two_sample_accuracy(torch.as_tensor(load_image_arrays(args.dataset, "train").images), seen[0])
    table += (f"\n\nReal vs generated two-sample test ({args.seen.name}): a small_cnn tells held-out real from "
              f"generated images apart with {100 * c2st:.1f}% accuracy (50% = indistinguishable).")
    print(table)
    if args.output:
        args.output.write_text(table + "\n")
        args.output.with_suffix(".json").write_text(json.dumps(rows, indent=1))
        save_figure(rows, args.output.with_suffix(".png"))


if __name__ == "__main__":
    main()
