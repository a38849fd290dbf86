"""Generation levers: CPU time per generated group and generation quality for the demo profile's generator, one
lever at a time against the demo's sampler before issue 43 (DDIM, 8 steps, no guidance, float32, 32 groups a
forward pass), then combined.

    OMP_NUM_THREADS=1 python benchmarks/generation_levers.py                # quality sets, timing, compile, page
    OMP_NUM_THREADS=1 python benchmarks/generation_levers.py --phase quality   # one phase (the others reuse it)
    python benchmarks/generation_levers.py --phase page                      # the page from the finished cells

Time: the process's CPU time (``time.process_time``, one torch thread) of generating ``--timing-groups`` groups of the
demo's 4 lambdas with each lever, every lever once per round in the same process, rounds interleaved, the best of
``--rounds`` kept. Quality: for each sampler setting and each of 3 generation seeds, ``--groups`` groups generated
and annotated as the demo annotates them (the reference encoder learned without the held-out tenth, s chosen on that
tenth, the annotation checks), read as: the pure-class images recognised by their nearest real-class prototype, the
share of groups the checks flag, the mean confidence max_k q_k of the soft labels, the mean |lambda-hat - lambda| of
the members, and the soft labels' total-variation distance to today's on the same groups. Cells are cached under
``--output`` (sets, quality cells, timing), so that a killed run resumes.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np
import torch

DEFAULT_OUTPUT = "runs/generation_levers"
COMMAND = ("OMP_NUM_THREADS=1 python benchmarks/generation_levers.py   # run here phase by phase: --phase quality, "
           "timing, compile, avx2, page")
#: the generation seeds of the quality sets: group i of seed k has the group seed SEED_BASE + k * SEED_STRIDE + i
#: (apart from every dataset's seeds, which start at 0, and from the generator check's)
SEED_BASE, SEED_STRIDE = 50_000_000, 1_000_000
NUM_LAMBDAS = 4  # the demo's lambda grid


@dataclass(frozen=True)
class Lever:
    """One generation setting: ``lever`` names what it varies against today's."""

    lever: str
    scheduler: str = "ddim"
    steps: int = 8
    spacing: Optional[str] = None  # the sampler's timestep_spacing; None: the generator's (leading)
    precision: str = "float32"
    batch_groups: int = 32
    channels_last: bool = False

    @property
    def name(self) -> str:
        extra = [f"{self.spacing} steps"] if self.spacing else []
        extra += [self.precision] if self.precision != "float32" else []
        extra += [f"{self.batch_groups} groups a batch"] if self.batch_groups != 32 else []
        extra += ["channels_last"] if self.channels_last else []
        return " ".join([f"{self.scheduler} {self.steps}", *(f"+ {e}" for e in extra)])

    @property
    def sampler_key(self) -> str:
        """What the images depend on: the sampler, its steps and their spacing, the precision."""
        return f"{self.scheduler}-{self.steps}{'-' + self.spacing if self.spacing else ''}-{self.precision}"


TODAY = Lever("today")
SAMPLERS = [Lever("sampler", s, n) for s in ("dpm", "unipc") for n in (4, 5, 6)]
SPACING = [*(Lever("time steps", "ddim", n, "trailing") for n in (4, 5, 6)),
           *(Lever("time steps", s, 5, "trailing") for s in ("dpm", "unipc"))]
PRECISION = [Lever("precision", precision="bfloat16"), Lever("memory format", channels_last=True)]
BATCH = [Lever("batch size", batch_groups=b) for b in (8, 16)]
COMBINED = [Lever("combined", "ddim", n, "trailing", "bfloat16") for n in (4, 5, 6)]
LEVERS = [TODAY, *SAMPLERS, *SPACING, *PRECISION, *BATCH, *COMBINED]
#: the order the quality sets are made in: the candidates for the default first
QUALITY_ORDER = [TODAY, PRECISION[0], *COMBINED, *SPACING, *SAMPLERS]


def mixing_of(lever: Lever, seed_offset: int = 0):
    from timm_csm.generation import MixingConfig
    from timm_csm.recipes.profiles import RECIPE_SHARDS

    return MixingConfig(num_lambdas=NUM_LAMBDAS, steps=lever.steps, scheduler=lever.scheduler, guidance_scale=1.0,
                        timestep_spacing=lever.spacing, precision=lever.precision, seed_offset=seed_offset,
                        **dict(RECIPE_SHARDS, batch_groups=lever.batch_groups))


def pipeline_of(generator, lever: Lever):
    from timm_csm.recipes.steps import load_mixing_pipeline

    pipe = load_mixing_pipeline(generator, mixing_of(lever), device="cpu")
    pipe.set_progress_bar_config(disable=True)
    if lever.channels_last:
        pipe.unet.to(memory_format=torch.channels_last)
    return pipe


def _silent(*_):
    pass


def quality_cell(generator, lever: Lever, seed: int, num_groups: int, real, encoder, output: Path) -> Dict:
    """Generate (resumably) and annotate ``num_groups`` groups of ``lever``'s sampler at generation seed ``seed``."""
    from timm_csm.annotation import annotate_generated
    from timm_csm.data.lazy import column_arrays
    from timm_csm.generation import load_generated
    from timm_csm.recipes.profiles import get_profile
    from timm_csm.recipes.steps import generate_groups

    folder = output / "sets" / f"{lever.sampler_key}-s{seed}"
    mixing = mixing_of(lever, SEED_BASE + seed * SEED_STRIDE)
    t0 = time.process_time()
    generate_groups(generator, folder, num_groups, mixing, progress=False, log=_silent)
    generation_s = time.process_time() - t0
    images, plan = load_generated(folder)
    annotation = dataclasses.replace(get_profile("demo").annotation, drop_flagged=False).resolved("fashion_mnist")
    result = annotate_generated(images, plan, real, encoder, annotation.s, holdout=True, cache_dir=output / "prototypes", progress=False, log=_silent,
        **annotation.annotate_kwargs())
    cols = column_arrays(result.dataset, ["group_id", "lambda_gen", "lambda_hat", "soft_label"])
    order = np.lexsort((cols["lambda_gen"], cols["group_id"]))
    np.save(output / "sets" / f"{lever.sampler_key}-s{seed}-soft.npy", np.stack(cols["soft_label"])[order])
    report = result.report
    return {"sampler_key": lever.sampler_key, "seed": seed, "num_groups": report["num_groups"], "s": result.s,
            "recognition": report["pure_class_recognition"]["accuracy"],
            "flagged_share": report["flagged"] / report["num_groups"],
            "soft_confidence": report["max_soft_label"]["mean"],
            "lambda_gap": float(np.abs(cols["lambda_hat"] - cols["lambda_gen"]).mean()),
            "generation_cpu_s": round(generation_s, 2)}


def run_quality(generator, levers: List[Lever], seeds, num_groups: int, output: Path, share=(0, 1)) -> None:
    """The quality cells of ``levers``' sampler settings not made yet (``share`` (i, n): the i-th of n processes
    makes every n-th of them)."""
    from timm_csm.annotation import holdout_split, train_reference_encoder
    from timm_csm.data import load_image_arrays
    from timm_csm.io import write_text_atomic
    from timm_csm.recipes.profiles import get_profile

    real = load_image_arrays("fashion_mnist", "train")
    demo = get_profile("demo")
    # the demo's reference encoder: learned without the held-out tenth that s is chosen on
    fit = holdout_split(real, demo.annotation.holdout_fraction, demo.annotation.seed)[0]
    encoder = train_reference_encoder(fit, output / "encoder", epochs=demo.encoder_epochs, seed=demo.seed,
                                      progress=False, log=_silent)
    keys = {}
    for lever in levers:
        keys.setdefault(lever.sampler_key, lever)
    cells = [(key, lever, seed) for key, lever in keys.items() for seed in seeds]
    for key, lever, seed in cells[share[0]::share[1]]:
        path = output / "quality" / f"{key}-s{seed}.json"
        if path.exists():
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        cell = quality_cell(generator, lever, seed, num_groups, real, encoder, output)
        write_text_atomic(path, json.dumps(cell, indent=1))
        print(json.dumps(cell), flush=True)


def time_levers(generator, levers: List[Lever], num_groups: int, rounds: int) -> Dict[str, float]:
    """Best-of-``rounds`` CPU seconds per group of each lever, rounds interleaved in this process."""
    from timm_csm.generation import lambda_grid, plan_groups

    groups, lams = plan_groups(10, num_groups, SEED_BASE), lambda_grid(NUM_LAMBDAS)
    pipes = {lever.name: pipeline_of(generator, lever) for lever in levers}
    for lever in levers:  # warm-up: one batch each
        pipes[lever.name](groups[:lever.batch_groups], lams, return_dict=False)
    best = {lever.name: float("inf") for lever in levers}
    for r in range(rounds):
        for lever in levers:
            t0 = time.process_time()
            for i in range(0, num_groups, lever.batch_groups):
                pipes[lever.name](groups[i:i + lever.batch_groups], lams, return_dict=False)
            best[lever.name] = min(best[lever.name], time.process_time() - t0)
        print(f"round {r + 1}/{rounds}: " + ", ".join(f"{k} {v / num_groups:.4f}" for k, v in best.items()),
              flush=True)
    return {k: v / num_groups for k, v in best.items()}


def _cpu_with_children() -> float:
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def time_compile(generator, num_groups: int, rounds: int) -> Dict:
    """``torch.compile`` of today's network: its compile time (the first batch's CPU time, compile workers included,
    less an eager batch) and its CPU seconds per group after it, beside eager, rounds interleaved."""
    from timm_csm.generation import lambda_grid, plan_groups

    groups, lams = plan_groups(10, num_groups, SEED_BASE), lambda_grid(NUM_LAMBDAS)
    eager, compiled = pipeline_of(generator, TODAY), pipeline_of(generator, TODAY)
    batch = groups[:TODAY.batch_groups]
    eager(batch, lams, return_dict=False)
    t0 = _cpu_with_children()
    eager(batch, lams, return_dict=False)
    eager_batch = _cpu_with_children() - t0
    compiled.unet.compile()
    t0 = _cpu_with_children()
    try:
        compiled(batch, lams, return_dict=False)
    except Exception as e:  # noqa: BLE001 (a compiler failure is a result of this lever)
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
    first = _cpu_with_children() - t0
    best = {"eager": float("inf"), "compiled": float("inf")}
    for _ in range(rounds):
        for name, pipe in (("eager", eager), ("compiled", compiled)):
            t0 = time.process_time()
            for i in range(0, num_groups, TODAY.batch_groups):
                pipe(groups[i:i + TODAY.batch_groups], lams, return_dict=False)
            best[name] = min(best[name], time.process_time() - t0)
    return {"compile_cpu_s": first - eager_batch, "eager_s_per_group": best["eager"] / num_groups,
            "compiled_s_per_group": best["compiled"] / num_groups, "rounds": rounds}


def _record() -> Dict:
    """The code's commit (and whether the package and this script were clean), torch, its threads, its CPU
    capability and the instruction-set variables in force."""
    from timm_csm.recipes.cells import INSTRUCTION_SET_PINS, git

    root = Path(__file__).resolve().parent.parent
    return {"commit": git("rev-parse", "--short", "HEAD", repo=root),
            "clean": not git("status", "--porcelain", "--", "timm_csm", "benchmarks/generation_levers.py", repo=root),
            "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "pins": {k: os.environ[k] for k in INSTRUCTION_SET_PINS if k in os.environ}}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--phase", choices=["all", "quality", "timing", "compile", "avx2", "page"], default="all",
                   help="avx2: today's sampler and its bfloat16 lever again with oneDNN held to AVX2 (a CPU without "
                        "bfloat16 instructions), in a process of its own")
    p.add_argument("--groups", type=int, default=90, help="groups per quality set (each generation seed)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="generation seeds of the quality sets")
    p.add_argument("--timing-groups", type=int, default=32, help="groups a timing round generates with each lever")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--avx2-groups", type=int, default=4, help="groups of the avx2 phase's timing (one round)")
    p.add_argument("--share", default="0/1", help="i/n: this process makes every n-th quality cell from the i-th")
    p.add_argument("--output", default=DEFAULT_OUTPUT)
    p.add_argument("--report", default="benchmarks/generation.md")
    p.add_argument("--json", default="benchmarks/generation.json")
    args = p.parse_args(argv)

    from timm_csm.io import write_text_atomic
    from timm_csm.recipes.steps import shipped_generator

    generator = shipped_generator("fashion_mnist")
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    if args.phase != "page":  # what this phase's numbers depend on besides its options
        write_text_atomic(output / f"record_{args.phase}.json", json.dumps(_record(), indent=1))
    if args.phase in ("all", "quality"):
        run_quality(generator, QUALITY_ORDER, args.seeds, args.groups, output,
                    tuple(int(v) for v in args.share.split("/")))
    if args.phase in ("all", "timing"):
        timing = time_levers(generator, LEVERS, args.timing_groups, args.rounds)
        write_text_atomic(output / "timing.json", json.dumps({"s_per_group": timing, "rounds": args.rounds,
                                                             "groups": args.timing_groups}, indent=1))
    if args.phase in ("all", "compile"):
        write_text_atomic(output / "compile.json", json.dumps(time_compile(generator, args.timing_groups,
                                                                           args.rounds), indent=1))
    if args.phase in ("all", "avx2"):
        if os.environ.get("ONEDNN_MAX_CPU_ISA") != "AVX2":  # oneDNN reads it once, at start: a process of its own
            subprocess.run([sys.executable, __file__, *(argv if argv is not None else sys.argv[1:]), "--phase",
                            "avx2"], env=dict(os.environ, ONEDNN_MAX_CPU_ISA="AVX2"), check=True)
        else:
            timing = time_levers(generator, [TODAY, PRECISION[0]], args.avx2_groups, 1)
            write_text_atomic(output / "timing_avx2.json", json.dumps({"s_per_group": timing, "rounds": 1,
                                                                      "groups": args.avx2_groups}, indent=1))
            return
    if args.phase in ("all", "page"):
        from generation_levers_page import write_page

        machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}"
        write_page(LEVERS, TODAY, output, args.seeds, args.groups, Path(args.report), Path(args.json), machine,
                   COMMAND)
        print(Path(args.report).read_text())


if __name__ == "__main__":
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    main()
