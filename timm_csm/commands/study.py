"""``timm-csm-study``: a pre-registered calibration study from its spec file (:mod:`timm_csm.study`).

    timm-csm-study init study.toml --dataset fashion_mnist --model resnet18      # write a spec, print its power
    timm-csm-study plan study.toml                                               # the cells the spec runs
    timm-csm-study plan benchmarks/study_fmnist_a4.toml --cells benchmarks/cells_a4
    timm-csm-study run study.toml --output runs/study --lanes 2                  # run it: stage 1, choices, stage 2
    timm-csm-study run study.toml --output runs/study --executor ray --address auto   # each cell a Ray task
    timm-csm-study report benchmarks/study_fmnist_a2.toml --cells benchmarks/cells_a2    # the page, its JSON, figures
    timm-csm-study verify benchmarks/study_fmnist_a2.toml ce-s0 --cells benchmarks/cells_a2   # re-run one cell

``init`` writes amendment 2's design of ``benchmarks/PROTOCOL.md`` (its baselines and grids, CSM's coordinate-wise
search, 3 tuning seeds, CSM minus CE and minus the best other method under Holm) for a dataset, a real-image budget
and a timm model, then prints what its decision seeds resolve at ``--planning-sd``: the 95% half-width and the
smallest true difference detected with 80% power at the family-wise alpha and at Holm's strictest level
(:func:`timm_csm.study.decide.decision_power`).

``plan`` lists the spec's cells, one a line: the stage, ``done`` or ``ready``, and the cell's name as the calibration
benchmark names it (``<configuration>[-<setting>][-d<data seed>]-s<seed>``). Stage 1's search steps and stage 2's
cells are listed once the choices they need are made on the finished cells of ``--cells`` (folders of cell folders);
what still waits is listed last.

``run`` runs the spec's cells into ``--output`` (:func:`timm_csm.study.engine.run_study`): stage 1, each choice made
on the validation split, then stage 2, round by round until nothing is left that can run, on local worker processes
(``--lanes``, ``--threads`` torch threads each) or as Ray tasks (``--executor ray``, the ``[ray]`` extra). Killed at
any point, the same command resumes it. A spec changed after its first cell is refused unless the change is a dated
amendment appended to it. ``--generated SETTING=DIR`` and ``--teacher SETTING=DIR`` give the sets and the teacher
that CSM's and KD's cells read; where they are not given for ``matched``, ``run`` first builds that setting from the
cells' own training images (generator, generation, annotation; the spec's ``[settings.matched]``, each stage resumed
where it stopped: :mod:`timm_csm.study.settings`). ``--pin-instruction-set`` runs every cell as amendment 4's ran
(AVX2).

``report`` writes the study's page (:mod:`timm_csm.study.report`): markdown at ``--page`` (default: the spec's
``[report] page``, else ``<spec>.md`` beside it), its rows with every seed's numbers at ``<page>.json`` and the
decision figure beside it, from the finished cells alone (nothing re-runs). ``verify`` re-runs one committed cell
from its record on the current code and appends what it found (the commit, whether the tree was clean, every
difference) to the spec's verify log (``[report] verify_log``, else ``--log``): a verify record is only written
this way.
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import List, Optional, Sequence

from timm_csm.cli import HelpFormatter, console_command, exit_interrupted
from timm_csm.io import write_text_atomic
from timm_csm.study import load_spec, parse_spec
from timm_csm.study.cells import study_rows
from timm_csm.study.decide import decision_power
from timm_csm.study.executors import EXECUTORS, list_executors
from timm_csm.study.plan import plan_cells
from timm_csm.study.spec import StudySpec
from timm_csm.study.template import PLANNING_SD, template_text

__all__ = ["power_text", "plan_text", "build_parser", "main"]

#: the options of ``init`` alone
_INIT_ONLY = ("dataset", "model")


def power_text(spec: StudySpec) -> str:
    """What the spec's decision seeds resolve at its planning sd (``decision.planning_sd``), in one line."""
    d = spec.decision
    if d.planning_sd is None:
        raise ValueError("the spec states no decision.planning_sd, the paired sd its power assumes")
    p = decision_power(d.planning_sd, len(spec.seeds.decision), d.comparisons(), d.family_alpha, d.power)
    return (f"power: {p.n} decision seeds at paired sd {p.sd:g} give a 95% half-width of {p.half_width:.2f}; the "
            f"smallest true difference detected with {d.power:.0%} power is {p.detectable:.2f} at alpha {p.alpha:g} "
            f"and {p.detectable_strictest:.2f} at Holm's strictest level {p.strictest_alpha:g} ({d.comparisons()} "
            "primary comparisons)")


def plan_text(spec: StudySpec, cells_roots: Sequence[Path] = ()) -> str:
    """The plan of ``spec`` given the finished cells under ``cells_roots`` (:func:`timm_csm.study.cells.study_rows`):
    a summary line per stage, one line per cell (stage, status, name), then the pending lines."""
    cells, pending = plan_cells(spec, study_rows(spec, cells_roots))
    lines: List[str] = []
    for stage in (1, 2):
        found = [c for c in cells if c.stage == stage]
        done = sum(c.status == "done" for c in found)
        lines.append(f"stage {stage}: {len(found)} cell(s) known, {done} done, {len(found) - done} ready")
    lines += [f"{c.stage}  {c.status:5}  {c.name}" for c in cells]
    lines += [f"pending: {line}" for line in pending]
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="timm-csm-study", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("verb", choices=("init", "plan", "run", "report", "verify"),
                   help="init: write a spec; plan: list the spec's cells; run: run them; report: write the study's "
                        "page; verify: re-run one cell and log what differs")
    p.add_argument("spec", help="the study's spec file (TOML)")
    p.add_argument("cell", nargs="?", default=None, help="verify: the cell's name (its folder under --cells)")
    init = p.add_argument_group("init")
    init.add_argument("--dataset", default=None, help="the dataset (init; required there)")
    init.add_argument("--model", default=None, help="the timm model (init; required there)")
    init.add_argument("--recipe", default="demo", help="the recipe profile the classifier trains with")
    init.add_argument("--train-size", type=int, default=2500, help="the real-image budget: training images")
    init.add_argument("--val-size", type=int, default=2000, help="validation images, where every choice is made")
    init.add_argument("--data-seed", type=int, default=0, help="the seed of the real subset")
    init.add_argument("--settings", nargs="+", default=["matched"],
                      help="the generated sets the methods read (matched, annotated, borrowed)")
    init.add_argument("--tuning-seeds", type=int, default=3, help="stage 1's seeds: 0 .. N-1")
    init.add_argument("--decision-seeds", type=int, default=15, help="stage 2's seeds: 0 .. N-1")
    init.add_argument("--planning-sd", type=float, default=PLANNING_SD,
                      help="the paired sd (ECE points) the power statement assumes")
    init.add_argument("--force", action="store_true", help="overwrite an existing spec file")
    plan = p.add_argument_group("plan")
    plan.add_argument("--cells", nargs="+", type=Path, default=[], metavar="DIR",
                      help="folders of finished cell folders, whose choices decide the later cells")
    run = p.add_argument_group("run")
    run.add_argument("--output", type=Path, default=None, metavar="DIR",
                     help="the study's folder: <DIR>/cells/<cell>/ (run; required there)")
    run.add_argument("--executor", default="local", choices=list_executors(),
                     help="local: worker processes on this machine; ray: each cell a Ray task")
    run.add_argument("--lanes", type=int, default=1, help="cells run side by side (local; ray: a new local instance)")
    run.add_argument("--threads", type=int, default=1, help="torch threads of each cell (its numbers depend on it)")
    run.add_argument("--address", default=None, help="the Ray cluster's address (ray; default: a local instance)")
    run.add_argument("--gpus", type=float, default=0.0, help="GPUs of each cell's Ray task (ray)")
    run.add_argument("--pin-instruction-set", action="store_true",
                     help="run every cell with the instruction set pinned at AVX2 (as amendment 4's cells ran): the "
                          "same numbers on x86-64 machines of the same vendor with other vector units, not across "
                          "Intel and AMD (benchmarks/instruction_sets.md)")
    run.add_argument("--generated", nargs="+", type=_setting_path, default=[], metavar="SETTING=DIR",
                     help="each setting's generated CSM dataset, which CSM's configurations read and derive from "
                          "(matched: built from the cells' training images when not given)")
    run.add_argument("--teacher", nargs="+", type=_setting_path, default=[], metavar="SETTING=DIR",
                     help="each setting's teacher (a reference encoder folder), which KD reads")
    report = p.add_argument_group("report and verify (--cells: the folders of the cells, earlier ones first)")
    report.add_argument("--page", type=Path, default=None,
                        help="report: the page to write (default: the spec's [report] page, else <spec>.md)")
    report.add_argument("--log", type=Path, default=None,
                        help="verify: the log to append to (default: the spec's [report] verify_log)")
    return p


def _setting_path(text: str):
    setting, eq, path = text.partition("=")
    if not eq or not setting or not path:
        raise argparse.ArgumentTypeError(f"expected SETTING=DIR, got {text!r}")
    return setting, path


def _run(args: argparse.Namespace, argv: Sequence[str]) -> Optional[int]:
    from timm_csm.study.engine import run_study  # torch and the recipes: not for --help

    if args.output is None:
        raise ValueError("run needs --output DIR, the study's folder")
    options = {"lanes": args.lanes, "threads": args.threads}
    takes = EXECUTORS.get(args.executor).own_options  # the options of the executor's own flags
    options.update({name: getattr(args, name) for name in takes})
    for name, cls in EXECUTORS.items():
        given = [f"--{o}" for o in cls.own_options if o not in takes and getattr(args, o) not in (None, False, 0)]
        if given:
            raise ValueError(f"{' and '.join(given)} belong to --executor {name}")
    sources: dict = {}
    for key, pairs in (("soft", args.generated), ("teacher", args.teacher)):
        for setting, path in pairs:
            sources.setdefault(setting, {})[key] = path
    again = " ".join(["timm-csm-study", *map(shlex.quote, argv)])  # the same command, its options included
    print(f"study {args.spec}: cells in {args.output / 'cells'} (stopped at any point, `{again}` resumes it)")
    try:
        done = run_study(args.spec, args.output, args.executor, options, sources,
                         pin_instruction_set=args.pin_instruction_set)
    except KeyboardInterrupt:
        exit_interrupted(f"the finished cells are in {args.output / 'cells'}; `{again}` resumes the study")
    print(f"ran {done.ran} cell(s); {done.done} of the {done.known} known are done, in {done.output / 'cells'}")
    for why in sorted(set(done.blocked.values())):
        names = sorted(name for name, reason in done.blocked.items() if reason == why)
        print(f"not run: {len(names)} cell(s) ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''}): {why}")
    for line in done.pending:
        print(f"pending: {line}")
    print(f"an amendment appended to the spec runs with the same command ({again}); "
          f"next: timm-csm-study plan {args.spec} --cells {args.output / 'cells'}")
    if done.blocked:  # a study with cells that cannot run has not reached its decision: not a success
        print(f"incomplete: {len(done.blocked)} cell(s) cannot run (above); the study's decision is not reached")
        return 1
    return None


def _init(args: argparse.Namespace) -> None:
    missing = [f"--{k}" for k in _INIT_ONLY if getattr(args, k) is None]
    if missing:
        raise ValueError(f"init needs {' and '.join(missing)}")
    path = Path(args.spec)
    if path.exists() and not args.force:
        raise ValueError(f"{path} exists: a spec is not overwritten once written (--force to do so)")
    text = template_text(f"{args.dataset}-{args.model}", args.dataset, args.model, args.recipe, args.train_size,
                         args.val_size, args.data_seed, args.settings, range(args.tuning_seeds),
                         range(args.decision_seeds), args.planning_sd)
    spec = parse_spec(text)  # what is written reads back: a bad flag is refused before the file exists
    write_text_atomic(path, text)
    print(f"wrote {path}: {len(spec.methods)} methods and CSM's search over {', '.join(spec.settings)}")
    print(power_text(spec))
    print(f"next: timm-csm-study plan {path}")


def _report(spec: StudySpec, path: Path, args: argparse.Namespace) -> None:
    from timm_csm.study.report import write_report

    if not args.cells:
        raise ValueError("report needs --cells: the folders of the study's finished cell folders")
    page = args.page or path.parent / (spec.report.page or f"{path.stem}.md")
    write_report(spec, args.cells, page, base=path.parent)
    print(f"wrote {page} and {page.with_suffix('.json')} from the cells under {', '.join(map(str, args.cells))}")
    print(f"next: timm-csm-study verify {path} CELL --cells {' '.join(map(str, args.cells))}  (re-run one cell)")


def _verify(spec: StudySpec, path: Path, args: argparse.Namespace) -> None:
    from timm_csm.study.cells import verify_and_log

    if not args.cells:
        raise ValueError("verify needs --cells: the folders that hold the committed cell")
    log = args.log or (path.parent / spec.report.verify_log if spec.report.verify_log else None)
    if log is None:
        raise ValueError("verify needs a log to append to: --log, or verify_log in the spec's [report] table")
    text, reproduced = verify_and_log(args.cell, args.cells, log)
    print(text)
    print(f"appended to {log}: {args.cell} {'reproduced' if reproduced else 'differs'}")
    print(f"next: timm-csm-study report {path} --cells {' '.join(map(str, args.cells))}")


@console_command("timm-csm-study", build_parser)
def main(argv: Optional[Sequence[str]] = None) -> Optional[int]:
    """``timm-csm-study``: bad input (a spec that does not validate, a missing flag) is one line and exit status 2."""
    args = build_parser().parse_args(argv)
    if args.verb == "init":
        _init(args)
        return
    given = [f"--{k}" for k in _INIT_ONLY if getattr(args, k) is not None]
    if given:
        raise ValueError(f"{' and '.join(given)} belong to init; {args.verb} reads the spec")
    if (args.cell is not None) != (args.verb == "verify"):
        raise ValueError("verify needs the cell's name after the spec" if args.verb == "verify" else
                         f"{args.verb} takes the spec alone; a cell name belongs to verify")
    if args.verb == "run":
        return _run(args, sys.argv[1:] if argv is None else argv)
    if args.verb in ("report", "verify"):
        (_report if args.verb == "report" else _verify)(load_spec(args.spec), Path(args.spec), args)
        return
    print(plan_text(load_spec(args.spec), args.cells), end="")


if __name__ == "__main__":
    raise SystemExit(main())
