"""Calibration benchmark: CSM against the calibration baselines and controls on Fashion-MNIST, before and after
temperature scaling; the command line over the method table (``calibration_methods.py``), the library's cells and
derived sets, and the pages (``calibration_pages.py``, ``calibration_protocol_page.py``).

Every method trains the same backbone with the same recipe (``--recipe``) on the same real images, for several
training seeds. ``matched`` and ``borrowed`` are the two settings of ``benchmarks/PROTOCOL.md`` (their generated
sets and reference encoders built by ``benchmarks/matched_setting.py`` under ``runs/settings/<setting>/``), on the
page ``benchmarks/calibration.md``; ``augmented`` and ``noaug`` reproduce the earlier benchmark's pages. Amendment 2
(``--amendment 2 --recipe matched / annotated / borrowed``) names its configurations ``<method>@<axis>=<value>,...``;
CSM's data axes derive the set it reads (:func:`timm_csm.recipes.derive.resolve_data_key`), each written once under
``--output``; ``--data-seed N`` (stage 5) names its cells ``<method>[-<setting>]-d<N>-s<seed>``.

Each (method, seed) cell is one :func:`timm_csm.training.run` into ``<output>/cells/<cell>/``, cached by its options
and resumable (:mod:`timm_csm.recipes.cells`), so the benchmark runs in pieces (``--max-cells``). Finished cells
are committed under ``benchmarks/cells/`` (``benchmarks/cells_a2/`` with their record) and never re-run;
``--verify CELL`` re-runs one on the current code. The hard-label, filtered, real-copies and boundary rows read sets
derived from the setting's (:mod:`timm_csm.recipes.derive`), written once under ``--output``.

    python benchmarks/matched_setting.py --setting matched       # the generated sets (hours, resumable)
    python benchmarks/calibration_bench.py --recipe matched      # all cells of a setting (hours; resumable)
    python benchmarks/calibration_bench.py --recipe matched --methods ce csm --max-cells 3
    python benchmarks/calibration_bench.py --report-only         # re-assemble the page only
    python benchmarks/calibration_bench.py --amendment 2 --recipe matched --methods csm@s=2.3 --seeds 0
    python benchmarks/calibration_bench.py --verify csm@s=2.3-matched-s0
"""
from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import calibration_pages as pages
import calibration_protocol_page as protocol_page
from calibration_methods import (A2_ANNOTATORS, A2_OUTPUT, A2_SETTINGS, A2_TUNING_SEEDS, A2_VERIFY_LOG,
                                 A4_OUTPUT, A4_SETTINGS, A4_VERIFY_LOG, BOUNDARY_SETS, COMMITTED_A2, COMMITTED_A4,
                                 a4_recipe, COMMITTED_CELLS, CONTROLS, CSM_VARIANTS, DEFAULT_JSON,
                                 DEFAULT_OUTPUTS, DEFAULT_REPORTS, DERIVED, METHODS, PROTOCOL_METHODS,
                                 PROTOCOL_RECIPES, PROTOCOL_SEEDS, RECIPES, SETTINGS_ROOT, VOLUMES, base_recipe,
                                 cell_config, cell_name, every_seed, get_method, plan_cells, stage1_methods,
                                 volume_dataset)
from timm_csm.hub import csm_dataset_problem
from timm_csm.recipes import derive
from timm_csm.recipes.cells import cell_state, instruction_set_problem, run_cell, verify_and_log

__all__ = ["prepare_cells", "run_cells", "build_parser", "main"]

#: the repository whose commit a cell's record names: the one this script runs from
REPO = Path(__file__).resolve().parent


def _resolve_boundary_sets(kinds, output: Path, setting: Optional[str], committed: Optional[Path],
                           csm_paths: Dict[str, str], blocked: Dict[str, str]) -> None:
    """The boundary study's sets, in the variant of the setting's decision row, which the validation rule chooses
    once both CSM variants have every seed (their cells run first)."""
    summary = (protocol_page.protocol_summary(protocol_page.protocol_cells(output, setting, committed), setting)
               if setting else None)
    if summary is None or not every_seed(summary["rows"], CSM_VARIANTS):
        for kind in kinds:
            blocked[kind] = "the decision row (csm or csm_filtered) is chosen once both have every seed"
        return
    variant = METHODS[summary["csm"]].csm
    for kind in sorted(kinds):
        generated, fraction = BOUNDARY_SETS[kind]
        if generated is None:
            source = csm_paths.get(variant)
            if source is None:
                blocked[kind] = blocked.get(variant, f"the {variant} CSM dataset is not available")
                continue
        else:
            source = str(SETTINGS_ROOT / generated / "csm" / "csm-fmnist-aug")
            problem = csm_dataset_problem(source)
            if problem is not None:
                blocked[kind] = f"CSM dataset {source!r} not available ({problem})"
                continue
            if variant == "filtered":
                source = str(derive.derive_filtered_dataset(source, output / f"csm-filtered-{generated}"))
        csm_paths[kind] = (source if fraction == 1.0 else
                           str(derive.derive_group_subset(source, output / f"csm-{kind}-{setting}", fraction)))


def _generated_sets(recipe: Dict[str, Any], specs, output: Path, csm_dataset: Optional[str],
                    csm_dataset_hard: Optional[str], setting: Optional[str], committed: Optional[Path],
                    volume_datasets: Optional[Dict[int, str]], annotator: Optional[str]
                    ) -> Tuple[Dict[str, str], Dict[str, str]]:
    """``(paths, blocked)``: the folder of every generated set ``specs`` read, by data key, derived where needed,
    and why each set that cannot be had is missing."""
    csm_paths: Dict[str, str] = {}
    blocked: Dict[str, str] = {}
    kinds = {m.csm for m in specs} - {None}
    filtered_needed = any(dict(m.derive).get("filtered") for m in specs)
    if kinds & {"soft", *DERIVED, *BOUNDARY_SETS}:
        problem = csm_dataset_problem(csm_dataset) if csm_dataset else "no --csm-dataset given"
        if problem is None:
            csm_paths["soft"] = str(csm_dataset)
        else:
            blocked["soft"] = f"CSM dataset {csm_dataset!r} not available ({problem})"
        if "hard" in kinds and csm_dataset_hard:
            problem = csm_dataset_problem(csm_dataset_hard)
            if problem is None:
                csm_paths["hard"] = str(csm_dataset_hard)
            else:
                blocked["hard"] = f"hard-label CSM dataset {csm_dataset_hard!r} not available ({problem})"
        # the boundary study's subsets come from the decision row's set, which may be the filtered one
        derived = kinds & set(DERIVED) | ({"filtered"} if kinds & set(BOUNDARY_SETS) or filtered_needed else set())
        for kind in sorted(derived - set(csm_paths) - set(blocked)):
            make, name, what = DERIVED[kind]
            if "soft" in csm_paths:
                csm_paths[kind] = str(make(csm_paths["soft"], output / (f"{name}-{setting}" if setting else name)))
            else:
                blocked[kind] = blocked["soft"] + f"; the {what} is derived from it"
    if kinds & set(BOUNDARY_SETS):
        _resolve_boundary_sets(kinds & set(BOUNDARY_SETS), output, setting, committed, csm_paths, blocked)
    for key in sorted({m.data_key for m in specs if m.data_key and "@" in m.data_key}):
        derive.resolve_data_key(key, output, setting, csm_paths, blocked, volume_datasets or {}, annotator)
    if "real_copies" in kinds:
        data_seed = recipe.get("data_seed")
        csm_paths["real_copies"] = str(derive.derive_real_copies_dataset(
            recipe, output / ("csm-real-copies" + (f"-d{data_seed}" if data_seed else ""))))
    return csm_paths, blocked


def prepare_cells(recipe: Dict[str, Any], methods: Sequence[str], seeds: Sequence[int], output: Path,
                  csm_dataset: Optional[str] = None, csm_dataset_hard: Optional[str] = None,
                  setting: Optional[str] = None, teacher: Optional[str] = None, committed: Optional[Path] = None,
                  volume_datasets: Optional[Dict[int, str]] = None, annotator: Optional[str] = None
                  ) -> Tuple[List[Tuple[str, int, Path, Dict[str, Any], Optional[Path]]], Dict[str, str]]:
    """The unfinished cells ``(method, seed, folder, options, committed folder)``, their generated sets derived,
    and the reasons of the cells that cannot run. ``methods``: method names or tuned names (:func:`get_method`);
    ``setting``: the protocol recipe (cells that depend on it are named after it); ``teacher``: the reference
    encoder of KD; ``committed``: the folder of committed cells; ``volume_datasets``: the setting's sets of 2x / 4x
    the groups by volume; ``annotator``: the reference encoder of the setting's annotation (``label=softmax``)."""
    output = Path(output)
    specs = {m: get_method(m) for m in methods}
    csm_paths, blocked = _generated_sets(recipe, specs.values(), output, csm_dataset, csm_dataset_hard, setting,
                                         committed, volume_datasets, annotator)
    if any(m.teacher for m in specs.values()):
        if teacher and (Path(teacher) / "model.safetensors").exists():
            csm_paths["teacher"] = str(teacher)
        else:
            blocked["teacher"] = f"teacher {teacher!r} not available (no model.safetensors)"
    data_seed = recipe.get("data_seed")
    todo, skipped = [], {}
    for m, s in plan_cells(list(dict.fromkeys(spec.name for spec in specs.values())), seeds):
        method = get_method(m)
        if setting is not None and method.recipes is not None and setting not in method.recipes:
            continue
        name = cell_name(m, s, setting, data_seed)
        reason = blocked.get(method.data_key) or (blocked.get("teacher") if method.teacher else None)
        if reason:
            skipped[name] = reason
            continue
        cell_dir = output / "cells" / name
        cfg = cell_config(recipe, method, s, cell_dir, csm_paths)
        home = committed / name if committed is not None else None
        if cell_state(cell_dir, cfg, home) != "done":
            todo.append((m, s, cell_dir, cfg, home))
    return todo, skipped


def run_cells(recipe: Dict[str, Any], methods: Sequence[str], seeds: Sequence[int], output: Path,
              csm_dataset: Optional[str] = None, csm_dataset_hard: Optional[str] = None,
              max_cells: Optional[int] = None, log=print, setting: Optional[str] = None,
              teacher: Optional[str] = None, committed: Optional[Path] = None,
              amendment: Optional[int] = None, volume_datasets: Optional[Dict[int, str]] = None,
              annotator: Optional[str] = None) -> Dict[str, Any]:
    """Run the unfinished cells (at most ``max_cells`` of them) of :func:`prepare_cells`; returns counts and the
    skipped cells' reasons. ``amendment``: recorded in each new cell's record."""
    from tqdm.auto import tqdm

    todo, skipped = prepare_cells(recipe, methods, seeds, output, csm_dataset, csm_dataset_hard, setting, teacher,
                                  committed, volume_datasets, annotator)
    if max_cells is not None:
        todo = todo[:max(0, max_cells)]
    for reason in sorted(set(skipped.values())):
        log(f"skipping {sum(v == reason for v in skipped.values())} cell(s): {reason}")
    bar = tqdm(todo, desc="cells", unit="cell", dynamic_ncols=True, disable=not todo)
    for m, s, cell_dir, cfg, home in bar:
        bar.set_postfix(cell=cell_dir.name)
        run_cell(cfg, cell_dir, m, s, log=log, setting=setting if get_method(m).per_setting else None,
                 committed=home, amendment=amendment, repo=REPO)
    return {"ran": len(todo), "skipped": skipped}


# ---------------------------------------------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------------------------------------------
def _key_value(text: str) -> Tuple[str, Any]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    import yaml

    key, value = text.split("=", 1)
    return key.strip().replace("-", "_"), yaml.safe_load(value)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", default="matched", choices=sorted(RECIPES),
                   help="the shared training recipe (see RECIPES): matched / borrowed, the two settings of "
                        "benchmarks/PROTOCOL.md (one shared cell cache, one page); augmented / noaug, the earlier "
                        "benchmark's; the flags below override single options")
    p.add_argument("--output", default=None,
                   help="cell cache: <output>/cells/<cell>/ (default: runs/calibration_protocol for matched / "
                        "borrowed, runs/calibration_bench_augmented, runs/calibration_bench for noaug)")
    p.add_argument("--report", default=None,
                   help="markdown report; default: the recipe's page (benchmarks/calibration.md for matched / "
                        "borrowed, calibration_earlier.md, calibration_demo.md) for its default --output, else "
                        "<output>/calibration.md, so that side experiments never overwrite the committed report")
    p.add_argument("--methods", nargs="+", default=None, metavar="METHOD",
                   help=f"methods to run (default: the protocol's {', '.join(PROTOCOL_METHODS)} for matched / "
                        f"borrowed, else {', '.join(m for m in METHODS if m not in CONTROLS)})")
    p.add_argument("--seeds", nargs="+", type=int, default=None,
                   help="training seeds (default: 0-4 for matched / borrowed, 0-2 otherwise)")
    p.add_argument("--max-cells", type=int, default=None, help="run at most N unfinished cells this time")
    p.add_argument("--amendment", type=int, default=None, choices=(2, 4),
                   help="run the cells of PROTOCOL.md's amendment 2 (--recipe matched / annotated / borrowed): cell "
                        "cache runs/protocol_a2, committed under benchmarks/cells_a2 with each cell's record; "
                        "amendment 4 (--recipe matched / annotated; the timm backbone, the instruction-set pins in "
                        "the environment): runs/protocol_a4, benchmarks/cells_a4; "
                        "--methods takes tuned names (ls@smoothing=0.1, csm@s=2.3,n_aug=2, stage 3's "
                        "csm@label=lambda, stage 4's csm@volume=2: the set runs/settings/<setting>-x2); default: "
                        "stage 1's cells of the setting at seeds 0-2")
    p.add_argument("--data-seed", type=int, default=None,
                   help="with --amendment: the real subset (2 500 training and 2 000 validation images) of this "
                        "data seed, stage 5's (default 0); cells of another data seed than 0 are named "
                        "<method>-d<N>-s<seed>")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads per cell (default 1 with --amendment: a cell's numbers depend on it)")
    p.add_argument("--verify", default=None, metavar="CELL",
                   help="re-run one committed cell (e.g. ce-s0 --amendment 2, csm@s=2.3-matched-s1; --amendment "
                        "says whose cell where amendments share a name) from its recorded options on "
                        "the current code and print every difference from its results.json and record; exits 1 "
                        "when any")
    p.add_argument("--report-only", action="store_true", help="only re-assemble the report from finished cells")
    p.add_argument("--json", default=None,
                   help="JSON rows of the summary (one per method and recipe; other recipes' rows are kept); "
                        "default: benchmarks/calibration.json when the report is the recipe's page, else none")
    p.add_argument("--csm-dataset", default=None,
                   help="generated CSM dataset (folder, installed name or Hub id) of the CSM rows (default: the "
                        "setting's, runs/settings/<recipe>/csm/csm-fmnist-aug, for matched / borrowed; else "
                        "csm-fmnist-aug)")
    p.add_argument("--teacher", default=None,
                   help="KD's teacher (default: runs/settings/borrowed/reference, the borrowed setting's encoder)")
    p.add_argument("--csm-dataset-hard", default=None,
                   help="the same generated images annotated with label_mode='generation' (hard labels); default: "
                        "derived from --csm-dataset")
    g = p.add_argument_group("recipe overrides (default: the --recipe's options)")
    g.add_argument("--dataset", default=None)
    g.add_argument("--model", default=None)
    g.add_argument("--model-kwargs", nargs="*", type=_key_value, default=None, metavar="KEY=VALUE")
    g.add_argument("--epochs", type=int, default=None)
    g.add_argument("--batch-size", type=int, default=None)
    g.add_argument("--lr", type=float, default=None)
    g.add_argument("--weight-decay", type=float, default=None)
    g.add_argument("--sched", default=None)
    g.add_argument("--max-train-samples", type=int, default=None)
    g.add_argument("--max-test-samples", type=int, default=None)
    g.add_argument("--n-aug", type=int, default=None)
    g.add_argument("--train-opt", nargs="*", type=_key_value, default=[], metavar="KEY=VALUE",
                   help="any other train.py option for every cell, e.g. --train-opt val_fraction=0.2 amp=true")
    g.add_argument("--no-progress", action="store_true", help="no per-epoch progress bars")
    return p


def main(argv: Optional[Sequence[str]] = None) -> str:
    args = build_parser().parse_args(argv)
    for m in args.methods or ():
        try:
            get_method(m)
        except ValueError as e:
            build_parser().error(str(e))
    settings = A4_SETTINGS if args.amendment == 4 else A2_SETTINGS
    if args.amendment is not None and args.recipe not in settings:
        build_parser().error(f"--amendment {args.amendment} runs the settings {', '.join(settings)}")
    if args.data_seed is not None and args.amendment == 4:
        build_parser().error("amendment 4 trains on data seed 0 only")
    verify_root = _verify_root(args) if args.verify else None
    a4_cell = args.amendment == 4 or verify_root == COMMITTED_A4
    problem = instruction_set_problem() if a4_cell else None
    if problem:
        build_parser().error(problem)
    if args.data_seed is not None and args.amendment is None:
        build_parser().error("--data-seed names amendment 2's cells; give --amendment 2")
    threads = args.threads if args.threads is not None else (1 if args.amendment or args.verify else None)
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    if args.verify:
        log_path = VERIFY_LOGS.get(verify_root)  # the amendment's page lists each run
        text, reproduced = verify_and_log(args.verify, (verify_root,), log_path, REPO)
        print(text)
        if not reproduced:
            raise SystemExit(1)
        return text
    t0 = time.time()
    overrides = {k: getattr(args, k) for k in ("dataset", "model", "epochs", "batch_size", "lr", "weight_decay",
                                               "sched", "max_train_samples", "max_test_samples", "n_aug",
                                               "data_seed")}
    if args.model_kwargs is not None:
        overrides["model_kwargs"] = dict(args.model_kwargs)
    overrides.update(dict(args.train_opt))
    if args.no_progress:
        overrides["progress"] = False
    recipe = base_recipe(overrides, args.recipe) if args.amendment != 4 else dict(
        a4_recipe(), **{k: v for k, v in overrides.items() if v is not None})
    if args.amendment is not None:
        return run_amendment(args, recipe)
    output = args.output or DEFAULT_OUTPUTS[args.recipe]
    protocol = args.recipe in PROTOCOL_RECIPES
    methods = list(dict.fromkeys(args.methods or (PROTOCOL_METHODS if protocol else
                                                  [m for m in METHODS if m not in CONTROLS])))
    seeds = list(dict.fromkeys(args.seeds or (PROTOCOL_SEEDS if protocol else (0, 1, 2))))
    csm_dataset = args.csm_dataset or (str(SETTINGS_ROOT / args.recipe / "csm" / "csm-fmnist-aug") if protocol
                                       else "csm-fmnist-aug")
    teacher = args.teacher or str(SETTINGS_ROOT / "borrowed" / "reference")
    committed = COMMITTED_CELLS if protocol and output == DEFAULT_OUTPUTS[args.recipe] else None
    skipped: Dict[str, str] = {}
    if not args.report_only:
        done = run_cells(recipe, methods, seeds, Path(output), csm_dataset=csm_dataset,
                         csm_dataset_hard=args.csm_dataset_hard, max_cells=args.max_cells,
                         setting=args.recipe if protocol else None, teacher=teacher, committed=committed)
        skipped = done["skipped"]
    command = "python benchmarks/calibration_bench.py" + "".join(
        " " + shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    if protocol:
        report = Path(args.report or DEFAULT_REPORTS[args.recipe])
        json_path = args.json or (DEFAULT_JSON if report == DEFAULT_REPORTS[args.recipe] else None)
        command = "python benchmarks/calibration_bench.py --recipe matched; python benchmarks/calibration_bench.py " \
                  "--recipe borrowed"
        text = protocol_page.write_protocol_report(Path(output), report, json_path, recipe, command,
                                                   committed=committed)
        for reason in sorted(set(skipped.values())):
            text += f"\nNot run: {reason}."
        print(text)
        return text
    report = args.report or (DEFAULT_REPORTS[args.recipe] if output == DEFAULT_OUTPUTS[args.recipe]
                             else Path(output) / "calibration.md")
    json_path = args.json or (DEFAULT_JSON if Path(report) == DEFAULT_REPORTS[args.recipe] else None)
    text = pages.write_report(Path(output), Path(report), recipe, seeds, command, time.time() - t0,
                              skipped=skipped, methods=methods, recipe_name=args.recipe, json_path=json_path)
    print(text)
    return text


#: the committed cells of each amendment (the protocol's own without one), and the log of their verify runs
VERIFY_ROOTS = {4: COMMITTED_A4, 2: COMMITTED_A2, None: COMMITTED_CELLS}
VERIFY_LOGS = {COMMITTED_A4: A4_VERIFY_LOG, COMMITTED_A2: A2_VERIFY_LOG}


def _verify_root(args: argparse.Namespace) -> Path:
    """The folder of committed cells that holds ``--verify``'s cell: ``--amendment``'s, else the one folder that has
    a cell of that name (amendments reuse names such as ``ce-s0``: then ``--amendment`` must say which)."""
    if args.amendment is not None:
        root = VERIFY_ROOTS[args.amendment]
        if not (root / args.verify).is_dir():
            build_parser().error(f"amendment {args.amendment} has no committed cell {args.verify!r} (under {root})")
        return root
    found = [(a, root) for a, root in VERIFY_ROOTS.items() if (root / args.verify).is_dir()]
    if len(found) > 1:
        owners = " and ".join(f"amendment {a}" if a else "the protocol" for a, _ in found)
        build_parser().error(f"{args.verify!r} names a cell of {owners}: give --amendment N")
    if not found:
        roots = ", ".join(str(r) for r in VERIFY_ROOTS.values())
        build_parser().error(f"no committed cell {args.verify!r} under {roots}")
    return found[0][1]


def run_amendment(args: argparse.Namespace, recipe: Dict[str, Any]) -> str:
    """Run amendment 2's (4's) cells of one setting (stage 1's by default) into ``--output`` (runs/protocol_a2,
    runs/protocol_a4), each committed under benchmarks/cells_a2 (cells_a4) with its record as it finishes (not with
    another ``--output``)."""
    output = Path(args.output or (A4_OUTPUT if args.amendment == 4 else A2_OUTPUT))
    committed = (COMMITTED_A4 if args.amendment == 4 else COMMITTED_A2) if args.output is None else None
    methods = list(args.methods or stage1_methods(args.recipe, args.amendment))
    seeds = list(args.seeds or A2_TUNING_SEEDS)
    csm_dataset = args.csm_dataset or str(SETTINGS_ROOT / args.recipe / "csm" / "csm-fmnist-aug")
    teacher = args.teacher or str(SETTINGS_ROOT / "borrowed" / "reference")
    volume_datasets = {v: volume_dataset(args.recipe, v) for v in VOLUMES[1:]}
    done = run_cells(recipe, methods, seeds, output, csm_dataset=csm_dataset, max_cells=args.max_cells,
                     setting=args.recipe, teacher=teacher, committed=committed, amendment=args.amendment,
                     volume_datasets=volume_datasets,
                     annotator=str(SETTINGS_ROOT / A2_ANNOTATORS[args.recipe] / "reference"))
    text = (f"amendment {args.amendment}, {args.recipe}"
            + (f", data seed {recipe['data_seed']}" if recipe.get("data_seed") else "")
            + f": ran {done['ran']} cell(s) into {output / 'cells'}"
            + (f", committed under {committed}" if committed else "")
            + "".join(f"\nnot run: {name}: {why}" for name, why in sorted(done["skipped"].items())))
    print(text)
    return text


if __name__ == "__main__":
    main()
