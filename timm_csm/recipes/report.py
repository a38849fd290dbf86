"""The main job's report, ``<output>/report.md``: the CE vs CSM table before and after temperature scaling,
generator quality, reliability diagrams, a figure of generated groups with their soft labels, stage times."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Optional

from ..io import atomic_path, write_bytes_atomic, write_text_atomic
from ..training.reporting import comparison_markdown

__all__ = ["write_report", "knowledge_line", "save_group_figure"]

def _quality_line(quality: Dict[str, Any]) -> str:
    real_acc = quality["classifier_real_test_accuracy"]  # None when the encoder was trained without a test split
    on_real = f" ({100 * real_acc:.1f}% on real test images)" if real_acc is not None else ""
    return (f"Generator quality: the reference classifier{on_real} recognises {100 * quality['accuracy']:.1f}% of "
            f"{quality['num_images']} generated pure-class images (guidance scale {quality['guidance_scale']}).")


def knowledge_line(generator_dir: Path, results: Dict) -> str:
    """What the generated data learned from, beside what the classifiers learned from: a generator (and a reference
    encoder) trained on more labelled images than the classifier lend CSM knowledge the CE run never sees."""
    index = Path(generator_dir) / "model_index.json"
    meta = json.loads(index.read_text()).get("metadata", {}) if index.is_file() else {}
    n_gen, n_cls = meta.get("num_train_images"), results.get("csm", results.get("ce", {})).get("n_train")
    if n_gen is None or n_cls is None:
        return ("The generator's training images are not recorded: compare with care (a generator trained on more "
                "labelled images than the classifier lends CSM knowledge the CE run never sees).")
    text = f"The generator learned from {n_gen} real images, the classifiers from {n_cls}."
    if n_gen > n_cls:
        text += (" CSM's generated data carries knowledge the CE run never sees: one seed, not a fair comparison "
                 "(benchmarks/PROTOCOL.md sets the fair one).")
    return text


def write_report(output: Path, results: Dict, csm_dataset: Path, generator_dir: Path, timings: Dict,
                 quality: Optional[Dict] = None) -> Dict:
    """Write ``report.md`` and its figures into ``output``; returns the table, the results and the figures."""
    output = Path(output)
    table = comparison_markdown(results)
    figures = _report_figures(output, results, csm_dataset)
    lines = ["# timm-csm main job report", "",
             "Test-set calibration of the same classifier trained with cross-entropy and with CSM "
             "(accuracy and calibration errors in %, 15 bins; temperature fitted on the validation split).", "",
             table, "", f"Generator: `{Path(generator_dir).name}`. CSM dataset: `{Path(csm_dataset).name}`.", "",
             knowledge_line(generator_dir, results), ""]
    if quality:
        lines += [_quality_line(quality), ""]
    for title, path in figures.items():
        lines += [f"## {title}", "", f"![{title}]({path})", ""]
    lines += ["## Stage times (s, this run)", "", json.dumps(timings, indent=1), ""]
    write_text_atomic(output / "report.md", "\n".join(lines))
    return {"table": table, "knowledge": knowledge_line(generator_dir, results), "results": results,
            "figures": figures}


def _report_figures(output: Path, results: Dict, csm_dataset: Path) -> Dict[str, str]:
    from ..hub import load_csm_dataset

    figures = {}
    for loss, res in results.items():  # the training run's side-by-side diagram, before and after scaling
        src = Path(res["output"]) / "reliability.png"
        if src.exists():
            dst = output / f"reliability_{loss}.png"
            write_bytes_atomic(dst, src.read_bytes())
            figures[f"Reliability diagrams: {loss.upper()} (before / after temperature scaling)"] = dst.name
    groups_png = output / "groups.png"
    save_group_figure(load_csm_dataset(str(csm_dataset))["train"], groups_png, num_groups=4)
    figures["Generated groups with their soft labels"] = groups_png.name
    return figures


def save_group_figure(dataset, path, num_groups: int = 4) -> Path:
    """A PNG of the first ``num_groups`` groups of a CSM dataset: one row per group ordered by lambda_gen, each image
    titled with lambda_gen and its soft label on class a."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from ..data.lazy import column_arrays

    cols = column_arrays(dataset, ["group_id", "lambda_gen", "class_a", "class_b"])
    gid = cols["group_id"]
    names = dataset.features["class_a"].names
    groups = list(dict.fromkeys(gid.tolist()))[:num_groups]
    rows = [sorted(np.flatnonzero(gid == g).tolist(), key=lambda i: -cols["lambda_gen"][i]) for g in groups]
    ncol = max(len(r) for r in rows)
    fig, axes = plt.subplots(len(rows), ncol, figsize=(1.3 * ncol, 1.6 * len(rows)), squeeze=False)
    for r, members in enumerate(rows):
        for c in range(ncol):
            ax = axes[r][c]
            ax.axis("off")
            if c >= len(members):
                continue
            row = dataset[members[c]]
            img = np.asarray(row["image"])
            ax.imshow(img, cmap="gray" if img.ndim == 2 else None, vmin=0, vmax=255)
            ax.set_title(f"λ={row['lambda_gen']:.2f}\nq_a={row['soft_label'][row['class_a']]:.2f}", fontsize=7)
        axes[r][0].text(-0.1, 0.5, f"{names[cols['class_a'][members[0]]]}\n→ {names[cols['class_b'][members[0]]]}",
                        transform=axes[r][0].transAxes, ha="right", va="center", fontsize=7)
    fig.suptitle("Semantic-mixing groups: generation ratio λ (weight of class a) and calibrated soft label q_a",
                 fontsize=8)
    fig.tight_layout()
    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)
    return path
