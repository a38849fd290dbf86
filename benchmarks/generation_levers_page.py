"""The page of ``benchmarks/generation_levers.py``: each lever's CPU time per group beside today's, its quality over the
generation seeds against today's seed spread, the new default it supports, ``torch.compile``'s account."""
from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np

from timm_csm.metrics.paired import interval_text

#: the quality measures: key, heading, the side on which a candidate may lie beyond today's band ("high": higher is
#: better, "low": lower is better, None: it must lie inside), scale for the page
MEASURES = [("recognition", "pure-class recognised (%)", "high", 100.0),
            ("flagged_share", "groups flagged (%)", "low", 100.0),
            ("soft_confidence", "mean max q", None, 1.0),
            ("lambda_gap", "mean abs(lambda-hat - lambda)", None, 1.0)]
#: a candidate's quality equals today's when its mean over the seeds lies within today's mean +- BAND sd (today's
#: standard deviation over the same seeds), or beyond it on the better side of a measure that has one
BAND = 2.0


def _cells(output: Path, key: str, seeds) -> Optional[List[Dict]]:
    paths = [output / "quality" / f"{key}-s{seed}.json" for seed in seeds]
    return [json.loads(p.read_text()) for p in paths] if all(p.exists() for p in paths) else None


def _tv_to_today(output: Path, key: str, today_key: str, seeds) -> float:
    """Mean total-variation distance between the soft labels of ``key`` and today's on the same groups."""
    out = []
    for seed in seeds:
        a = np.load(output / "sets" / f"{key}-s{seed}-soft.npy")
        b = np.load(output / "sets" / f"{today_key}-s{seed}-soft.npy")
        out.append(0.5 * np.abs(a - b).sum(1).mean())
    return float(np.mean(out))


def quality_summary(output: Path, keys, today_key: str, seeds) -> Dict[str, Dict]:
    """Per sampler key: each measure's mean, sd and per-seed values, the distance to today's labels, and whether
    every measure lies within today's band."""
    today = _cells(output, today_key, seeds)
    summary = {}
    for key in keys:
        cells = _cells(output, key, seeds)
        if cells is None or today is None:
            continue
        row = {"tv_to_today": _tv_to_today(output, key, today_key, seeds), "passes": True}
        for m, _, better, _ in MEASURES:
            values = [c[m] for c in cells]
            ref = [c[m] for c in today]
            mean, sd = statistics.mean(values), statistics.stdev(values)
            lo = statistics.mean(ref) - BAND * statistics.stdev(ref)
            hi = statistics.mean(ref) + BAND * statistics.stdev(ref)
            inside = (lo <= mean or better == "low") and (mean <= hi or better == "high")
            row[m] = {"mean": mean, "sd": sd, "values": values, "band": [lo, hi], "inside": inside}
            row["passes"] = row["passes"] and inside
        summary[key] = row
    return summary


def _fmt(q: Dict, scale: float) -> str:
    mark = "" if q["inside"] else " (out)"
    return f"{scale * q['mean']:.{1 if scale > 1 else 3}f} ± {scale * q['sd']:.{1 if scale > 1 else 3}f}{mark}"


def write_page(levers, today, output: Path, seeds, num_groups: int, report: Path, json_path: Path, machine: str,
               command: str, generator: str = "demo") -> None:
    """The page of the levers measured on ``generator`` ("demo": the shipped generator, whose profile's default the
    page decides; "matched": amendment 2's matched generator, where the page reports the demo's decision's setting)."""
    from timm_csm.io import write_text_atomic

    timing = json.loads((output / "timing.json").read_text())
    per_group = timing["s_per_group"]
    base = per_group[today.name]
    keys = list(dict.fromkeys(lever.sampler_key for lever in levers))
    quality = quality_summary(output, keys, today.sampler_key, seeds)
    rows = []
    for lever in levers:
        q = quality.get(lever.sampler_key)
        rows.append({"lever": lever.lever, "setting": lever.name, "sampler_key": lever.sampler_key,
                     "s_per_group": per_group.get(lever.name), "ratio": per_group.get(lever.name, float("nan")) / base,
                     "quality": q})
    passing = [r for r in rows if r["quality"] and r["quality"]["passes"] and r["s_per_group"] is not None]
    best = min(passing, key=lambda r: r["s_per_group"])
    lines = [*_intro(generator, command, machine, timing, num_groups, seeds),
             "| lever | setting | CPU s / group | x today's time | " + " | ".join(h for _, h, _, _ in MEASURES)
             + " | TV to today's labels | equal quality |",
             "|---|---|---|---|" + "---|" * len(MEASURES) + "---|---|"]
    for r in rows:
        q = r["quality"]
        cells = [_fmt(q[m], scale) for m, _, _, scale in MEASURES] if q else ["-"] * len(MEASURES)
        tv = f"{q['tv_to_today']:.3f}" if q else "-"
        verdict = ("yes" if q["passes"] else "no") if q else "-"
        mark = "**" if r is best else ""
        lines.append(f"| {r['lever']} | {mark}{r['setting']}{mark} | {r['s_per_group']:.4f} | {mark}{r['ratio']:.2f}"
                     f"{mark} | " + " | ".join(cells) + f" | {tv} | {verdict} |")
    goal = "meets" if best["ratio"] <= 0.5 else "misses"
    lines += ["", f"**Fastest setting of equal quality: {best['setting']}, {best['ratio']:.2f}x today's CPU time per "
              f"group** ({goal} the goal of 0.5x).", ""]
    if generator == "matched":
        lines += _matched_findings(rows)
    else:
        lines += [_decision(best, output, levers, today), "", *_downstream(rows)]
    lines += _faster_but_different(rows, best)
    lines += _records(output)
    lines += _per_seed(quality, keys, seeds)
    lines += _matched_not_measured() if generator == "matched" else _demo_tail(output, timing, levers, today)
    write_text_atomic(report, "\n".join(lines))
    write_text_atomic(json_path, json.dumps({"timing": timing, "rows": rows, "best": best["setting"]}, indent=1))


def _intro(generator: str, command: str, machine: str, timing: Dict, num_groups: int, seeds) -> List[str]:
    """The title, what was measured on which generator, the command, the machine and the quality rule."""
    if generator == "matched":
        head = ["# Generation levers on the matched generator", "",
                "PROTOCOL.md amendment 2's `matched` generator (the shipped generator's recipe and network, learned "
                "from the benchmark's 2 500 real Fashion-MNIST images only; built by `python "
                "benchmarks/matched_setting.py --setting matched`) with the demo's lambda grid (4 values) and no "
                "guidance. Today's sampler is amendment 2's registered one, the demo's before issue 43: DDIM, 8 "
                "steps, float32, 32 groups a forward pass. The levers are the samplers and precisions that "
                "[generation.md](generation.md) found fastest on the demo's generator; batch size, memory format "
                "and compile act on the network, which is the demo's, so they are not repeated here."]
        annotated = ("annotated as the matched setting annotates (its reference encoder, learned from its 2 500 real "
                     "images without their held-out tenth, s chosen on that tenth, the annotation checks)")
    else:
        head = ["# Generation at half its cost: each lever beside today's sampler", "",
                "The `demo` profile's generator (the shipped Fashion-MNIST one, `timm_csm/assets/generator-fmnist`, "
                "an epsilon-prediction UNet) with the demo's lambda grid (4 values) and no guidance. Today's sampler "
                "(the demo's default before these levers were measured): DDIM, 8 steps, float32, 32 groups a forward "
                "pass (the recipe's shards). Each lever changes one thing; *combined* changes the sampler and the "
                "precision together."]
        annotated = ("annotated as the demo annotates (the reference encoder learned without the held-out tenth of "
                     "the real training split, s chosen on that tenth, the annotation checks)")
    return head + [
        "", "Command:", "", f"    {command}", "",
        f"Machine: {machine}. **The machine was loaded**: two long benchmark jobs (one torch thread each) and "
        "another job ran on its 2 cores throughout, so the times are CPU times of this process "
        "(`time.process_time`, one torch thread), each the best of "
        f"{timing['rounds']} rounds of {timing['groups']} groups, every lever once per round in the same process, "
        "rounds interleaved; the ratios are the result, the absolute seconds are those of a loaded machine.", "",
        f"Quality: for each sampler setting, {num_groups} groups (each ordered class pair once) at each of "
        f"{len(seeds)} generation seeds, {annotated}. Measures: the "
        "pure-class images (lambda 0 and 1) recognised by their nearest real-class prototype, the share of groups "
        "the checks flag (lambda-hat not monotone, or a misread endpoint), the soft labels' mean confidence max_k "
        "q_k, the members' mean abs(lambda-hat - lambda), and the soft labels' mean total-variation distance to "
        "today's on the same groups (same seeds, same noise). Mean ± sd over the seeds. **Rule** (fixed before the "
        f"run): a setting's quality equals today's when each measure's mean lies within today's mean ± {BAND:g} sd "
        "(today's sd over the same seeds), or beyond it on the better side (more recognised, fewer flagged); "
        "(out) marks a measure outside. Batch size and memory format leave the images as today's (quality: "
        "today's). A dash: the setting's quality sets were not made in this run (timed only).", ""]


def _matched_findings(rows: List[Dict]) -> List[str]:
    """What the matched generator says of the demo's new sampler, with the downstream cells where they ran; the
    matched setting's own sampler is registered."""
    import sampler_downstream

    steps, spacing = sampler_downstream.SETTINGS["candidate"]
    name = f"ddim {steps} + {spacing} steps"
    row = next((r for r in rows if r["setting"] == name), None)
    lines = ["The `matched` setting's sampler stays amendment 2's registered one: its cells (amendments 2 and 4) "
             "read the sets it made, so its cost on [cost.md](cost.md) has no after column."]
    found = (sampler_downstream.decision(json.loads(sampler_downstream.RESULTS.read_text()), "matched_")
             if sampler_downstream.RESULTS.exists() else None)
    if found is None:
        downstream = "no downstream CSM cell checked it on this generator"
    else:
        ece = found[0]["val_ece"]
        downstream = (f"downstream, the protocol's CSM cell on its full set against today's set: validation ECE "
                      f"{interval_text(ece)} points, reported only "
                      "([sampler_downstream.md](sampler_downstream.md))")
    if row and row["quality"]:
        q = row["quality"]
        outside = [f"{heading} {'above' if q[m]['mean'] > q[m]['band'][1] else 'below'}"
                   for m, heading, _, _ in MEASURES if not q[m]["inside"]]
        lines.append(f"The demo's new sampler ({name}, chosen on the demo's generator by "
                     f"[sampler_downstream.md](sampler_downstream.md)) costs {row['ratio']:.2f}x today's CPU time per "
                     "group on this generator too; its quality here is "
                     + ("inside today's band on every measure" if not outside else
                        "outside today's band on " + ", ".join(outside)) + f"; {downstream}.")
    return [" ".join(lines), ""]


def _matched_not_measured() -> List[str]:
    return ["## Not measured here", "",
            "- a downstream CSM cell on this generator's sets of the other faster samplers;",
            "- batch size, memory format, compile and bfloat16 on a CPU without bfloat16 instructions: the network is "
            "the demo's ([generation.md](generation.md)).", ""]


def _demo_tail(output: Path, timing: Dict, levers, today) -> List[str]:
    return _compile(output, timing) + _avx2(output, levers, today) + [
        "The samplers and precision on PROTOCOL.md amendment 2's `matched` generator: "
        "[generation_matched.md](generation_matched.md).", "",
        "## Processes", "",
        "Not measured here: on a 2-core machine the demo already runs its generation with torch's 2 threads "
        "(`make demo`, `OMP_NUM_THREADS=2`); 2 processes of one thread each (`accelerate launch` of "
        "`timm-csm-generate`) divide the same CPU time between the cores, so they change the wall time, not the "
        "CPU seconds per group compared here. The machine was loaded, so a wall-time comparison of the two would "
        "measure the other jobs.", "",
        "## Not measured here", "",
        "- the downstream validation ECE of a CSM cell on the other faster sets (only DDIM 4 + trailing steps was "
        "checked, [sampler_downstream.md](sampler_downstream.md));",
        "- the `full` profile: its EDM network is sampled with EDM's Heun sampler in float64; these levers apply to a "
        "generator folder (the options refuse an EDM pickle);",
        "- bfloat16 / float16 (`--precision float16`) on a GPU: `python benchmarks/gpu_levers.py` times them and "
        "measures how far they move the demo generator's images, on the demo's generator and the full profile's; "
        "it has not run on a GPU yet.", ""]


def _decision(best: Dict, output: Path, levers, today) -> str:
    """The default the page supports, in one paragraph."""
    if best["ratio"] > 0.5:
        return ("No setting of equal quality by this rule reaches 0.5x. The levers are options (`--scheduler "
                "unipc`, `--timestep-spacing`, `--precision bfloat16` of `timm-csm-generate`; a profile's `mixing`).")
    avx2 = output / "timing_avx2.json"
    if "bfloat16" in best["setting"] and avx2.exists():
        t = json.loads(avx2.read_text())["s_per_group"]
        half = next(lever.name for lever in levers if lever.lever == "precision" and lever.precision == "bfloat16")
        return (f"**The `demo` profile's sampler stays today's**: the setting reaches 0.5x only through bfloat16, "
                f"which costs {t[half] / t[today.name]:.0f}x float32's time on a CPU without bfloat16 instructions "
                "(below), so as a default it would slow the demo there; `--precision bfloat16` is an option.")
    return f"The `demo` profile's default becomes {best['setting']} (the demo's numbers change with it)."


def _downstream(rows: List[Dict]) -> List[str]:
    """The downstream check of benchmarks/sampler_downstream.py, where it ran: the default it decided."""
    import sampler_downstream

    if not sampler_downstream.RESULTS.exists():
        return []
    found = sampler_downstream.decision(json.loads(sampler_downstream.RESULTS.read_text()))
    if found is None:
        return []
    intervals, passed = found
    steps, spacing = sampler_downstream.SETTINGS["candidate"]
    name = f"ddim {steps} + {spacing} steps"
    row = next(r for r in rows if r["setting"] == name)
    check = (f"the CSM classifier the demo trains on its set has a validation ECE of "
             f"{interval_text(intervals['val_ece'])} points against today's set's (margin +"
             f"{sampler_downstream.ECE_MARGIN}) and an accuracy of {interval_text(intervals['val_accuracy'])} "
             f"(margin -{sampler_downstream.ACCURACY_MARGIN}), over {intervals['val_ece'].n} paired seeds")
    if not passed:
        return [f"Checked downstream ([sampler_downstream.md](sampler_downstream.md), its rule fixed before the run): "
                f"{name} did not pass: {check}; the demo's sampler stays today's.", ""]
    q = row["quality"]
    outside = [(heading, side, "above" if q[m]["mean"] > q[m]["band"][1] else "below")
               for m, heading, side, _ in MEASURES if q and not q[m]["inside"]]
    where = "; ".join(f"{heading} {place}" + ("" if side else " (a measure the rule gives no better side)")
                      for heading, side, place in outside) or "none"
    return [f"**The `demo` profile's sampler is now {name}** ({row['ratio']:.2f}x today's CPU time per group; "
            f"outside today's band: {where}), checked downstream ([sampler_downstream.md](sampler_downstream.md), "
            "its rule fixed before the run): " + check + ".", ""]


def _faster_but_different(rows: List[Dict], best: Dict) -> List[str]:
    """The settings faster than the chosen one whose quality lies outside today's band, with the measures outside
    and on which side."""
    lines = []
    for r in sorted(rows, key=lambda r: r["s_per_group"]):
        q = r["quality"]
        if r["s_per_group"] >= best["s_per_group"] or not q or q["passes"]:
            continue
        out = [f"{heading} {'above' if q[m]['mean'] > q[m]['band'][1] else 'below'}"
               for m, heading, _, _ in MEASURES if not q[m]["inside"]]
        lines.append(f"- {r['setting']} ({r['ratio']:.2f}x): outside today's band on " + ", ".join(out) + ".")
    if not lines:
        return []
    return ["Faster, but outside today's quality band (the rule decides the default; a measure outside on the side "
            "the rule does not call better is a different set, not a worse one, until a downstream CSM cell "
            "compares them):", "", *lines, ""]


def _records(output: Path) -> List[str]:
    """The phases' records (commit, torch threads, CPU capability), or that the run kept none."""
    records = {p.stem[len("record_"):]: json.loads(p.read_text()) for p in sorted(output.glob("record_*.json"))}
    if not records:
        return ["Records: the phases of this run kept no record of their code version, threads or CPU capability "
                "(they ran before the script wrote one).", ""]
    return ["Records (each phase's code version, torch threads, CPU capability, instruction-set variables): "
            + "; ".join(f"{phase}: {r['commit']}{'' if r['clean'] else ' with changes'}, {r['torch_threads']} "
                        f"thread(s), {r['cpu_capability']}, {r['pins'] or 'no pins'}" for phase, r in records.items())
            + ".", ""]


def _per_seed(quality: Dict, keys, seeds) -> List[str]:
    lines = ["## Per seed", "", "| setting | seed | " + " | ".join(h for _, h, _, _ in MEASURES) + " |",
             "|---|---|" + "---|" * len(MEASURES)]
    for key in keys:
        if key not in quality:
            continue
        for i, seed in enumerate(seeds):
            vals = [f"{scale * quality[key][m]['values'][i]:.{1 if scale > 1 else 3}f}" for m, _, _, scale in MEASURES]
            lines.append(f"| {key} | {seed} | " + " | ".join(vals) + " |")
    return lines + [""]


def _avx2(output: Path, levers, today) -> List[str]:
    path = output / "timing_avx2.json"
    if not path.exists():
        return []
    t = json.loads(path.read_text())
    half = next(lever for lever in levers if lever.lever == "precision" and lever.precision == "bfloat16")
    fp32, bf16 = t["s_per_group"][today.name], t["s_per_group"][half.name]
    return ["## bfloat16 on a CPU without bfloat16 instructions", "",
            f"The same two settings with oneDNN held to AVX2 (`ONEDNN_MAX_CPU_ISA=AVX2`, `--phase avx2`: "
            f"{t['groups']} groups, one round after a warm-up): {today.name} {fp32:.3f} CPU-s per group, "
            f"{half.name} {bf16:.3f}, **{bf16 / fp32:.1f}x**. Without bfloat16 instructions (AVX512-BF16 or AMX) "
            "autocast to bfloat16 is emulated: the lever pays only on a CPU that has them, and costs many times "
            "float32's time on one that does not.", ""]


def _compile(output: Path, timing: Dict) -> List[str]:
    path = output / "compile.json"
    if not path.exists():
        return []
    c = json.loads(path.read_text())
    lines = ["## torch.compile", ""]
    if "error" in c:
        return lines + [f"`torch.compile` of the UNet failed: {c['error']}.", ""]
    gain = c["eager_s_per_group"] - c["compiled_s_per_group"]
    demo_groups = 3375
    pays = gain > 0 and c["compile_cpu_s"] < gain * demo_groups
    lines += [f"Today's network compiled (`unet.compile()`, default mode): compile time {c['compile_cpu_s']:.0f} "
              f"CPU-s (the first batch, compile workers included, less an eager batch); then "
              f"{c['compiled_s_per_group']:.4f} CPU-s per group against eager's {c['eager_s_per_group']:.4f} "
              f"({c['compiled_s_per_group'] / c['eager_s_per_group']:.2f}x), best of {c['rounds']} interleaved "
              f"rounds."]
    if gain > 0:
        lines.append(f"It pays after {c['compile_cpu_s'] / gain:.0f} groups; the demo generates {demo_groups}: "
                     f"{'it pays' if pays else 'it does not pay'} over a demo-sized generation.")
    else:
        lines.append("It gains nothing per group, so it never pays.")
    return lines + [""]
