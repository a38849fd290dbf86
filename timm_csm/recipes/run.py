"""The main job, end to end: generator -> semantic mixing -> re-annotation -> dataset -> CE vs CSM -> report, as
one call, :func:`run_recipe` (its command line is ``timm-csm-pipeline``, :mod:`timm_csm.commands.pipeline`).

Every stage writes into ``<output>/<stage>-<key>/``, where the key hashes the stage's configuration and the
configurations of the stages it reads; a stage marked done is skipped on a re-run, and a stage that was killed
resumes (the generator, generation and training stages checkpoint as they go).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict

from . import stages
from .cache import StageCache
from .profiles import RecipeProfile, resolve_dataset
from .report import write_report

__all__ = ["run_recipe"]


def run_recipe(profile: RecipeProfile, output, log: Callable[[str], None] = print) -> Dict:
    """Run (or resume) every stage of ``profile`` under ``output``; returns the comparison (``table``,
    ``results``, ``figures``) and writes ``<output>/report.md``."""
    profile = resolve_dataset(profile, log)
    stages.generator_source(profile)  # a --generator that names nothing stops the run before anything is written
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    cache = StageCache(output, log)
    train_real, test_real, profile = stages.real_splits(profile, log)
    clip = stages.check_encoder(profile)  # an open_clip encoder is built once: checked now, used to annotate

    generator_dir = stages.generator(cache, profile, train_real, log)
    generated = stages.generate(cache, profile, generator_dir, train_real.class_names)
    encoder_dir = stages.encoder(cache, profile, train_real, test_real, log)
    quality = None
    if encoder_dir is not None:  # measured with the reference encoder's classifier
        quality = stages.quality(cache, profile, generator_dir, generated, encoder_dir, train_real.class_names)
    annotated = stages.annotate(cache, profile, generated, encoder_dir, train_real, clip)
    del clip  # its memory is free for the training stages
    results = {loss: stages.train(cache, profile, loss, annotated) for loss in ("ce", "csm")}

    csm_dataset = stages.csm_dataset_folder(annotated, profile.dataset)
    report = write_report(output, results, csm_dataset, generator_dir, cache.timings, quality)
    log(report["table"])
    log(report["knowledge"])
    return report
