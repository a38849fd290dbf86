"""``timm-csm-compare``: paired differences between methods trained at the same seeds, each metric with its 95%
t-interval over the seeds, and Holm-corrected decisions on the primary metric.

    timm-csm-compare runs/ce-s* runs/csm-s*                        # methods told apart by their configuration
    timm-csm-compare ce=runs/ce-s0 ce=runs/ce-s1 csm=runs/csm-s0 csm=runs/csm-s1 --json cmp.json --markdown cmp.md

Each RUN is a finished ``timm-csm-train`` run folder (its ``results.json`` and ``args.yaml``; a cell of the
calibration benchmark, whose ``cell.json`` holds the configuration, reads too), optionally prefixed ``NAME=``. Runs
without a name are grouped into methods by their configuration (every option but the seed and where and how the run
was written), named by the options that tell the methods apart. Runs of one method are matched with those of another
by the seed each recorded: every method needs the same seeds, each once, and every run the same scored images.

For each pair (the first method minus each other one; every pair with ``--all-pairs``) and each metric of the runs'
reports before and after temperature scaling: the mean of the per-seed differences and its t-interval
(:func:`timm_csm.metrics.paired_t_interval`, the statistic of ``benchmarks/calibration_bench.py``), accuracy and
calibration errors in percentage points. The primary metric's paired t-tests form one family, corrected by Holm
(:func:`timm_csm.metrics.holm`) at family-wise ``--alpha``: a pair's decision is "lower" or "higher" where Holm
rejects, "no difference shown" where it does not. The other metrics' intervals are unadjusted.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from timm_csm.cli import HelpFormatter, console_command
from timm_csm.io import write_json_atomic, write_text_atomic
from timm_csm.metrics import holm, interval_text, paired_t_interval
from timm_csm.training.config import CONFIG_MARKER, TrainConfig
from timm_csm.training.reporting import REPORT_ROWS
from timm_csm.training.run_dir import config_record

__all__ = ["read_run", "group_runs", "metric_values", "compare_methods", "paired_markdown", "build_parser", "main"]

PHASES = {"pre_ts": "before TS", "post_ts": "after TS"}
#: options that say where and how a run was written, not what it trained: not part of a method
_NOT_A_METHOD = {"seed", "run_id", "output", "experiment", "resume", "auto_resume", "progress", "workers", "pin_mem",
                 "log_with", "log_wandb", "checkpoint_hist", "validation_batch_size", "config", "eval_only",
                 "checkpoint", "cpu", "channels_last", "torchcompile", "torchcompile_mode", CONFIG_MARKER}


def read_run(folder) -> Dict[str, Any]:
    """``{"folder", "seed", "config", "results", "data"}`` of a finished run folder (see the module docstring)."""
    import yaml

    folder = Path(folder)
    if not (folder / "results.json").is_file():
        raise ValueError(f"{folder} holds no results.json: not a finished timm-csm-train run")
    if not (folder / "args.yaml").is_file() and not (folder / "cell.json").is_file():
        raise ValueError(f"{folder} has no args.yaml: the run's seed and configuration are unknown")
    try:
        if (folder / "args.yaml").is_file():
            config = yaml.safe_load((folder / "args.yaml").read_text())
        else:
            config = json.loads((folder / "cell.json").read_text()).get("config")
        results = json.loads((folder / "results.json").read_text())
    except (yaml.YAMLError, ValueError) as e:
        raise ValueError(f"{folder}: a file does not read ({type(e).__name__}: {str(e).splitlines()[0]})") from None
    if not isinstance(config, dict) or not isinstance(config.get("seed"), int):
        raise ValueError(f"{folder} records no integer seed in its configuration")
    split = "test" if results.get("test") else "val"
    data = (str(results.get("dataset")), split, results.get(f"n_{split}"))
    return {"folder": folder, "seed": config["seed"], "config": config, "results": results, "data": data}


def _method_options(config: Mapping[str, Any], defaults: Mapping[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in {**defaults, **config}.items() if k not in _NOT_A_METHOD}


def _short(value) -> str:
    text = json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else str(value)
    return Path(text).name if "/" in text and " " not in text else text


def _labels(options: List[Dict[str, Any]], defaults: Mapping[str, Any]) -> List[str]:
    """Names of methods with these options: the loss and the options that differ between them (those left at
    their defaults unnamed, unless that makes two names equal)."""
    keys = sorted({k for o in options for k in o if len({json.dumps(p.get(k), sort_keys=True) for p in options}) > 1}
                  - {"loss"})

    def name(o, every):
        shown = [f"{k}={_short(o.get(k))}" for k in keys if every or o.get(k) != defaults.get(k)]
        return str(o.get("loss")) + (f" ({', '.join(shown)})" if shown else "")

    labels = [name(o, False) for o in options]
    return labels if len(set(labels)) == len(labels) else [name(o, True) for o in options]


def group_runs(specs: Sequence[str]) -> Dict[str, Dict[int, Dict[str, Any]]]:
    """``{method: {seed: run}}`` of the RUN arguments (``[NAME=]FOLDER``), in the order given; a one-line
    ``ValueError`` for runs on other data, a seed twice in a method, or methods with other seeds."""
    defaults = config_record(TrainConfig())
    named: Dict[str, List[Dict[str, Any]]] = {}
    for spec in specs:
        name, sep, folder = spec.partition("=")
        if not sep or Path(spec).exists():
            name, folder = "", spec
        run = read_run(folder)
        key = name or "\0" + json.dumps(_method_options(run["config"], defaults), sort_keys=True, default=str)
        named.setdefault(key, []).append(run)
    auto = [k for k in named if k.startswith("\0")]
    options = [_method_options(named[k][0]["config"], defaults) for k in auto]
    titles = dict(zip(auto, _labels(options, defaults)))
    groups: Dict[str, Dict[int, Dict[str, Any]]] = {}
    for key, runs in named.items():
        label = titles.get(key, key)
        for run in runs:
            if run["seed"] in groups.setdefault(label, {}):
                raise ValueError(f"{label}: seed {run['seed']} twice ({groups[label][run['seed']]['folder']} and "
                                 f"{run['folder']}); give each method one run per seed")
            groups[label][run["seed"]] = run
    _check_matching(groups)
    return groups


def _check_matching(groups: Mapping[str, Mapping[int, Dict[str, Any]]]) -> None:
    if len(groups) < 2:
        raise ValueError(f"runs of one method only ({', '.join(groups) or 'none'}); compare two or more methods "
                         "(name runs NAME=FOLDER to group them yourself)")
    runs = [r for g in groups.values() for r in g.values()]
    data = {r["data"] for r in runs}
    if len(data) > 1:
        seen = "; ".join(f"{r['folder']}: {r['data'][0]} {r['data'][1]} ({r['data'][2]} images)"
                         for r in {r["data"]: r for r in runs}.values())
        raise ValueError(f"the runs score different data ({seen}); compare runs evaluated on the same images")
    seeds = {name: sorted(g) for name, g in groups.items()}
    if len({tuple(s) for s in seeds.values()}) > 1:
        raise ValueError("the methods have different seeds (" + "; ".join(f"{k}: {v}" for k, v in seeds.items())
                         + "); pair runs at matching seeds")
    if len(next(iter(seeds.values()))) < 2:
        raise ValueError("each method has one seed: a t-interval needs at least 2 paired seeds")


def metric_values(results: Mapping[str, Any]) -> Dict[str, float]:
    """``{"<metric>_<phase>": value}`` of one run's report: accuracy and calibration errors in %, NLL and Brier
    raw (:data:`timm_csm.training.reporting.REPORT_ROWS`)."""
    scored = results.get("test") or results.get("val") or {}
    out = {}
    for phase in PHASES:
        for key, _, scale in REPORT_ROWS:
            value = (scored.get(phase) or {}).get(key)
            if value is not None:
                out[f"{key}_{phase}"] = float(value) * scale
    return out


def compare_methods(values: Mapping[str, Mapping[int, Mapping[str, float]]], primary: str = "ece_pre_ts",
                    level: float = 0.95, alpha: float = 0.05, all_pairs: bool = False) -> Dict[str, Any]:
    """Paired differences of ``values`` (``{method: {seed: {metric: value}}}``) for the pairs (the first method
    minus each other; every pair with ``all_pairs``): ``{"primary", "level", "alpha", "metrics", "pairs": [{"a",
    "b", "intervals": {metric: {"n", "mean", "low", "high", "p_value", "sd"}}, "holm_p", "reject", "decision"}]}``,
    Holm's family being the pairs' tests of ``primary``."""
    methods = list(values)
    metrics = [m for m in next(iter(next(iter(values.values())).values()))
               if all(m in v for runs in values.values() for v in runs.values())]
    if primary not in metrics:
        raise ValueError(f"primary metric {primary!r} is not reported by every run; choose one of {metrics}")
    pairs = [(a, b) for i, a in enumerate(methods) for b in methods[i + 1:]] if all_pairs else \
        [(methods[0], b) for b in methods[1:]]
    out: List[Dict[str, Any]] = []
    for a, b in pairs:
        intervals = {m: paired_t_interval({s: v[m] for s, v in values[a].items()},
                                          {s: v[m] for s, v in values[b].items()}, level) for m in metrics}
        out.append({"a": a, "b": b, "intervals": {m: iv._asdict() for m, iv in intervals.items()}})
    adjusted, reject = holm([p["intervals"][primary]["p_value"] for p in out], alpha)
    for p, adj, rej in zip(out, adjusted, reject):
        mean = p["intervals"][primary]["mean"]
        p.update(holm_p=adj, reject=rej,
                 decision=(f"{p['a']} lower" if mean < 0 else f"{p['a']} higher") if rej else "no difference shown")
    return {"primary": primary, "level": level, "alpha": alpha, "metrics": metrics, "pairs": out}


def _metric_label(metric: str) -> Tuple[str, int]:
    """The row label of ``<key>_<phase>`` and the digits its differences are shown with."""
    phase = next(p for p in PHASES if metric.endswith("_" + p))
    label, scale = next((lab, sc) for k, lab, sc in REPORT_ROWS if f"{k}_{phase}" == metric)
    return f"{label.replace(' (%)', ' (points)')}, {PHASES[phase]}", 2 if scale == 100 else 4


def _text(interval: Mapping[str, Any], digits: int) -> str:
    return interval_text((interval["n"], interval["mean"], interval["low"], interval["high"]), digits)


def paired_markdown(comparison: Mapping[str, Any], seeds: Sequence[int], data: Tuple[str, str, Any]) -> str:
    """The comparison as markdown: the primary family with Holm, then every metric's unadjusted interval."""
    pairs = comparison["pairs"]
    primary, digits = _metric_label(comparison["primary"])
    lines = [f"Paired differences over seeds {', '.join(map(str, seeds))} ({data[0]}, {data[1]} split, {data[2]} "
             f"images): mean [{comparison['level']:.0%} t-interval] (n = seeds).", "",
             f"Primary: {primary} (`{comparison['primary']}`); Holm's correction over {len(pairs)} pair(s) at "
             f"family-wise alpha {comparison['alpha']:g}.", "",
             "| pair | difference | p | Holm p | decision |", "|---|---|---|---|---|"]
    for p in pairs:
        iv = p["intervals"][comparison["primary"]]
        lines.append(f"| {p['a']} minus {p['b']} | {_text(iv, digits)} | {iv['p_value']:.4g} | "
                     f"{p['holm_p']:.4g} | {p['decision']} |")
    lines += ["", "Every metric (unadjusted intervals):", "",
              "| metric | " + " | ".join(f"{p['a']} minus {p['b']}" for p in pairs) + " |",
              "|---|" + "---|" * len(pairs)]
    for metric in comparison["metrics"]:
        label, digits = _metric_label(metric)
        lines.append(f"| {label} | " + " | ".join(_text(p["intervals"][metric], digits) for p in pairs) + " |")
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="timm-csm-compare", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("runs", nargs="+", metavar="RUN", help="[NAME=]a finished run folder")
    p.add_argument("--primary", default="ece_pre_ts", help="the metric of Holm's family, <metric>_<pre|post>_ts")
    p.add_argument("--level", type=float, default=0.95, help="level of the t-intervals")
    p.add_argument("--alpha", type=float, default=0.05, help="family-wise error rate of Holm's correction")
    p.add_argument("--all-pairs", action="store_true", help="every pair of methods, not the first against each")
    p.add_argument("--json", default=None, help="also write the comparison as JSON here")
    p.add_argument("--markdown", default=None, help="also write the markdown here")
    return p


@console_command("timm-csm-compare", build_parser, requires=("scipy",))
def main(argv: Optional[Sequence[str]] = None) -> None:
    """``timm-csm-compare``: the markdown on stdout; bad input is one line on stderr and exit status 2, with
    nothing written."""
    args = build_parser().parse_args(argv)
    groups = group_runs(args.runs)
    values = {name: {s: metric_values(r["results"]) for s, r in runs.items()} for name, runs in groups.items()}
    comparison = compare_methods(values, args.primary, args.level, args.alpha, args.all_pairs)
    seeds = sorted(next(iter(groups.values())))
    first = next(iter(next(iter(groups.values())).values()))
    text = paired_markdown(comparison, seeds, first["data"])
    comparison.update(seeds=seeds, dataset=first["data"][0], split=first["data"][1], images=first["data"][2],
                      runs={name: {s: str(r["folder"]) for s, r in runs.items()} for name, runs in groups.items()})
    if args.json:
        write_json_atomic(args.json, comparison)
    if args.markdown:
        write_text_atomic(args.markdown, text)
    print(text, end="")
    written = [path for path in (args.json, args.markdown) if path]
    print(f"comparison of {len(groups)} methods over {len(seeds)} seeds: "
          + (", ".join(written) if written else "stdout only (--json, --markdown to keep it)"), file=sys.stderr)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
