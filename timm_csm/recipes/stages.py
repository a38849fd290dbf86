"""The main job's stages, one function each: generator, generated set, reference encoder, generator quality,
re-annotation, classifier training (CE or CSM).

Each takes the stage cache, the profile and its inputs and returns its outputs. A stage's configuration (its cache
key) holds its own settings and the configurations of the stages it reads, so that changing a setting re-runs that
stage and every stage after it. The generated set is keyed by the generator's weights, not their path: a moved
checkout or another copy of the same generator reuses it.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Callable, Dict, Optional

from ..io import write_json_atomic
from .cache import Stage, StageCache
from .profiles import RecipeProfile, training_options

__all__ = ["shipped_generator", "short_name", "csm_dataset_name", "generator", "generate", "encoder_config",
           "encoder", "quality", "annotate", "train_config", "train"]

_ASSETS = Path(__file__).resolve().parents[1] / "assets"


def shipped_generator(dataset: str) -> Optional[Path]:
    """The generator weights shipped in the package for ``dataset`` (short name, e.g. ``fmnist``), if any."""
    folder = _ASSETS / f"generator-{dataset}"
    return folder if (folder / "unet" / "config.json").exists() else None


def short_name(dataset: str) -> str:
    """The dataset's short name in asset and CSM dataset names: ``fashion_mnist`` -> ``fmnist``, ``org/x`` -> ``x``."""
    return {"fashion_mnist": "fmnist"}.get(dataset, dataset.split("/")[-1])


def csm_dataset_name(dataset: str) -> str:
    """The bare name the CSM dataset of ``dataset`` is installed under: ``csm-<short name>-aug``."""
    return f"csm-{short_name(dataset)}-aug"


def generator(cache: StageCache, profile: RecipeProfile, train_real, log: Callable[[str], None]) -> Path:
    """The generator folder: the shipped weights, or a generator trained on ``train_real`` with the
    generator-training profile ``profile.generator`` (at the real images' size and channels)."""
    if profile.generator == "shipped":
        shipped = shipped_generator(short_name(profile.dataset))
        if shipped is None:
            raise FileNotFoundError(f"no generator is shipped for {profile.dataset!r}: choose a generator-training "
                                    "profile (--generator fmnist / digits / cifar10 ...) to train one")
        log(f"[generator] shipped weights: {shipped}")
        return shipped
    config = {"dataset": profile.dataset, "generator": profile.generator, "steps": profile.generator_steps}
    with cache.stage("generator", config) as stage:
        if not stage.done:
            from ..generation import GENERATOR_PROFILES
            from ..generation.training import train_generator

            cfg = GENERATOR_PROFILES[profile.generator]
            if profile.generator_steps is not None:
                cfg = dataclasses.replace(cfg, steps=profile.generator_steps)
            if train_real.images.shape[2] != cfg.sample_size:
                cfg = dataclasses.replace(cfg, sample_size=train_real.images.shape[2],
                                          in_channels=train_real.images.shape[1])
            train_generator(train_real.images, train_real.labels, train_real.class_names, stage.folder, cfg,
                            meta={"dataset": profile.dataset, "profile": profile.generator}, log=log)
    return stage.folder


def _mixing_pipeline(profile: RecipeProfile, generator_dir: Path):
    from ..generation import SemanticMixingPipeline, create_scheduler

    pipe = SemanticMixingPipeline.from_pretrained(generator_dir, num_inference_steps=profile.sampler_steps,
                                                  guidance_scale=profile.guidance_scale)
    if profile.scheduler != "ddim":  # the folder's scheduler is DDIM
        pipe.scheduler = create_scheduler(profile.scheduler, pipe.scheduler.config)
    return pipe


def generate(cache: StageCache, profile: RecipeProfile, generator_dir: Path) -> Stage:
    """The semantic-mixing set: ``num_groups`` groups x ``num_lambdas`` ratios, sharded (32 groups a shard)."""
    from ..generation.models import weights_digest

    config = {"generator": weights_digest(generator_dir), "num_groups": profile.num_groups,
              "lambdas": profile.num_lambdas, "steps": profile.sampler_steps, "guidance": profile.guidance_scale}
    if profile.scheduler != "ddim":  # keys of DDIM sets stay those written before the choice existed
        config["scheduler"] = profile.scheduler
    with cache.stage("generated", config) as stage:
        if not stage.done:
            from ..generation import generate_to_folder, lambda_grid, make_plan

            pipe = _mixing_pipeline(profile, generator_dir)
            plan = make_plan(pipe.num_classes, profile.num_groups, lambda_grid(profile.num_lambdas),
                             pipe.class_names, groups_per_shard=32, generator=pipe.provenance)
            generate_to_folder(pipe, stage.folder, plan, batch_groups=32)
    return stage


_HELD_OUT = 0.1  # share of the real training split s is chosen on (never seen by the reference encoder)


def encoder_config(profile: RecipeProfile) -> Dict[str, Any]:
    """The re-annotation encoder's configuration (part of the keys of the stages that use it)."""
    config = {"dataset": profile.dataset, "encoder": profile.encoder, "epochs": profile.encoder_epochs,
              "max_steps": profile.encoder_max_steps, "seed": profile.seed}
    if profile.encoder == "reference" and profile.soft_label_scale is None:
        config["held_out"] = _HELD_OUT
    return config


def encoder(cache: StageCache, profile: RecipeProfile, train_real, test_real,
            log: Callable[[str], None]) -> Optional[Path]:
    """The reference encoder's folder, or None for an open_clip encoder. It trains on the real training split
    without the held-out share s is chosen on (:func:`~timm_csm.annotation.holdout_split`, the profile's seed)
    when s is chosen there, as ``hub_scripts/annotate.py --s auto`` does; on all of it when s is given."""
    if profile.encoder != "reference":
        return None
    with cache.stage("encoder", encoder_config(profile)) as stage:
        if not stage.done:
            from ..annotation import holdout_split, train_reference_encoder

            if profile.soft_label_scale is None:
                train_real = holdout_split(train_real, _HELD_OUT, profile.seed)[0]
            train_reference_encoder(train_real, stage.folder / "encoder", epochs=profile.encoder_epochs,
                                    seed=profile.seed, test=test_real, max_steps=profile.encoder_max_steps, log=log)
    return stage.folder / "encoder"


def quality(cache: StageCache, profile: RecipeProfile, generator_dir: Path, generated: Stage,
            encoder_dir: Path) -> Dict[str, Any]:
    """Generator quality: the share of generated pure-class images (up to 90 groups) that the reference encoder's
    classifier recognises, with its accuracy on real test images and the guidance scale used."""
    with cache.stage("quality", {"generated": generated.config, "encoder": encoder_config(profile)}) as stage:
        if not stage.done:
            from ..annotation import load_reference_encoder
            from ..generation import pure_class_accuracy

            classifier = load_reference_encoder(encoder_dir)
            pipe = _mixing_pipeline(profile, generator_dir)
            q = pure_class_accuracy(pipe, classifier.classify, num_groups=min(90, profile.num_groups))
            q["classifier_real_test_accuracy"] = classifier.test_accuracy
            q["guidance_scale"] = pipe.guidance_scale
            write_json_atomic(stage.folder / "quality.json", q, indent=1)
    return json.loads((stage.folder / "quality.json").read_text())


def _load_encoder(profile: RecipeProfile, encoder_dir: Optional[Path]):
    from ..annotation import create_encoder, load_reference_encoder

    if profile.encoder == "reference":
        return load_reference_encoder(encoder_dir)
    _, model_name, weights = profile.encoder.split(":", 2)
    return create_encoder("open_clip", model_name=model_name, pretrained=weights)


def annotate(cache: StageCache, profile: RecipeProfile, generated: Stage, encoder_dir: Optional[Path],
             train_real) -> Stage:
    """Re-annotation through :func:`timm_csm.annotation.annotate_generated`: prototypes of the real training split,
    lambda-hat and soft labels (s from the profile, or chosen on a held-out tenth of the real training split),
    saved as the Hub-layout dataset ``csm-<short name>-aug`` inside the stage folder and installed under that bare
    name."""
    name = csm_dataset_name(profile.dataset)
    s = "auto" if profile.soft_label_scale is None else profile.soft_label_scale
    config = {"generated": generated.config, "encoder": encoder_config(profile), "s": profile.soft_label_scale,
              "s_selection": {"held_out": _HELD_OUT, "seed": profile.seed} if s == "auto" else None}
    if profile.drop_flagged:
        config["drop_flagged"] = True
    with cache.stage("annotated", config) as stage:
        if not stage.done:
            from ..annotation import annotate_generated
            from ..generation import load_generated
            from ..hub import install_dataset, provenance_from_plan, save_csm_dataset

            images, plan = load_generated(generated.folder)
            result = annotate_generated(images, plan, train_real, _load_encoder(profile, encoder_dir), s,
                                        holdout_fraction=_HELD_OUT, seed=profile.seed,
                                        drop_flagged=profile.drop_flagged, cache_dir=stage.folder / "prototypes")
            provenance = {"dataset": profile.dataset, **provenance_from_plan(plan), **result.provenance()}
            folder = save_csm_dataset(result.dataset, stage.folder / name, provenance=provenance,
                                      class_names=train_real.class_names)
            install_dataset(folder)
            write_json_atomic(stage.folder / "annotation.json", {"s": result.s, "rows": len(result.dataset)})
    return stage


def train_config(profile: RecipeProfile, loss: str, csm_dataset: Path) -> Dict[str, Any]:
    """The training options of the CE or the CSM run: the profile's recipe, ``train_extra``, and for CSM the
    generated dataset and ``n_aug``."""
    cfg = training_options(profile)
    n_aug = cfg.pop("n_aug")
    cfg.update(loss=loss, seed=profile.seed, experiment=".")
    if loss == "csm":
        cfg.update(csm_dataset=str(csm_dataset), n_aug=n_aug)
    return cfg


def train(cache: StageCache, profile: RecipeProfile, loss: str, annotated: Stage) -> Dict[str, Any]:
    """The classifier trained with ``loss`` (``ce`` or ``csm``); its ``results.json`` plus ``output``, the stage
    folder. A killed run resumes its own training run (``auto_resume``)."""
    cfg = train_config(profile, loss, annotated.folder / csm_dataset_name(profile.dataset))
    config = {"train": cfg, "data": annotated.config if loss == "csm" else None}
    with cache.stage(f"train-{loss}", config) as stage:
        if not stage.done:
            from ..train import run

            run(dict(cfg, output=str(stage.folder), auto_resume=True))
    results = json.loads((stage.folder / "results.json").read_text())
    results["output"] = str(stage.folder)
    return results
