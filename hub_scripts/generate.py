"""Generate semantic-mixing groups with a trained class-conditional generator (resumable, multi-process).

    accelerate launch hub_scripts/generate.py --generator runs/generator-fmnist --num-groups 900 --output runs/gen
Run the same command again after an interruption: finished shards are kept, the rest is generated.
"""
from __future__ import annotations

import argparse


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--generator", required=True, help="generator folder (unet/, scheduler/, generator.json)")
    p.add_argument("--num-groups", type=int, required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--num-lambdas", type=int, default=8, help="lambda grid linspace(0, 1, n)")
    p.add_argument("--steps", type=int, default=50, help="sampler steps")
    p.add_argument("--scheduler", default="ddim", choices=["ddim", "dpm"])
    p.add_argument("--guidance-scale", type=float, default=None,
                   help="classifier-free guidance; 1 = none (the paper); default: the generator's recommendation")
    p.add_argument("--groups-per-shard", type=int, default=64)
    p.add_argument("--batch-groups", type=int, default=16, help="groups per forward batch")
    p.add_argument("--seed-offset", type=int, default=0)
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    from accelerate import Accelerator

    from timm_csm.generation import SemanticMixingPipeline, generate_to_folder, lambda_grid, make_plan

    accelerator = Accelerator()
    pipeline = SemanticMixingPipeline.from_pretrained(args.generator, args.scheduler, args.steps, args.guidance_scale,
                                                      device=accelerator.device)
    plan = make_plan(pipeline.num_classes, args.num_groups, lambda_grid(args.num_lambdas), pipeline.class_names,
                     args.groups_per_shard, args.seed_offset, generator=pipeline.provenance)
    generate_to_folder(pipeline, args.output, plan, args.batch_groups, accelerator)


if __name__ == "__main__":
    main()
