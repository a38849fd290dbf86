"""The main job, end to end: generator -> semantic mixing -> re-annotation -> dataset -> CE vs CSM -> report.

    timm-csm-pipeline --profile demo          # or: python hub_scripts/pipeline.py --profile demo

Every stage writes into ``<output>/<stage>-<key>/``, where the key hashes the stage's configuration and the keys of
the stages it reads; a stage marked done is skipped on a re-run, and a stage that was killed resumes (the generator,
generation and training stages checkpoint as they go). Profiles:

* ``demo``: real Fashion-MNIST (Debian's package, which must be installed), the shipped generator,
  a reference encoder trained here in place of CLIP, then the same small classifier trained with CE and with CSM;
* ``smoke``: the same stages at toy size (CI runs it);
* ``full``: the GPU recipe of the paper (CIFAR-100, a CIFAR generator, open_clip ViT-B-32 from a local weights file,
  ResNet-50 for 200 epochs); see the README for its commands.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Optional

from .io import write_json_atomic, write_text_atomic

__all__ = ["PipelineProfile", "PROFILES", "run_pipeline", "main", "shipped_generator"]

_ASSETS = Path(__file__).resolve().parent / "assets"


@dataclass
class PipelineProfile:
    dataset: str = "fashion_mnist"
    # generator: "shipped" (package weights for the dataset) or a generator-training profile name
    generator: str = "shipped"
    generator_steps: Optional[int] = None
    num_groups: int = 225  # 5 per class pair for 10 classes: 1 800 images
    num_lambdas: int = 8
    sampler_steps: int = 20
    guidance_scale: Optional[float] = None  # None: the generator's recommended scale
    # re-annotation
    encoder: str = "reference"  # "reference" or "open_clip:<model>:<weights file>"
    encoder_epochs: int = 4
    encoder_max_steps: Optional[int] = None
    soft_label_scale: Optional[float] = None  # None: chosen on held-out real data (annotation.select_scale)
    # classifier training (the same for CE and CSM)
    model: str = "small_cnn"
    epochs: int = 15
    batch_size: int = 128
    lr: float = 0.05
    weight_decay: float = 0.0
    sched: str = "cosine"
    max_train_samples: Optional[int] = 10000
    max_test_samples: Optional[int] = None
    n_aug: int = 1
    seed: int = 0
    train_extra: Dict = field(default_factory=dict)


PROFILES: Dict[str, PipelineProfile] = {
    # A calibration demo needs an over-confident baseline: a 5-stage small_cnn (395 k parameters, 1.5x the step time
    # of the 3-stage default) over-fits the 10k subset without augmentation or weight decay. Fashion-MNIST, seeds
    # 0/1: CE accuracy 89.1/88.4%, ECE 6.5/7.2% before temperature scaling, 1.0/1.0% after (T = 1.9/2.1), about
    # 95 s of one CPU core (benchmarks/calibration_demo.md). The 5 stages need images of at least 16 px (not digits).
    "demo": PipelineProfile(train_extra={"model_kwargs": {"widths": [16, 32, 64, 128, 256]}, "crop_pad": 0,
                                         "hflip": 0.0}),
    "smoke": PipelineProfile(generator="smoke", num_groups=24, sampler_steps=4, encoder_epochs=1,
                             encoder_max_steps=20, soft_label_scale=4.0, epochs=1, batch_size=64,
                             max_train_samples=512, max_test_samples=512),
    "full": PipelineProfile(dataset="cifar100", generator="cifar100", num_groups=19800, sampler_steps=50,
                            encoder="open_clip:ViT-B-32:open_clip_vit_b32.safetensors", soft_label_scale=2.3,
                            model="resnet50_cifar", epochs=200, batch_size=128, lr=0.1, weight_decay=5e-4,
                            sched="multistep", max_train_samples=None,
                            train_extra={"decay_milestones": [80, 120], "clip_grad": 2.0}),
}


def shipped_generator(dataset: str) -> Optional[Path]:
    """The generator weights shipped in the package for ``dataset``, if any."""
    folder = _ASSETS / f"generator-{dataset}"
    return folder if (folder / "unet" / "config.json").exists() else None


def _key(config: Dict) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:10]


class _Stages:
    """Runs stages once: ``<root>/<name>-<key>/`` with a ``DONE.json`` marker written last."""

    def __init__(self, root: Path, log: Callable[[str], None]):
        self.root, self.log, self.timings = root, log, {}

    def __call__(self, name: str, config: Dict, fn: Callable[[Path], None]) -> Path:
        out = self.root / f"{name}-{_key(config)}"
        marker = out / "DONE.json"
        if marker.exists():
            self.log(f"[{name}] done already: {out}")
            return out
        out.mkdir(parents=True, exist_ok=True)
        self.log(f"[{name}] -> {out}")
        t0 = time.time()
        fn(out)
        self.timings[name] = round(time.time() - t0, 1)
        write_json_atomic(marker, {"config": config, "seconds": self.timings[name]})
        return out


def _resolve_dataset(profile: PipelineProfile, log) -> PipelineProfile:
    """The profile as run. The dataset is never switched on the run's own: without Debian's Fashion-MNIST the run
    stops with the command that installs it. scikit-learn's digits is an explicit choice (``--dataset digits``); its
    8x8 images have no shipped generator (the digits generator-training profile replaces ``shipped``) and are too
    small for the demo's 5-stage network (``model_kwargs`` is dropped: the default 3-stage ``small_cnn``)."""
    from .data.embedded import FASHION_MNIST_INSTALL, fashion_mnist_root

    if profile.dataset == "fashion_mnist" and fashion_mnist_root() is None:
        raise FileNotFoundError(
            f"Fashion-MNIST is not installed: run `sudo sh -c '{FASHION_MNIST_INSTALL}'` (Debian's "
            "dataset-fashion-mnist; `make demo` runs it when it has root), or set TIMM_CSM_FASHION_MNIST to a folder "
            "holding the IDX files; scikit-learn's digits runs with --dataset digits")
    if profile.dataset != "digits":
        return profile
    extra = {k: v for k, v in profile.train_extra.items() if k != "model_kwargs"}
    generator = "digits" if profile.generator == "shipped" else profile.generator
    log(f"[dataset] digits (8x8): generator {generator!r}, the default small_cnn")
    return dataclasses.replace(profile, generator=generator, train_extra=extra)


def run_pipeline(profile: PipelineProfile, output, log: Callable[[str], None] = print) -> Dict:
    """Run (or resume) every stage; returns the comparison and writes ``<output>/report.md``."""
    from .data import load_image_arrays

    profile = _resolve_dataset(profile, log)
    dataset = profile.dataset
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    stage = _Stages(output, log)
    train_real = load_image_arrays(dataset, "train")
    test_real = load_image_arrays(dataset, "test")
    short = {"fashion_mnist": "fmnist"}.get(dataset, dataset.split("/")[-1])

    # 1. generator
    gen_cfg = {"dataset": dataset, "generator": profile.generator, "steps": profile.generator_steps}
    shipped = shipped_generator(short) if profile.generator == "shipped" else None
    if profile.generator == "shipped" and shipped is None:
        raise FileNotFoundError(f"no generator is shipped for {dataset!r}: choose a generator-training profile "
                                "(--generator fmnist / digits / cifar10 ...) to train one")
    if shipped is not None:
        generator_dir = shipped
        log(f"[generator] shipped weights: {shipped}")
    else:
        def train_gen(out: Path):
            from .generation import GENERATOR_PROFILES
            from .generation.training import train_generator

            cfg = GENERATOR_PROFILES[profile.generator]
            if profile.generator_steps is not None:
                cfg = dataclasses.replace(cfg, steps=profile.generator_steps)
            if train_real.images.shape[2] != cfg.sample_size:
                cfg = dataclasses.replace(cfg, sample_size=train_real.images.shape[2],
                                          in_channels=train_real.images.shape[1])
            train_generator(train_real.images, train_real.labels, train_real.class_names, out, cfg,
                            meta={"dataset": dataset, "profile": profile.generator}, log=log)

        generator_dir = stage("generator", gen_cfg, train_gen)

    # 2. semantic mixing
    from .generation.models import weights_digest

    # keyed by the weights, not their path: a moved checkout or another copy of the same generator reuses the stage
    gen_key = {"generator": weights_digest(generator_dir), "num_groups": profile.num_groups,
               "lambdas": profile.num_lambdas, "steps": profile.sampler_steps, "guidance": profile.guidance_scale}

    def generate(out: Path):
        from .generation import SemanticMixingPipeline, generate_to_folder, lambda_grid, make_plan

        pipe = SemanticMixingPipeline.from_pretrained(generator_dir, num_inference_steps=profile.sampler_steps,
                                                      guidance_scale=profile.guidance_scale)
        plan = make_plan(pipe.num_classes, profile.num_groups, lambda_grid(profile.num_lambdas), pipe.class_names,
                         groups_per_shard=32, generator=pipe.provenance)
        generate_to_folder(pipe, out, plan, batch_groups=8)

    generated_dir = stage("generated", gen_key, generate)

    # 3. encoder (+ generator quality, measured with the same real-data classifier)
    enc_cfg = {"dataset": dataset, "encoder": profile.encoder, "epochs": profile.encoder_epochs,
               "max_steps": profile.encoder_max_steps, "seed": profile.seed}

    def train_encoder(out: Path):
        from .annotation import train_reference_encoder

        train_reference_encoder(train_real, out / "encoder", epochs=profile.encoder_epochs, seed=profile.seed,
                                test=test_real, max_steps=profile.encoder_max_steps, log=log)

    encoder_dir = stage("encoder", enc_cfg, train_encoder) if profile.encoder == "reference" else None
    quality = None
    if encoder_dir is not None:
        def measure_quality(out: Path):
            from .annotation import load_reference_encoder
            from .generation import SemanticMixingPipeline, pure_class_accuracy

            classifier = load_reference_encoder(encoder_dir / "encoder")
            pipe = SemanticMixingPipeline.from_pretrained(generator_dir, num_inference_steps=profile.sampler_steps,
                                                          guidance_scale=profile.guidance_scale)
            q = pure_class_accuracy(pipe, classifier.classify, num_groups=min(90, profile.num_groups))
            q["classifier_real_test_accuracy"] = classifier.test_accuracy
            q["guidance_scale"] = pipe.guidance_scale
            (out / "quality.json").write_text(json.dumps(q, indent=1))

        quality_dir = stage("quality", {"generated": gen_key, "encoder": enc_cfg}, measure_quality)
        quality = json.loads((quality_dir / "quality.json").read_text())

    # 4. re-annotation -> Hugging Face dataset, installed under its bare name
    name = f"csm-{short}-aug"
    ann_cfg = {"generated": gen_key, "encoder": enc_cfg, "s": profile.soft_label_scale}

    def annotate_stage(out: Path):
        from .annotation import annotate, load_or_compute_prototypes, select_scale
        from .generation import load_generated
        from .hub import install_dataset, save_csm_dataset

        encoder = _load_encoder(profile, encoder_dir)
        generated, plan = load_generated(generated_dir)
        prototypes = load_or_compute_prototypes(encoder, train_real, cache_dir=out / "prototypes")
        s = profile.soft_label_scale
        if s is None:
            s = _choose_scale(encoder, train_real, prototypes, profile.seed)
        annotated = annotate(generated, plan["class_names"], encoder, prototypes, s, lambdas=plan["lambdas"])
        provenance = {"dataset": dataset, "generator": plan["generator"], "lambdas": plan["lambdas"],
                      "num_groups": plan["num_groups"], "encoder": encoder.describe(), "s": s}
        folder = save_csm_dataset(annotated, out / name, provenance=provenance, class_names=train_real.class_names)
        install_dataset(folder)
        (out / "annotation.json").write_text(json.dumps({"s": s, "rows": len(annotated)}, indent=2))

    annotated_dir = stage("annotated", ann_cfg, annotate_stage)
    csm_dataset = annotated_dir / name

    # 5. the same classifier with CE and with CSM
    results = {}
    for loss in ("ce", "csm"):
        train_cfg = _train_config(profile, dataset, loss, csm_dataset)
        key = {"train": {k: v for k, v in train_cfg.items() if k != "output"},
               "data": ann_cfg if loss == "csm" else None}

        def train_stage(out: Path, cfg=train_cfg):
            from .train import run

            run(dict(cfg, output=str(out), auto_resume=True))  # a killed stage resumes its own run

        out = stage(f"train-{loss}", key, train_stage)
        results[loss] = json.loads((out / "results.json").read_text())
        results[loss]["output"] = str(out)

    report = write_report(output, results, annotated_dir / name, generator_dir, stage.timings, quality)
    log(report["table"])
    return report


def _load_encoder(profile: PipelineProfile, encoder_dir: Optional[Path]):
    from .annotation import create_encoder, load_reference_encoder

    if profile.encoder == "reference":
        return load_reference_encoder(encoder_dir / "encoder")
    _, model_name, weights = profile.encoder.split(":", 2)
    return create_encoder("open_clip", model_name=model_name, pretrained=weights)


def _choose_scale(encoder, train_real, prototypes, seed: int) -> float:
    """s chosen on held-out real images (the annotation module's criterion), 2 000 at most."""
    import numpy as np

    from .annotation import encode_images, select_scale

    rng = np.random.default_rng(seed)
    idx = rng.choice(len(train_real), size=min(2000, len(train_real)), replace=False)
    sub = train_real.subset(idx)
    feats = encode_images(encoder, sub.images)
    return float(select_scale(feats, __import__("torch").as_tensor(sub.labels), prototypes.means))


def _train_config(profile: PipelineProfile, dataset: str, loss: str, csm_dataset: Path) -> Dict:
    cfg = {
        "dataset": dataset, "model": profile.model, "loss": loss, "epochs": profile.epochs,
        "batch_size": profile.batch_size, "lr": profile.lr, "weight_decay": profile.weight_decay,
        "sched": profile.sched, "seed": profile.seed, "max_train_samples": profile.max_train_samples,
        "max_test_samples": profile.max_test_samples, "experiment": ".",
    }
    cfg.update(profile.train_extra)
    if loss == "csm":
        cfg.update(csm_dataset=str(csm_dataset), n_aug=profile.n_aug)
    return cfg


def write_report(output: Path, results: Dict, csm_dataset: Path, generator_dir: Path, timings: Dict,
                 quality: Optional[Dict] = None) -> Dict:
    """``report.md``: the CE vs CSM table before and after temperature scaling, reliability diagrams, groups."""
    rows = []
    keys = [("accuracy", "acc"), ("ece", "ECE"), ("aece", "AECE"), ("cece", "CECE"), ("nll", "NLL"),
            ("brier", "Brier")]
    header = "| method | TS | " + " | ".join(h for _, h in keys) + " | T |"
    rows.append(header)
    rows.append("|" + "---|" * (len(keys) + 3))
    for loss, res in results.items():
        for phase in ("pre_ts", "post_ts"):
            m = res["test"].get(phase)
            if not m:
                continue
            vals = " | ".join(f"{100 * m[k]:.2f}" if k not in ("nll", "brier") else f"{m[k]:.4f}" for k, _ in keys)
            t = f"{res['temperature']:.1f}" if phase == "post_ts" and res.get("temperature") else "1.0"
            rows.append(f"| {loss.upper()} | {'after' if phase == 'post_ts' else 'before'} | {vals} | {t} |")
    table = "\n".join(rows)
    figures = _report_figures(output, results, csm_dataset)
    lines = ["# timm-csm main job report", "",
             "Test-set calibration of the same classifier trained with cross-entropy and with CSM "
             "(accuracy and calibration errors in %, 15 bins; temperature fitted on the validation split).", "",
             table, "", f"Generator: `{generator_dir.name}`. CSM dataset: `{csm_dataset.name}`.", ""]
    if quality:
        real_acc = quality["classifier_real_test_accuracy"]  # None when the encoder was trained without a test split
        on_real = f" ({100 * real_acc:.1f}% on real test images)" if real_acc is not None else ""
        lines += [f"Generator quality: the reference classifier{on_real} recognises "
                  f"{100 * quality['accuracy']:.1f}% of {quality['num_images']} generated pure-class images "
                  f"(guidance scale {quality['guidance_scale']}).", ""]
    for title, path in figures.items():
        lines += [f"## {title}", "", f"![{title}]({path})", ""]
    lines += ["## Stage times (s, this run)", "", json.dumps(timings, indent=1), ""]
    text = "\n".join(lines)
    write_text_atomic(output / "report.md", text)
    return {"table": table, "results": results, "figures": figures}


def _report_figures(output: Path, results: Dict, csm_dataset: Path) -> Dict[str, str]:
    figures = {}
    for loss, res in results.items():  # train.py's side-by-side diagram, before and after temperature scaling
        src = Path(res["output"]) / "reliability.png"
        if src.exists():
            dst = output / f"reliability_{loss}.png"
            shutil.copyfile(src, dst)
            figures[f"Reliability diagrams: {loss.upper()} (before / after temperature scaling)"] = dst.name
    groups_png = output / "groups.png"
    from .hub import load_csm_dataset

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

    cols = dataset.select_columns(["group_id", "lambda_gen", "lambda_hat", "class_a", "class_b", "soft_label"])
    gid = np.asarray(cols["group_id"])
    names = dataset.features["class_a"].names
    groups = list(dict.fromkeys(gid.tolist()))[:num_groups]
    rows = [sorted(np.flatnonzero(gid == g).tolist(), key=lambda i: -cols[i]["lambda_gen"]) for g in groups]
    ncol = max(len(r) for r in rows)
    fig, axes = plt.subplots(len(rows), ncol, figsize=(1.3 * ncol, 1.6 * len(rows)), squeeze=False)
    for r, members in enumerate(rows):
        for c in range(ncol):
            ax = axes[r][c]
            ax.axis("off")
            if c >= len(members):
                continue
            i = members[c]
            row = dataset[i]
            img = np.asarray(row["image"])
            ax.imshow(img, cmap="gray" if img.ndim == 2 else None, vmin=0, vmax=255)
            ax.set_title(f"λ={row['lambda_gen']:.2f}\nq_a={row['soft_label'][row['class_a']]:.2f}", fontsize=7)
        axes[r][0].text(-0.1, 0.5, f"{names[cols[members[0]]['class_a']]}\n→ {names[cols[members[0]]['class_b']]}",
                        transform=axes[r][0].transAxes, ha="right", va="center", fontsize=7)
    fig.suptitle("Semantic-mixing groups: generation ratio λ (weight of class a) and calibrated soft label q_a",
                 fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", default="demo", choices=sorted(PROFILES))
    p.add_argument("--output", default=None, help="default: runs/<profile>")
    p.add_argument("--generator", default=None,
                   help="'shipped' or a generator-training profile (retrains from scratch), e.g. fmnist")
    p.add_argument("--dataset", default=None)
    p.add_argument("--epochs", type=int, default=None)
    args = p.parse_args(argv)
    profile = PROFILES[args.profile]
    overrides = {k: v for k, v in (("generator", args.generator), ("dataset", args.dataset),
                                   ("epochs", args.epochs)) if v is not None}
    profile = dataclasses.replace(profile, **overrides)
    t0 = time.time()
    run_pipeline(profile, args.output or f"runs/{args.profile}")
    print(f"pipeline finished in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
