"""A study's ``matched`` setting, built from its own real training images: the generator learns from exactly the
images the study's cells train on, the generated groups are annotated by a reference encoder trained on the same
images, and that encoder is KD's teacher (``benchmarks/PROTOCOL.md``'s matched setting, for any folder).

The stages, each one of the package's own commands in a folder keyed by its command (:class:`KeyedFolder`: a
finished stage is skipped, a killed one runs again and the long ones resume from their checkpoints)::

    <output>/settings/matched/real        the cells' training images (and the test split), a save_to_disk folder
    <output>/settings/matched/generator   timm-csm-train-generator on them
    <output>/settings/matched/generated   timm-csm-generate: semantic-mixing groups
    <output>/settings/matched/csm         timm-csm-annotate: the CSM dataset (<csm>/csm-matched); the encoder it
    <output>/settings/matched/reference     trains on the real images is the annotator and KD's teacher

Each stage's command, wall and CPU seconds (and the images generated) go to ``<output>/settings/settings.json``,
the build record the study page's cost section reads (``[report] builds``).

The generator profile and its steps, the generated volume and sampler, and the annotator's epochs come from the
spec's ``[settings.matched]`` table (:class:`~.settings_spec.MatchedSettingSpec`); what it leaves out follows from
the image size (:func:`generator_defaults`: 8 px digits, 3 000 steps; 16-32 px fmnist, 6 000 steps), 75 groups per
class pair of 4 lambdas from 8 DDIM steps without guidance (the ``demo`` recipe's sampler when amendment 2 was
registered; the recipe's is now 4 trailing steps, checked on its shipped generator, not on a ``matched`` one), and
the annotator trained as many epochs as the cells' recipe.
"""
from __future__ import annotations

import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from ..io import write_json_atomic
from ..recipes.cache import KeyedFolder

__all__ = ["MATCHED", "BUILD_RECORD", "CSM_NAME", "STAGE_COMMANDS", "images_digest", "save_image_splits",
           "export_splits", "real_splits", "generator_defaults", "generation_options", "generator_command",
           "generate_command", "annotate_command", "matched_stages", "run_stage", "needs_matched_setting",
           "build_matched_setting"]

MATCHED = "matched"
#: the build record of a study's settings, under ``<output>/settings``
BUILD_RECORD = "settings.json"
#: the CSM dataset's folder name under the annotation stage's folder
CSM_NAME = "csm-matched"
#: the package's commands each stage runs (``python -m``: the interpreter of the study)
STAGE_COMMANDS = {"generator": ["-m", "timm_csm.commands.train_generator"],
                  "generate": ["-m", "timm_csm.commands.generate"],
                  "annotate": ["-m", "timm_csm.commands.annotate"]}
#: the generator profile and default steps by the largest image side it takes (docs/own_folder.md's profile table)
_PROFILES_BY_SIZE = ((8, "digits", 3000), (32, "fmnist", 6000))
#: generated groups per class pair by default (the demo recipe's 75: 6 generated images per real training image)
GROUPS_PER_PAIR = 75


def image_array(images):
    """uint8 (N, C, H, W) of ``images``: an array as it is, a lazy folder or dataset view decoded."""
    import numpy as np

    if isinstance(images, np.ndarray):
        return images
    return np.asarray(images[np.arange(len(images))])


def images_digest(arrays) -> str:
    """sha256 of the uint8 pixels and labels of ``arrays`` (no shape): names the exact images a model learned from,
    as a cell records its real images (:func:`timm_csm.recipes.cells.real_images_digests`)."""
    from ..data.arrays import images_labels_hash

    return images_labels_hash(image_array(arrays.images), arrays.labels, with_shape=False).hexdigest()


def save_image_splits(folder: Path, splits: Dict[str, object], class_names: Sequence[str]) -> None:
    """``{split name: ImageArrays}`` as a ``save_to_disk`` DatasetDict of PNG images and class labels at ``folder``,
    written beside it, then renamed into place (a killed export leaves no half-written folder)."""
    import shutil

    import datasets
    import numpy as np

    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=list(class_names))})

    def to_dataset(arrays):
        imgs = [np.ascontiguousarray(x.transpose(1, 2, 0).squeeze(-1)) for x in image_array(arrays.images)]
        return datasets.Dataset.from_dict({"image": imgs, "label": [int(v) for v in arrays.labels]},
                                          features=features)

    tmp = folder.with_name(folder.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    datasets.DatasetDict({name: to_dataset(arrays) for name, arrays in splits.items()}).save_to_disk(str(tmp))
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)


def export_splits(folder: Path, splits) -> Dict[str, Any]:
    """The training images and the test split of ``splits`` (a :class:`~timm_csm.training.DataSplits`) as a
    ``save_to_disk`` folder that the commands read like any user's dataset; the counts and digests of the training
    and validation images."""
    parts = {"train": splits.train, **({"test": splits.test} if splits.test is not None else {})}
    save_image_splits(Path(folder), parts, splits.class_names)
    return {"train_images": len(splits.train), "train_digest": images_digest(splits.train),
            "validation_images": len(splits.val), "validation_digest": images_digest(splits.val)}


#: the training options that select a study's real images (its cells all share them)
DATA_KEYS = ("dataset", "data_dir", "train_split", "val_split", "val_size", "val_fraction", "data_seed",
             "max_train_samples", "max_test_samples")


def real_splits(recipe: Mapping[str, Any]):
    """The training, validation and test arrays a study's cells load under its recipe (the same options, hence the
    same images: :func:`timm_csm.recipes.cells.real_images_digests`)."""
    from ..training import TrainConfig, load_data

    return load_data(TrainConfig(**{k: recipe[k] for k in DATA_KEYS if recipe.get(k) is not None}))


def generator_defaults(image_size: int) -> tuple:
    """``(generator profile, steps)`` for images of ``image_size`` px; a ValueError above 32 px."""
    for largest, profile, steps in _PROFILES_BY_SIZE:
        if image_size <= largest:
            return profile, steps
    raise ValueError(f"no CPU generator profile for {image_size} px images: resize them to 32 px, or name a GPU "
                     "profile in [settings.matched] generator_profile")


def generation_options(num_groups: int, num_lambdas: int, sampler_steps: int, scheduler: str,
                       guidance_scale: float, groups_per_shard: int = 128, batch_groups: int = 32) -> List[str]:
    """The generation command's volume and sampler options."""
    return ["--num-groups", str(num_groups), "--num-lambdas", str(num_lambdas), "--steps", str(sampler_steps),
            "--scheduler", scheduler, "--guidance-scale", str(float(guidance_scale)), "--groups-per-shard",
            str(groups_per_shard), "--batch-groups", str(batch_groups)]


def generator_command(launch: Sequence[str], profile: str, dataset: str, output: Path, steps: int) -> List[str]:
    """The generator's training on ``dataset`` (seed 0, no sample grid)."""
    return [*launch, "--profile", profile, "--dataset", str(dataset), "--output", str(output), "--steps", str(steps),
            "--seed", "0", "--no-grid"]


def generate_command(launch: Sequence[str], generator: Path, options: Sequence[str], output: Path) -> List[str]:
    return [*launch, "--generator", str(generator), *options, "--output", str(output)]


def annotate_command(launch: Sequence[str], generated: Path, dataset: str, output: Path, name: str,
                     reference: Path, epochs: int, extra: Sequence[str] = ()) -> List[str]:
    """The annotation of ``generated`` with the reference encoder at ``reference`` (trained on ``dataset`` on first
    use, ``epochs`` epochs), s chosen on its held-out real images; ``extra``: further annotation options."""
    return [*launch, "--generated", str(generated), "--dataset", str(dataset), "--output", str(output), "--name",
            name, "--s", "auto", "--reference-dir", str(reference), "--reference-epochs", str(epochs), *extra]


def matched_stages(root: Path, settings, recipe: Mapping[str, Any], image_size: int, num_classes: int,
                   python: str = sys.executable) -> List[tuple]:
    """``(stage, folder, command)`` of the matched setting under ``root``, its real images exported at
    ``root/real``, with the choices of ``settings`` (a :class:`~.settings_spec.MatchedSettingSpec`) and their
    defaults."""
    default_profile, default_steps = generator_defaults(image_size)
    profile = settings.generator_profile or default_profile
    # another profile than the size's, without steps: its own schedule (no --steps)
    steps = settings.generator_steps or (default_steps if profile == default_profile else None)
    pairs = num_classes * (num_classes - 1) // 2
    options = generation_options(settings.num_groups or GROUPS_PER_PAIR * pairs, settings.num_lambdas,
                                 settings.sampler_steps, settings.scheduler, settings.guidance_scale)
    real, generator, generated = root / "real", root / "generator", root / "generated"
    epochs = settings.annotator_epochs or int(recipe["epochs"])
    launch = {name: [python, *args] for name, args in STAGE_COMMANDS.items()}
    command = generator_command(launch["generator"], profile, real, generator, steps)
    if steps is None:
        command = command[:command.index("--steps")] + command[command.index("--steps") + 2:]
    return [("generator", generator, command),
            ("generated", generated, generate_command(launch["generate"], generator, options, generated)),
            ("csm", root / "csm", annotate_command(launch["annotate"], generated, real, root / "csm", CSM_NAME,
                                                    root / "reference", epochs,
                                                    ["--accept-poor-generator"] if settings.accept_poor_generator
                                                    else []))]


def run_stage(name: str, folder: Path, command: List[str], log: Callable[[str], None] = print) -> Dict[str, Any]:
    """Run ``command`` (its progress on this terminal) unless ``folder`` holds its marker; the stage's record:
    the command (less the interpreter) and the wall and CPU seconds of its last run. A folder holding another
    command's output is refused (ValueError)."""
    stage = KeyedFolder(Path(folder), command[1:], config_field="command")
    stage.check()
    if stage.state() == "done":
        log(f"[{name}] done: {folder}")
        return stage.read()
    log(f"[{name}] " + " ".join(map(str, command)))
    Path(folder).mkdir(parents=True, exist_ok=True)
    before, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.time()
    subprocess.run(command, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    stage.write(indent=1, seconds=round(time.time() - t0, 1), cpu_seconds=round(cpu, 1))
    return stage.read()


def needs_matched_setting(spec, given: Mapping[str, str]) -> bool:
    """Whether ``spec`` runs a method in ``matched`` that reads a generated set or a teacher that ``given`` (the
    paths the user named for the setting) lacks."""
    from .methods import get_method

    if MATCHED not in spec.settings:
        return False
    soft = get_method(spec.search.method).csm is not None or any(
        get_method(m.name).csm is not None and MATCHED in m.settings for m in spec.methods)
    teacher = any(get_method(m.name).teacher and MATCHED in m.settings for m in spec.methods)
    return (soft and not given.get("soft")) or (teacher and not given.get("teacher"))


def build_matched_setting(spec, output: Path, recipe: Mapping[str, Any], log: Callable[[str], None] = print,
                          python: str = sys.executable) -> Dict[str, str]:
    """Build the matched setting of ``spec`` (cells' options ``recipe``) under ``<output>/settings/matched``, each
    finished stage skipped; ``{"soft": CSM dataset, "teacher": reference encoder, "annotator": the same}``."""
    base = Path(output) / "settings"
    root = base / MATCHED
    data_options = {k: recipe.get(k) for k in DATA_KEYS}
    real = KeyedFolder(root / "real", data_options, config_field="data_options")
    real.check()
    if real.state() != "done":
        log(f"[real] exporting the cells' training images to {root / 'real'}")
        t0 = time.time()
        splits = real_splits(recipe)
        shape = image_array(splits.train.images).shape
        real.write({"data_options": data_options, **export_splits(root / "real", splits),
                    "image_size": int(max(shape[2:])), "classes": len(splits.class_names),
                    "seconds": round(time.time() - t0, 1)}, indent=1)
    found = real.read()
    record = {"real": {k: v for k, v in found.items() if k != "data_options"}}
    for name, folder, command in matched_stages(root, spec.matched_setting, recipe, found["image_size"],
                                                found["classes"], python):
        done = run_stage(name, folder, command, log)
        record[name] = {"command": done["command"], "seconds": done["seconds"],
                        "cpu_seconds": done.get("cpu_seconds")}
    from .report_cost import generated_images

    record["generated"]["images"] = generated_images(record["generated"]["command"])
    path = base / BUILD_RECORD
    builds = _read(path)
    builds.setdefault("settings", {})[MATCHED] = record
    builds["seconds"] = "wall and CPU seconds of each stage's last run (a resumed stage: its last piece)"
    write_json_atomic(path, builds, indent=1)
    log(f"[matched] built: {root} (record: {path})")
    reference = str(root / "reference")
    return {"soft": str(root / "csm" / CSM_NAME), "teacher": reference, "annotator": reference}


def _read(path: Path) -> Dict[str, Any]:
    from ..recipes.cells import read_json

    return read_json(path) if Path(path).exists() else {}

