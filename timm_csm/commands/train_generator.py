"""Train a class-conditional diffusers UNet2DModel generator (resumable; run again to continue).

    OMP_NUM_THREADS=1 timm-csm-train-generator --profile fmnist --output runs/generator-fmnist
    accelerate launch -m timm_csm.commands.train_generator --profile cifar10 --dataset cifar10 --output runs/gen-c10
"""
from __future__ import annotations

import argparse
import sys

from timm_csm.cli import console_command
from timm_csm.generation.models import GENERATOR_PROFILES
from timm_csm.training.args import HelpFormatter


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
    p.add_argument("--no-grid", action="store_true", help="skip the PNG grid of samples at the end")
    p.add_argument("--guidance-scale", type=float, default=1.0,
                   help="classifier-free guidance recorded as the generator's recommended scale (and used for the "
                        "grid); 1 = none. Measure it with timm-csm-evaluate-generator")
    return p


def parse_args(argv=None):
    return build_parser().parse_args(argv)


@console_command("timm-csm-train-generator", build_parser, requires=("diffusers",))
def main(argv=None):
    args = parse_args(argv)
    from timm_csm.data import load_image_arrays
    from timm_csm.generation.report import save_sample_grid
    from timm_csm.steps import train_generator_folder
    from timm_csm.train import exit_interrupted

    data = load_image_arrays(args.dataset, "train", args.image_column, args.label_column)
    if args.max_train_samples:
        data = data.subset(range(min(args.max_train_samples, len(data))))
    meta = {"dataset": args.dataset, "profile": args.profile, "num_train_images": len(data),
            "recommended_guidance_scale": args.guidance_scale, "name": f"timm-csm-{args.profile}-ddpm"}
    try:
        unet, scheduler = train_generator_folder(data, args.output, args.profile, steps=args.steps,
                                                 batch_size=args.batch_size, seed=args.seed, meta=meta)
    except KeyboardInterrupt:
        exit_interrupted(f"the checkpoints are in {args.output}; the same command resumes from the last one")
    if not args.no_grid:
        save_sample_grid(unet, scheduler, data.num_classes, f"{args.output}/samples.png",
                         guidance_scale=args.guidance_scale)
    print(f"generator: {args.output}; next: timm-csm-evaluate-generator --generator {args.output} --classifier "
          f"<reference encoder> --dataset {args.dataset}, then timm-csm-generate --generator {args.output}")


if __name__ == "__main__":
    sys.exit(main())
