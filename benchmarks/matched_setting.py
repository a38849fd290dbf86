"""The calibration benchmark's two generated sets (``benchmarks/PROTOCOL.md``): ``matched``, where the generator and
the reference encoder learn from exactly the classifier's real training images, and ``borrowed``, the shipped
generator (all 60 000 Fashion-MNIST training images) with a reference encoder trained on 54 000.

Each stage is one of the commands a user runs on a folder of their own (``hub_scripts/train_generator.py``,
``generate.py``, ``annotate.py``, ``evaluate_generator.py``), each resumable; a finished stage leaves ``DONE.json``
in its folder and is skipped. Run it again after a kill to continue.

    python benchmarks/matched_setting.py --setting matched     # export, generator, generate, annotate, quality
    python benchmarks/matched_setting.py --setting borrowed    # generate, annotate, quality
    python benchmarks/matched_setting.py --setting matched --until generator

The matched setting's real images are the classifier's: ``load_data`` with the benchmark's data options
(``--data-seed 0 --val-size 2000 --max-train-samples 2500``), exported with the test split as a ``save_to_disk``
folder that the scripts read like any user's dataset. The CSM dataset of a setting is
``<output>/<setting>/csm/csm-fmnist-aug``.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Sequence

from timm_csm.io import write_json_atomic

__all__ = ["DATA_OPTIONS", "GENERATION", "SETTINGS", "stage_commands", "real_subset", "export_real", "main"]

#: the data options every cell of the benchmark trains with (PROTOCOL.md): one real subset and one validation set
DATA_OPTIONS = ["--dataset", "fashion_mnist", "--max-train-samples", "2500", "--val-size", "2000",
                "--data-seed", "0"]
#: the generated volume and sampler of both settings (the earlier benchmark's set: 6 750 groups x 4 lambdas)
GENERATION = ["--num-groups", "6750", "--num-lambdas", "4", "--steps", "8", "--scheduler", "ddim",
              "--guidance-scale", "1.0", "--groups-per-shard", "128", "--batch-groups", "32"]
#: the generator recipe of the matched setting: the shipped generator's (profile fmnist, 4 000 steps), so that the
#: two settings differ in the images the generator learned from only
GENERATOR_STEPS = 4000
#: reference-encoder epochs: the shipped default (4 epochs of 54 000 images) in the borrowed setting; in the matched
#: setting as many epochs as the classifier's recipe (60 of 2 250 images), fixed in advance
ENCODER_EPOCHS = {"borrowed": 4, "matched": 60}
SETTINGS = ("matched", "borrowed")
SHIPPED = "timm_csm/assets/generator-fmnist"


def real_subset():
    """The classifier's training, validation and test arrays under :data:`DATA_OPTIONS`."""
    from timm_csm.training import build_parser, load_data

    return load_data(build_parser().parse_args(list(DATA_OPTIONS)))


def images_digest(arrays) -> str:
    """sha256 of the uint8 pixels and labels of ``arrays``: names the exact images a model learned from."""
    import numpy as np

    h = hashlib.sha256(np.ascontiguousarray(arrays.images).tobytes())
    h.update(np.asarray(arrays.labels, dtype=np.int64).tobytes())
    return h.hexdigest()


def export_real(folder: Path) -> Dict:
    """The classifier's 2 500 training images and the test split as a ``save_to_disk`` DatasetDict at ``folder``
    (written beside it, then renamed into place)."""
    import shutil

    import datasets
    import numpy as np

    splits = real_subset()
    names = list(splits.class_names)
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=names)})

    def to_dataset(arrays):
        imgs = [np.ascontiguousarray(x.transpose(1, 2, 0).squeeze(-1)) for x in np.asarray(arrays.images)]
        return datasets.Dataset.from_dict({"image": imgs, "label": [int(v) for v in arrays.labels]},
                                          features=features)

    tmp = folder.with_name(folder.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    datasets.DatasetDict({"train": to_dataset(splits.train), "test": to_dataset(splits.test)}).save_to_disk(str(tmp))
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return {"train_images": len(splits.train), "train_digest": images_digest(splits.train),
            "validation_images": len(splits.val), "validation_digest": images_digest(splits.val),
            "data_options": DATA_OPTIONS}


def stage_commands(setting: str, root: Path, python: str = sys.executable) -> List[tuple]:
    """``(stage name, folder, command)`` of each script stage of ``setting``, in order."""
    real = root / "real"
    dataset = str(real) if setting == "matched" else "fashion_mnist"
    generator = root / "generator" if setting == "matched" else Path(SHIPPED)
    stages = []
    if setting == "matched":
        stages.append(("generator", generator, [python, "hub_scripts/train_generator.py", "--profile", "fmnist",
                                                "--dataset", dataset, "--output", str(generator), "--steps",
                                                str(GENERATOR_STEPS), "--seed", "0", "--no-grid"]))
    stages.append(("generate", root / "generated", [python, "hub_scripts/generate.py", "--generator", str(generator),
                                                    *GENERATION, "--output", str(root / "generated")]))
    stages.append(("annotate", root / "csm", [python, "hub_scripts/annotate.py", "--generated",
                                              str(root / "generated"), "--dataset", dataset, "--output",
                                              str(root / "csm"), "--name", "csm-fmnist-aug", "--s", "auto",
                                              "--reference-dir", str(root / "reference"), "--reference-epochs",
                                              str(ENCODER_EPOCHS[setting])]))
    stages.append(("quality", root / "quality", [python, "hub_scripts/evaluate_generator.py", "--generator",
                                                 str(generator), "--classifier", str(root / "reference"),
                                                 "--dataset", dataset, "--num-groups", "200", "--steps", "8",
                                                 "--guidance-scale", "1.0", "--output",
                                                 str(root / "quality" / "quality.json")]))
    return stages


def _done(folder: Path) -> bool:
    return (folder / "DONE.json").exists()


def run_setting(setting: str, output: Path, until: str = None, log=print) -> None:
    root = output / setting
    root.mkdir(parents=True, exist_ok=True)
    if setting == "matched" and not _done(root / "real"):
        log(f"[real] exporting the classifier's training images to {root / 'real'}")
        info = export_real(root / "real")
        write_json_atomic(root / "real" / "DONE.json", info, indent=1)
    for name, folder, cmd in stage_commands(setting, root):
        if _done(folder):
            log(f"[{name}] done: {folder}")
        else:
            log(f"[{name}] " + " ".join(cmd))
            folder.mkdir(parents=True, exist_ok=True)
            t0 = time.time()
            subprocess.run(cmd, check=True)
            write_json_atomic(folder / "DONE.json", {"command": cmd[1:], "seconds": round(time.time() - t0, 1)},
                              indent=1)
        if name == until:
            return


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--setting", choices=SETTINGS, required=True)
    p.add_argument("--output", default="runs/settings", help="stage folders: <output>/<setting>/<stage>")
    p.add_argument("--until", default=None, choices=("generator", "generate", "annotate", "quality"),
                   help="stop after this stage")
    return p


def main(argv: Sequence[str] = None) -> None:
    args = build_parser().parse_args(argv)
    run_setting(args.setting, Path(args.output), args.until)
    print(f"CSM dataset: {Path(args.output) / args.setting / 'csm' / 'csm-fmnist-aug'}")


if __name__ == "__main__":
    main()
