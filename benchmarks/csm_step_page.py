"""The page of ``benchmarks/csm_step.py``: ``benchmarks/csm_step.md`` from the numbers in
``benchmarks/csm_step.json``."""
from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "csm_step.json"
PAGE = ROOT / "csm_step.md"
VARIANTS = ("two-pass", "concat")


def _seed_section(results: dict) -> list:
    from timm_csm.metrics.paired import interval_text, mean_std, paired_t_interval

    runs = {v: results.get(f"seeds_{v}") for v in VARIANTS}
    if not all(runs.values()):
        return ["(b) not measured yet: run the `seeds` part for both variants."]
    epochs = runs[VARIANTS[0]]["epochs"]
    rows = {v: runs[v]["rows"] for v in VARIANTS}
    seeds = sorted(set(rows["two-pass"]) & set(rows["concat"]), key=int)
    out = [f"(b) The demo's CSM recipe at {epochs} epochs (the demo trains 60, over 20 minutes a run on this loaded "
           f"machine; the learning-rate steps keep their share of the run), seeds {', '.join(seeds)}, each variant "
           "from the same seed (same real subset, initialisation, batches and companions); validation split (250 "
           "images), before temperature scaling, in %:", "",
           "| seed | two-pass acc | concat acc | two-pass ECE | concat ECE |", "|---|---|---|---|---|"]
    for seed in seeds:
        a, b = rows["two-pass"][seed], rows["concat"][seed]
        out.append(f"| {seed} | {100 * a['val_accuracy']:.2f} | {100 * b['val_accuracy']:.2f} | "
                   f"{100 * a['val_ece']:.2f} | {100 * b['val_ece']:.2f} |")
    out.append("")
    for key, name in (("val_accuracy", "accuracy"), ("val_ece", "ECE"),
                      ("val_ece_after_ts", "ECE after temperature scaling (fitted on the same 250 images)")):
        per = {v: {sd: 100 * rows[v][sd][key] for sd in seeds} for v in VARIANTS}
        spread = ", ".join(f"{v} {m:.2f} ± {sd_:.2f}" for v in VARIANTS
                           for m, sd_ in [mean_std(list(per[v].values()))] if sd_ is not None)
        interval = paired_t_interval(per["concat"], per["two-pass"])
        out.append(f"* {name}: {spread}; paired difference concat - two-pass {interval_text(interval)} points "
                   "(95% t-interval over the seeds)")
    return out


def _step_section(results: dict) -> list:
    step, data = results.get("step"), results.get("data")
    if not step or not data:
        return ["(a), (c) not measured yet: run the `step` part."]
    out = [f"(a) One optimizer step of the demo's model (`small_cnn`, widths 16-256) on one demo batch: "
           f"{step['real_batch']} real images and their {step['companions']} companions (n_aug 1), forward, "
           f"backward, gradient-norm clip and SGD; CPU seconds, {step['rounds']} interleaved rounds:", "",
           "| forward | best (s) | median (s) |", "|---|---|---|"]
    for v in VARIANTS:
        out.append(f"| {v} | {step[f'{v}_best']:.4f} | {step[f'{v}_median']:.4f} |")
    low, high = step["ratio_range"]
    out += ["", f"concat / two-pass: {step['ratio_best']:.2f} (best against best), "
            f"{step['ratio_median_of_rounds']:.2f} (median of the rounds' ratios; range {low:.2f}-{high:.2f}). "
            "Both forms do the same arithmetic; on this CPU one forward over the 3x larger batch costs more than two "
            "smaller ones, as [train.md](train.md) found for a CE step at 3x the batch.", "",
            "(c) The demo's training loader against the step, over two epochs of batches (CPU seconds per step, "
            "medians; wall seconds where the step waits):", "",
            "| loader workers | steps | `next(loader)` CPU (s) | of which companions' Arrow reads + PNG decoding (s) "
            "| step CPU (s) | loader share of CPU | `next(loader)` wall, median / max (s) |",
            "|---|---|---|---|---|---|---|"]
    for workers, d in sorted((k, v) for k, v in data.items() if k.isdigit()):
        decode = f"{d['decode_median']:.4f}" if "decode_median" in d else "(in the worker)"
        out.append(f"| {workers} | {d['steps']} | {d['load_median']:.4f} | {decode} | {d['step_median']:.4f} | "
                   f"{100 * d['load_share']:.1f}% | {d['wall_load_median']:.3f} / {d['wall_load_max']:.3f} |")
    inline, worker = data["0"], data["1"]
    out += ["", f"With the demo's 0 workers every step waits for its batch, built in the training process between two "
            f"steps: {inline['load_median']:.3f} CPU-seconds a step, {100 * inline['load_share']:.1f}% of the "
            f"training CPU time, of which the companions' Arrow reads and PNG decoding are "
            f"{inline['decode_median']:.3f} s ({100 * inline['decode_share']:.1f}%); the rest is the real batch, the "
            "companion draw, stacking and the crop + flip of both. With one worker the batch is built beside the "
            f"step, which keeps up (the loader's work is {inline['load_median'] / inline['step_median']:.2f}x the "
            f"step's): the step waits {worker['wall_load_median']:.3f} s (median) for the batch to arrive; the "
            f"longest wait, {worker['wall_load_max']:.2f} s, is the first batch of an epoch, when the worker starts. "
            "So no step needs to wait on data where a core is free for a worker (`--workers 1`); the demo keeps 0 "
            "workers, since on 2 cores its training runs 2 torch threads and a worker would take one of them (not "
            "measured on a quiet machine), and a changed default would change the demo's and the benchmark cells' "
            "training configurations."]
    return out


def _encoder_section(results: dict) -> list:
    enc = results.get("encoder")
    if not enc:
        return ["Not measured yet: run the `encoder` part."]
    stages, fwd = enc["stages"], enc["forward"]
    total = sum(stages.values())
    out = ["The demo's stage seconds, from each stage's `DONE.json` (`runs/demo/<stage>-<key>/DONE.json`, the run of "
           "[demo.md](demo.md): 2 threads, nothing else running):", "", "| stage | s | share |", "|---|---|---|"]
    for name, sec in stages.items():
        out.append(f"| {name} | {sec:.1f} | {100 * sec / total:.1f}% |")
    out.append(f"| all stages | {total:.1f} | 100% |")
    out += ["", f"The reference encoder's forward (`encode_images`, as the prototypes' and the annotation's passes "
            f"call it) over {fwd['images']} real training images, CPU time, best of {fwd['rounds']} interleaved "
            "rounds; ratio: CPU seconds against the default (batch 256, float32):", "",
            "| batch | precision | images per CPU-second | CPU time / default |", "|---|---|---|---|"]
    for r in fwd["rows"]:
        out.append(f"| {r['batch_size']} | {r['precision']} | {r['images_per_cpu_second']:.0f} | {r['ratio']:.2f} |")
    agree = fwd["agreement"]["bfloat16"]
    out += ["", f"bfloat16 autocast against float32 (batch 256): features differ by up to "
            f"{100 * agree['max_relative_error']:.2f}% (relative L2), the encoder's class agrees on "
            f"{100 * agree['same_class']:.2f}% of the images."]
    rows = {(r["batch_size"], r["precision"]): r for r in fwd["rows"]}
    bf16, rate = rows[(256, "bfloat16")]["ratio"], rows[(256, "float32")]["images_per_cpu_second"]
    annotated, encoder, quality = (stages.get(k, 0.0) for k in ("annotated", "encoder", "quality"))
    others = " and ".join(f"batch {b} takes {r['ratio']:.2f}x" for (b, p), r in rows.items()
                          if p == "float32" and b != 256)
    pays = all(r["ratio"] > 0.95 for (b, p), r in rows.items() if p == "float32")
    batches = f"{others} the default batch 256's CPU time{' (no batch size pays beyond the noise)' if pays else ''}"
    out += ["", f"Annotation and the reference encoder take {annotated + encoder:.1f} s of the demo's {total:.0f} s "
            f"({100 * (annotated + encoder) / total:.1f}%; with the generator's quality check "
            f"{100 * (annotated + encoder + quality) / total:.1f}%): the encoder's training {encoder:.1f} s, the "
            f"annotation {annotated:.1f} s (the encoder's passes over the 60 000 real training images, the "
            "prototypes' 54 000 and the 6 000 held out that choose s, and over the 13 500 generated images: at the "
            f"float32 rate above, 73 500 forwards are about {73500 / rate:.0f} CPU-seconds, most of the stage). "
            f"In float32, {batches}; bfloat16 autocast takes {bf16:.2f}x the default's CPU time, so it would save "
            f"at most about {(1 - bf16) * annotated:.1f} s of the annotation stage "
            f"({100 * (1 - bf16) * annotated / total:.1f}% of the demo)."]
    step = enc.get("train_step")
    if step:
        saved = (1 - step["ratio"]) * encoder
        out += ["", f"The reference encoder's training step (its `encoder` stage: batch {step['batch_size']}, AdamW, "
                f"channels-last), CPU time, best of {step['rounds']} interleaved rounds: float32 "
                f"{step['float32_best']:.4f} s, bfloat16 autocast {step['bfloat16_best']:.4f} s "
                f"({step['ratio']:.2f}x): at most about {saved:.0f} s of the encoder stage "
                f"({100 * saved / total:.1f}% of the demo)."]
    out += ["", "Neither lever changes a default: bfloat16 changes the features (above), so the soft labels, the "
            "flagged groups and the generated set's digest would change, and equal annotation was not shown; the "
            "time either saves is under 2% of the demo, whose cost is the generation (issue 43, item 1) and the CSM "
            "training."]
    return out


def _decision(results: dict) -> list:
    """The issue's rule: two passes stay the default unless concat is equal within the spread (its paired ECE
    interval holds 0) and cheaper."""
    from timm_csm.metrics.paired import paired_outcome, paired_t_interval

    step, runs = results.get("step"), [results.get(f"seeds_{v}") for v in VARIANTS]
    if not step or not all(runs):
        return []
    ece = {v: {sd: r["val_ece"] for sd, r in run["rows"].items()} for v, run in zip(VARIANTS, runs)}
    interval = paired_t_interval(ece["concat"], ece["two-pass"])
    equal = interval is not None and paired_outcome(interval) == "none"
    cheaper = step["ratio_best"] < 1.0 and step["ratio_median_of_rounds"] < 1.0
    shown = (f"not shown to differ from the two passes' (the paired interval over {interval.n} seeds holds 0, "
             f"{100 * interval.low:+.2f} to {100 * interval.high:+.2f} points)" if equal else
             f"different from the two passes' ({100 * interval.low:+.2f} to {100 * interval.high:+.2f} points)")
    verdict = ("concat is equal within the spread and cheaper: it could become the default" if equal and cheaper else
               f"two passes stay the default: concat is {'not cheaper' if not cheaper else 'cheaper'} on this CPU "
               f"({step['ratio_best']:.2f}x the two passes' CPU time per step) and its validation ECE is {shown}")
    return ["## Decision", "", f"By the issue's rule (keep two passes unless one forward is equal within the spread): "
            f"{verdict}. `--csm-forward concat` stays an option (`timm-csm-train --help`). What it changes is the "
            "normalisation during training: each image is normalised by the statistics of the real and generated "
            "images together instead of its own batch's; the running averages the evaluation uses see the generated "
            "images in both forms (two passes update them once per pass). No GPU was lent for this measurement: "
            "there, where a step is bound by kernel launches rather than arithmetic, one forward may pay; it is not "
            "measured here.", ""]


def _records(results: dict) -> str:
    seen = sorted({f"{r['commit']}{'' if r['clean'] else '+changes'}, torch {r['torch']}, {r['torch_threads']} "
                   f"thread, {r['cpu_capability']}" for r in (v.get("record") for v in results.values()
                                                             if isinstance(v, dict)) if r})
    return "; ".join(seen) or "not recorded"


def write_page() -> None:
    from timm_csm.io import write_text_atomic

    results = json.loads(RESULTS.read_text())
    seeds = " ".join(sorted(results.get(f"seeds_{VARIANTS[0]}", {}).get("rows", {}), key=int))
    lines = ["# The CSM step and the annotation's share (issue 43, items 2 and 3)", "",
             "Commands (from the repository root; `DEMO_RUN` is the folder of a `timm-csm-pipeline --profile demo` "
             "run, here `runs/demo` of the run [demo.md](demo.md) reports; `DEMO_SET` is its CSM set, "
             "`DEMO_RUN/annotated-<key>/csm-fmnist-aug`, 9 588 images):", "",
             *(f"    OMP_NUM_THREADS=1 python benchmarks/csm_step.py seeds --csm-dataset DEMO_SET --variant {v} "
               f"--epochs 20 --seeds {seeds}" for v in VARIANTS),
             "    OMP_NUM_THREADS=1 python benchmarks/csm_step.py step --csm-dataset DEMO_SET",
             "    OMP_NUM_THREADS=1 python benchmarks/csm_step.py encoder --demo-run DEMO_RUN",
             "    python benchmarks/csm_step.py page", "",
             "Machine: 2-core AMD EPYC (AVX-512 with BF16), CPU only, torch 2.14.1, one torch thread per process. "
             "**The machine was loaded**: two long benchmark jobs held both cores and other jobs ran beside them "
             "(load average 6-10), and the two `seeds` processes ran at once. Times are CPU time "
             "(`time.process_time`), the variants timed in interleaved rounds in one process; wall times are "
             "inflated several-fold. The numbers are in [csm_step.json](csm_step.json), each part with its record "
             f"(commit, torch, threads, CPU capability: {_records(results)}).", "",
             "## The CSM step: two passes against one concatenated forward", "",
             "`--csm-forward two-pass` (the default, the paper's) runs the real batch, then its generated companions: "
             "batch norm normalises each batch by its own statistics. `--csm-forward concat` runs both in one forward "
             "over their concatenation: one call of the classifier, batch-norm statistics over real and generated "
             "images together. The loss is the same function of the two sets of logits; without batch norm in "
             "training mode both give the same loss (`tests/test_training_tasks.py`).", ""]
    lines += _step_section(results) + [""] + _seed_section(results) + [""] + _decision(results)
    lines += ["## Annotation and the reference encoder: their share of the demo's time", ""] + _encoder_section(results)
    write_text_atomic(PAGE, "\n".join(lines) + "\n")
    print(f"wrote {PAGE}")
