"""Measure a generator: how often a real-data classifier recognises its pure-class samples (lambda = 0 and 1),
next to that classifier's accuracy on real test images.

    timm-csm-evaluate-generator --generator runs/generator-fmnist --classifier runs/encoder
    timm-csm-evaluate-generator --checkpoint-of runs/generator-fmnist --profile fmnist --classifier ...
"""
from __future__ import annotations

import argparse
import json
import sys

from timm_csm.cli import console_command
from timm_csm.training.args import HelpFormatter


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--generator", help="a finished generator folder, or the name of a shipped generator (fmnist)")
    src.add_argument("--checkpoint-of", help="a generator-training folder: evaluate its latest checkpoint's EMA")
    p.add_argument("--profile", default="fmnist", help="generator profile of --checkpoint-of")
    p.add_argument("--classifier", required=True,
                   help="a reference encoder folder (annotation.train_reference_encoder)")
    p.add_argument("--dataset", default="fashion_mnist", help="real dataset of the test images")
    p.add_argument("--num-groups", type=int, default=200, help="groups sampled (two pure-class images each)")
    p.add_argument("--steps", type=int, default=20, help="DDIM sampler steps")
    p.add_argument("--guidance-scale", type=float, default=None,
                   help="default: the generator's recommended scale (1 = no guidance for a checkpoint)")
    p.add_argument("--output", default=None, help="write the result as JSON here")
    return p


@console_command("timm-csm-evaluate-generator", build_parser, requires=("diffusers",))
def main(argv=None):
    args = build_parser().parse_args(argv)

    from diffusers import DDIMScheduler

    from timm_csm.annotation import load_reference_encoder
    from timm_csm.data import load_image_arrays
    from timm_csm.generation import GENERATOR_PROFILES, SemanticMixingPipeline, pure_class_accuracy
    from timm_csm.generation.training import load_checkpoint_ema
    from timm_csm.steps import resolve_generator

    classifier = load_reference_encoder(args.classifier)
    test = load_image_arrays(args.dataset, "test")
    real_acc = float((classifier.classify(test.images).argmax(1).numpy() == test.labels).mean())
    if args.generator:
        pipe = SemanticMixingPipeline.from_pretrained(resolve_generator(args.generator),
                                                      num_inference_steps=args.steps,
                                                      guidance_scale=args.guidance_scale)
        step = None
    else:
        cfg = GENERATOR_PROFILES[args.profile]
        unet, step = load_checkpoint_ema(args.checkpoint_of, test.num_classes, cfg)
        sched = DDIMScheduler(num_train_timesteps=cfg.num_train_timesteps, beta_schedule=cfg.beta_schedule)
        pipe = SemanticMixingPipeline(unet, sched, test.class_names, num_inference_steps=args.steps,
                                      guidance_scale=args.guidance_scale or 1.0)
    quality = pure_class_accuracy(pipe, classifier.classify, num_groups=args.num_groups)
    result = {"generated_pure_class_accuracy": quality["accuracy"], "per_class": quality["per_class"],
              "num_images": quality["num_images"], "classifier_real_test_accuracy": real_acc,
              "training_step": step, "sampler_steps": args.steps, "guidance_scale": pipe.guidance_scale}
    print(json.dumps(result, indent=1))
    if args.output:
        with open(args.output, "w") as f:
            json.dump(result, f, indent=1)
        print(f"result: {args.output}")
    print(f"next: timm-csm-generate --generator {args.generator or args.checkpoint_of} --num-groups N --output "
          "runs/gen")


if __name__ == "__main__":
    sys.exit(main())
