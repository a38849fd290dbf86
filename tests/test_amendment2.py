"""Amendment 2's stages and decisions (benchmarks/amendment2.py) on constructed per-seed rows; the choice rule
itself is the library's (tests/test_study.py)."""
import json

import pytest

from benchmark_scripts import load_benchmark
from timm_csm.hub import content_fingerprint

a2 = load_benchmark("amendment2")
table = a2.method_table


def _rows(values, seeds=(0, 1, 2)):
    """``{method: (val ECE, val NLL, test ECE)}`` -> per-seed rows with those values at every seed (test ECE
    differing by seed so that intervals have a spread)."""
    return {m: [{"seed": s, "val_ece_pre_ts": v[0], "val_nll_pre_ts": v[1], "val_ece_post_ts": v[0],
                 "val_nll_post_ts": v[1], "ece_pre_ts": v[2] + 0.1 * (s % 3), "ece_post_ts": v[2]} for s in seeds]
            for m, v in values.items()}


def test_next_cells_follow_the_protocols_stages():
    rows = {}
    everything = a2.next_cells("matched", rows)
    first = [(m, s) for m, s in everything if s <= 2]
    assert everything[:len(first)] == first  # stage 1's cells before stage 2's
    # stage 2's seeds only of the methods whose choice is made: CE (no choice to make) before any cell has run
    assert {m for m, s in everything if s > 2} == {"ce"} and {s for m, s in everything if s > 2} == set(range(3, 15))
    names = {m for m, _ in first}
    assert {s for _, s in first} == {0, 1, 2} and "kd" not in {m.split("@")[0] for m in names}
    assert {"ce", "ls@smoothing=0.2", "regmixup@regmixup=2", "csm@s=1", "csm"} <= names
    assert not any("weight" in m for m in names)  # CSM's later steps wait for the scale
    # every stage-1 cell and CSM's s step done, s = 2.3 best: the weight step comes next
    values = {m: (3.0, 0.4, 3.0) for m in names}
    values["csm@s=2.3"] = (1.0, 0.3, 1.0)
    nxt = a2.next_cells("matched", _rows(values))
    assert sorted({m for m, s in nxt if s <= 2}) == ["csm@s=2.3,weight=0.5", "csm@s=2.3,weight=2"]
    # the baselines' choices are made: their stage-2 seeds may run while CSM's search goes on
    choices = a2.stage1_choices("matched", _rows(values))
    assert choices["csm"] is None and choices["chosen"]["regmixup"] is not None
    assert {m for m, s in nxt if s > 2} == {"ce", choices["chosen"]["regmixup"], *choices["best_other"].values()}
    assert "kd@alpha=0.5,temperature=2" in {m for m, _ in a2.next_cells("annotated", {})}


def test_stage2_runs_the_chosen_methods_to_15_seeds_and_decides_under_holm():
    choices_rows = {}
    for setting in ("matched", "annotated"):
        rows = {}
        while True:
            todo = [(m, s) for m, s in a2.next_cells(setting, rows) if s <= 2]
            if not todo:
                break
            for m, s in todo:  # stage 1: the unfiltered s = 4 at weight 2, n_aug 2 wins; RegMixup alpha 10 is best other
                good = {"csm@s=4": 1.5, "csm@s=4,weight=2": 1.2, "csm@n_aug=2,s=4,weight=2": 1.0,
                        "regmixup@regmixup=10": 1.4}.get(m, 3.0)
                rows.update({k: rows.get(k, []) + v for k, v in _rows({m: (good, 0.4, good)}, [s]).items()})
        stage2 = a2.next_cells(setting, rows)
        assert {m for m, _ in stage2} == {"ce", "regmixup@regmixup=10", "csm@n_aug=2,s=4,weight=2"}
        assert {s for _, s in stage2} == set(range(3, 15))
        choices_rows[setting] = rows
    summaries = {s: {"rows": r, "choices": a2.stage1_choices(s, r)} for s, r in choices_rows.items()}
    assert a2.primary_decisions(summaries).verdicts == {"matched": "pending", "annotated": "pending"}
    for setting, rows in choices_rows.items():  # 15 seeds: CSM 0.4 below RegMixup and 2 below CE, with noise
        for m, base in (("ce", 3.0), ("regmixup@regmixup=10", 1.4), ("csm@n_aug=2,s=4,weight=2", 1.0)):
            rows[m] = [{"seed": s, "val_ece_pre_ts": base, "val_nll_pre_ts": 0.4, "val_ece_post_ts": base,
                        "ece_pre_ts": base + (0.05 * ((s * 7) % 5) if m.startswith("csm") else 0.0)}
                       for s in range(15)]
    out = a2.primary_decisions(summaries)
    assert out.verdicts == {"matched": "holds", "annotated": "holds"}
    assert all(c.p_holm >= c.test.p_value for c in out.comparisons)


def _add(rows, method, seeds, val, test=None):
    for m, new in _rows({method: (val, 0.4, val if test is None else test)}, seeds).items():
        rows[m] = [r for r in rows.get(m, []) if r["seed"] not in seeds] + new


# stage 1: CSM's row csm@n_aug=2,s=4,weight=2 in both settings, lower in annotated; RegMixup alpha 10; KD tau 2 alpha 0.5
_GOOD = {"csm@s=4": 1.5, "csm@s=4,weight=2": 1.2, "csm@n_aug=2,s=4,weight=2": 1.0, "regmixup@regmixup=10": 1.4,
         "kd@alpha=0.5,temperature=2": 1.3}
ROW = "csm@n_aug=2,s=4,weight=2"


def _value(setting, m):
    return _GOOD.get(m, 3.0) - (0.5 if setting == "annotated" and m.startswith("csm") else 0.0)


def _stage1(setting):
    rows = {}
    while True:
        todo = [(m, s) for m, s in a2.next_cells(setting, rows) if s <= 2]
        if not todo:
            return rows
        for m, s in todo:
            _add(rows, m, [s], _value(setting, m))


def test_later_stages_start_once_their_choices_are_made_and_stage_2_has_finished():
    rows = {st: _stage1(st) for st in a2.DECISION_SETTINGS}
    assert a2.stage3_setting(rows) == "annotated" and a2.later_stage_cells(rows) == {}
    assert a2.stage3_setting({"matched": rows["matched"]}) is None  # both CSM rows are needed
    # matched finishes stage 2: its volume points follow, at 15 seeds; nothing else yet
    for m, s in a2.next_cells("matched", rows["matched"], rows):
        _add(rows["matched"], m, [s], _value("matched", m))
    volumes = ["csm@n_aug=2,s=4,volume=2,weight=2", "csm@n_aug=2,s=4,volume=4,weight=2"]
    assert a2.later_stage_cells(rows) == {("matched", 0): [(m, tuple(range(15))) for m in volumes]}
    assert a2.next_cells("matched", rows["matched"], rows) == [(m, s) for s in range(15) for m in volumes]
    assert a2.next_cells("borrowed", {}, rows, data_seed=1) == []  # stage 5 waits for annotated's stage 2
    # annotated's stage 2: then stage 3 there (its CSM row has the lower validation ECE), its volumes, stage 5
    stage2 = a2.next_cells("annotated", rows["annotated"], rows)
    assert all(s >= 3 for _, s in stage2)
    for m, s in stage2:
        _add(rows["annotated"], m, [s], _value("annotated", m))
    variants = [name for _, name in a2.stage3_variants(ROW)]
    assert variants == [ROW, "csm@n_aug=2,s=2.3,weight=2", "csm@label=hard,n_aug=2,weight=2",
                        "csm@label=lambda,n_aug=2,weight=2", "csm@label=softmax,n_aug=2,weight=2"]  # s = 4 is the row's
    nxt = a2.next_cells("annotated", rows["annotated"], rows)
    assert {(m, s) for m, s in nxt if m in variants} == {(m, s) for m in variants[1:] for s in range(5)}
    assert {m for m, _ in nxt} == set(variants[1:]) | set(volumes)
    fifth = [ROW if m == "csm" else m for m in ("ce", "regmixup@regmixup=10", "kd@alpha=0.5,temperature=2", "csm")]
    assert a2.next_cells("borrowed", {}, rows, data_seed=2) == [(m, s) for s in range(5) for m in fifth]
    # on data seed 0 the shared cells that ran already are not proposed again
    shared = {m: r for m, r in rows["annotated"].items() if not table.get_method(m).per_setting}
    d0 = a2.next_cells("borrowed", shared, rows)
    assert ("ce", 0) not in d0 and (ROW, 4) in d0 and ("kd@alpha=0.5,temperature=2", 4) in d0


def _write_cells(root, setting, rows, data_seed=0, extra=None):
    """Cell folders (cell.json, results.json) holding ``rows``' values, as calibration_bench writes them."""
    for m, rs in rows.items():
        for r in rs:
            d = root / table.cell_name(m, r["seed"], setting, data_seed)
            d.mkdir(parents=True, exist_ok=True)
            meta = {"method": m, "seed": r["seed"], "setting": setting if table.get_method(m).per_setting else None,
                    "config": {"data_seed": data_seed}, "record": {"amendment": 2}}
            for key, value in (extra or {}).get(m, {}).items():
                meta[key].update(value)
            results = {"test": {ph: {"ece": r[f"ece_{ph}"] / 100} for ph in ("pre_ts", "post_ts")},
                       "val": {ph: {"ece": r[f"val_ece_{ph}"] / 100, "nll": r[f"val_nll_{ph}"]}
                               for ph in ("pre_ts", "post_ts")}}
            (d / "cell.json").write_text(json.dumps(meta))
            (d / "results.json").write_text(json.dumps(results))


def test_page_reports_stages_3_to_5(tmp_path):
    import numpy as np
    from scipy.stats import t as student_t

    from csm_testdata import save_digits_csm_folder
    from timm_csm.annotation import soft_label_confidence
    from timm_csm.hub import load_csm_dataset

    rows = {st: _stage1(st) for st in a2.DECISION_SETTINGS}
    for st in a2.DECISION_SETTINGS:
        for m, s in a2.next_cells(st, rows[st], rows):
            _add(rows[st], m, [s], _value(st, m), test=_value(st, m) + 0.1 * (s % 4))
    # stage 3: lambda labels 0.5 above the row at every seed; stage 4: one volume point; stage 5 below
    lam = "csm@label=lambda,n_aug=2,weight=2"
    rows["annotated"][lam] = [dict(r, ece_pre_ts=r["ece_pre_ts"] + 0.5, ece_post_ts=r["ece_post_ts"] + 0.5)
                              for r in rows["annotated"][ROW] if r["seed"] < 5]
    _add(rows["matched"], "csm@n_aug=2,s=4,volume=2,weight=2", list(range(15)), 1.0, test=0.8)
    labels = save_digits_csm_folder(tmp_path / "lambda-set")
    extra = {lam: {"record": {"generated_set": content_fingerprint(labels)}, "config": {"csm_dataset": labels}}}
    root = tmp_path / "cells"
    for st in a2.DECISION_SETTINGS:
        _write_cells(root, st, rows[st], extra=extra)
    # stage 5: CE's test ECE 3 + 0.1 s, CSM's 2 - d: CSM minus CE is -1 - d - 0.1 s (on data seed 0 the shared
    # cells of seeds 0-4 take these values)
    for d in (0, 1, 2):
        stage5 = {m: [{"seed": s, "val_ece_pre_ts": v, "val_nll_pre_ts": 0.4, "val_ece_post_ts": v,
                       "val_nll_post_ts": 0.4, "ece_pre_ts": v + (0.1 * s if m == "ce" else -d), "ece_post_ts": v}
                      for s in range(5)]
                  for m, v in (("ce", 3.0), ("regmixup@regmixup=10", 1.4), ("kd@alpha=0.5,temperature=2", 1.3),
                               (ROW, 2.0))}
        _write_cells(root, "borrowed", stage5, d)
    page, cache = tmp_path / "page.md", tmp_path / "labels.json"
    text = a2.write_page(page, tmp_path / "no-cache", root, cache)

    stage2 = text.split("## Stage 2")[1].split("### `matched`: stage 1")[0]
    # annotated's CSM row sits 0.8 below KD at every seed: no spread, nothing to detect
    kd = table.get_method("kd@alpha=0.5,temperature=2").label
    assert f"| annotated | {kd} | -0.80 [-0.80, -0.80] (n=15) | 0.0000 | yes | 0.00 | 0.00 / 0.00 |" in stage2
    # the secondary table's before-TS column is the primary comparison's interval
    primary = next(x for x in stage2.splitlines() if x.startswith("| matched | CE |")).split(" | ")[2]
    matched = stage2.split("### `matched`: the stage-2 rows")[1].split("### `annotated`")[0]
    rows_table, secondary = matched.split("Secondary:")
    assert f"| CSM row: {table.get_method(ROW).label} | 15 |" in rows_table
    assert next(x for x in secondary.splitlines() if x.startswith("| CE |")).startswith(f"| CE | {primary} |")
    assert (tmp_path / "page_decision.png").stat().st_size > 0 and "(page_decision.png)" in stage2
    stage3 = text.split("## Stage 3")[1].split("## Stage 4")[0]
    assert "Setting `annotated`" in stage3
    q = np.asarray(load_csm_dataset(labels)["train"]["soft_label"])
    line = next(x for x in stage3.splitlines() if x.startswith(f"| lambda labels: `{lam}`"))
    assert f"| 5 | {soft_label_confidence(q)['mean']:.3f} |" in line and "+0.50 [+0.50, +0.50] (n=5)" in line
    stage4 = text.split("## Stage 4")[1].split("## Stage 5")[0]
    assert "| matched | 54,000 | 15 |" in stage4 and (tmp_path / "page_volume.png").stat().st_size > 0
    assert "annotated |" in stage4  # annotated is stage 3's setting: its volume rows too (pending cells)
    stage5 = text.split("## Stage 5")[1]
    ce_line = next(x for x in stage5.splitlines() if x.startswith("| CE (`ce`) | before TS"))
    diffs = {(d, s): -1.0 - d - 0.1 * s for d in range(3) for s in range(5)}
    per_data_seed = [[v for (d, _), v in diffs.items() if d == k] for k in range(3)]
    for values in (*per_data_seed, [np.mean(v) for v in per_data_seed], list(diffs.values())):
        n, mean, sd = len(values), np.mean(values), np.std(values, ddof=1)
        half = student_t.ppf(0.975, n - 1) * sd / np.sqrt(n)
        assert f"{mean:+.2f} [{mean - half:+.2f}, {mean + half:+.2f}] (n={n})" in ce_line
    # the JSON rows beside the page: every seed of each (setting, data seed, method), and their summaries
    rows_json = {(r["setting"], r["data_seed"], r["method"]): r for r in json.loads(page.with_suffix(".json").read_text())}
    ce1 = rows_json["borrowed", 1, "ce"]
    assert ce1["seeds"] == list(range(5)) and "(page.json)" in text
    assert [r["ece_pre_ts"] for r in ce1["per_seed"]] == pytest.approx([3.0 + 0.1 * s for s in range(5)])
    assert ce1["ece_pre_ts"]["mean"] == pytest.approx(3.2) and ce1["ece_pre_ts"]["std"] == pytest.approx(
        np.std([0.1 * s for s in range(5)], ddof=1))
    assert [r["ece_pre_ts"] for r in rows_json["annotated", 0, lam]["per_seed"]] == pytest.approx(
        [r["ece_pre_ts"] + 0.5 for r in rows["annotated"][ROW] if r["seed"] < 5])
    # the labels' confidence is cached by fingerprint: it survives the derived set
    import shutil

    shutil.rmtree(labels)
    assert a2.write_page(page, tmp_path / "no-cache", root, cache) == text


def test_a_verify_run_that_differs_names_its_largest_relative_difference_and_the_fields():
    text = a2._differences_text(["history[3].val_ece: committed 0.1, now 0.1000001",
                                 "test.pre_ts.nll: committed 2.0, now 2.002", "checkpoint_epoch: committed 4, now 5",
                                 "a field only in one of them"])
    assert text.startswith("4 difference(s), 3 of them numbers, the largest 0.25 relative (`checkpoint_epoch`)")
    assert text.endswith("in checkpoint_epoch, nll, val_ece")


def test_the_power_column_is_the_detectable_difference_at_the_comparisons_sd_and_both_levels():
    from timm_csm.metrics import PairedInterval, detectable_difference

    text = a2._power_text(PairedInterval(n=15, mean=-0.5, low=-0.8, high=-0.2, p_value=0.01, sd=0.56))
    sd, levels = text.split(" | ")
    assert sd == "0.56"
    # at the protocol's planning sd: alpha 0.05, then Holm's strictest level over the 4 comparisons, 0.0125
    assert levels == f"{detectable_difference(0.56, 15):.2f} / {detectable_difference(0.56, 15, 0.0125):.2f}"
    assert detectable_difference(0.56, 15) < detectable_difference(0.56, 15, 0.0125)
    assert a2._power_text(None) == "- | -"
