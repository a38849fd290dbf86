"""Reliability (and risk-coverage) diagrams as PNG files (matplotlib, the optional ``[plots]`` extra, is imported on
first use).

Bars show the accuracy of each equal-width confidence bin, red hatched bars the gap to the bin's mean confidence,
the dashed diagonal perfect calibration, and a lower panel the share of samples per bin. The ECE written on the
diagram is the value :func:`timm_csm.metrics.ece` returns for the same inputs (both come from one
:class:`~timm_csm.metrics.ReliabilityTable`), and it is also returned.
"""
from __future__ import annotations

import os
from typing import Callable, Dict, Mapping, Optional, Tuple

from ..extras import require
from ..registry import Registry
from .binning import DEFAULT_N_BINS
from .functional import ReliabilityTable, reliability_table

__all__ = ["reliability_diagram", "reliability_diagrams", "table_diagrams", "kind_diagrams", "risk_coverage_diagram",
           "plot_reliability", "ece_label", "PANELS_PER_ROW", "RELIABILITY_KINDS", "register_reliability_kind"]


def ece_label(ece_value: float) -> str:
    """The text printed on a diagram for an ECE given as a fraction."""
    return f"ECE = {100.0 * ece_value:.2f}%"


#: panels per row of a figure of several diagrams (more go to further rows: 4 x 4 inches at 120 dpi is 1,920 px)
PANELS_PER_ROW = 4


def _figure(panels: int):
    """A figure of ``panels`` diagrams, :data:`PANELS_PER_ROW` a row: [(diagram axes, share axes)] in reading
    order."""
    FigureCanvasAgg = require("matplotlib.backends.backend_agg", "a reliability diagram", "FigureCanvasAgg")
    Figure = require("matplotlib.figure", "a reliability diagram", "Figure")
    ncols = min(panels, PANELS_PER_ROW)
    nrows = -(-panels // ncols)
    fig = Figure(figsize=(4.0 * ncols, 4.6 * nrows), layout="constrained")
    FigureCanvasAgg(fig)  # no pyplot: no global state, no GUI backend
    grid = fig.add_gridspec(2 * nrows, ncols, height_ratios=(4, 1) * nrows)
    rows_cols = [(2 * (i // ncols), i % ncols) for i in range(panels)]
    axes = [(fig.add_subplot(grid[r, c]), fig.add_subplot(grid[r + 1, c])) for r, c in rows_cols]
    return fig, axes


def plot_reliability(table: ReliabilityTable, ax, hist_ax=None, title: Optional[str] = None) -> str:
    """Draw ``table`` on a matplotlib Axes (and the per-bin sample share on ``hist_ax``); returns the ECE label."""
    edges = table.edges.cpu().double()
    lower, width = edges[:-1].numpy(), (edges[1:] - edges[:-1]).numpy()
    count = table.count.cpu().numpy()
    acc = table.accuracy.cpu().nan_to_num(0.0).numpy()
    conf = table.confidence.cpu().numpy()
    nonempty = count > 0
    ax.bar(lower, acc, width=width, align="edge", color="#4878cf", edgecolor="black", linewidth=0.6,
           label="accuracy")
    gap_bottom = [min(a, c) if ok else 0.0 for a, c, ok in zip(acc, conf, nonempty)]
    gap_height = [abs(a - c) if ok else 0.0 for a, c, ok in zip(acc, conf, nonempty)]
    ax.bar(lower, gap_height, bottom=gap_bottom, width=width, align="edge", color="#d65f5f", alpha=0.45,
           edgecolor="#b22222", hatch="//", linewidth=0.6, label="gap")
    ax.plot([0, 1], [0, 1], linestyle="--", color="gray", linewidth=1)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy")
    ax.legend(loc="upper left", fontsize=8)
    label = ece_label(table.ece)
    ax.text(0.97, 0.04, label, transform=ax.transAxes, ha="right", va="bottom", fontsize=10,
            bbox=dict(boxstyle="round", facecolor="white", alpha=0.8))
    if title:
        ax.set_title(title)
    if hist_ax is not None:
        share = count / max(count.sum(), 1.0)
        hist_ax.bar(lower, share, width=width, align="edge", color="gray", edgecolor="black", linewidth=0.4)
        hist_ax.set_xlim(0, 1)
        hist_ax.set_xlabel("confidence")
        hist_ax.set_ylabel("share")
    else:
        ax.set_xlabel("confidence")
    return label


def _save(fig, path) -> str:
    from ..io import atomic_path

    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    return os.fspath(path)


def reliability_diagram(preds, target, path, n_bins: int = DEFAULT_N_BINS, title: Optional[str] = None,
                        input_type: str = "logits", **kwargs) -> float:
    """Write a reliability diagram PNG to ``path`` (atomically); returns the ECE printed on it.

    ``kwargs`` (``task``, ``num_classes``, ``ignore_index``) go to :func:`timm_csm.metrics.reliability_table`.
    """
    table = reliability_table(preds, target, n_bins, input_type=input_type, **kwargs)
    fig, axes = _figure(1)
    plot_reliability(table, axes[0][0], axes[0][1], title=title)
    _save(fig, path)
    return table.ece


def reliability_diagrams(runs: Mapping[str, Tuple[object, object]], path, n_bins: int = DEFAULT_N_BINS,
                         title: Optional[str] = None, input_type: str = "logits", **kwargs) -> Dict[str, float]:
    """Reliability diagrams, one panel per ``{name: (preds, target)}`` (:data:`PANELS_PER_ROW` a row); returns
    ``{name: ece}``."""
    if not runs:
        raise ValueError("runs is empty: pass {name: (preds, target)}")
    tables = {name: reliability_table(preds, target, n_bins, input_type=input_type, **kwargs)
              for name, (preds, target) in runs.items()}
    return table_diagrams(tables, path, title)


def table_diagrams(tables: Mapping[str, ReliabilityTable], path, title: Optional[str] = None) -> Dict[str, float]:
    """Diagrams of ready tables (e.g. adaptive or classwise ones from
    :func:`~timm_csm.metrics.reliability_table_from_points`), one panel per name (:data:`PANELS_PER_ROW` a row);
    returns ``{name: ece}``, the ECE of each table's own binning."""
    if not tables:
        raise ValueError("tables is empty: pass {name: ReliabilityTable}")
    fig, axes = _figure(len(tables))
    for (name, table), (ax, hist_ax) in zip(tables.items(), axes):
        plot_reliability(table, ax, hist_ax, title=name)
    if title:
        fig.suptitle(title)
    _save(fig, path)
    return {name: table.ece for name, table in tables.items()}


#: the reliability diagrams beside the equal-width top-label one, in registration order: name -> ``table(probs,
#: labels, n_bins)``, the reliability table of that binning
RELIABILITY_KINDS = Registry("reliability diagram", sort=False)


def register_reliability_kind(name: str, table: Optional[Callable] = None, *, overwrite: bool = False):
    """Register ``table(probs, labels, n_bins) -> ReliabilityTable`` as the reliability diagram ``name`` (without
    ``table``, a decorator)."""
    return RELIABILITY_KINDS.register(name, overwrite=overwrite) if table is None else \
        RELIABILITY_KINDS.register(name, table, overwrite=overwrite)


@register_reliability_kind("adaptive")
def _adaptive_table(probs, labels, n_bins: int):
    """Equal-mass bins of the top-label confidence."""
    from .functional import reliability_table_from_points

    conf, pred = probs.max(dim=1)
    return reliability_table_from_points(conf, (pred == labels).double(), n_bins, equal_mass=True)


@register_reliability_kind("classwise")
def _classwise_table(probs, labels, n_bins: int):
    """The pairs (p_ik, 1[y_i = k]) of every class in equal-width bins."""
    import torch

    from .functional import reliability_table_from_points

    hits = torch.nn.functional.one_hot(labels, probs.shape[1]).double()
    return reliability_table_from_points(probs, hits, n_bins)


def kind_diagrams(runs: Mapping[str, Tuple[object, object]], path, n_bins: int, kind: str) -> Dict[str, float]:
    """Diagrams of one of :data:`RELIABILITY_KINDS` for each ``{name: (logits, labels)}``: ``adaptive`` (equal-mass
    bins of the top-label confidence) or ``classwise`` (the pairs (p_ik, 1[y_i = k]) of every class in equal-width
    bins); returns ``{name: ece}`` of those binnings."""
    import torch

    if kind not in RELIABILITY_KINDS:
        raise ValueError(f"unknown reliability diagram {kind!r}; known: {', '.join(RELIABILITY_KINDS)}")
    table = RELIABILITY_KINDS.get(kind)
    tables = {name: table(torch.softmax(logits.double(), dim=1), labels, n_bins) for name, (logits, labels) in
              runs.items()}
    return table_diagrams(tables, path, title=f"{kind} reliability")


def risk_coverage_diagram(runs: Mapping[str, Tuple[object, object]], path) -> str:
    """Selective risk against coverage (abstaining on the least confident first), one line per
    ``{name: (logits, labels)}``, written to ``path`` (atomically)."""
    import torch

    from .selective import risk_coverage_from_points

    Figure = require("matplotlib.figure", "a risk-coverage diagram", "Figure")
    FigureCanvasAgg = require("matplotlib.backends.backend_agg", "a risk-coverage diagram", "FigureCanvasAgg")
    fig = Figure(figsize=(5, 4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for name, (logits, labels) in runs.items():
        conf, pred = torch.softmax(logits.double(), dim=1).max(dim=1)
        curve = risk_coverage_from_points(conf, (pred == labels).double())
        ax.plot(curve.coverage.numpy(), curve.risk.numpy(), label=name)
    ax.set_xlabel("coverage")
    ax.set_ylabel("selective risk")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return _save(fig, path)
