"""The calibration benchmark's two generated sets (``benchmarks/PROTOCOL.md``): ``matched``, where the generator and
the reference encoder learn from exactly the classifier's real training images, and ``borrowed``, the shipped
generator (all 60 000 Fashion-MNIST training images) with a reference encoder trained on 54 000; and the boundary
study's ``matched-gen2000`` (amendment 1): the matched generator's run stopped at 2 000 steps, with the matched
images and encoder.

Each stage is one of the commands a user runs on a folder of their own (``hub_scripts/train_generator.py``,
``generate.py``, ``annotate.py``, ``evaluate_generator.py``), each resumable; a finished stage leaves ``DONE.json``
in its folder and is skipped. Run it again after a kill to continue.

    python benchmarks/matched_setting.py --setting matched     # export, generator, generate, annotate, quality
    python benchmarks/matched_setting.py --setting borrowed    # generate, annotate, quality
    python benchmarks/matched_setting.py --setting matched --until generator
    python benchmarks/matched_setting.py --setting matched-gen2000   # PROTOCOL.md amendment 1: 2 000 generator steps
    python benchmarks/matched_setting.py --setting matched-x2        # amendment 2, stage 4: groups 0 ... 13 499
    python benchmarks/matched_setting.py --setting annotated-x2      # the same images, the borrowed annotator
    python benchmarks/matched_setting.py --compare benchmarks/settings_quality.json   # both generators, one judge
    python benchmarks/matched_setting.py --record benchmarks/settings_a4.json matched annotated borrowed

The matched generator that amendment 4's sets were rebuilt from (PROTOCOL.md, amendment 4's clarification of
2026-12-07: ``b6a2b93``'s build, one thread, the instruction-set pins) is kept in ``benchmarks/generator_matched/``
(its weights' sha256 in ``benchmarks/settings_a4.json``, with its stage marker): on a machine without ``runs/``,
``cp -r benchmarks/generator_matched runs/settings/matched/generator`` before ``--setting matched`` starts the build
at generation, about 40 CPU-minutes instead of two hours of training.

The matched setting's real images are the classifier's: ``load_data`` with the benchmark's data options
(``--data-seed 0 --val-size 2000 --max-train-samples 2500``), exported with the test split as a ``save_to_disk``
folder that the scripts read like any user's dataset. The CSM dataset of a setting is
``<output>/<setting>/csm/csm-fmnist-aug``.

Amendment 2's volume sets (stage 4): ``matched-x2`` and ``matched-x4`` hold groups 0 ... 13 499 and 0 ... 26 999 of
the same plan, generator and sampler as ``matched``; each extends the next smaller set (``generate.py
--extend-from``: the groups it holds are copied, so the first 6 750 are the matched set's images) and is annotated by
the matched annotator; ``annotated-x2`` / ``-x4`` annotate the same images with the borrowed annotator.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from timm_csm.io import write_json_atomic
from timm_csm.recipes.cache import MARKER, KeyedFolder
from timm_csm.study.settings import (annotate_command, export_splits, generate_command, generator_command,
                                     images_digest, run_stage, save_image_splits)

__all__ = ["DATA_OPTIONS", "GENERATION", "SETTINGS", "stage_commands", "real_subset", "borrowed_encoder_overlap",
           "save_image_splits", "export_real", "main"]

#: the data options every cell of the benchmark trains with (PROTOCOL.md): one real subset and one validation set
DATA_OPTIONS = ["--dataset", "fashion_mnist", "--max-train-samples", "2500", "--val-size", "2000",
                "--data-seed", "0"]
#: the generated volume and sampler of both settings (the earlier benchmark's set: 6 750 groups x 4 lambdas)
GENERATION = ["--num-groups", "6750", "--num-lambdas", "4", "--steps", "8", "--scheduler", "ddim",
              "--guidance-scale", "1.0", "--groups-per-shard", "128", "--batch-groups", "32"]
#: the generator recipe of the matched setting: the shipped generator's (profile fmnist, 4 000 steps), so that the
#: two settings differ in the images the generator learned from only; "matched-gen2000" (PROTOCOL.md amendment 1)
#: is the same run stopped at 2 000 steps (the learning rate is constant after warm-up), with the matched encoder
GENERATOR_STEPS = {"matched": 4000, "matched-gen2000": 2000}
#: reference-encoder epochs: the shipped default (4 epochs of 54 000 images) in the borrowed setting; in the matched
#: setting as many epochs as the classifier's recipe (60 of 2 250 images), fixed in advance
ENCODER_EPOCHS = {"borrowed": 4, "matched": 60, "matched-gen2000": 60, "annotated": 4}
#: amendment 2's "annotated": the matched generator's images annotated by the borrowed setting's annotator (its
#: encoder, prototypes and s choice, learned from 54 000 labelled images: a supervised stand-in for CLIP's wider
#: knowledge; the paper's generator, annotator and backbones differ from these in every setting)
#: amendment 2's volume sets (stage 4): the matched plan at 2x and 4x the groups, each extending the set named here
VOLUME_SETS = {"matched-x2": (2, "matched"), "matched-x4": (4, "matched-x2")}
#: the same images annotated by the borrowed annotator, as "annotated" annotates the matched set's
ANNOTATED_VOLUME_SETS = {"annotated-x2": "matched-x2", "annotated-x4": "matched-x4"}
SETTINGS = ("matched", "borrowed", "matched-gen2000", "annotated", *VOLUME_SETS, *ANNOTATED_VOLUME_SETS)
SHIPPED = "timm_csm/assets/generator-fmnist"
#: the stages' scripts (thin wrappers over the package's commands, run from the checkout's root)
_SCRIPTS = {"generator": "hub_scripts/train_generator.py", "generate": "hub_scripts/generate.py",
            "annotate": "hub_scripts/annotate.py"}


def real_subset():
    """The classifier's training, validation and test arrays under :data:`DATA_OPTIONS`."""
    from timm_csm.training import load_data, parse_args

    return load_data(parse_args(DATA_OPTIONS))


def borrowed_encoder_overlap(data_seeds: Sequence[int]) -> Dict[int, Dict[str, int]]:
    """``{data seed: {"train", "val"}}``: how many of the classifier's training and validation images on the real
    subset of each data seed the borrowed reference encoder learned from. It trains on the 60 000 training images
    less annotate's held-out share (:func:`~timm_csm.annotation.holdout_split` at its defaults), the images the
    subsets are drawn from; an image counts when its pixels and label are among those it trained on."""
    import hashlib

    import numpy as np

    from timm_csm.annotation import AnnotationConfig, holdout_split
    from timm_csm.data.sources import load_image_arrays
    from timm_csm.training import load_data, parse_args

    def keys(arrays):
        images, labels = np.asarray(arrays.images), np.asarray(arrays.labels)
        return [hashlib.sha1(images[i].tobytes() + int(labels[i]).to_bytes(2, "little")).digest()
                for i in range(len(labels))]

    defaults = AnnotationConfig()
    full = load_image_arrays(DATA_OPTIONS[DATA_OPTIONS.index("--dataset") + 1], "train")
    seen = set(keys(holdout_split(full, defaults.holdout_fraction, defaults.seed)[0]))
    options = DATA_OPTIONS[:DATA_OPTIONS.index("--data-seed")]
    overlap = {}
    for data_seed in data_seeds:
        split = load_data(parse_args([*options, "--data-seed", str(data_seed)]))
        overlap[data_seed] = {name: sum(k in seen for k in keys(part))
                              for name, part in (("train", split.train), ("val", split.val))}
    return overlap


def export_real(folder: Path) -> Dict:
    """The classifier's 2 500 training images and the test split as a ``save_to_disk`` DatasetDict at ``folder``."""
    return {**export_splits(folder, real_subset()), "data_options": DATA_OPTIONS}


def generation_options(volume: int = 1) -> List[str]:
    """:data:`GENERATION` with ``volume`` times its groups."""
    i = GENERATION.index("--num-groups") + 1
    return GENERATION[:i] + [str(int(GENERATION[i]) * volume)] + GENERATION[i + 1:]


def stage_commands(setting: str, root: Path, python: str = sys.executable) -> List[tuple]:
    """``(stage name, folder, command)`` of each script stage of ``setting``, in order."""
    if setting == "annotated" or setting in ANNOTATED_VOLUME_SETS:
        images = ANNOTATED_VOLUME_SETS.get(setting, "matched")
        return [("annotate", root / "csm", _annotate_command(python, root.parent / images / "generated",
                                                             "fashion_mnist", root, root.parent / "borrowed",
                                                             ENCODER_EPOCHS["borrowed"]))]
    if setting in VOLUME_SETS:
        volume, smaller = VOLUME_SETS[setting]
        matched, extend = root.parent / "matched", ["--extend-from", str(root.parent / smaller / "generated")]
        return [("generate", root / "generated",
                 generate_command([python, _SCRIPTS["generate"]], matched / "generator",
                                  [*generation_options(volume), *extend], root / "generated")),
                ("annotate", root / "csm", _annotate_command(python, root / "generated", str(matched / "real"), root,
                                                             matched, ENCODER_EPOCHS["matched"]))]
    matched = setting in GENERATOR_STEPS
    # the matched variants share the matched setting's real images and reference encoder
    shared = root.parent / "matched" if matched else root
    dataset = str(shared / "real") if matched else "fashion_mnist"
    generator = root / "generator" if matched else Path(SHIPPED)
    stages = []
    if matched:
        stages.append(("generator", generator, generator_command([python, _SCRIPTS["generator"]], "fmnist", dataset,
                                                                 generator, GENERATOR_STEPS[setting])))
    stages.append(("generate", root / "generated", generate_command([python, _SCRIPTS["generate"]], generator,
                                                                    GENERATION, root / "generated")))
    stages.append(("annotate", root / "csm", _annotate_command(python, root / "generated", dataset, root, shared,
                                                               ENCODER_EPOCHS[setting])))
    stages.append(("quality", root / "quality", [python, "hub_scripts/evaluate_generator.py", "--generator",
                                                 str(generator), "--classifier", str(shared / "reference"),
                                                 "--dataset", dataset, "--num-groups", "200", "--steps", "8",
                                                 "--guidance-scale", "1.0", "--output",
                                                 str(root / "quality" / "quality.json")]))
    return stages


def _annotate_command(python: str, generated: Path, dataset: str, root: Path, annotator: Path, epochs: int) -> list:
    """annotate.py on ``generated`` with the reference encoder of ``annotator`` (trained there on first use)."""
    return annotate_command([python, _SCRIPTS["annotate"]], generated, dataset, root / "csm", "csm-fmnist-aug",
                            annotator / "reference", epochs)


def _done(folder: Path) -> bool:
    return (folder / MARKER).exists()


def _prerequisite(setting: str) -> Optional[Tuple[str, str]]:
    """``(setting, stage)`` whose finished folder ``setting`` builds on, and None where it builds on nothing."""
    if setting != "matched" and setting in GENERATOR_STEPS:
        return "matched", "real"
    if setting == "annotated":
        return "matched", "generated"
    if setting in VOLUME_SETS:
        return VOLUME_SETS[setting][1], "generated"
    if setting in ANNOTATED_VOLUME_SETS:
        return ANNOTATED_VOLUME_SETS[setting], "generated"
    return None


def run_setting(setting: str, output: Path, until: str = None, log=print) -> None:
    needed = _prerequisite(setting)
    if needed is not None and not _done(output / needed[0] / needed[1]):
        raise SystemExit(f"{setting} builds on the {needed[0]} setting's {needed[1]} folder: build --setting "
                         f"{needed[0]} first")
    root = output / setting
    root.mkdir(parents=True, exist_ok=True)
    real = KeyedFolder(root / "real", DATA_OPTIONS, config_field="data_options")
    if setting == "matched" and real.state() != "done":
        real.check()
        log(f"[real] exporting the classifier's training images to {root / 'real'}")
        real.write(export_real(root / "real"), indent=1)
    for name, folder, cmd in stage_commands(setting, root):
        run_stage(name, folder, cmd, log)
        if name == until:
            return


def compare_generators(output: Path, judge: Path, log=print) -> Dict:
    """Each finished setting's generated set measured the same way (reported, never used for a choice): the share
    of its pure-class images (lambda = 0 and 1, the first 1 000 groups) that ``judge`` (the borrowed setting's
    54 000-image reference encoder) recognises, and the two-sample accuracy of a small CNN telling 2 500 of them from
    the classifier's 2 500 real training images (0.5: indistinguishable)."""
    import numpy as np
    import torch

    from timm_csm.annotation import load_reference_encoder
    from timm_csm.generation import two_sample_accuracy
    from timm_csm.generation.writer import load_generated

    classify = load_reference_encoder(judge).classify
    real = torch.as_tensor(np.asarray(real_subset().train.images))
    rows = {}
    for setting in [s for s in SETTINGS if s not in VOLUME_SETS]:  # a volume set's images are the matched generator's
        folder = output / setting / "generated"
        if not _done(folder):
            continue
        ds, plan = load_generated(folder)
        ends = ds.filter(lambda lam, g: lam in (0.0, 1.0) and g < 1000, input_columns=["lambda_gen", "group_id"])
        images = np.stack([np.asarray(im, dtype=np.uint8) for im in ends["image"]])
        images = torch.as_tensor(images[:, None] if images.ndim == 3 else images.transpose(0, 3, 1, 2))
        target = np.where(np.asarray(ends["lambda_gen"]) == 1.0, ends["class_a"], ends["class_b"])
        recognised = float((classify(images).argmax(1).numpy() == target).mean())
        rows[setting] = {"pure_class_images": len(images), "recognised_by_judge": recognised,
                         "two_sample_accuracy": two_sample_accuracy(real, images, epochs=5)}
        log(f"[compare] {setting}: {rows[setting]}")
    return rows


#: the file of each folder a stage makes whose bytes name what it made (the CSM dataset: its content fingerprint)
PRODUCTS = {"generator": "unet/diffusion_pytorch_model.safetensors", "reference": "model.safetensors"}


def build_record(output: Path, settings: Sequence[str]) -> Dict:
    """Each finished stage folder of ``settings`` under ``output``: its marker (the command and the seconds of its
    last run) and the digest of what it made (the generator's and reference encoders' weights, the CSM dataset's
    content fingerprint), so that a rebuild on another machine is checked stage by stage, the generator's weights
    hours before its set exists. The folders' own build commit is not known here: the record names the machine and
    the code that read them."""
    import json

    import torch

    from timm_csm.hub import content_fingerprint
    from timm_csm.io.hashing import file_sha256
    from timm_csm.recipes.cells import cpu_model, git

    record = {"what": "the stage folders of each setting under " + output.as_posix() + ": marker and product digest",
              "read_at_commit": git("rev-parse", "--short", "HEAD"), "cpu": cpu_model(),
              "cpu_capability": torch.backends.cpu.get_cpu_capability(), "settings": {}}
    for setting in settings:
        stages = {}
        # a reference encoder trains inside the annotate stage that first needs it: its folder has no marker
        root = output / setting
        for folder in sorted(p for p in (root.iterdir() if root.is_dir() else ())
                             if _done(p) or (p.name == "reference" and (p / PRODUCTS["reference"]).exists())):
            entry = json.loads((folder / MARKER).read_text()) if _done(folder) else {}
            if folder.name in PRODUCTS:
                entry["sha256"] = file_sha256(folder / PRODUCTS[folder.name])
            elif folder.name == "csm":
                entry["content_fingerprint"] = content_fingerprint(folder / "csm-fmnist-aug")
            stages[folder.name] = entry
        record["settings"][setting] = stages
    return record


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--setting", choices=SETTINGS, default=None, help="the setting to build (required unless --compare)")
    p.add_argument("--output", default="runs/settings", help="stage folders: <output>/<setting>/<stage>")
    p.add_argument("--until", default=None, choices=("generator", "generate", "annotate", "quality"),
                   help="stop after this stage")
    p.add_argument("--compare", default=None, metavar="JSON",
                   help="instead of building a setting: measure every finished setting's generated set with the "
                        "borrowed encoder as the judge and write the numbers to this JSON file")
    p.add_argument("--record", nargs="+", default=None, metavar=("JSON", "SETTING"),
                   help="instead of building: write each finished stage of the SETTINGs (its marker and the digest "
                        "of what it made) to JSON")
    return p


def main(argv: Sequence[str] = None) -> None:
    args = build_parser().parse_args(argv)
    if args.record:
        if len(args.record) < 2:
            build_parser().error("--record needs a JSON file and at least one setting")
        write_json_atomic(Path(args.record[0]), build_record(Path(args.output), args.record[1:]), indent=1)
        return
    if not args.compare and args.setting is None:
        build_parser().error("give --setting (or --compare, or --record)")
    if args.compare:
        rows = compare_generators(Path(args.output), Path(args.output) / "borrowed" / "reference")
        write_json_atomic(Path(args.compare), rows, indent=1)
        return
    run_setting(args.setting, Path(args.output), args.until)
    if args.until in (None, "annotate", "quality"):
        print(f"CSM dataset: {Path(args.output) / args.setting / 'csm' / 'csm-fmnist-aug'}")


if __name__ == "__main__":
    main()
