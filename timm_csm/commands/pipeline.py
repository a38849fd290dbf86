"""The main job, end to end: generator -> semantic mixing -> re-annotation -> dataset -> CE vs CSM -> report.

    timm-csm-pipeline --profile demo          # or python -m timm_csm.commands.pipeline --profile demo

Every stage writes into ``<output>/<stage>-<key>/``, where the key hashes the stage's configuration and the
configurations of the stages it reads; a stage marked done is skipped on a re-run, and a stage that was killed
resumes (the generator, generation and training stages checkpoint as they go). Profiles: ``demo`` (real
Fashion-MNIST, the shipped generator, a reference encoder trained here in place of CLIP, a small classifier trained
with CE and with CSM), ``smoke`` (the same stages at toy size; CI runs it) and ``full`` (the paper's GPU recipe on
CIFAR-100; see the README for its commands).

``--generator`` / ``--encoder`` / ``--dataset`` point a profile at other files (``--generator`` a generator folder
of ``timm-csm-train-generator`` is used as it is, not trained again), and ``--rehearse`` runs it at toy
size (:func:`~timm_csm.recipes.profiles.rehearsal_profile`: every stage, in minutes, into ``runs/<profile>-rehearsal``)
before the long run:

    timm-csm-pipeline --profile full --generator path/to/edm-cifar100-cond-32x32-cond-vp.pkl --rehearse
"""
from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

from timm_csm.cli import HelpFormatter, console_command, exit_interrupted
from timm_csm.recipes import RecipeProfile, get_profile, list_profiles, rehearsal_profile, run_recipe
from timm_csm.recipes.profiles import with_epochs

__all__ = ["build_parser", "profile_from_args", "main"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--profile", default="demo", choices=list_profiles(), help="the registered profile to run")
    p.add_argument("--output", default=None, help="default: runs/<profile>, runs/<profile>-rehearsal with --rehearse")
    p.add_argument("--generator", default=None,
                   help="'shipped', a generator folder (written by timm-csm-train-generator or an earlier "
                        "pipeline: used as it is), a generator-training profile (trained here from scratch, e.g. "
                        "fmnist) or an NVlabs EDM network pickle (a .pkl path)")
    p.add_argument("--encoder", default=None,
                   help="'reference' or open_clip:<model>:<tag or weights file>, e.g. open_clip:ViT-B-32-quickgelu:"
                        "openai (downloaded when online) or open_clip:ViT-B-32-quickgelu:/path/to/weights.safetensors")
    p.add_argument("--dataset", default=None,
                   help="the real dataset (default: the profile's): a name, or an image folder [<split>/]<class>/*.png")
    p.add_argument("--test-fraction", type=float, default=None,
                   help="a dataset with no test split (a flat <class>/*.png folder): the seeded share of it every "
                        "stage holds out as the test split (default: the profile's, 0.1)")
    p.add_argument("--accept-poor-generator", action="store_true",
                   help="build the CSM dataset even when the annotation checks find the generator poor (pure-class "
                        "images recognised near chance, or most groups flagged), with a warning")
    p.add_argument("--epochs", type=int, default=None, help="classifier epochs, the profile's learning-rate "
                                                            "milestones scaled to keep their share of the run "
                                                            "(default: the profile's)")
    p.add_argument("--seed", type=int, default=None, help="seed of every stage (default: the profile's, 0)")
    p.add_argument("--rehearse", action="store_true",
                   help="run every stage of the profile at toy size (groups, steps, epochs, image counts) first")
    return p


def profile_from_args(args: argparse.Namespace) -> RecipeProfile:
    """The registered profile ``args.profile`` with ``--generator``, ``--encoder``, ``--dataset``, ``--epochs``,
    ``--seed``, ``--test-fraction`` and ``--accept-poor-generator`` replaced where given, then at rehearsal size with
    ``--rehearse``."""
    overrides = {k: getattr(args, k) for k in ("generator", "encoder", "dataset", "seed", "test_fraction")
                 if getattr(args, k) is not None}
    profile = get_profile(args.profile)
    if args.accept_poor_generator:
        overrides["annotation"] = dataclasses.replace(profile.annotation, accept_poor_generator=True)
    profile = dataclasses.replace(profile, **overrides)
    if args.epochs is not None:
        profile = with_epochs(profile, args.epochs)
    return rehearsal_profile(profile) if args.rehearse else profile


# diffusers: the generator and generation stages; matplotlib: the report's figures
@console_command("timm-csm-pipeline", build_parser, requires=("diffusers", "matplotlib"))
def main(argv=None) -> None:
    """The command line: :func:`profile_from_args` run into ``--output`` (``runs/<profile>``, or
    ``runs/<profile>-rehearsal``); it ends naming the report and the installed CSM dataset."""
    from timm_csm.hub import csm_dataset_name

    args = build_parser().parse_args(argv)
    profile = profile_from_args(args)
    t0 = time.time()
    output = args.output or f"runs/{args.profile}{'-rehearsal' if args.rehearse else ''}"
    try:
        run_recipe(profile, output)
    except KeyboardInterrupt:
        exit_interrupted(f"the finished stages are kept in {output}; the same command continues from them")
    name = csm_dataset_name(profile.dataset)
    print(f"pipeline finished in {time.time() - t0:.0f} s; report: {Path(output) / 'report.md'}; CSM dataset "
          f"installed as {name}")
    print(f"next: timm-csm-train --dataset {profile.dataset} --loss csm --csm-dataset {name} (or "
          f"datasets.load_dataset({name!r}))")


if __name__ == "__main__":
    raise SystemExit(main())
