"""The report of ``timm-csm-calibrate`` (:func:`~timm_csm.evaluation.calibrate`): the curves of ``report.json``,
``report.md`` from its numbers, and the diagrams (``reliability.png``, the optional adaptive / classwise ones,
``risk_coverage.png``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import torch

from ..calibration import fold_table_markdown
from ..calibration.conformal import coverage_outside_range
from ..calibration.temperature import SMALL_VALIDATION
from ..extras import missing_extra
from ..metrics.interval_methods import no_interval_line
from ..metrics import list_metrics, reliability_table
from ..metrics.plots import RELIABILITY_KINDS, kind_diagrams, reliability_diagrams, risk_coverage_diagram
from ..metrics.selective import risk_coverage_from_points

__all__ = ["report_markdown", "prediction_curves", "write_plots", "RELIABILITY_KINDS"]


def report_markdown(report: Dict[str, Any]) -> str:
    """``report.md``: the headline metrics of each calibrator (the metric table's calibration and selective
    ones; each with its bootstrap interval when the report holds them), the exported one and why (the fold table of
    the choice), the conformal sets."""
    keys = list_metrics(("calibration", "selective"), headline=True)
    pre, boot = report.get("preprocessing"), report.get("bootstrap")
    shown = (f" Each number with its {boot['level']:.0%} interval [low, high]: {boot['interval']} bootstrap, "
             f"{boot['resamples']} resamples of the test images (seed {boot['seed']})." if boot else "")
    missing = no_interval_line({name: row.get("intervals", {}) for name, row in
                                [("uncalibrated", report["uncalibrated"]), *report["calibrators"].items()]})
    shown += f" {missing}" if boot and missing else ""
    lines = [f"# Calibration of {report['model']}", "",
             f"Data: {report['dataset']}, calibration split {report['calibration']['source']} "
             f"({report['calibration']['n']} images), test split {report['test']['source']} "
             f"({report['test']['n']} images), {report['n_bins']} bins. Lower is better except accuracy." + shown,
             ""]
    if pre:
        lines += [f"Preprocessing: {pre['description']}" + (f" (guessed: {'; '.join(pre['guessed'])})"
                                                             if pre["guessed"] else "") + ".", ""]
    lines += ["| calibrator | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
    for name, row in [("uncalibrated", report["uncalibrated"]), *report["calibrators"].items()]:
        intervals = row.get("intervals", {}).get("test", {})
        lines.append(f"| {name} | " + " | ".join(_cell(row["test"][k], intervals.get(k), 4) for k in keys) + " |")
    lines += ["", *_temperature_lines(report), *_export_lines(report["calibrated_model"], report.get("selection")),
              *_conformal_lines(report)]
    return "\n".join(lines) + "\n"


def _temperature_lines(report: Dict[str, Any]) -> List[str]:
    """Each temperature's 95% interval over refits on resampled calibration images, and with few of them how far
    the test ECE and NLL after it move."""
    lines = []
    for name, row in report["calibrators"].items():
        interval = row.get("temperature_interval")
        if interval is None:
            continue
        line = (f"{name}: T = {row['temperature']:.2f} [{interval['low']:.2f}, {interval['high']:.2f}], refitted on "
                f"{interval['resamples']} resamples of the calibration images.")
        spread = row.get("post_ts_spread")
        if spread:
            line += (f" Only {spread['n_val']} calibration images: with T in that range the test ECE moves within "
                     f"[{spread['ece']['low']:.4f}, {spread['ece']['high']:.4f}] and the NLL within "
                     f"[{spread['nll']['low']:.4f}, {spread['nll']['high']:.4f}]; {SMALL_VALIDATION} images or more "
                     "give a steadier temperature.")
        lines += [line, ""]
    return lines


def _cell(value: float, interval: Optional[Dict[str, float]], digits: int) -> str:
    """``value [low, high]`` (the value alone without an interval)."""
    if interval is None or interval.get("low") is None:
        return f"{value:.{digits}f}"
    return f"{value:.{digits}f} [{interval['low']:.{digits}f}, {interval['high']:.{digits}f}]"


def _export_lines(record: Dict[str, Any], selection: Optional[Dict[str, Any]]) -> List[str]:
    lines = [f"Calibrated model: `{record['model']}` + `{record['calibrator']}` ({record['kind']}: "
             f"{record['chosen_by']}; the test split took no part in the choice), loaded by "
             "`timm_csm.training.load_trained_classifier(folder, calibrated=True)`.", ""]
    if selection:
        left_out = ", ".join(f"{name} ({why})" for name, why in selection["left_out"].items()) or "none"
        lines += [f"Each calibrator fitted on all folds of the calibration split but one and scored by "
                  f"{selection['by'].upper()} on the one left out ({selection['folds']} folds stratified by class, "
                  f"seed {selection['seed']}; not tried: {left_out}):", "", fold_table_markdown(selection), ""]
    return lines


def _conformal_lines(report: Dict[str, Any]) -> List[str]:
    if not report["conformal"]:
        return []
    alpha = report["alpha"]
    lines = [f"Conformal sets at alpha = {alpha} (target coverage {1 - alpha:.2f}). The coverage of one split "
             "varies about the target: given n calibration points it follows Beta(n + 1 - l, l), l = floor((n + 1) "
             "alpha), and the test split adds its binomial noise; the expected range is its 5-95% interval, so a "
             "coverage inside it is what a correct conformal procedure gives. On top of a calibrator, the sets "
             "refit it on one part of the calibration split and compute their quantile on the other (a calibrator "
             "that has seen the quantile's images breaks the guarantee: coverage falls below the target); "
             "`images` gives the calibrator / tuning / quantile parts. `set_size_temperature`: the sets' own "
             "temperature T, fitted for set size on a tuning part of the calibration split, the quantile on the "
             "rest.", "",
             "| calibrator | method | T | images | coverage | expected range | mean set size | empty sets |",
             "|---|---|---|---|---|---|---|---|"]
    warnings = []
    for base, methods in report["conformal"].items():
        for method, r in methods.items():
            lo, hi = r["coverage_range"]
            iv = r.get("intervals", {})
            t = "-" if r["temperature"] is None else f"{r['temperature']:g}"
            parts = " / ".join(str(n) if n else "-" for n in (r.get("n_calibrator"), r["n_tuning"],
                                                               r["n_calibration"]))
            warning = coverage_outside_range(r)
            if warning is not None:
                warnings.append(f"**Warning** ({base}): {warning}.")
            lines.append(f"| {base} | {method} | {t} | {parts} | {_cell(r['coverage'], iv.get('coverage'), 4)}"
                         f"{' (outside)' if warning else ''} | {lo:.3f}-{hi:.3f} | "
                         f"{_cell(r['mean_set_size'], iv.get('mean_set_size'), 3)} | "
                         f"{_cell(r['empty_sets'], iv.get('empty_sets'), 4)} |")
    if warnings:
        lines += ["", "A coverage outside its expected range happens to one split in ten by chance; in several rows, "
                  "or far outside, it says the calibration and test images are not exchangeable (another "
                  "distribution, or the calibration images overlap the model's training images).", "", *warnings]
    for base, why in report.get("conformal_left_out", {}).items():
        lines += ["", f"No conformal sets on {base}: it {why}."]
    raps = report["conformal"]["none"].get("raps")
    if raps is not None and raps["n_tuning"]:
        lines += ["", f"RAPS (uncalibrated): k_reg {raps['k_reg']} and penalty {raps['penalty']:g} tuned on "
                  f"{raps['n_tuning']} calibration images (Angelopoulos et al., 2021), its quantile fitted on the "
                  f"other {raps['n_calibration']}; each row tunes its own."]
    return lines


def prediction_curves(logits, labels, n_bins: int) -> Dict[str, Any]:
    """The report's curves of one set of predictions: the reliability table and the risk-coverage curve."""
    conf, pred = torch.softmax(logits.double(), dim=1).max(dim=1)
    return {"reliability": reliability_table(logits, labels, n_bins).to_dict(),
            "risk_coverage": risk_coverage_from_points(conf, (pred == labels).double()).to_dict()}


def write_plots(folder: Path, test, fitted, n_bins: int, log, reliability: Sequence[str] = ()) -> None:
    """``reliability.png`` (before and after each calibrator of ``fitted``, ``{name: (calibrator, test logits)}``),
    ``reliability_<kind>.png`` for each kind of ``reliability`` and ``risk_coverage.png``; without matplotlib one
    line in the log and no plots."""
    try:
        import matplotlib  # noqa: F401  (the [plots] extra)
    except ImportError as e:
        log(f"plots skipped: {missing_extra(e) or e}")
        return
    runs = {"uncalibrated": (test[0], test[1])}
    runs.update({name: (out, test[1]) for name, (_, out) in fitted.items()})
    reliability_diagrams(runs, str(folder / "reliability.png"), n_bins=n_bins)
    for kind in reliability:
        kind_diagrams(runs, folder / f"reliability_{kind}.png", n_bins, kind)
    risk_coverage_diagram(runs, folder / "risk_coverage.png")
