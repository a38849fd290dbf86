"""What CSM costs beside CE, stage by stage: the CPU seconds of each stage of a `make demo` pipeline run (from each
stage's ``DONE.json``), and of amendment 2's ``matched`` setting (its build record and its cells), with the ratio of
CSM's whole cost to CE's.

    # one demo run per code version, each from a clean checkout of that version, nothing else running
    OMP_NUM_THREADS=2 python -m timm_csm.commands.pipeline --profile demo --output runs/demo
    # record a run (its stages' seconds and the commit of the checkout it ran in) under a label, then the page
    python benchmarks/cost.py --record before=CHECKOUT/runs/demo
    python benchmarks/cost.py --report

Records go to ``benchmarks/cost.json`` (committed; the runs themselves stay outside git); the page is
``benchmarks/cost.md``, written from that file, the matched setting's build record ``benchmarks/settings_a2.json`` and
amendment 2's committed cells.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from timm_csm.io import write_json_atomic, write_text_atomic
from timm_csm.recipes.cache import MARKER
from timm_csm.recipes.cells import read_json
from timm_csm.study.report_cost import BUILD_STAGES, cell_seconds, set_costs

ROOT = Path(__file__).resolve().parent.parent
RECORDS = ROOT / "benchmarks" / "cost.json"
PAGE = ROOT / "benchmarks" / "cost.md"
BUILDS = ROOT / "benchmarks" / "settings_a2.json"
CELLS_A2 = ROOT / "benchmarks" / "cells_a2"
#: the demo's stages, in order, and the path each belongs to: CE's classifier, or what CSM adds (the generated set,
#: the reference encoder that annotates it, the annotation's checks, the annotation, CSM's classifier)
DEMO_STAGES = (("train-ce", "ce"), ("generated", "csm"), ("encoder", "csm"), ("quality", "csm"),
               ("annotated", "csm"), ("train-csm", "csm"))


def demo_run(folder: Path) -> Dict[str, Any]:
    """A pipeline run's stages (``{stage: {"seconds", "cpu_seconds"}}``, from each ``DONE.json``) and the commit of
    the checkout it ran in, with whether its tracked files were clean."""
    folder = Path(folder).resolve()
    stages: Dict[str, Dict[str, Optional[float]]] = {}
    for marker in sorted(folder.glob(f"*/{MARKER}")):
        name = marker.parent.name.rsplit("-", 1)[0]
        done = read_json(marker)
        stages[name] = {"seconds": done.get("seconds"), "cpu_seconds": done.get("cpu_seconds")}
    missing = [name for name, _ in DEMO_STAGES if name not in stages]
    if missing:
        raise SystemExit(f"{folder}: no finished stage {', '.join(missing)} (run the demo pipeline to its end first)")

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True,
                              check=True).stdout.strip()

    return {"commit": git("rev-parse", "HEAD"), "clean": git("status", "--porcelain", "--untracked-files=no") == "",
            "stages": stages}


def _total(run: Dict[str, Any], path: str, key: str) -> float:
    return sum(run["stages"][name][key] for name, belongs in DEMO_STAGES if belongs == path)


def _ratio(last: Dict[str, Any], first: Dict[str, Any], stage: str) -> float:
    return last["stages"][stage]["cpu_seconds"] / first["stages"][stage]["cpu_seconds"]


def demo_lines(records: Dict[str, Dict[str, Any]]) -> List[str]:
    labels = list(records)
    lines = ["## `make demo`", "",
             "One pipeline run per code version (`OMP_NUM_THREADS=2 python -m timm_csm.commands.pipeline --profile "
             "demo`, the shipped generator, so no generator training), CPU seconds of each stage (all threads of the "
             "process), wall seconds in brackets.", "",
             "| stage | path | " + " | ".join(f"{label} (`{records[label]['commit'][:7]}`"
                                              f"{'' if records[label]['clean'] else ', changes'})" for label in labels)
             + " |", "|---|---|" + "---:|" * len(labels)]
    for name, path in DEMO_STAGES:
        cells = []
        for label in labels:
            stage = records[label]["stages"][name]
            cells.append(f"{stage['cpu_seconds']:.0f} ({stage['seconds']:.0f})")
        lines.append(f"| {name} | {path.upper()} | " + " | ".join(cells) + " |")
    for what, key in (("CSM's whole path / CE", "cpu_seconds"), ("CSM's classifier alone / CE", None)):
        values = []
        for label in labels:
            run = records[label]
            ce = run["stages"]["train-ce"]["cpu_seconds"]
            csm = _total(run, "csm", key) if key else run["stages"]["train-csm"]["cpu_seconds"]
            values.append(f"{csm / ce:.1f}x")
        lines.append(f"| **{what}** | | " + " | ".join(values) + " |")
    if len(labels) >= 2:
        first, last = records[labels[0]], records[labels[-1]]
        lines += ["", f"{labels[-1]} / {labels[0]}: generation "
                  f"{_ratio(last, first, 'generated'):.2f}x, "
                  f"CSM's whole path {_total(last, 'csm', 'cpu_seconds') / _total(first, 'csm', 'cpu_seconds'):.2f}x "
                  "(CPU seconds). CE's stage does the same work in every run (its recipe and seed are unchanged, so "
                  f"are its numbers): its {_ratio(last, first, 'train-ce'):.2f}x is how much slower the machine ran "
                  "that run, which the ratios to CE divide out and the ratios between runs do not."]
    return lines


def matched_lines() -> List[str]:
    """Amendment 2's ``matched`` setting: its build stages and the mean cell of CE and of CSM."""
    built = set_costs(BUILDS).get("matched", {})
    seconds: Dict[str, List[float]] = {"ce": [], "csm": []}
    kinds = set()
    for folder in sorted(CELLS_A2.iterdir()):
        meta = read_json(folder / "cell.json")
        method = meta["method"].split("@", 1)[0]
        if method in seconds and meta.get("setting") in (None, "matched"):
            value, kind = cell_seconds(meta)
            if value is not None:
                seconds[method].append(value)
                kinds.add(kind)
    ce, csm = statistics.mean(seconds["ce"]), statistics.mean(seconds["csm"])
    build = sum(built.get(stage, 0.0) for stage, _ in BUILD_STAGES)
    lines = ["", "## Amendment 2's `matched` setting (before)", "",
             "The build record of the generated set ([settings_a2.json](settings_a2.json), whose seconds are, in "
             f"its words, \"{read_json(BUILDS)['seconds']}\") and amendment 2's cells ({', '.join(sorted(kinds))} "
             "seconds; "
             f"`benchmarks/cells_a2`, one thread each; mean over {len(seconds['ce'])} CE and {len(seconds['csm'])} "
             "CSM cells of every configuration).", "",
             "| stage | path | seconds |", "|---|---|---:|"]
    lines += [f"| {label} | CSM | {built[stage]:.0f} |" for stage, label in BUILD_STAGES if stage in built]
    lines += [f"| CE cell | CE | {ce:.0f} |", f"| CSM cell | CSM | {csm:.0f} |",
              f"| **CSM's whole path / CE** (one classifier: the set built for it alone) | | "
              f"{(build + csm) / ce:.1f}x |",
              f"| **CSM's classifier alone / CE** | | {csm / ce:.1f}x |", "",
              f"The set is built once and read by every CSM cell of the setting ({built.get('images') or '?'} "
              "images): over the study's CSM cells its cost is shared.", "",
              "No *after* column: no stage of this setting changed. Its sampler (DDIM, 8 steps) is amendment 2's "
              "registered spec. The faster sampler the demo now uses was checked downstream on the demo's shipped "
              "generator only ([sampler_downstream.md](sampler_downstream.md)); on the `matched` generator its "
              "generation time and quality measures beside today's are on [generation_matched.md]"
              "(generation_matched.md), and a downstream check, reported only, on the same page as the demo's."]
    return lines


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    verb = p.add_mutually_exclusive_group(required=True)
    verb.add_argument("--record", nargs="+", metavar="LABEL=RUN", help="record demo pipeline runs under labels")
    verb.add_argument("--report", action="store_true", help=f"write {PAGE.name} from {RECORDS.name}")
    args = p.parse_args(argv)
    records = read_json(RECORDS) if RECORDS.exists() else {}
    if args.record:
        for item in args.record:
            label, sep, folder = item.partition("=")
            if not sep or not label:
                raise SystemExit(f"--record takes LABEL=RUN, got {item!r}")
            records[label] = demo_run(Path(folder))
        write_json_atomic(RECORDS, records, indent=1)
        print(f"recorded {', '.join(r.partition('=')[0] for r in args.record)} in {RECORDS}")
        return
    if not records:
        raise SystemExit(f"no runs recorded in {RECORDS}: --record LABEL=RUN first")
    lines = ["# What CSM costs beside CE", "",
             "    python benchmarks/cost.py --report   # from benchmarks/cost.json (recorded with --record)", ""]
    write_text_atomic(PAGE, "\n".join(lines + demo_lines(records) + matched_lines()) + "\n")
    print(f"wrote {PAGE}")


if __name__ == "__main__":
    main()
