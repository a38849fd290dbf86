"""Every list of metrics is a view of the metric table: no module of the package or of the benchmarks spells a list of
metric names (or their abbreviations), and each view, its headings, scales, decimals and directions come from the
table's specs."""
import ast
from pathlib import Path

import pytest

from timm_csm.metrics import MetricSpec, list_metrics, metric_of_abbrev, metric_spec, metrics_for, register_metric, table
from timm_csm.metrics.table import VIEWS

ROOT = Path(__file__).resolve().parents[1]
#: the one place the names are written
TABLE_FILE = ROOT / "timm_csm" / "metrics" / "table.py"


def _metric_words():
    return {name for name in list_metrics()} | {metric_spec(name).abbrev for name in list_metrics()}


def _spelled_lists(tree: ast.AST, words):
    """``(line, names)`` of each list, tuple or set display (or dict display with constant values) whose string
    elements (keys) are two or more metric names and nothing else; ``__all__`` names functions, not metrics."""
    exports = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Assign)
               and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)}
    for node in ast.walk(tree):
        if id(node) in exports:
            continue
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            items = node.elts
        elif isinstance(node, ast.Dict) and all(isinstance(v, ast.Constant) for v in node.values):
            items = [k for k in node.keys if k is not None]
        else:
            continue
        strings = [e.value for e in items if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        if len(strings) >= 2 and all(s in words for s in strings):
            yield node.lineno, strings


def test_no_list_of_metric_names_outside_the_metric_table():
    words = _metric_words()
    found = []
    for folder in ("timm_csm", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == TABLE_FILE:
                continue
            for line, names in _spelled_lists(ast.parse(path.read_text(), str(path)), words):
                found.append(f"{path.relative_to(ROOT)}:{line}: {names}")
    assert not found, "metric lists outside the metric table (use metrics_for(view)):\n" + "\n".join(found)


def test_the_scan_sees_a_spelled_list_a_tuple_of_abbreviations_and_a_constant_dict_but_not_computed_values():
    words = _metric_words()
    source = ('A = ("accuracy", "ece")\nB = {"acc", "nll"}\nC = {"ece": "ECE", "nll": "NLL"}\n'
              'D = {"ece": f(x), "nll": g(x)}\n__all__ = ["ece", "nll"]\nE = ("ece", "count")\n')
    assert [line for line, _ in _spelled_lists(ast.parse(source), words)] == [1, 2, 3]


def test_each_view_is_in_table_order_and_an_unknown_view_is_named():
    order = list_metrics()
    for view in VIEWS:
        names = metrics_for(view)
        assert names and names == sorted(names, key=order.index), view
    assert metrics_for("headline") == list_metrics(headline=True)
    with pytest.raises(ValueError, match="unknown metric view 'columns'"):
        metrics_for("columns")
    with pytest.raises(ValueError, match="unknown views"):
        MetricSpec("gap2", "Gap", views=("columns",), from_state=lambda st: 0.0)


def test_the_views_carry_what_the_reports_printed_before():
    from timm_csm.calibration import SELECTION_METRICS
    from timm_csm.study.decide import ROW_METRICS
    from timm_csm.training.checkpoint import SELECT_METRICS
    from timm_csm.training.reporting import REPORT_ROWS

    assert ROW_METRICS == ("acc", "ece", "aece", "cece", "nll", "brier")
    assert [metric_spec(n).short_heading for n in metrics_for("per_seed")] == [
        "Acc (%)", "ECE (%)", "AECE (%)", "CECE (%)", "NLL", "Brier"]
    assert [metric_spec(n).digits for n in metrics_for("page")] == [2, 2, 2, 2, 4]
    assert SELECT_METRICS == {"acc": ("val_accuracy", max), "ece": ("val_ece", min), "nll": ("val_nll", min)}
    assert set(SELECTION_METRICS) == {"ece", "nll"}
    assert REPORT_ROWS[0] == ("accuracy", "Accuracy (%)", 100) and REPORT_ROWS[-1] == ("piece", "PIECE (%)", 100)
    assert metric_of_abbrev("acc").name == "accuracy" and metric_of_abbrev("cece").in_text == "classwise ECE"
    with pytest.raises(ValueError, match="unknown metric abbreviation 'accuracy_'"):
        metric_of_abbrev("accuracy_")


def test_a_registered_metric_joins_its_views_and_an_abbreviation_is_taken_once():
    with table.METRICS.restored():
        _register_a_gap_metric()


def _register_a_gap_metric():
    register_metric(MetricSpec("gap", "Gap", scale=100, views=("shift", "per_seed"), abbrev="gp",
                               from_state=lambda st: (float(st.confidence) - float(st.correct)) / float(st.n)))
    assert metrics_for("shift")[-1] == "gap" and metrics_for("per_seed")[-1] == "gap"
    assert "gap" not in metrics_for("report") + list_metrics(headline=True)
    with pytest.raises(ValueError, match="abbreviation 'acc' is already taken"):
        register_metric(MetricSpec("gap3", "Gap", abbrev="acc", from_state=lambda st: 0.0))
