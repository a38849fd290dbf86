"""GPU cost of the ``full`` recipe: generation images/s of both generator routes, the CE and CSM training-step times
of resnet50_cifar, and their projection to the whole run. Random weights throughout: only the time is measured.

    python benchmarks/gpu_bench.py                              # on the GPU (the full profile's sizes)
    OMP_NUM_THREADS=1 python benchmarks/gpu_bench.py --toy      # a check that it runs: CPU, toy sizes
    python benchmarks/gpu_bench.py --flops-only                 # any machine: FLOPs and their projection

* diffusers route: the ``cifar100`` generator profile's class-conditional UNet2DModel (100 classes + the null row),
  DDIM without guidance;
* EDM route: ``EDMPrecond`` around DDPM++ in NVlabs' CIFAR configuration (EDM ``train.py --arch=ddpmpp``: 128
  channels, channel_mult 2,2,2, 4 blocks a resolution, attention at 16 px, augment_dim 9), 100 classes, 32 px, Heun;
  both at the full profile's sampler steps, 32 groups x 8 lambdas a call (the recipe's batch);
* training: resnet50_cifar for 100 classes at 32 px, real batch 128, the recipe's optimiser (SGD 0.1, momentum 0.9,
  weight decay 5e-4, gradient norm clipped at 2), fp32: a CE step (``ClassificationTask``) and a CSM step
  (``CSMTask``: the real batch, then its 2 x 128 companions with soft labels, in a second pass).

Projection: the full profile's num_groups x num_lambdas images; 200 epochs of the 45 000 training images
(CIFAR-100's 50 000 less the 10% validation share) in full batches of 128. Not counted: CLIP annotation, validation
passes, data loading.

FLOPs (every run, and alone with ``--flops-only``, on any machine): torch's ``FlopCounterMode`` over the same
networks built on the meta device at the full sizes (no memory, no compute), per network evaluation of one image and
per training step (forward and backward of the model; the loss and the optimiser update, under 0.1%, are not
counted). The run's total FLOPs, divided by the rate the paper's anchor implies (its generation of the full profile's
images in about 4 hours on an RTX 4090), give a projection that needs no GPU: it assumes training sustains the rate
that generation did. Writes ``<output>/gpu_bench.json`` and ``<output>/gpu_bench.md``.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import time
from pathlib import Path

import torch

# NVlabs EDM train.py, --arch=ddpmpp with CIFAR's dropout (0.13) and augmentation (augment_dim 9)
EDM_CIFAR = dict(model_type="SongUNet", embedding_type="positional", encoder_type="standard", decoder_type="standard",
                 channel_mult_noise=1, resample_filter=[1, 1], model_channels=128, channel_mult=[2, 2, 2],
                 num_blocks=4, attn_resolutions=[16], dropout=0.13, augment_dim=9)
EDM_TOY = dict(EDM_CIFAR, model_channels=8, channel_mult=[1, 2], num_blocks=1)
TRAIN_IMAGES = 45_000  # CIFAR-100's 50 000 training images less the 10% validation share
ANCHOR_HOURS = 4.0  # the CSM authors' generation of the CIFAR-100 set on one RTX 4090


def timed(fn, repeats: int, device: str, warmup: bool = True) -> float:
    """Median seconds of ``fn()`` over ``repeats`` calls (CUDA synchronised) after one warm-up call, unless
    ``warmup`` is False: toy runs, a check that the code runs, skip it (on a CPU without bfloat16 instructions it is
    half their time), as does a caller that has just made the same call."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    if warmup:
        fn()
        sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def generation_rows(args, steps: int, num_classes: int = 100):
    """Images per second of the two routes on ``args.groups`` groups x 8 lambdas."""
    from diffusers import DDIMScheduler

    from timm_csm.generation import (GENERATOR_PROFILES, EDMSemanticMixingPipeline, SemanticMixingPipeline,
                                     create_class_unet, lambda_grid, plan_groups)
    from timm_csm.generation.edm import EDMPrecond

    torch.manual_seed(0)
    cfg = dataclasses.replace(GENERATOR_PROFILES["smoke" if args.toy else "cifar100"], sample_size=32, in_channels=3)
    unet = create_class_unet(cfg, num_classes)
    names = [str(k) for k in range(num_classes)]
    diffusers_pipe = SemanticMixingPipeline(unet.eval(), DDIMScheduler(beta_schedule="squaredcos_cap_v2"), names,
                                            num_inference_steps=steps, guidance_scale=1.0).to(args.device)
    diffusers_pipe.set_progress_bar_config(disable=True)
    net = EDMPrecond(32, 3, num_classes, **(EDM_TOY if args.toy else EDM_CIFAR)).to(args.device).eval()
    edm_pipe = EDMSemanticMixingPipeline(net.requires_grad_(False), num_classes, (3, 32, 32), steps, args.device)
    groups, lambdas = plan_groups(num_classes, args.groups), lambda_grid(8)
    rows = []
    for name, pipe, nfe, model in (("diffusers UNet, DDIM", diffusers_pipe, steps, unet),
                                   ("EDM DDPM++, Heun", edm_pipe, 2 * steps - 1, net)):
        seconds = timed(lambda: pipe(groups, lambdas), args.repeats, args.device, warmup=not args.toy)
        n = len(groups) * len(lambdas)
        rows.append({"route": name, "steps": steps, "nfe_per_image": nfe, "batch_images": n,
                     "parameters": sum(p.numel() for p in model.parameters()), "images_per_s": n / seconds})
    return rows


def training_setup(device: str, batch: int, num_classes: int = 100, model: str = "resnet50_cifar", in_chans: int = 3,
                   size: int = 32, **model_kwargs):
    """``model`` (random weights) in training mode on ``device``, the recipe's optimiser (SGD 0.1, momentum 0.9, weight
    decay 5e-4), a real batch of ``batch`` random images and its 2 x ``batch`` companions with soft labels."""
    import timm
    from timm.optim import create_optimizer_v2

    import timm_csm  # noqa: F401 (registers resnet50_cifar and small_cnn)

    torch.manual_seed(0)
    net = timm.create_model(model, num_classes=num_classes, in_chans=in_chans, **model_kwargs).to(device).train()
    opt = create_optimizer_v2(net, opt="momentum", lr=0.1, momentum=0.9, weight_decay=5e-4)
    real = {"pixel_values": torch.randn(batch, in_chans, size, size, device=device),
            "labels": torch.randint(0, num_classes, (batch,), device=device),
            "index": torch.arange(batch, device=device)}
    companions = {"mix_pixel_values": torch.randn(2 * batch, in_chans, size, size, device=device),
                  "mix_targets": torch.softmax(torch.randn(2 * batch, num_classes, device=device), 1)}
    return net, opt, real, companions


def training_step(task, batch: dict, opt, autocast_dtype=None):
    """One step as the training loop takes it (forward and loss, under ``autocast_dtype`` autocast when given;
    backward, gradient norm clipped at 2, step, clear)."""
    device = batch["pixel_values"].device.type

    def step():
        with torch.autocast(device, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            loss = task(batch)["loss"]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(task.model.parameters(), 2.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def training_rows(args, num_classes: int = 100):
    """Seconds per CE and per CSM step of resnet50_cifar at real batch ``args.batch``."""
    from timm_csm.losses import create_loss
    from timm_csm.training import ClassificationTask, CSMTask

    model, opt, real, companions = training_setup(args.device, args.batch, num_classes)
    tasks = {"CE": (ClassificationTask(model, create_loss("ce")), real),
             "CSM": (CSMTask(model, create_loss("csm"), companions=None), {**real, **companions})}
    rows = []
    for name, (task, batch) in tasks.items():
        task.criterion.to(args.device)
        seconds = timed(training_step(task, batch, opt), args.repeats, args.device, warmup=not args.toy)
        rows.append({"loss": name, "batch": args.batch, "images_per_step": args.batch * (3 if name == "CSM" else 1),
                     "seconds_per_step": seconds})
    return rows


def flop_rows(steps: int, batch: int, num_classes: int = 100):
    """FLOPs of the full-size networks, counted on the meta device: per network evaluation of one image (both
    generator routes) and per training step of resnet50_cifar (forward and backward, ``batch`` real images; CSM
    adds its 2 x ``batch`` companions)."""
    import timm
    from torch.utils.flop_counter import FlopCounterMode

    from timm_csm.generation import GENERATOR_PROFILES, create_class_unet  # and registers resnet50_cifar
    from timm_csm.generation.conditioning import enable_soft_class_conditioning
    from timm_csm.generation.edm import EDMPrecond

    def count(fn) -> int:
        with FlopCounterMode(display=False) as counter:
            fn()
        return counter.get_total_flops()

    with torch.device("meta"):
        cfg = dataclasses.replace(GENERATOR_PROFILES["cifar100"], sample_size=32, in_channels=3)
        unet = enable_soft_class_conditioning(create_class_unet(cfg, num_classes)).eval()
        net = EDMPrecond(32, 3, num_classes, **EDM_CIFAR).eval()
        x, w = torch.randn(1, 3, 32, 32), torch.full((1, num_classes), 1.0 / num_classes)
        with torch.no_grad():
            gen = [("diffusers UNet, DDIM", steps, count(lambda: unet(x, torch.tensor([500]), class_labels=w))),
                   ("EDM DDPM++, Heun", 2 * steps - 1, count(lambda: net(x, torch.tensor([1.0]), class_labels=w)))]
        model = timm.create_model("resnet50_cifar", num_classes=num_classes).train()
        per_image = count(lambda: model(torch.randn(batch, 3, 32, 32)).sum().backward()) / batch
    return ([{"route": r, "nfe_per_image": nfe, "gflop_per_evaluation": f / 1e9, "gflop_per_image": nfe * f / 1e9}
             for r, nfe, f in gen],
            [{"loss": name, "batch": batch, "images_per_step": batch * k, "gflop_per_step": per_image * batch * k / 1e9}
             for name, k in (("CE", 1), ("CSM", 3))])


def project_flops(gen, train, images: int, epochs: int, batch: int):
    """Total PFLOPs of the run's stages, and hours at the rate implied by the anchor (the EDM route's generation of
    ``images`` in ``ANCHOR_HOURS``)."""
    edm = next(r for r in gen if r["route"].startswith("EDM"))
    rate = images * edm["gflop_per_image"] * 1e9 / (ANCHOR_HOURS * 3600)
    for r in gen:
        r["total_pflop"] = images * r["gflop_per_image"] / 1e6
    for r in train:
        r["total_pflop"] = epochs * (TRAIN_IMAGES // batch) * r["gflop_per_step"] / 1e6
    for r in gen + train:
        r["hours_at_anchor_rate"] = r["total_pflop"] * 1e15 / rate / 3600
    return {"anchor_hours": ANCHOR_HOURS, "anchor_tflop_per_s": rate / 1e12, "generated_images": images,
            "epochs": epochs, "steps_per_epoch": TRAIN_IMAGES // batch}


def project(gen, train, images: int, epochs: int, batch: int):
    """Hours of the full run: generation of ``images``, ``epochs`` of ``TRAIN_IMAGES // batch`` steps."""
    for r in gen:
        r["projected_hours"] = images / r["images_per_s"] / 3600
    for r in train:
        r["projected_hours"] = epochs * (TRAIN_IMAGES // batch) * r["seconds_per_step"] / 3600
    return {"generated_images": images, "epochs": epochs, "train_images": TRAIN_IMAGES, "steps_per_epoch":
            TRAIN_IMAGES // batch}


def flops_markdown(flops) -> str:
    f = flops["projection"]
    lines = [f"FLOPs at the full profile's sizes (meta device), {f['generated_images']:,} images, {f['epochs']} epochs "
             f"x {f['steps_per_epoch']} steps; the anchor ({f['anchor_hours']:g} h for the EDM route's generation) "
             f"implies {f['anchor_tflop_per_s']:.1f} TFLOP/s sustained.", "",
             "| stage | GFLOP / evaluation | evaluations / image | GFLOP / image or step | run total (PFLOP) | "
             "hours at the anchor's rate |", "|---|---|---|---|---|---|"]
    lines += [f"| generation, {r['route']} | {r['gflop_per_evaluation']:.2f} | {r['nfe_per_image']} | "
              f"{r['gflop_per_image']:.1f} | {r['total_pflop']:.1f} | {r['hours_at_anchor_rate']:.2f} |"
              for r in flops["generation"]]
    lines += [f"| training step, {r['loss']} ({r['images_per_step']} images) | | | {r['gflop_per_step']:.0f} | "
              f"{r['total_pflop']:.1f} | {r['hours_at_anchor_rate']:.2f} |" for r in flops["training"]]
    return "\n".join(lines) + "\n"


def markdown(result) -> str:
    p = result["projection"]
    flops = flops_markdown(result["flops"])
    if result["flops_only"]:
        return flops
    sizes = "the full profile's sizes"
    if result["toy"]:
        sizes = "TOY SIZES: a check that the script runs, not a measurement"
    lines = [f"Device: {result['device']} ({result['device_name']}); torch {result['torch']}; {sizes}.",
             "", "| generation route | steps | NFE / image | batch (images) | parameters | images/s | "
             f"{p['generated_images']:,} images (h) |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['route']} | {r['steps']} | {r['nfe_per_image']} | {r['batch_images']} | {r['parameters']:,} | "
              f"{r['images_per_s']:.1f} | {r['projected_hours']:.2f} |" for r in result["generation"]]
    lines += ["", f"| training step (resnet50_cifar) | real batch | images / step | s / step | {p['epochs']} epochs x "
              f"{p['steps_per_epoch']} steps (h) |", "|---|---|---|---|---|"]
    lines += [f"| {r['loss']} | {r['batch']} | {r['images_per_step']} | {r['seconds_per_step']:.4f} | "
              f"{r['projected_hours']:.2f} |" for r in result["training"]]
    return "\n".join(lines) + "\n\n" + flops


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--toy", action="store_true", help="toy sizes (tiny generators, batch 4, 2 steps), e.g. on a CPU")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--repeats", type=int, default=None, help="timed calls (default: 5, toy 1)")
    p.add_argument("--flops-only", action="store_true", help="only count the FLOPs and project from them (no timing)")
    p.add_argument("--output", default="runs/gpu_bench")
    args = p.parse_args(argv)
    t0 = time.time()
    from timm_csm.recipes import get_profile

    full = get_profile("full")
    args.repeats = args.repeats or (1 if args.toy else 5)
    args.groups, args.batch = (1, 4) if args.toy else (32, full.batch_size)
    images = full.num_groups * full.mixing.num_lambdas
    flop_gen, flop_train = flop_rows(full.mixing.steps, full.batch_size)
    flops = {"projection": project_flops(flop_gen, flop_train, images, full.epochs, full.batch_size),
             "generation": flop_gen, "training": flop_train}
    gen, train = [], []
    if not args.flops_only:
        gen = generation_rows(args, 2 if args.toy else full.mixing.steps)
        train = training_rows(args)
    result = {**device_record(args), "flops_only": args.flops_only,
              "projection": project(gen, train, images, full.epochs, args.batch),
              "generation": gen, "training": train, "flops": flops}
    write_result(args.output, "gpu_bench", result, markdown(result), t0)
    return result


def device_record(args) -> dict:
    """What the times depend on: the device and its name, toy sizes or not, torch, the machine, and the code's record
    (commit, clean scripts, threads, CPU capability; ``csm_step.record``)."""
    from csm_step import record

    return {"device": args.device, "toy": args.toy, "torch": torch.__version__, "machine": platform.machine(),
            "device_name": torch.cuda.get_device_name(args.device) if args.device.startswith("cuda")
            else platform.processor() or platform.machine(),
            "record": record("benchmarks/gpu_bench.py", "benchmarks/gpu_levers.py")}


def write_result(output: str, stem: str, result: dict, text: str, t0: float) -> None:
    """``<output>/<stem>.json`` and ``<stem>.md``; the tables and the wall time since ``t0`` printed."""
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1))
    (out / f"{stem}.md").write_text(text)
    print(text)
    print(f"total wall time {time.time() - t0:.0f} s; tables in {out / stem}.md")


if __name__ == "__main__":
    main()
