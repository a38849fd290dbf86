"""The main job's stages, one function each: generator, generated set, reference encoder, generator quality,
re-annotation, classifier training (CE or CSM).

Each takes the stage cache, the profile and its inputs and returns its outputs. A stage's configuration (its cache
key) holds its own settings and the configurations of the stages it reads, so that changing a setting re-runs that
stage and every stage after it. The generated set is keyed by the generator's weights, not their path (the UNet
weights of a generator folder, the file of an EDM pickle): a moved checkout or another copy of the same generator
reuses it.

Two generator routes: a diffusers generator folder (shipped or trained here) sampled with its scheduler, and an
NVlabs EDM network pickle (``*.pkl``, :meth:`~timm_csm.generation.EDMSemanticMixingPipeline.from_edm_pickle`) sampled
with EDM's Heun sampler without guidance, named with the real dataset's class names (the label order the EDM
networks are trained with). Both write the same group plan, shards and resume. Generation and open_clip annotation
run on the GPU when there is one.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import steps
from ..annotation.config import AUTO
from ..generation.config import DEFAULTS as MIXING_DEFAULTS
from ..io import write_json_atomic
from ..losses import loss_spec
from .cache import Stage, StageCache, stage_key
from .profiles import FULL_EDM_PICKLE_URL, RecipeProfile, paper_protocol, training_options

__all__ = ["real_splits", "generator_source", "generator", "generate", "encoder_config", "recipe_encoder",
           "check_encoder", "encoder", "quality", "annotate", "csm_dataset_folder", "train_config", "train"]


def held_out_test(profile: RecipeProfile) -> Optional[float]:
    """The share of the real training split the run holds out as its test split (a dataset without one), or None;
    part of the keys of the stages that learn from the real images."""
    return profile.train_extra.get("test_fraction")


def real_splits(profile: RecipeProfile, log: Callable[[str], None]):
    """``(train, test, profile)``: the real training and test splits in memory. A dataset with no test split (a
    flat ``<class>/<image>`` folder) has ``profile.test_fraction`` of its images held out as the test split
    (:func:`~timm_csm.data.sources.hold_out_test_split`, with the classifier's data seed), and the returned profile
    carries that share to every stage (the classifier holds out the same images with ``--test-fraction``)."""
    from ..data import load_image_arrays
    from ..data.sources import dataset_split_names, detect_test_split, hold_out_test_split

    train = load_image_arrays(profile.dataset, "train")
    split = detect_test_split(dataset_split_names(profile.dataset), exclude=["train"])
    if split is not None:
        return train, load_image_arrays(profile.dataset, split), profile
    seed = profile.train_extra.get("data_seed", profile.seed)
    train, test = hold_out_test_split(train, profile.test_fraction, seed)
    log(f"[dataset] {profile.dataset} has no test split: {len(test)} of its {len(train) + len(test)} images "
        f"({profile.test_fraction:g}, seed {seed}) are held out as the test split of every stage (--test-fraction)")
    extra = dict(profile.train_extra, test_fraction=profile.test_fraction)
    return train, test, dataclasses.replace(profile, train_extra=extra)


def generator_source(profile: RecipeProfile) -> Tuple[str, Optional[Path]]:
    """What ``profile.generator`` names, checked before any stage runs: ``("shipped", folder)``; ``("given",
    path)`` for a path that holds a generator (:func:`~timm_csm.generation.registry.find_generator`: a generator
    folder written by ``timm-csm-train-generator`` or an earlier pipeline, an EDM network pickle), used as it is and
    never trained again; ``("train", None)`` for a generator-training profile
    (:data:`~timm_csm.generation.GENERATOR_PROFILES`), trained here. Anything else is one line listing these."""
    from ..generation.models import GENERATOR_PROFILES
    from ..generation.registry import find_generator, generator_kind

    if profile.generator == "shipped":
        shipped = steps.shipped_generator(profile.dataset)
        if shipped is None:
            raise FileNotFoundError(f"no generator is shipped for {profile.dataset!r}: give a generator folder "
                                    "trained on it (timm-csm-train-generator), or train one here with a "
                                    "generator-training profile: --generator digits (8 px), fmnist (up to 32 px, "
                                    "CPU), cifar10 or cifar100 (32 px colour, GPU)")
        return "shipped", shipped
    if find_generator(profile.generator) is not None:
        return "given", Path(profile.generator)
    if profile.generator in GENERATOR_PROFILES:
        return "train", None
    if generator_kind(profile.generator).is_file:
        raise FileNotFoundError(f"generator file {profile.generator} not found: download it (the full "
                                f"profile's CIFAR-100 network: {FULL_EDM_PICKLE_URL}) or give the path of your "
                                "copy with --generator")
    raise ValueError(steps.unknown_generator(profile.generator, also=[
        "'shipped'", f"a generator-training profile, trained here ({', '.join(sorted(GENERATOR_PROFILES))})"]))


def _given_generator(path: Path, profile: RecipeProfile, train_real, log: Callable[[str], None]) -> Path:
    """A generator given by its path, checked against the real dataset before anything is generated: the classes
    it records (a generator folder's) must be the dataset's, in order."""
    from ..data.csm_format import check_class_names
    from ..data.sources import same_dataset
    from ..generation.registry import generator_kind

    kind = generator_kind(path)
    record = kind.record(path)
    if "class_names" in record:
        check_class_names(record["class_names"], train_real.class_names, f"generator {path}",
                          f"the dataset {profile.dataset}")
    learned = (f", trained on {record['num_train_images']} images of {record.get('dataset', 'its dataset')}"
               if "num_train_images" in record else "")
    log(f"[generator] {kind.name} generator {path}{learned}: used as it is, not trained here")
    if (held_out_test(profile) is not None and same_dataset(record.get("dataset"), profile.dataset)
            and record.get("num_train_images", 0) > len(train_real)):
        log(f"[generator] warning: it learned from more images of {profile.dataset} than the {len(train_real)} "
            "left after the held-out test split, so it may have seen test images; train one with this command's "
            "--generator <profile> to keep them out")
    return path


def generator(cache: StageCache, profile: RecipeProfile, train_real, log: Callable[[str], None]) -> Path:
    """The generator (:func:`generator_source`): the shipped weights, a generator given by its path (a generator
    folder or an EDM network pickle, reused as it is), or a generator folder trained on ``train_real`` with the
    generator-training profile ``profile.generator`` (at the real images' size and channels)."""
    source, path = generator_source(profile)
    if source == "shipped":
        log(f"[generator] shipped weights: {path}")
        return path
    if source == "given":
        return _given_generator(path, profile, train_real, log)
    config = {"dataset": profile.dataset, "generator": profile.generator, "steps": profile.generator_steps}
    if held_out_test(profile) is not None:
        config["test_fraction"] = held_out_test(profile)
    with cache.stage("generator", config) as stage:
        if not stage.done:
            steps.train_generator_folder(train_real, stage.folder, profile.generator, steps=profile.generator_steps,
                                         meta={"dataset": profile.dataset, "profile": profile.generator}, log=log)
    return stage.folder


def generate(cache: StageCache, profile: RecipeProfile, generator_path: Path,
             class_names: Optional[List[str]] = None) -> Stage:
    """The semantic-mixing set: ``num_groups`` groups x the profile's mixing's ``num_lambdas`` ratios, in the recipe's
    shards (:data:`~timm_csm.recipes.profiles.RECIPE_SHARDS`).
    ``class_names``: the real dataset's, which name the classes of an EDM pickle (a generator folder names its
    own); they are part of the key of the EDM route."""
    from ..generation.registry import generator_kind

    kind = generator_kind(generator_path)
    mixing = profile.mixing
    config = {"generator": kind.digest(generator_path), "num_groups": profile.num_groups,
              "lambdas": mixing.num_lambdas, "steps": mixing.steps, "guidance": mixing.guidance_scale}
    if kind.names_classes:
        config["class_names"] = stage_key({"class_names": class_names})
    else:  # keys of the default sampler's (DDIM, float32) sets stay those written before the choices existed
        for option in ("scheduler", "timestep_spacing", "precision"):
            if getattr(mixing, option) != getattr(MIXING_DEFAULTS, option):
                config[option] = getattr(mixing, option)
    with cache.stage("generated", config) as stage:
        if not stage.done:
            steps.generate_groups(generator_path, stage.folder, profile.num_groups, profile.mixing,
                                  class_names=class_names)
    return stage


def encoder_config(profile: RecipeProfile) -> Dict[str, Any]:
    """The re-annotation encoder's configuration (part of the keys of the stages that use it); ``"held_out"`` where
    a reference encoder learns without the annotation's held-out share (decided here, once)."""
    config = {"dataset": profile.dataset, "encoder": profile.encoder, "epochs": profile.encoder_epochs,
              "max_steps": profile.encoder_max_steps, "seed": profile.seed}
    annotation = profile.annotation
    if _trained_here(profile) and annotation.holds_out(profile.dataset):
        config["held_out"] = annotation.holdout_fraction
    if held_out_test(profile) is not None:
        config["test_fraction"] = held_out_test(profile)
    return config


def encoder(cache: StageCache, profile: RecipeProfile, train_real, test_real,
            log: Callable[[str], None]) -> Optional[Path]:
    """The folder of the encoder the recipe trains (the bare ``reference``), or None for an encoder its spec names
    in full (open_clip). It trains on the real training split without the held-out share s is chosen on
    (:func:`~timm_csm.annotation.holdout_split`, the profile's seed) when s is chosen there, as
    ``hub_scripts/annotate.py --s auto`` does; on all of it when s is given."""
    if not _trained_here(profile):
        return None
    config = encoder_config(profile)
    with cache.stage("encoder", config) as stage:
        if not stage.done:
            from ..annotation import encoder_spec, holdout_split, parse_encoder_spec

            if "held_out" in config:
                train_real = holdout_split(train_real, config["held_out"], profile.annotation.seed)[0]
            train_encoder = encoder_spec(parse_encoder_spec(profile.encoder)[0]).trains
            train_encoder(train_real, stage.folder / "encoder", epochs=profile.encoder_epochs, seed=profile.seed,
                          test=test_real, max_steps=profile.encoder_max_steps, log=log)
    return stage.folder / "encoder"


def _trained_here(profile: RecipeProfile) -> bool:
    """Whether the recipe trains the profile's encoder (its kind trains one and the spec names none: ``reference``)."""
    from ..annotation import encoder_spec, parse_encoder_spec

    kind, fields = parse_encoder_spec(profile.encoder)
    return encoder_spec(kind).trained_here(fields)


def recipe_encoder(encoder_name: str) -> Tuple[str, Dict[str, str]]:
    """``(kind, fields)`` of the recipe's encoder spec (:func:`~timm_csm.annotation.parse_encoder_spec`): one the
    recipe trains (``reference``), or one whose spec names every field (``open_clip:<model>:<pretrained>``, the
    pretrained an open_clip tag of the model, downloaded by open_clip when online, or a local weights file)."""
    from ..annotation import ENCODERS, encoder_spec, parse_encoder_spec

    kind, fields = parse_encoder_spec(encoder_name)
    spec = encoder_spec(kind)
    if not spec.trained_here(fields) and len(fields) != len(spec.fields):
        trained = [k for k, s in ENCODERS.items() if s.trains is not None]
        full = [s.kind + "".join(f":<{f}>" for f in s.fields) for _, s in ENCODERS.items() if s.fields]
        raise ValueError(f"encoder {encoder_name!r}: give {' or '.join(map(repr, trained))} (trained here) or a spec "
                         f"with every field: {', '.join(full)} (e.g. open_clip:ViT-B-32-quickgelu:openai, "
                         "open_clip:ViT-B-32-quickgelu:/path/w.safetensors)")
    return kind, fields


def _load_encoder(profile: RecipeProfile, encoder_dir: Optional[Path]):
    from ..annotation import create_encoder, create_encoder_checked, encoder_spec

    kind, fields = recipe_encoder(profile.encoder)
    if encoder_spec(kind).trained_here(fields):
        return create_encoder(kind, **{encoder_spec(kind).fields[0]: encoder_dir})
    return create_encoder_checked(profile.encoder, device=steps.default_device())


def check_encoder(profile: RecipeProfile):
    """Build the profile's encoder once, before any long stage, when its spec names it in full, so that missing
    weights stop the run at its start (:func:`~timm_csm.annotation.create_encoder_checked`: for open_clip, a
    weights file that does not exist, or a tag whose weights are neither in the cache nor downloadable offline, is
    an error naming both ways); returns it for :func:`annotate` (its weights are read once per run). None for an
    encoder the recipe trains."""
    recipe_encoder(profile.encoder)
    return None if _trained_here(profile) else _load_encoder(profile, None)


def quality(cache: StageCache, profile: RecipeProfile, generator_path: Path, generated: Stage,
            encoder_dir: Path, class_names: Optional[List[str]] = None) -> Dict[str, Any]:
    """Generator quality: the share of generated pure-class images (up to 90 groups) that the reference encoder's
    classifier recognises, with its accuracy on real test images and the guidance scale used (1 for an EDM
    pickle). ``class_names`` as for :func:`generate`."""
    with cache.stage("quality", {"generated": generated.config, "encoder": encoder_config(profile)}) as stage:
        if not stage.done:
            from ..annotation import load_reference_encoder
            from ..generation import pure_class_accuracy

            classifier = load_reference_encoder(encoder_dir)
            pipe = steps.load_mixing_pipeline(generator_path, profile.mixing, class_names)
            q = pure_class_accuracy(pipe, classifier.classify, num_groups=min(90, profile.num_groups))
            q["classifier_real_test_accuracy"] = classifier.test_accuracy
            q["guidance_scale"] = pipe.provenance["guidance_scale"]
            write_json_atomic(stage.folder / "quality.json", q, indent=1)
    return json.loads((stage.folder / "quality.json").read_text())


def annotate(cache: StageCache, profile: RecipeProfile, generated: Stage, encoder_dir: Optional[Path],
             train_real, encoder=None) -> Stage:
    """Re-annotation through :func:`timm_csm.recipes.steps.annotate_generated_folder`: prototypes of the real training
    split, lambda-hat and soft labels (s from the profile, or chosen on a held-out tenth of the real training split),
    saved as the Hub-layout dataset :func:`~timm_csm.hub.csm_dataset_name` inside the stage folder and installed
    under that bare name. ``encoder``: the open_clip encoder :func:`check_encoder` built (None: the profile's
    encoder is loaded here)."""
    annotation = profile.annotation.resolved(profile.dataset)
    auto = annotation.s == AUTO
    # the key holds s as the profile gives it where s is chosen (None), so that the caches of then are found
    config = {"generated": generated.config, "encoder": encoder_config(profile),
              "s": None if auto else annotation.s,
              "s_selection": {"held_out": annotation.holdout_fraction, "seed": annotation.seed} if auto else None}
    if annotation.drop_flagged:
        config["drop_flagged"] = True
    with cache.stage("annotated", config) as stage:
        if not stage.done:
            encoder = _load_encoder(profile, encoder_dir) if encoder is None else encoder
            _, result = steps.annotate_generated_folder(
                generated.folder, stage.folder, encoder, annotation, dataset=profile.dataset, real=train_real,
                cache_dir=stage.folder / "prototypes", install=True)
            write_json_atomic(stage.folder / "annotation.json", {"s": result.s, "rows": len(result.dataset)})
    return stage


def csm_dataset_folder(annotated: Stage, dataset: str) -> Path:
    """The CSM dataset an annotated stage holds: ``csm_dataset_name(dataset)``, or the one ``csm-*-aug`` folder of a
    stage written under an earlier name of the same dataset (a Hub id's full name, ``csm-fashion_mnist-aug``)."""
    folder = annotated.folder / steps.csm_dataset_name(dataset)
    earlier = [p for p in annotated.folder.glob("csm-*-aug") if p.is_dir()] if not folder.exists() else []
    return earlier[0] if len(earlier) == 1 else folder


def train_config(profile: RecipeProfile, loss: str, csm_dataset: Path) -> Dict[str, Any]:
    """The training options of the CE or the CSM run: the profile's recipe, ``train_extra``, and for CSM the
    generated dataset and ``n_aug``."""
    cfg = training_options(profile)
    n_aug = cfg.pop("n_aug")
    cfg.update(loss=loss, seed=profile.seed, experiment=".")
    if loss_spec(loss).needs_generated:
        cfg.update(csm_dataset=str(csm_dataset), n_aug=n_aug)
    return cfg


def train(cache: StageCache, profile: RecipeProfile, loss: str, annotated: Stage) -> Dict[str, Any]:
    """The classifier trained with ``loss`` (``ce`` or ``csm``); its ``results.json`` plus ``output``, the stage
    folder. A killed run resumes its own training run (``auto_resume``)."""
    cfg = train_config(profile, loss, csm_dataset_folder(annotated, profile.dataset))
    config = {"train": cfg, "data": annotated.config if loss_spec(loss).needs_generated else None}
    with cache.stage(f"train-{loss}", config) as stage:
        if not stage.done:
            from ..training import run

            run(paper_protocol(dict(cfg, output=str(stage.folder), auto_resume=True)))
    results = json.loads((stage.folder / "results.json").read_text())
    results["output"] = str(stage.folder)
    return results
