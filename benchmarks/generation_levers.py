"""Generation levers: CPU time per generated group and generation quality, one lever at a time against the demo's
sampler before issue 43 (DDIM, 8 steps, no guidance, float32, 32 groups a forward pass), then combined, on the demo
profile's generator (the shipped one) or, with ``--generator matched``, on PROTOCOL.md amendment 2's matched
generator (learned from the benchmark's 2 500 real images; its sampler, amendment 2's registered one, is the same).

    OMP_NUM_THREADS=1 python benchmarks/generation_levers.py                # quality sets, timing, compile, page
    OMP_NUM_THREADS=1 python benchmarks/generation_levers.py --phase quality   # one phase (the others reuse it)
    python benchmarks/generation_levers.py --phase page                      # the page from the finished cells
    OMP_NUM_THREADS=1 python benchmarks/generation_levers.py --generator matched   # quality, timing, page

Time: the process's CPU time (``time.process_time``, one torch thread) of generating ``--timing-groups`` groups of the
demo's 4 lambdas with each lever, every lever once per round in the same process, rounds interleaved, the best of
``--rounds`` kept. Quality: for each sampler setting and each of 3 generation seeds, ``--groups`` groups generated
and annotated as the generator's setting annotates them (demo: the demo's reference encoder, learned without the
held-out tenth of the real training split; matched: the matched setting's reference encoder and its 2 500 real images;
s chosen on the held-out tenth, the annotation checks), read as: the pure-class images recognised by their nearest
real-class prototype, the share of groups the checks flag, the mean confidence max_k q_k of the soft labels, the mean
|lambda-hat - lambda| of the members, and the soft labels' total-variation distance to today's on the same groups.
Cells are cached under ``--output`` (sets, quality cells, timing), so that a killed run resumes.
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

from csm_step import record

#: per generator: the run folder, the page, its JSON and the command that made them
TARGETS = {
    "demo": ("runs/generation_levers", "benchmarks/generation.md", "benchmarks/generation.json",
             "OMP_NUM_THREADS=1 python benchmarks/generation_levers.py   # run here phase by phase: --phase quality, "
             "timing, compile, avx2, page"),
    "matched": ("runs/generation_levers_matched", "benchmarks/generation_matched.md",
                "benchmarks/generation_matched.json",
                "OMP_NUM_THREADS=1 python benchmarks/generation_levers.py --generator matched   # quality, timing, "
                "page"),
}
#: where ``--generator matched`` reads amendment 2's matched setting (``benchmarks/matched_setting.py`` builds it)
SETTINGS_ROOT = "runs/settings"
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
#: on the matched generator: today's sampler, the demo's new one (DDIM 4 + trailing steps) and its neighbours,
#: bfloat16 alone and with it (the network is the demo's, so batch size, memory format and compile are the demo's)
MATCHED_LEVERS = [TODAY, *SPACING[:3], PRECISION[0], COMBINED[0]]


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


def quality_cell(generator, lever: Lever, seed: int, num_groups: int, annotator, output: Path) -> Dict:
    """Generate (resumably) and annotate ``num_groups`` groups of ``lever``'s sampler at generation seed ``seed``
    (``annotator``: the real images, the encoder and the annotation options of :func:`setting_annotator`)."""
    from timm_csm.annotation import annotate_generated
    from timm_csm.data.lazy import column_arrays
    from timm_csm.generation import load_generated
    from timm_csm.recipes.steps import generate_groups

    real, encoder, annotation = annotator
    folder = output / "sets" / f"{lever.sampler_key}-s{seed}"
    mixing = mixing_of(lever, SEED_BASE + seed * SEED_STRIDE)
    t0 = time.process_time()
    generate_groups(generator, folder, num_groups, mixing, progress=False, log=_silent)
    generation_s = time.process_time() - t0
    images, plan = load_generated(folder)
    result = annotate_generated(images, plan, real, encoder, annotation.s, holdout=True,
                                cache_dir=output / "prototypes", progress=False, log=_silent,
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


def setting_generator(which: str, settings_root: Path) -> Path:
    """The generator folder of ``which``: the demo's shipped one, or amendment 2's matched one."""
    from timm_csm.recipes.steps import shipped_generator

    if which == "demo":
        return shipped_generator("fashion_mnist")
    folder = settings_root / "matched" / "generator"
    if not (folder / "DONE.json").exists():
        raise SystemExit(f"no finished matched generator at {folder}: build it with `python "
                         "benchmarks/matched_setting.py --setting matched --until generator`")
    return folder


def setting_annotator(which: str, settings_root: Path, output: Path):
    """``(real images, reference encoder, annotation options)`` as ``which``'s setting annotates: the demo's (its
    encoder learned here without the held-out tenth of the real training split) or the matched setting's (its 2 500
    real images and the reference encoder its annotation step trained; the annotation options' defaults, s chosen on
    the held-out tenth). The groups the checks flag are kept: their share is a measure."""
    from timm_csm.annotation import AnnotationConfig, holdout_split, load_reference_encoder, train_reference_encoder
    from timm_csm.data import load_image_arrays
    from timm_csm.recipes.profiles import get_profile

    if which == "matched":
        real = load_image_arrays(str(settings_root / "matched" / "real"), "train")
        encoder = load_reference_encoder(settings_root / "matched" / "reference")
        return real, encoder, AnnotationConfig(drop_flagged=False).resolved("fashion_mnist")
    real = load_image_arrays("fashion_mnist", "train")
    demo = get_profile("demo")
    fit = holdout_split(real, demo.annotation.holdout_fraction, demo.annotation.seed)[0]
    encoder = train_reference_encoder(fit, output / "encoder", epochs=demo.encoder_epochs, seed=demo.seed,
                                      progress=False, log=_silent)
    return real, encoder, dataclasses.replace(demo.annotation, drop_flagged=False).resolved("fashion_mnist")


def run_quality(generator, levers: List[Lever], seeds, num_groups: int, output: Path, annotator,
                share=(0, 1)) -> None:
    """The quality cells of ``levers``' sampler settings not made yet (``share`` (i, n): the i-th of n processes
    makes every n-th of them)."""
    from timm_csm.io import write_text_atomic

    keys = {}
    for lever in levers:
        keys.setdefault(lever.sampler_key, lever)
    cells = [(key, lever, seed) for key, lever in keys.items() for seed in seeds]
    for key, lever, seed in cells[share[0]::share[1]]:
        path = output / "quality" / f"{key}-s{seed}.json"
        if path.exists():
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        cell = quality_cell(generator, lever, seed, num_groups, annotator, output)
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


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--generator", choices=list(TARGETS), default="demo",
                   help="demo: the shipped generator, every lever; matched: amendment 2's matched generator, "
                        "the samplers and precisions of MATCHED_LEVERS (phases quality, timing, page)")
    p.add_argument("--phase", choices=["all", "quality", "timing", "compile", "avx2", "page"], default="all",
                   help="avx2: today's sampler and its bfloat16 lever again with oneDNN held to AVX2 (a CPU without "
                        "bfloat16 instructions), in a process of its own")
    p.add_argument("--groups", type=int, default=90, help="groups per quality set (each generation seed)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="generation seeds of the quality sets")
    p.add_argument("--timing-groups", type=int, default=32, help="groups a timing round generates with each lever")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--avx2-groups", type=int, default=4, help="groups of the avx2 phase's timing (one round)")
    p.add_argument("--share", default="0/1", help="i/n: this process makes every n-th quality cell from the i-th")
    p.add_argument("--settings-root", default=SETTINGS_ROOT, help="where amendment 2's settings were built")
    p.add_argument("--output", help="the run folder (default: the generator's, see TARGETS)")
    p.add_argument("--report", help="the page (default: the generator's)")
    p.add_argument("--json", help="the page's JSON (default: the generator's)")
    args = p.parse_args(argv)
    default_output, default_report, default_json, command = TARGETS[args.generator]
    output = Path(args.output or default_output)
    report, json_path = Path(args.report or default_report), Path(args.json or default_json)
    matched = args.generator == "matched"
    if matched and args.phase in ("compile", "avx2"):
        raise SystemExit(f"--phase {args.phase} is the demo generator's only: the matched generator has its network")
    phases = {"all": ("quality", "timing", "page") if matched else ("quality", "timing", "compile", "avx2", "page")}
    phases = phases.get(args.phase, (args.phase,))
    levers = MATCHED_LEVERS if matched else LEVERS

    from timm_csm.io import write_text_atomic

    settings_root = Path(args.settings_root)
    generator = setting_generator(args.generator, settings_root) if phases != ("page",) else None
    output.mkdir(parents=True, exist_ok=True)
    if args.phase != "page":  # what this phase's numbers depend on besides its options
        scripts = ("benchmarks/generation_levers.py", "benchmarks/generation_levers_page.py")
        write_text_atomic(output / f"record_{args.phase}.json", json.dumps(record(*scripts), indent=1))
    if "quality" in phases:
        run_quality(generator, levers if matched else QUALITY_ORDER, args.seeds, args.groups, output,
                    setting_annotator(args.generator, settings_root, output),
                    tuple(int(v) for v in args.share.split("/")))
    if "timing" in phases:
        timing = time_levers(generator, levers, args.timing_groups, args.rounds)
        write_text_atomic(output / "timing.json", json.dumps({"s_per_group": timing, "rounds": args.rounds,
                                                             "groups": args.timing_groups}, indent=1))
    if "compile" in phases:
        write_text_atomic(output / "compile.json", json.dumps(time_compile(generator, args.timing_groups,
                                                                           args.rounds), indent=1))
    if "avx2" in phases:
        if os.environ.get("ONEDNN_MAX_CPU_ISA") != "AVX2":  # oneDNN reads it once, at start: a process of its own
            subprocess.run([sys.executable, __file__, *(argv if argv is not None else sys.argv[1:]), "--phase",
                            "avx2"], env=dict(os.environ, ONEDNN_MAX_CPU_ISA="AVX2"), check=True)
        else:
            timing = time_levers(generator, [TODAY, PRECISION[0]], args.avx2_groups, 1)
            write_text_atomic(output / "timing_avx2.json", json.dumps({"s_per_group": timing, "rounds": 1,
                                                                      "groups": args.avx2_groups}, indent=1))
            return
    if "page" in phases:
        from generation_levers_page import write_page

        machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}"
        write_page(levers, TODAY, output, args.seeds, args.groups, report, json_path, machine, command,
                   generator=args.generator)
        print(report.read_text())


if __name__ == "__main__":
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    main()
