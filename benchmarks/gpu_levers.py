"""Issue 43's levers on a GPU: the generators' precision and batch, and the CSM step's forward and precision.

    python benchmarks/gpu_levers.py --output OUT                 # on the GPU
    OMP_NUM_THREADS=1 python benchmarks/gpu_levers.py --toy      # any machine: toy sizes, a check that it runs

* **The demo's generator** (the shipped Fashion-MNIST one, its own weights) with the demo profile's sampler (DDIM,
  4 trailing steps, 4 lambdas): ``--groups`` groups (the same plan and noise in every row) in float32 with TF32 off
  (the reference), float32 under PyTorch's defaults (cuDNN convolutions in TF32), bfloat16 and float16 autocast
  (``--precision``), at the recipe's 32 groups a batch and at ``--big-batch``; seconds per group, and how far each
  row's images lie from the reference's: mean abs difference in grey levels, the share of pixels more than 8 levels
  off, the largest difference. On a CPU TF32 does not apply: the two float32 rows agree.
* **The full profile's generators at its sizes** (random weights: time only), as ``gpu_bench.py`` builds them: the
  diffusers UNet route under each precision, and the EDM route (DDPM++, Heun, float64 sampler) with its network under
  bfloat16 / float16 autocast (the EDM route has no precision option: this row asks whether one would pay).
* **Training steps** (random data): the full profile's resnet50_cifar at real batch 128 and the demo's small_cnn at
  real batch 128, each a CE step and a CSM step with 2 x 128 companions, the CSM step in two passes (the default) and
  in one concatenated forward (``--csm-forward concat``), in float32 and under bfloat16 autocast.

Each time is the median of ``--repeats`` calls after a warm-up call, CUDA synchronised (``gpu_bench.timed``). Writes
``<output>/gpu_levers.json`` and ``<output>/gpu_levers.md`` and prints the tables.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import time

import torch

from gpu_bench import EDM_CIFAR, EDM_TOY, device_record, timed, training_setup, training_step, write_result

from timm_csm.generation.config import PRECISIONS
from timm_csm.generation.pipeline import AUTOCAST_DTYPES

#: the demo generator's rows: (name, precision, TF32 allowed, batch of groups: "recipe" or "big")
DEMO_ROWS = [("float32, TF32 off (reference)", "float32", False, "recipe"),
             ("float32", "float32", True, "recipe"), ("bfloat16", "bfloat16", True, "recipe"),
             ("float16", "float16", True, "recipe"), ("float32", "float32", True, "big"),
             ("bfloat16", "bfloat16", True, "big"), ("float16", "float16", True, "big")]


@contextlib.contextmanager
def tf32(allowed: bool):
    """cuDNN's and cuBLAS's TF32 switches set to ``allowed`` (restored after)."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = allowed
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def _generate(pipe, groups, lambdas, batch_groups: int) -> torch.Tensor:
    return torch.cat([pipe(groups[i:i + batch_groups], lambdas, return_dict=False)[0]
                      for i in range(0, len(groups), batch_groups)])


def demo_generator_rows(args):
    """The shipped generator at the demo's sampler: seconds per group and the images' distance to the reference."""
    from timm_csm.generation import lambda_grid, plan_groups
    from timm_csm.recipes import get_profile
    from timm_csm.recipes.steps import load_mixing_pipeline, shipped_generator

    mixing = get_profile("demo").mixing
    mixing = dataclasses.replace(mixing, steps=2) if args.toy else mixing
    groups, lambdas = plan_groups(10, args.groups, 60_000_000), lambda_grid(mixing.num_lambdas)
    batches = {"recipe": mixing.batch_groups, "big": args.big_batch}
    rows, reference = [], None
    for name, precision, allow_tf32, batch in DEMO_ROWS:
        sampler = dataclasses.replace(mixing, precision=precision)
        pipe = load_mixing_pipeline(shipped_generator("fashion_mnist"), sampler, device=args.device)
        pipe.set_progress_bar_config(disable=True)
        with tf32(allow_tf32):
            images = _generate(pipe, groups, lambdas, batches[batch]).int()  # also the timing's warm-up
            seconds = timed(lambda: _generate(pipe, groups, lambdas, batches[batch]), args.repeats, args.device,
                            warmup=False)
        reference = images if reference is None else reference
        diff = (images - reference).abs()
        rows.append({"setting": name, "precision": precision, "tf32": allow_tf32, "batch_groups": batches[batch],
                     "s_per_group": seconds / len(groups), "mean_abs_levels": float(diff.float().mean()),
                     "share_over_8_levels": float((diff > 8).float().mean()), "max_levels": int(diff.max())})
    return {"groups": len(groups), "lambdas": len(lambdas), "steps": mixing.steps,
            "spacing": mixing.timestep_spacing, "rows": rows}


def full_generator_rows(args):
    """Images per second of the full profile's two routes (random weights) under each precision."""
    from diffusers import DDIMScheduler

    from timm_csm.generation import (GENERATOR_PROFILES, EDMSemanticMixingPipeline, SemanticMixingPipeline,
                                     create_class_unet, lambda_grid, plan_groups)
    from timm_csm.generation.edm import EDMPrecond

    torch.manual_seed(0)
    cfg = dataclasses.replace(GENERATOR_PROFILES["smoke" if args.toy else "cifar100"], sample_size=32, in_channels=3)
    unet = create_class_unet(cfg, 100)
    diffusers_pipe = SemanticMixingPipeline(unet.eval(), DDIMScheduler(beta_schedule="squaredcos_cap_v2"),
                                            [str(k) for k in range(100)], num_inference_steps=args.steps,
                                            guidance_scale=1.0).to(args.device)
    diffusers_pipe.set_progress_bar_config(disable=True)
    net = EDMPrecond(32, 3, 100, **(EDM_TOY if args.toy else EDM_CIFAR)).to(args.device).eval()
    edm_pipe = EDMSemanticMixingPipeline(net.requires_grad_(False), 100, (3, 32, 32), args.steps, args.device)
    edm_pipe.set_progress_bar_config(disable=True)
    groups, lambdas = plan_groups(100, args.full_groups), lambda_grid(8)
    rows = []
    for precision in PRECISIONS:  # the EDM route has no precision option: its network under the same autocast
        dtype = AUTOCAST_DTYPES.get(precision)
        diffusers_pipe.set_precision(precision)

        def edm():
            with torch.autocast(torch.device(args.device).type, dtype=dtype, enabled=dtype is not None):
                edm_pipe(groups, lambdas)

        for route, call in (("diffusers UNet, DDIM", lambda: diffusers_pipe(groups, lambdas)),
                            ("EDM DDPM++, Heun", edm)):
            seconds = timed(call, args.repeats, args.device, warmup=not args.toy)
            rows.append({"route": route, "precision": precision, "steps": args.steps,
                         "images_per_s": len(groups) * len(lambdas) / seconds})
    return {"batch_images": len(groups) * len(lambdas), "rows": rows}


def training_rows(args):
    """Seconds per step: CE, CSM in two passes and concatenated, in float32 and bfloat16 autocast, for the full
    profile's model and the demo's."""
    from timm_csm.losses import create_loss
    from timm_csm.recipes import get_profile
    from timm_csm.training import ClassificationTask, CSMTask

    demo = get_profile("demo")
    # toy: the same code at a fraction of the CPU time (a CPU without bfloat16 instructions emulates them)
    full_model, full_size = ("resnet18_cifar", 8) if args.toy else ("resnet50_cifar", 32)
    models = {full_model: dict(num_classes=100, model=full_model, size=full_size),
              "small_cnn": dict(num_classes=10, model="small_cnn", in_chans=1, size=28,
                                **demo.train_extra.get("model_kwargs", {}))}
    rows = []
    for model_name, kwargs in models.items():
        model, opt, real, companions = training_setup(args.device, args.batch, **kwargs)
        both = {**real, **companions}
        tasks = {"CE": (ClassificationTask(model, create_loss("ce")), real),
                 "CSM, two passes": (CSMTask(model, create_loss("csm"), None, forward="two-pass"), both),
                 "CSM, concatenated": (CSMTask(model, create_loss("csm"), None, forward="concat"), both)}
        for precision in ("float32", "bfloat16"):
            for step_name, (task, batch) in tasks.items():
                step = training_step(task, batch, opt, AUTOCAST_DTYPES.get(precision))
                rows.append({"model": model_name, "step": step_name, "precision": precision, "batch": args.batch,
                             "seconds_per_step": timed(step, args.repeats, args.device, warmup=not args.toy)})
    return rows


def markdown(result) -> str:
    sizes = "TOY SIZES: a check that the script runs, not a measurement" if result["toy"] else "the sizes below"
    demo = result["demo_generator"]
    lines = [f"Device: {result['device']} ({result['device_name']}); torch {result['torch']}; {sizes}.", "",
             f"The demo's generator (shipped weights), DDIM {demo['steps']} {demo['spacing']} steps, {demo['groups']} "
             f"groups x {demo['lambdas']} lambdas, the same noise in every row; distances to the first row's images:",
             "", "| setting | groups a batch | s / group | x reference | mean abs diff (levels) | "
             "pixels > 8 levels off | max diff |", "|---|---|---|---|---|---|---|"]
    ref = demo["rows"][0]["s_per_group"]
    lines += [f"| {r['setting']} | {r['batch_groups']} | {r['s_per_group']:.5f} | {r['s_per_group'] / ref:.2f} | "
              f"{r['mean_abs_levels']:.3f} | {100 * r['share_over_8_levels']:.3f}% | {r['max_levels']} |"
              for r in demo["rows"]]
    full = result["full_generators"]
    lines += ["", f"The full profile's generators (random weights), {full['batch_images']} images a call:", "",
              "| route | precision | steps | images/s | x float32 |", "|---|---|---|---|---|"]
    base = {r["route"]: r["images_per_s"] for r in full["rows"] if r["precision"] == "float32"}
    lines += [f"| {r['route']} | {r['precision']} | {r['steps']} | {r['images_per_s']:.1f} | "
              f"{r['images_per_s'] / base[r['route']]:.2f} |" for r in full["rows"]]
    lines += ["", "Training steps (random data; CSM: 2 x batch companions):", "",
              "| model | step | precision | real batch | s / step | x float32 two passes |",
              "|---|---|---|---|---|---|"]
    two = {r["model"]: r["seconds_per_step"] for r in result["training"]
           if r["step"] == "CSM, two passes" and r["precision"] == "float32"}
    lines += [f"| {r['model']} | {r['step']} | {r['precision']} | {r['batch']} | {r['seconds_per_step']:.5f} | "
              f"{r['seconds_per_step'] / two[r['model']]:.2f} |" for r in result["training"]]
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--toy", action="store_true", help="toy sizes (1 group, 2 steps, batch 4, tiny full-profile "
                                                      "generators, resnet18_cifar), e.g. on a CPU")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--repeats", type=int, default=None, help="timed calls (default: 5, toy 1)")
    p.add_argument("--groups", type=int, default=None, help="the demo generator's groups (default 256, toy 1)")
    p.add_argument("--big-batch", type=int, default=None, help="the demo generator's large batch of groups (default "
                                                               "256, toy 2)")
    p.add_argument("--output", default="runs/gpu_levers")
    args = p.parse_args(argv)
    t0 = time.time()
    from timm_csm.recipes import get_profile

    full = get_profile("full")
    args.repeats = args.repeats or (1 if args.toy else 5)
    args.groups = args.groups or (1 if args.toy else 256)
    args.big_batch = args.big_batch or (2 if args.toy else 256)
    args.steps, args.full_groups, args.batch = (2, 1, 4) if args.toy else (full.mixing.steps, 32, full.batch_size)
    result = {**device_record(args), "repeats": args.repeats, "demo_generator": demo_generator_rows(args),
              "full_generators": full_generator_rows(args), "training": training_rows(args)}
    write_result(args.output, "gpu_levers", result, markdown(result), t0)
    return result


if __name__ == "__main__":
    main()
