"""The shift and OOD sections of a report (``results.md`` of a training run, ``report.md`` of timm-csm-calibrate)
and the figure ``shift.png``: ECE and accuracy against severity, the mean over the corruptions, one line per method
(before and after each calibrator), the in-distribution value marked at severity 0."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Dict, List

__all__ = ["shift_markdown", "ood_markdown", "ood_reading", "shift_figure", "SHIFT_FIGURE"]

SHIFT_FIGURE = "shift.png"
_OOD_LABELS = {"msp": "max softmax", "max_logit": "max logit", "energy": "energy", "entropy": "neg. entropy"}


def _pct(v: float) -> str:
    return f"{100 * v:.2f}"


def _with(value: str, interval: Dict[str, float] = None, fmt=_pct) -> str:
    """``value`` and, when there is one, its 95% interval ``[low, high]`` in the same format."""
    if not interval or interval.get("low") is None:
        return value
    return f"{value} [{fmt(interval['low'])}, {fmt(interval['high'])}]"


def shift_markdown(results: Dict[str, Any]) -> str:
    """The sections of ``results["shift"]`` and ``results["ood"]`` (empty when neither is there)."""
    text = ""
    if results.get("shift"):
        text += "\n" + "\n".join(_shift_lines(results["shift"])) + "\n"
    if results.get("ood"):
        text += "\n" + ood_markdown(results["ood"])
    return text


def _shift_lines(shift: Dict[str, Any]) -> List[str]:
    methods, sevs = shift["methods"], shift["severities"]
    cover = shift["conformal_methods"][0] if shift["clean"][methods[0]]["conformal"] else None  # none: no sets
    head = ["severity", "accuracy (%)"] + [f"ECE {m} (%)" for m in methods] + [f"NLL {m}" for m in methods]
    head += [f"{cover} coverage {m}" for m in methods] if cover else []
    head += [f"worst corruption (ECE {methods[-1]}, %)"]
    lines = [f"## Under corruption: {len(shift['corruptions'])} corruptions x severities {sevs}", "",
             f"The {shift['n']} test images under each corruption (seed {shift['seed']}), the calibrators fitted on "
             "the clean calibration split; each row the mean over the corruptions, and the corruption with the "
             f"highest ECE. Every cell per corruption is in the JSON report (`shift.table`); figure: "
             f"`{SHIFT_FIGURE}`." + (f" Brackets: 95% bootstrap intervals ({shift['bootstrap']['resamples']} "
                                      "resamples of the images, the same for every corruption, so a severity's "
                                      "interval is that of the mean over corruptions)." if shift.get("bootstrap")
                                      else ""),
             *(["", shift["applied"]] if shift.get("applied") else []),
             "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def row(label: str, cells: Dict[str, Dict[str, Any]], intervals: Dict[str, Dict[str, Any]], worst: str) -> str:
        def iv(m, k):
            return intervals.get(m, {}).get(k)

        vals = [_with(_pct(cells[methods[0]]["accuracy"]), iv(methods[0], "accuracy"))]
        vals += [_with(_pct(cells[m]["ece"]), iv(m, "ece")) for m in methods]
        vals += [_with(f"{cells[m]['nll']:.4f}", iv(m, "nll"), lambda v: f"{v:.4f}") for m in methods]
        vals += [f"{cells[m]['conformal'][cover]['coverage']:.3f}" if cover in cells[m]["conformal"] else "-"
                 for m in methods] if cover else []  # "-": no sets on a calibrator too large for its part
        return f"| {label} | " + " | ".join(vals + [worst]) + " |"

    clean = shift["clean"]
    lines.append(row("clean", clean, {m: clean[m].get("intervals", {}) for m in methods}, "-"))
    for s in sevs:
        summary = shift["summary"][str(s)]
        worst = summary[methods[-1]]["worst"]
        lines.append(row(str(s), {m: summary[m]["mean"] for m in methods},
                         {m: summary[m].get("intervals", {}) for m in methods},
                         f"{worst['corruption']} ({_pct(worst['ece'])})"))
    return lines


def ood_markdown(ood: Dict[str, Any]) -> str:
    """The OOD table: AUROC, AUPR (in- and out-of-distribution as positives) and FPR at 95 % TPR per method and
    score."""
    lines = [f"## Out of distribution: {ood['source']} ({ood['split']}, {ood['n_out']} images) against the "
             f"{ood['n_in']} test images", "",
             "Higher AUROC / AUPR and lower FPR at 95 % TPR detect the unknown images better."
             + (" Brackets: 95% bootstrap intervals (the test and the OOD images resampled apart)."
                if ood.get("intervals") else ""), "",
             "| method | score | AUROC | AUPR-in | AUPR-out | FPR@95TPR |", "|---|---|---|---|---|---|"]
    four = lambda v: f"{v:.4f}"  # noqa: E731
    for method, scores in ood["methods"].items():
        for kind, m in scores.items():
            iv = ood.get("intervals", {}).get(method, {}).get(kind, {})
            cells = [_with(four(m[k]), iv.get(k), four) for k in ("auroc", "aupr_in", "aupr_out", "fpr95")]
            lines.append(f"| {method} | {_OOD_LABELS.get(kind, kind)} | " + " | ".join(cells) + " |")
    return "\n".join(lines + [""] + ood_reading(ood)) + "\n"


def ood_reading(ood: Dict[str, Any]) -> List[str]:
    """What a user reads first: the score (method and kind) with the highest AUROC, and, when a score's AUROC lies
    below 0.5, one line saying what that means: the model is more confident on the OOD images than on its own."""
    ranked = sorted(((m["auroc"], method, kind) for method, scores in ood["methods"].items()
                     for kind, m in scores.items()), reverse=True)
    auroc, method, kind = ranked[0]
    lines = [f"OOD {ood['source']}: {ood['n_out']} images, best AUROC {auroc:.4f} ({_OOD_LABELS.get(kind, kind)}, "
             f"{method})."]
    below = [(a, m, k) for a, m, k in ranked if a < 0.5]
    if below:
        a, m, k = below[-1]
        lines.append(f"AUROC below 0.5 for {len(below)} of {len(ranked)} scores (lowest {a:.4f}, "
                     f"{_OOD_LABELS.get(k, k)}, {m}): the model is more confident on the OOD images than on its own "
                     "test images, so these scores take the OOD images for the known ones.")
    return lines


def shift_figure(folder: Path, results: Dict[str, Any], log: Callable[[str], None] = print) -> None:
    """``shift.png`` in ``folder`` when ``results`` holds a shift table (skipped, said in the log, without
    matplotlib)."""
    shift = results.get("shift")
    if not shift:
        return
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        log(f"{SHIFT_FIGURE} skipped ({e}; pip install matplotlib)")
        return
    sevs = shift["severities"]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for ax, key, label in ((axes[0], "ece", "ECE (%)"), (axes[1], "accuracy", "accuracy (%)")):
        for i, method in enumerate(shift["methods"]):
            colour = f"C{i}"
            means = [100 * shift["summary"][str(s)][method]["mean"][key] for s in sevs]
            ax.plot(sevs, means, "o-", color=colour, label=method)
            clean = 100 * shift["clean"][method][key]
            ax.plot([0], [clean], "*", color=colour, markersize=12)
            ax.axhline(clean, color=colour, linestyle=":", linewidth=0.8)
        ax.set_xticks([0, *sevs], ["clean", *map(str, sevs)])
        ax.set_xlabel("severity (mean over corruptions)")
        ax.set_ylabel(label)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{len(shift['corruptions'])} corruptions; star: in distribution", fontsize=9)
    fig.tight_layout()
    tmp = Path(folder) / f".{SHIFT_FIGURE}.tmp.png"
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(Path(folder) / SHIFT_FIGURE)
