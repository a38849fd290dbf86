"""Train a class-conditional diffusers UNet2DModel generator (resumable; run again to continue).

    OMP_NUM_THREADS=1 timm-csm-train-generator --profile fmnist --output runs/generator-fmnist
    OMP_NUM_THREADS=1 timm-csm-train-generator --profile fmnist --dataset my_images --output runs/generator-mine
    accelerate launch -m timm_csm.commands.train_generator --profile cifar10 --dataset cifar10 --output runs/gen-c10

The profile sets the network and the schedule; the images keep their own size and channels (fmnist: up to 32 px
on a CPU; digits: 8 px; cifar10 / cifar100: 32 px colour on a GPU). The first line printed gives the schedule and
when checkpoints are written; the last, the generator folder and the next step.
"""
from __future__ import annotations

import argparse
import os
import sys

from timm_csm.cli import HelpFormatter, console_command
from timm_csm.generation.models import GENERATOR_PROFILES
from timm_csm.generation.training import CHECKPOINT_MINUTES


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--profile", default="fmnist", choices=sorted(GENERATOR_PROFILES),
                   help="generator architecture and training schedule")
    p.add_argument("--dataset", default="fashion_mnist",
                   help="fashion_mnist (embedded), digits, or a Hugging Face dataset name or folder")
    p.add_argument("--image-column", default=None, help="image column (detected when omitted)")
    p.add_argument("--label-column", default=None, help="label column (detected when omitted)")
    p.add_argument("--output", required=True, help="generator folder (resumed when it holds a checkpoint)")
    p.add_argument("--steps", type=int, default=None, help="override the profile's number of steps")
    p.add_argument("--batch-size", type=int, default=None, help="images per step (default: the profile's)")
    p.add_argument("--seed", type=int, default=None, help="training seed (default: the profile's)")
    p.add_argument("--max-train-samples", type=int, default=None, help="train on the first N images (default: all)")
    p.add_argument("--checkpoint-every", type=int, default=None,
                   help="steps between two checkpoints (default: the profile's)")
    p.add_argument("--checkpoint-minutes", type=float, default=CHECKPOINT_MINUTES,
                   help="also checkpoint when this many minutes passed since the last checkpoint")
    p.add_argument("--no-grid", action="store_true", help="skip the PNG grid of samples at the end")
    p.add_argument("--guidance-scale", type=float, default=1.0,
                   help="classifier-free guidance recorded as the generator's recommended scale (and used for the "
                        "grid); 1 = none. Judge it with timm-csm-evaluate-generator")
    return p


def parse_args(argv=None):
    return build_parser().parse_args(argv)


@console_command("timm-csm-train-generator", build_parser, requires=("diffusers",))
def main(argv=None):
    args = parse_args(argv)
    from timm_csm.data import load_image_arrays
    from timm_csm.generation.report import save_sample_grid
    from timm_csm.recipes.steps import train_generator_folder
    from timm_csm.cli import exit_interrupted

    data = load_image_arrays(args.dataset, "train", args.image_column, args.label_column)
    if args.max_train_samples:
        data = data.subset(range(min(args.max_train_samples, len(data))))
    meta = {"dataset": args.dataset, "profile": args.profile, "num_train_images": len(data),
            "recommended_guidance_scale": args.guidance_scale}
    try:
        unet, scheduler = train_generator_folder(data, args.output, args.profile, steps=args.steps,
                                                 batch_size=args.batch_size, seed=args.seed,
                                                 checkpoint_every=args.checkpoint_every,
                                                 checkpoint_minutes=args.checkpoint_minutes, meta=meta)
    except KeyboardInterrupt:
        exit_interrupted(f"the checkpoints are in {args.output}; the same command resumes from the last one")
    if not args.no_grid:
        save_sample_grid(unet, scheduler, data.num_classes, f"{args.output}/samples.png",
                         guidance_scale=args.guidance_scale)
    if os.environ.get("RANK", "0") == "0":
        print(finished_message(args))


def finished_message(args) -> str:
    """Where the generator is, and the next step of the method."""
    grid = "" if args.no_grid else ", samples.png"
    dataset = f" --dataset {args.dataset}" if args.dataset != "fashion_mnist" else ""
    return (f"generator saved in {args.output} (model_index.json, unet/, scheduler/{grid}); next, measure it: "
            f"timm-csm-evaluate-generator --generator {args.output}{dataset}, then generate groups: "
            f"timm-csm-generate --generator {args.output} --num-groups 900 --output runs/generated")


if __name__ == "__main__":
    sys.exit(main())
