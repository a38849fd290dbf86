"""Amendment 2's validation choices and decisions (benchmarks/amendment2.py) on constructed per-seed rows."""
import pytest

from benchmark_scripts import load_benchmark

load_benchmark("calibration_bench")
a2 = load_benchmark("amendment2")
bench = a2.bench


def _rows(values, seeds=(0, 1, 2)):
    """``{method: (val ECE, val NLL, test ECE)}`` -> per-seed rows with those values at every seed (test ECE
    differing by seed so that intervals have a spread)."""
    return {m: [{"seed": s, "val_ece_pre_ts": v[0], "val_nll_pre_ts": v[1], "val_ece_post_ts": v[0],
                 "val_nll_post_ts": v[1], "ece_pre_ts": v[2] + 0.1 * (s % 3), "ece_post_ts": v[2]} for s in seeds]
            for m, v in values.items()}


def test_choice_is_the_lowest_validation_ece_with_nll_breaking_ties_and_waits_for_every_seed():
    rows = _rows({"ls": (2.0, 0.40, 9.0), "ls@smoothing=0.1": (2.005, 0.30, 0.0), "ls@smoothing=0.2": (1.0, 0.9, 9.0)})
    assert a2.choose(rows, ["ls", "ls@smoothing=0.1"]) == "ls@smoothing=0.1"  # tie within 0.01: lower NLL
    assert a2.choose(rows, ["ls", "ls@smoothing=0.1", "ls@smoothing=0.2"]) == "ls@smoothing=0.2"
    rows["ls@smoothing=0.2"] = rows["ls@smoothing=0.2"][:2]  # a seed missing: no choice yet
    assert a2.choose(rows, ["ls", "ls@smoothing=0.1", "ls@smoothing=0.2"]) is None
    # the test split never decides: a configuration with a far better test ECE is not chosen
    assert a2.choose(_rows({"mixup": (3.0, 0.4, 0.0), "mixup@mixup=1": (2.0, 0.4, 9.0)}),
                     ["mixup", "mixup@mixup=1"]) == "mixup@mixup=1"


def test_holm_matches_a_hand_worked_example():
    # p = (0.01, 0.04, 0.03, 0.005), m = 4: sorted 0.005*4 = 0.02, 0.01*3 = 0.03, 0.03*2 = 0.06, 0.04*1 -> 0.06
    out = a2.holm([0.01, 0.04, 0.03, 0.005])
    assert [round(p, 6) for p, _ in out] == [0.03, 0.06, 0.06, 0.02]
    assert [r for _, r in out] == [True, False, False, True]


def test_next_cells_follow_the_protocols_stages():
    rows = {}
    first = a2.next_cells("matched", rows)
    names = {m for m, _ in first}
    assert {s for _, s in first} == {0, 1, 2} and "kd" not in {m.split("@")[0] for m in names}
    assert {"ce", "ls@smoothing=0.2", "regmixup@regmixup=2", "csm@s=1", "csm"} <= names
    assert not any("weight" in m for m in names)  # CSM's later steps wait for the scale
    # every stage-1 cell and CSM's s step done, s = 2.3 best: the weight step comes next
    values = {m: (3.0, 0.4, 3.0) for m in names}
    values["csm@s=2.3"] = (1.0, 0.3, 1.0)
    nxt = a2.next_cells("matched", _rows(values))
    assert sorted({m for m, _ in nxt}) == ["csm@s=2.3,weight=0.5", "csm@s=2.3,weight=2"]
    assert "kd@alpha=0.5,temperature=2" in {m for m, _ in a2.next_cells("annotated", {})}


def test_stage2_runs_the_chosen_methods_to_15_seeds_and_decides_under_holm():
    choices_rows = {}
    for setting in ("matched", "annotated"):
        rows = {}
        while True:
            todo = a2.next_cells(setting, rows)
            if not todo or min(s for _, s in todo) > 2:
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
    assert a2.primary_decisions(summaries)["verdicts"] == {"matched": "pending", "annotated": "pending"}
    for setting, rows in choices_rows.items():  # 15 seeds: CSM 0.4 below RegMixup and 2 below CE, with noise
        for m, base in (("ce", 3.0), ("regmixup@regmixup=10", 1.4), ("csm@n_aug=2,s=4,weight=2", 1.0)):
            rows[m] = [{"seed": s, "val_ece_pre_ts": base, "val_nll_pre_ts": 0.4, "val_ece_post_ts": base,
                        "ece_pre_ts": base + (0.05 * ((s * 7) % 5) if m.startswith("csm") else 0.0)}
                       for s in range(15)]
    out = a2.primary_decisions(summaries)
    assert out["verdicts"] == {"matched": "holds", "annotated": "holds"}
    assert all(c["p_holm"] >= c["test"]["p"] for c in out["comparisons"])
