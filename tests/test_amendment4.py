"""Amendment 4's cells, choices and page (benchmarks/amendment4.py) on constructed per-seed rows: amendment 2's
rules over amendment 4's grids (at most 4 configurations a method) and 10 decision seeds."""
import json

from benchmark_scripts import load_benchmark

a4 = load_benchmark("amendment4")
table = a4.method_table


def _rows(values, seeds=(0, 1, 2)):
    return {m: [{"seed": s, "val_ece_pre_ts": v[0], "val_nll_pre_ts": v[1], "val_ece_post_ts": v[0],
                 "val_nll_post_ts": v[1], "ece_pre_ts": v[2] + 0.1 * (s % 3), "ece_post_ts": v[2]} for s in seeds]
            for m, v in values.items()}


def test_stage1_runs_amendment4s_grids_then_the_filter_step_at_the_chosen_scale():
    first = a4.next_cells("matched", {})
    names = {m for m, s in first if s <= 2}
    assert {s for m, s in first if s > 2} == set(range(3, 10)) and {m for m, s in first if s > 2} == {"ce"}
    assert names == set(table.stage1_methods("matched", amendment=4))
    assert not {"mbls", "brier", "kd"} & {m.partition("@")[0] for m in names}
    assert "kd@alpha=0.5,temperature=2" in {m for m, _ in a4.next_cells("annotated", {})}
    values = {m: (3.0, 0.4, 0.5) for m in names}
    values["csm@s=8"] = (1.0, 0.3, 9.0)  # chosen on validation, whatever its test ECE
    nxt = a4.next_cells("matched", _rows(values))
    assert sorted({m for m, s in nxt if s <= 2}) == ["csm@filtered=1,s=8"]
    values["csm@filtered=1,s=8"] = (1.2, 0.3, 0.0)
    choices = a4.stage1_choices("matched", _rows(values))
    assert choices["csm"] == "csm@s=8"
    stage2 = {m for m, s in a4.next_cells("matched", _rows(values)) if s > 2}
    assert stage2 == {"ce", choices["chosen"]["regmixup"], *choices["best_other"].values(), "csm@s=8"}
    assert max(s for _, s in a4.next_cells("matched", _rows(values))) == 9


def _csm_chosen(seeds):
    """Rows of every stage-1 configuration at ``seeds``, CSM (s 8) chosen and 2 points lower in test ECE; and the
    summaries of both settings on them."""
    values = {m: (3.0, 0.4, 3.0) for m in table.stage1_methods("matched", amendment=4)}
    values["csm@s=8"] = (1.0, 0.3, 1.0)
    values["csm@filtered=1,s=8"] = (1.2, 0.3, 1.0)
    rows = _rows(values, seeds=seeds)
    return rows, {s: {"rows": rows, "choices": a4.stage1_choices("matched", rows)} for s in ("matched", "annotated")}


def test_the_decision_waits_for_ten_paired_seeds(tmp_path):
    rows, summaries = _csm_chosen(range(10))
    decided = a4.a2.primary_decisions(summaries, table.A4_SEEDS)
    assert decided.verdicts == {"matched": "holds", "annotated": "holds"}
    short = {m: r[:9] for m, r in rows.items()}
    summaries = {s: {"rows": short, "choices": a4.stage1_choices("matched", rows)} for s in ("matched", "annotated")}
    assert set(a4.a2.primary_decisions(summaries, table.A4_SEEDS).verdicts.values()) == {"pending"}


def test_the_page_shows_stage_2s_rows_and_decision_figure_and_what_the_annotator_saw(tmp_path):
    _, summaries = _csm_chosen(range(10))
    figure = tmp_path / "page_decision.png"
    text = "\n".join(a4.body_lines(summaries, figure))
    assert "### `matched`: the stage-2 rows (seeds 0-9" in text and "| CSM row: CSM (s 8) | 10 |" in text
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"]({figure.name})" in text
    annotated = text.split("### `annotated`: stage 1")[1]
    assert "1,787 of the 2,000 validation images" in annotated
    assert "validation images" not in text.split("### `annotated`: stage 1")[0].split("### `matched`: stage 1")[1]


def test_page_states_pending_cells_without_any_cell(tmp_path):
    text = a4.write_page(tmp_path / "page.md", tmp_path / "rows.json", tmp_path / "none", tmp_path / "committed",
                         tmp_path / "earlier", tmp_path / "verify.json")
    assert "Cells: 0 finished" in text and ": pending.**" in text and "can run now, next `ce` seed 0" in text
    assert "No cell has been re-run" in text
    assert (tmp_path / "rows.json").read_text().strip() == "[]"


def test_cells_on_amendment2s_sets_are_reported_apart_and_enter_no_choice(tmp_path):
    import shutil
    from pathlib import Path

    earlier = tmp_path / "earlier"
    shutil.copytree(Path(a4.EARLIER_SETS) / "csm@s=4-matched-s0", earlier / "csm@s=4-matched-s0")
    text = a4.write_page(tmp_path / "page.md", tmp_path / "rows.json", tmp_path / "none", tmp_path / "committed",
                         earlier)
    section = text.split("Cells of `matched` on amendment 2's sets")[1].split("###")[0]
    assert "enter no choice and no test" in section and "| CSM (s 4) | 1 |" in section
    assert "Cells of `annotated` on amendment 2's sets" not in text
    assert "Cells: 0 finished" in text
    (row,) = json.loads((tmp_path / "rows.json").read_text())
    assert row["method"] == "csm@s=4" and row["seeds"] == [0] and row["superseded"] == a4.EARLIER_SET_NOTE
    # the stage-1 table above counts no seed of it: the earlier cell enters no choice
    stage1 = text.split("Cells of `matched` on amendment 2's sets")[0].split("`matched`: stage 1")[1]
    assert "| CSM (s 4) | 0 |" in stage1


def test_cost_leaves_out_resumed_cells_whose_cpu_time_starts_at_the_resume():
    one_go = {"cpu_seconds": 600.0, "record": {}}
    cells = {"ce": {0: one_go, 1: {"cpu_seconds": 1200.0, "record": {}}},
             "csm@s=8": {0: {"cpu_seconds": 60.0, "record": {"resumed": True}}}}
    lines = a4._cost_lines(cells)
    assert "| CE | 2 | 15.0 | 10.0-20.0 | 1.00x | 0 |" in lines
    assert "| CSM | 0 | - | - | - | 1 |" in lines
    cells["csm@s=8"][1] = {"cpu_seconds": 2700.0, "record": {}}
    assert "| CSM | 1 | 45.0 | 45.0-45.0 | 3.00x | 1 |" in a4._cost_lines(cells)


def test_set_lines_name_each_set_read_and_the_rule_for_a_rebuilt_one(monkeypatch):
    earlier = {"csm@s=8": {0: {"record": {"generated_set": "a" * 64}}},
               "kd": {0: {"record": {"teacher": "t" * 64}}}}
    monkeypatch.setattr(a4.a2, "a2_cells", lambda setting: earlier)
    cells = {"csm@s=8": {s: {"record": {"generated_set": "a" * 64}} for s in range(3)},
             "kd": {0: {"record": {"teacher": "t" * 64}}}}
    assert a4._set_lines(cells, "annotated") == ["- `csm@s=8`: generated set `aaaaaaaaaaaa`, byte-identical to "
                                                 "amendment 2's", "- `kd`: teacher `tttttttttttt`, byte-identical "
                                                 "to amendment 2's"]
    cells["kd"][0]["record"]["teacher"] = "u" * 64  # rebuilt: the clarification's rule is named
    cells["csm@s=8"][2]["record"]["generated_set"] = "b" * 64  # one configuration, two sets: shown, not hidden
    lines = a4._set_lines(cells, "annotated")
    assert lines[0] == ("- `csm@s=8`: its cells read 2 generated sets, `aaaaaaaaaaaa`, `bbbbbbbbbbbb` (the protocol "
                        "wants one)")
    assert lines[1] == "- `kd`: teacher `uuuuuuuuuuuu`, differs from amendment 2's tttttttttttt"
    assert "clarification of 2026-12-07" in lines[2] and len(lines) == 3


def test_the_decision_figure_marks_no_primary_comparison_and_no_colour_before_its_seeds_are_in(tmp_path, monkeypatch):
    from timm_csm.study import report, report_figures

    drawn = []
    real = report.decision_figure
    monkeypatch.setattr(report, "decision_figure", lambda entries, *a: drawn.append((entries, a)) or real(entries, *a))
    for seeds in (range(4), range(10)):
        a4.body_lines(_csm_chosen(seeds)[1], tmp_path / "decision.png")
    (partial, (*_, expected)), (full, _) = drawn
    assert expected == 10 and {t.n for *_, t in partial} == {4} and {t.n for *_, t in full} == {10}
    assert not any("(P)" in label for _, label, _ in partial)
    assert any("(P)" in label for _, label, _ in full)
    # CSM is 2 points lower in every pair: green once the 10 seeds are in, grey before
    assert {report_figures.interval_colour(t, expected) for *_, t in partial} == {"tab:gray"}
    assert {report_figures.interval_colour(t, expected) for g, lab, t in full if "(P)" in lab and g == "before TS"} \
        == {"tab:green"}
