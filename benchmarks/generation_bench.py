"""Semantic-mixing generation throughput against the raw model forward at the same batch.

    OMP_NUM_THREADS=1 python benchmarks/generation_bench.py [--generator DIR] [--batch-groups 8] [--steps 20]

The pipeline's overhead (noise per group, soft conditions, scheduler steps, uint8 conversion) is
``1 - raw_images_per_s / pipeline_images_per_s`` (time ratio); PNG encoding and Parquet writing are timed apart.
"""
from __future__ import annotations

import argparse
import platform
import time

import torch


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--generator", default=None, help="generator folder; default: the fmnist profile, random weights")
    p.add_argument("--batch-groups", type=int, default=8)
    p.add_argument("--num-lambdas", type=int, default=8)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--guidance-scale", type=float, default=1.0,
                   help="with guidance != 1 the model runs on 2x the batch, and so does the raw-forward reference")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)

    from diffusers import DDIMScheduler

    from timm_csm.generation import (GENERATOR_PROFILES, SemanticMixingPipeline, create_class_unet, lambda_grid,
                                     plan_groups)
    from timm_csm.generation.writer import encode_png

    if args.generator:
        pipe = SemanticMixingPipeline.from_pretrained(args.generator, num_inference_steps=args.steps,
                                                      guidance_scale=args.guidance_scale).to(args.device)
    else:
        unet = create_class_unet(GENERATOR_PROFILES["fmnist"], 10).to(args.device).eval()
        pipe = SemanticMixingPipeline(unet, DDIMScheduler(beta_schedule="squaredcos_cap_v2"),
                                      num_inference_steps=args.steps, guidance_scale=args.guidance_scale)
    pipe.set_progress_bar_config(disable=True)
    lams = lambda_grid(args.num_lambdas)
    groups = plan_groups(pipe.num_classes, args.batch_groups)
    batch = args.batch_groups * len(lams)
    model_batch = batch * (2 if args.guidance_scale != 1.0 else 1)  # guidance: conditional + null branches
    x = torch.randn(model_batch, *pipe.image_shape, device=args.device)
    w = torch.rand(model_batch, pipe.num_classes, device=args.device)
    t = torch.full((model_batch,), 500, device=args.device)

    def sync():
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    with torch.no_grad():
        pipe(groups[:1], lams[:2])  # warm-up
        raw, full = [], []
        for _ in range(args.repeats):
            sync(); t0 = time.perf_counter()
            for _ in range(args.steps):
                pipe.unet(x, t, class_labels=w).sample
            sync(); raw.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            images, _ = pipe(groups, lams, return_dict=False)
            sync(); full.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    for img in images.numpy():
        encode_png(img)
    png = time.perf_counter() - t0
    raw_s, full_s = min(raw), min(full)
    print("| device | batch (images) | guidance | steps | raw forward img/s | pipeline img/s | overhead "
          "| PNG encode img/s |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| {args.device} ({platform.processor() or platform.machine()}, {torch.get_num_threads()} thread(s)) "
          f"| {batch} | {args.guidance_scale} | {args.steps} | {batch / raw_s:.1f} | {batch / full_s:.1f} "
          f"| {full_s / raw_s - 1:+.1%} | {batch / png:.0f} |")


if __name__ == "__main__":
    main()
