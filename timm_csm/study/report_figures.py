"""A study's figures: the decision figure, a forest plot of the paired differences of the searched row minus each
other row (:func:`decision_figure`), and the later volume stage's test ECE against generated images
(:func:`volume_figure`). matplotlib (the ``[plots]`` extra) is imported when a figure is drawn."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Tuple

from ..metrics import PairedInterval

__all__ = ["decision_figure", "interval_colour", "volume_figure"]


def interval_colour(test: PairedInterval, seeds: int) -> str:
    """Green where the interval lies below 0 (CSM lower), red above, grey where it holds 0 or has fewer than
    ``seeds`` paired seeds."""
    if test.n < seeds:
        return "tab:gray"
    return "tab:green" if test.high < 0 else "tab:red" if test.low > 0 else "tab:gray"


def decision_figure(entries: Sequence[Tuple[str, str, Optional[PairedInterval]]], path: Path,
                    title: str, seeds: int) -> Path:
    """A forest plot of paired differences: one row per ``(group, label, test)`` (a :class:`PairedInterval`), the
    mean and its 95% t-interval in ECE points, 0 marked; groups (e.g. before / after TS) side by side. A row with
    fewer than ``seeds`` paired seeds is drawn hollow and grey with its count: colour would read as a decision."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(dict.fromkeys(g for g, _, _ in entries))
    labels = list(dict.fromkeys(lab for _, lab, _ in entries))
    fig, axes = plt.subplots(1, len(groups), figsize=(4.2 * len(groups), 0.45 * len(labels) + 1.4), sharey=True,
                             squeeze=False)
    for ax, group in zip(axes[0], groups):
        for y, label in enumerate(labels):
            test = next((t for g, lab, t in entries if g == group and lab == label), None)
            if test is None:
                continue
            complete, colour = test.n >= seeds, interval_colour(test, seeds)
            ax.errorbar(test.mean, y, xerr=[[test.mean - test.low], [test.high - test.mean]], fmt="o", color=colour,
                        mfc=colour if complete else "white", capsize=3)
            if not complete:
                ax.annotate(f"{test.n} of {seeds} seeds", (test.mean, y), xytext=(0, 5), textcoords="offset points",
                            ha="center", va="bottom", fontsize=7, color="tab:gray")
        ax.axvline(0.0, color="black", lw=0.8)
        ax.set_title(group, fontsize=10)
    axes[0][0].set_yticks(range(len(labels)), labels)
    axes[0][0].set_ylim(len(labels) - 0.5, -0.9)  # first row on top, room above for a seed count; axes share y
    fig.supxlabel(f"CSM minus the other method, test ECE (points); green: interval below 0, red: above "
                  f"(rows with all {seeds} seeds; hollow grey: seeds still running)", fontsize=9)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")  # a long study label widens the title beyond the panels
    plt.close(fig)
    return Path(path)


def volume_figure(series: Dict[str, Dict[str, Any]], path: Path) -> Path:
    """Test ECE before and after TS against generated images, one row of panels per setting: each point's mean and
    95% t-interval over its seeds, RegMixup's mean and interval as a band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(series), 2, figsize=(8.4, 3.2 * len(series)), squeeze=False, sharey="row")
    for row, (setting, sr) in zip(axes, series.items()):
        for ax, (phase, name) in zip(row, (("pre_ts", "before TS"), ("post_ts", "after TS"))):
            band = sr["regmixup"][phase]
            if band is not None:
                ax.axhspan(band[2], band[3], color="tab:orange", alpha=0.2, lw=0)
                ax.axhline(band[1], color="tab:orange", lw=1, label=f"RegMixup, 95% interval (n={band[0]})")
            drawn = [(x, i) for x, ph in sr["points"] for i in [ph[phase]] if i is not None]
            if drawn:
                ax.errorbar([x for x, _ in drawn], [i[1] for _, i in drawn],
                            yerr=[[i[1] - i[2] for _, i in drawn], [i[3] - i[1] for _, i in drawn]], fmt="o-",
                            color="tab:blue", capsize=3, label="CSM row")
            xs = [x for x, _ in sr["points"]]
            ax.set_xscale("log")
            ax.set_xlim(min(xs) / 1.3, max(xs) * 1.3)
            ax.set_xticks(xs, [f"{x:,}" for x in xs])
            ax.minorticks_off()
            ax.set_title(f"{setting}: test ECE {name}", fontsize=10)
            ax.set_xlabel("generated images")
            ax.legend(fontsize=8)
        row[0].set_ylabel("ECE (%)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)
