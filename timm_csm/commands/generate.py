"""Generate semantic-mixing groups with a trained class-conditional generator (resumable, multi-process).

    accelerate launch -m timm_csm.commands.generate --generator runs/generator-fmnist --num-groups 900 --output runs/gen
Run the same command again after an interruption: finished shards are kept, the rest is generated.

The paper's generators: ``--generator`` an NVlabs EDM network pickle (``.pkl``, read without running code from it),
sampled with EDM's Heun sampler, no guidance, 20 steps for CIFAR-10 and 25 for CIFAR-100 unless ``--steps`` says
otherwise; the class names are CIFAR-10's or CIFAR-100's by the label dimension unless ``--class-names`` gives them.

    timm-csm-generate --generator edm-cifar10-32x32-cond-vp.pkl --num-groups 19980 --output runs/c10

More groups of the same plan without generating the first ones again: ``--extend-from`` a finished output of the
same command with fewer ``--num-groups`` (its groups are copied as stored; any other difference is refused).

    timm-csm-generate --generator runs/generator-fmnist --num-groups 1800 --output runs/gen-x2 --extend-from runs/gen

Real-anchored mode: ``--strength t`` (< 1) starts every group from a real training image of one of its two classes,
noised to strength t with the group's noise (SDEdit), instead of pure noise. The anchors are the training images of
the classifier run they are made for: ``--anchor-dataset`` with the run's ``--anchor-max-train-samples``,
``--anchor-val-fraction`` and ``--anchor-seed`` (train.py's ``--max-train-samples``, ``--val-fraction``,
``--seed``), so no validation or test image is ever an anchor.

    timm-csm-generate --generator G --num-groups 900 --output runs/gen-t06 --strength 0.6 \
        --anchor-dataset fashion_mnist --anchor-max-train-samples 2500 --anchor-seed 0
"""
from __future__ import annotations

import argparse
import sys

from timm_csm.cli import HelpFormatter, console_command
from timm_csm.generation.config import MixingConfig
from timm_csm.options import add_options, options_from_namespace
from timm_csm.training.config import TrainConfig


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--generator", required=True,
                   help="generator folder (model_index.json, unet/, scheduler/), an EDM network pickle (.pkl), or "
                        "the name of a shipped generator (fmnist)")
    p.add_argument("--num-groups", type=int, required=True, help="groups to generate (each: one image per lambda)")
    p.add_argument("--output", required=True, help="folder of the generated shards (plan.json, shards/)")
    p.add_argument("--extend-from", default=None, metavar="FOLDER",
                   help="a finished output of this command with fewer groups: its groups are copied, not generated "
                        "again (the plan must be the same but for --num-groups)")
    p.add_argument("--class-names", default=None,
                   help="EDM pickle: comma-separated class names in label order (default: CIFAR-10 / CIFAR-100)")
    add_options(p, MixingConfig)
    g = next(g for g in p._action_groups if g.title == "real-anchored mode")
    g.add_argument("--anchor-dataset", default=None, help="dataset of the anchors (train.py's --dataset)")
    g.add_argument("--anchor-max-train-samples", type=int, default=None, help="train.py's --max-train-samples")
    g.add_argument("--anchor-val-fraction", type=float, default=TrainConfig.val_fraction,
                   help="train.py's --val-fraction")
    g.add_argument("--anchor-seed", type=int, default=0, help="train.py's --seed of the run the anchors are for")
    return p


def parse_args(argv=None):
    p = build_parser()
    args = p.parse_args(argv)
    from timm_csm.generation.registry import generator_kind
    from timm_csm.recipes.steps import check_mixing_options

    try:
        check_mixing_options(args.generator, options_from_namespace(MixingConfig, args))
    except ValueError as e:
        p.error(str(e))
    if args.class_names is not None and not generator_kind(args.generator).names_classes:
        p.error("--class-names is for EDM pickles; a generator folder names its classes in model_index.json")
    if args.strength < 1.0 and not args.anchor_dataset:
        p.error("--strength below 1 needs --anchor-dataset (the real images the groups start from)")
    return args


def training_anchors(dataset: str, max_train_samples=None, val_fraction: float = TrainConfig.val_fraction,
                     seed: int = 0):
    """The training images of the train.py run with these options, as an anchor pool."""
    from timm_csm.generation.anchors import AnchorPool
    from timm_csm.training import load_data

    subset = None if max_train_samples is None else int(max_train_samples)
    train = load_data(TrainConfig(dataset=dataset, val_fraction=float(val_fraction), seed=int(seed),
                                  max_train_samples=subset)).train
    source = {"dataset": dataset, "split": "train", "max_train_samples": max_train_samples,
              "val_fraction": val_fraction, "seed": seed}
    return AnchorPool(train.images, train.labels, source)


@console_command("timm-csm-generate", build_parser, requires=("diffusers",))
def main(argv=None):
    args = parse_args(argv)
    from accelerate import Accelerator

    from timm_csm.recipes.steps import generate_groups
    from timm_csm.cli import end_process_group, exit_interrupted

    try:
        anchors = None
        if args.strength < 1.0:
            anchors = training_anchors(args.anchor_dataset, args.anchor_max_train_samples, args.anchor_val_fraction,
                                       args.anchor_seed)
        class_names = [n.strip() for n in args.class_names.split(",")] if args.class_names else None
        accelerator = Accelerator()
        generate_groups(args.generator, args.output, args.num_groups, options_from_namespace(MixingConfig, args),
                        class_names=class_names, anchors=anchors, accelerator=accelerator,
                        extend_from=args.extend_from)
        accelerator.print(f"generated {args.num_groups} groups in {args.output}; next: timm-csm-annotate --generated "
                          f"{args.output} --install")
    except KeyboardInterrupt:
        exit_interrupted(f"the finished shards are in {args.output}; the same command generates the rest")
    finally:  # a process exiting with a live gloo group can abort in gloo's worker thread (SIGABRT)
        end_process_group()


if __name__ == "__main__":
    sys.exit(main())
