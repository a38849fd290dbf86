"""Reports of a training run: the per-epoch log (``log.json`` / ``log.csv``), timm's ``summary.csv``, ``results.md``
(the markdown table of :func:`results_markdown`, with the shift and OOD sections of
:mod:`~timm_csm.evaluation.shift_report` when the run has them), ``results.json``, the test predictions, the
reliability diagrams and ``shift.png``."""
from __future__ import annotations

import csv
import io
import json
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from ..extras import MissingExtra, require
from ..io import save_model_file, write_text_atomic
from ..calibration.temperature import SMALL_VALIDATION
from ..metrics.interval_methods import no_interval_line
from ..metrics.table import list_metrics, metric_spec, metrics_for
from ..evaluation.shift_report import shift_figure, shift_markdown

__all__ = ["REPORT_ROWS", "results_markdown", "comparison_markdown", "write_log", "SUMMARY_FILE",
           "write_summary", "write_results", "reliability_title"]

SUMMARY_FILE = "summary.csv"


#: (results key, heading, scale) of each row a training report shows: the metric table's ``"report"`` view, in its
#: order (fractions in %)
REPORT_ROWS = tuple((name, metric_spec(name).heading, metric_spec(name).scale) for name in metrics_for("report"))


def _fmt(v, scale):
    return "-" if v is None else f"{v * scale:.2f}" if scale == 100 else f"{v:.4f}"


def results_markdown(results: Dict[str, Any]) -> str:
    """A markdown report: a one-line summary table to paste, then every metric before and after TS."""
    scored = results["test"] or results["val"]  # no test split: the validation images are the report
    pre, post = scored["pre_ts"], scored.get("post_ts")
    t = results.get("temperature")
    lines = [f"# {results['model']} on {results['dataset']} ({results['loss']})", ""]
    lines += ["| dataset | model | loss | acc | ECE | AECE | ECE (TS) | AECE (TS) | T |",
              "|---|---|---|---|---|---|---|---|---|",
              f"| {results['dataset']} | {results['model']} | {results['loss']} | {_fmt(pre['accuracy'], 100)} | "
              f"{_fmt(pre['ece'], 100)} | {_fmt(pre['aece'], 100)} | "
              f"{_fmt(post['ece'] if post else None, 100)} | {_fmt(post['aece'] if post else None, 100)} | "
              f"{'-' if t is None else f'{t:.2f}'} |", ""]
    lines += [f"{_scored_line(results)}; {_temperature_line(results)}; {results['n_bins']} bins; "
              f"{_checkpoint_line(results)}; run {results.get('run_id')}.", ""]
    if results.get("post_ts_spread"):
        lines += [_small_validation_line(results), ""]
    intervals = (results.get("intervals") or {}).get("test" if results["test"] else "val") or {}
    if intervals:
        boot = results["bootstrap"]
        lines += [f"Each value with its {boot['level']:.0%} interval [low, high]: {boot['interval']} bootstrap, "
                  f"{boot['resamples']} resamples of the scored images (seed {boot['seed']})."
                  + _no_interval(intervals), ""]
    split = "test" if results["test"] else "val"
    others = {name: (row[split], (row.get("intervals") or {}).get(split) or {})
              for name, row in (results.get("calibrators") or {}).items()}  # --calibrators besides TS
    phases = [(pre, intervals.get("pre_ts", {})), (post, intervals.get("post_ts", {})), *others.values()]
    skipped = results.get("calibrators_skipped") or {}
    if skipped:
        lines += ["Not fitted, so not in the table: " + "; ".join(f"{name} ({why})" for name, why in skipped.items())
                  + ".", ""]
    lines += ["| metric | before TS | after TS |" + "".join(f" after {name} |" for name in others),
              "|---|---|---|" + "---|" * len(others)]
    for key, label, scale in REPORT_ROWS:
        if key in pre:
            cells = [_with_interval(scores.get(key) if scores else None, shown.get(key), scale)
                     for scores, shown in phases]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n" + shift_markdown(results)


def _scored_line(results: Dict[str, Any]) -> str:
    if results["test"]:
        return f"Test split: {results['n_test']} images"
    return (f"No test split: the numbers are on the {results['n_val']} validation images, which also selected the "
            "checkpoint (after TS: in-sample)")


def _temperature_line(results: Dict[str, Any]) -> str:
    if results.get("temperature") is None:
        return "no temperature scaling (no validation images to fit it on)" if not results["n_val"] else (
            "temperature scaling skipped")
    if results.get("temperature_source"):
        return f"temperature {results['temperature']:.2f} {results['temperature_source']}"
    interval = results.get("temperature_interval")
    shown = (f" {results['temperature']:.2f} [{interval['low']:.2f}, {interval['high']:.2f}]" if interval else "")
    return f"temperature{shown} fitted on {results['n_val']} validation images ({results['ts_method']})"


def _small_validation_line(results: Dict[str, Any]) -> str:
    """How far the after-TS test numbers move with a temperature fitted on few validation images."""
    spread, interval = results["post_ts_spread"], results["temperature_interval"]
    return (f"Only {spread['n_val']} validation images: refitted on {interval['resamples']} resamples of them, the "
            f"temperature moves within [{interval['low']:.2f}, {interval['high']:.2f}], and with it the test ECE after "
            f"TS within [{_fmt(spread['ece']['low'], 100)}, {_fmt(spread['ece']['high'], 100)}] % and the NLL within "
            f"[{spread['nll']['low']:.4f}, {spread['nll']['high']:.4f}]; {SMALL_VALIDATION} validation images or "
            "more give a steadier temperature (docs/own_folder.md).")


def _checkpoint_line(results: Dict[str, Any]) -> str:
    epoch = results.get("checkpoint_epoch")
    if results.get("eval_only"):
        return f"checkpoint: {results.get('checkpoint')}" + (f" (epoch {epoch})" if epoch is not None else "")
    if epoch is None:
        return "checkpoint: the model as created (no epoch trained)"
    return f"checkpoint: epoch {epoch} selected by validation {results.get('select_by')}"


def _no_interval(intervals) -> str:
    """`` <metric> has no interval: <why>.`` for the metrics shown without one (``""`` when none)."""
    line = no_interval_line(intervals, {k: metric_spec(k).label for k in list_metrics()})
    return f" {line}" if line else ""


def _with_interval(value, interval: Optional[Dict[str, float]], scale) -> str:
    """``value [low, high]`` (the value alone without an interval)."""
    if value is None or interval is None or interval.get("low") is None:
        return _fmt(value, scale)
    return f"{_fmt(value, scale)} [{_fmt(interval['low'], scale)}, {_fmt(interval['high'], scale)}]"


# (results key, column, scale) of the side-by-side table, the metric table's "per_seed" view: accuracy and
# calibration errors in %, NLL and Brier raw
_COMPARISON = tuple((name, metric_spec(name).short, metric_spec(name).scale) for name in metrics_for("per_seed"))


def comparison_markdown(results: Dict[str, Dict[str, Any]]) -> str:
    """Runs side by side: one row per method (the keys of ``results``, each a run's ``results.json``) and phase
    (before / after temperature scaling), with the fitted temperature T (1.0 before); each value with its bootstrap
    interval ``[low, high]`` where the run holds one."""
    rows = ["| method | TS | " + " | ".join(h for _, h, _ in _COMPARISON) + " | T |",
            "|" + "---|" * (len(_COMPARISON) + 3)]
    for method, res in results.items():
        split = "test" if res["test"] else "val"
        for phase in ("pre_ts", "post_ts"):
            m = res[split].get(phase)
            if not m:
                continue
            intervals = ((res.get("intervals") or {}).get(split) or {}).get(phase) or {}
            vals = " | ".join(_with_interval(m[k], intervals.get(k), scale) for k, _, scale in _COMPARISON)
            t = f"{res['temperature']:.1f}" if phase == "post_ts" and res.get("temperature") else "1.0"
            rows.append(f"| {method.upper()} | {'after' if phase == 'post_ts' else 'before'} | {vals} | {t} |")
    return "\n".join(rows)


def write_log(out_dir: Path, rows: List[Dict[str, Any]]) -> None:
    """The per-epoch rows as ``log.json`` and ``log.csv`` (columns in order of first appearance)."""
    write_text_atomic(out_dir / "log.json", json.dumps(rows, indent=1))
    keys: List[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=keys)
    w.writeheader()
    w.writerows(rows)
    write_text_atomic(out_dir / "log.csv", buf.getvalue())


def write_summary(out_dir: Path, row: Dict[str, Any], val: Optional[Sequence] = None) -> None:
    """Append epoch ``row`` (a ``log.json`` row) to ``summary.csv`` in timm's format (``timm.utils.update_summary``):
    ``epoch``, ``train_<term>`` (``train_loss`` and the loss's terms), then with validation predictions ``val`` =
    (logits, labels) of the weights that are validated (the EMA with ``--model-ema``, as timm): ``eval_loss`` (NLL),
    ``eval_top1`` / ``eval_top5`` in percent (``timm.utils.accuracy``) and our calibration metrics ``eval_<name>``
    as fractions (``ece``, ``aece``, ...), and ``lr``."""
    from timm.utils import accuracy, update_summary

    train = {k[len("train_"):]: v for k, v in row.items() if k.startswith("train_")}
    evals = None
    if val is not None and len(val):
        top1, top5 = accuracy(val[0], val[1], topk=(1, 5))
        evals = {"loss": row["val_nll"], "top1": float(top1), "top5": float(top5)}
        evals.update({k[len("val_"):]: v for k, v in row.items() if k.startswith("val_")
                      and not k.startswith("val_online_") and k not in ("val_nll", "val_accuracy")})
    update_summary(row["epoch"], train, evals, str(Path(out_dir) / SUMMARY_FILE), lr=row["lr"])


def reliability_title(results: Dict[str, Any], split: str) -> str:
    """What a run's reliability diagram shows: ``"resnet18 / csm, cifar100 test, N=10000"``."""
    n = results["n_test"] if results["test"] is not None else results["n_val"]
    return f"{results['model']} / {results['loss']}, {Path(results['dataset']).name} {split}, N={n}"


def _reliability_plots(out_dir: Path, test_logits, test_y, post_logits, results, split: str) -> None:
    """Reliability diagrams of the test logits before and after TS (skipped, saying so, without matplotlib)."""
    from ..metrics.plots import reliability_diagram, reliability_diagrams

    try:
        require("matplotlib", "a reliability diagram")
    except MissingExtra as e:  # an optional extra: the results are complete without the pictures
        warnings.warn(f"reliability diagrams skipped: {e}")
        return
    name, n_bins = reliability_title(results, split), results["n_bins"]
    reliability_diagram(test_logits, test_y, str(out_dir / "reliability_before.png"), n_bins=n_bins,
                        title=f"{name}: before TS")
    if post_logits is not None:
        t = results["temperature"]
        reliability_diagram(post_logits, test_y, str(out_dir / "reliability_after.png"), n_bins=n_bins,
                            title=f"{name}: after TS (T={t:.2f})")
        reliability_diagrams({"before TS": (test_logits, test_y), f"after TS (T={t:.2f})": (post_logits, test_y)},
                             str(out_dir / "reliability.png"), n_bins=n_bins, title=name)


def write_results(out_dir: Path, results: Dict[str, Any], test_logits, test_y, post_logits=None,
                  scaler=None, split: str = "test", diagrams: bool = True) -> str:
    """Write a run's evaluation into ``out_dir``: ``results.json``, ``results.md``, ``test_predictions.safetensors``
    (test logits and labels, so that reports can redraw or re-score them without the model; without a test split
    ``val_predictions.safetensors``, the validation ones), ``temperature.safetensors`` (with a fitted ``scaler``) and
    the reliability diagrams (unless ``diagrams`` is False), titled with the model, the loss, the dataset, the
    ``split`` and its size; returns the markdown."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if scaler is not None:
        scaler.save(str(out_dir / "temperature.safetensors"))
    markdown = results_markdown(results)
    write_text_atomic(out_dir / "results.json", json.dumps(results, indent=2))
    write_text_atomic(out_dir / "results.md", markdown)
    scored = "test" if results["test"] else "val"
    save_model_file(out_dir / f"{scored}_predictions.safetensors", {"logits": test_logits, "targets": test_y},
                    {"temperature": results["temperature"], "run_id": results["run_id"]})
    if diagrams:
        _reliability_plots(out_dir, test_logits, test_y, post_logits, results, split)
    shift_figure(out_dir, results, log=warnings.warn)
    return markdown
