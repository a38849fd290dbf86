"""A study's stages (timm_csm.study): stage 1's choices read the validation split alone, stage 2's Holm decision over
any settings and comparisons, the plan of a spec's cells, and ``timm-csm-study init / plan``."""
import json
from pathlib import Path

import pytest

from timm_csm.metrics import detectable_difference
from timm_csm.study import load_spec, parse_spec
from timm_csm.study.choose import choose, coordinate_search, stage1_choices
from timm_csm.study.decide import BEST_OTHER, DOES_NOT_HOLD, HOLDS, PENDING, comparison_pairs, decide, decision_power
from timm_csm.study.plan import plan_cells, setting_plan
from timm_csm.study.template import template_text

ROOT = Path(__file__).resolve().parents[1]
A4_SPEC = ROOT / "benchmarks" / "study_fmnist_a4.toml"


class ValidationOnlyRow(dict):
    """A per-seed row whose test-split keys may not be read: reading one fails the test."""

    def _check(self, key):
        if key != "seed" and not key.startswith("val_"):
            raise AssertionError(f"the chooser read {key!r}, a key of the test split")

    def __getitem__(self, key):
        self._check(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self._check(key)
        return super().get(key, default)


def _rows(values, seeds=(0, 1, 2), test=None, row=dict):
    """``{configuration: (val ECE, val NLL)}`` -> per-seed rows; ``test``: ``{configuration: test ECE}``, the test
    keys a cell's row also holds (absent when None)."""
    out = {}
    for m, (ece, nll) in values.items():
        keys = {"val_ece_pre_ts": ece, "val_nll_pre_ts": nll, "val_ece_post_ts": ece, "val_nll_post_ts": nll}
        if test is not None:
            keys.update(ece_pre_ts=test[m], ece_post_ts=test[m], nll_pre_ts=test[m], acc_pre_ts=100 - test[m])
        out[m] = [row(seed=s, **keys) for s in seeds]
    return out


def test_choose_takes_the_lowest_validation_ece_ties_by_nll_and_waits_for_every_seed():
    rows = _rows({"ls": (2.0, 0.40), "ls@smoothing=0.1": (2.005, 0.30), "ls@smoothing=0.2": (1.0, 0.9)})
    assert choose(rows, ["ls", "ls@smoothing=0.1"]) == "ls@smoothing=0.1"  # within 0.01 points: the lower NLL
    assert choose(rows, ["ls", "ls@smoothing=0.1"], tie=0.001) == "ls"
    assert choose(rows, list(rows)) == "ls@smoothing=0.2"
    rows["ls@smoothing=0.2"] = rows["ls@smoothing=0.2"][:2]
    assert choose(rows, list(rows)) is None and choose(rows, []) is None


def test_nothing_of_the_test_split_reaches_the_chooser():
    """Rows whose test numbers would choose otherwise: the choices are those of rows without test keys, and rows
    that fail on any read of a test key give them too."""
    spec = load_spec(A4_SPEC)
    grids = {m.name: m.configurations() for m in spec.methods if "matched" in m.settings}
    names = [c for cs in grids.values() for c in cs] + ["csm@s=4", "csm@s=8", "csm", "csm@filtered=1,s=8"]
    # validation: LS 0.1, Mixup 1.0, RegMixup 2, the unfiltered s = 8; the test split says the opposite everywhere
    val = {m: (3.0 - (0.5 if m in ("ls@smoothing=0.1", "mixup@mixup=1", "regmixup@regmixup=2", "csm@s=8") else 0)
               - (1.0 if m == "regmixup@regmixup=2" else 0), 0.4) for m in names}
    test = {m: 10.0 - val[m][0] for m in names}
    poisoned = _rows(val, test=test, row=ValidationOnlyRow)
    without_test = _rows(val)
    by_test = {m: [dict(r, val_ece_pre_ts=t, val_ece_post_ts=t) for r in rows] for (m, rows), t in
               zip(_rows(val).items(), test.values())}
    args = (grids, spec.search.steps)
    picked = stage1_choices(poisoned, *args)
    assert picked == stage1_choices(without_test, *args)
    assert picked["chosen"] == {"ce": "ce", "ls": "ls@smoothing=0.1", "mixup": "mixup@mixup=1",
                                "regmixup": "regmixup@regmixup=2"}
    assert picked["csm"] == "csm@s=8" and picked["best_other"] == {"pre_ts": "regmixup@regmixup=2",
                                                                  "post_ts": "regmixup@regmixup=2"}
    # had the test numbers been the validation numbers, every choice would differ
    other = stage1_choices(by_test, *args)
    assert all(other["chosen"][m] != picked["chosen"][m] for m in ("ls", "mixup", "regmixup"))
    assert other["csm"] != picked["csm"]
    with pytest.raises(AssertionError, match="a key of the test split"):
        poisoned["ce"][0]["ece_pre_ts"]  # the trap works


def test_the_coordinate_wise_search_steps_at_the_values_chosen_before():
    steps = (("s", (4.0, 8.0)), ("weight", (1.0, 2.0)))
    chosen, reached = coordinate_search(_rows({"csm@s=4": (2.0, 0.4), "csm@s=8": (1.0, 0.4)}), steps)
    assert chosen == {"s": 8.0} and [s.axis for s in reached] == ["s", "weight"]
    assert reached[1].configurations == ["csm@s=8", "csm@s=8,weight=2"] and reached[1].choice is None


def _decision_rows(differences, n):
    """Per-seed rows of ``row`` and ``other`` whose test ECE differs by ``differences[s % len]`` at seed ``s``."""
    return {"row": [{"seed": s, "ece_pre_ts": 1.0 + differences[s % len(differences)]} for s in range(n)],
            "other": [{"seed": s, "ece_pre_ts": 1.0} for s in range(n)]}


def test_the_decision_is_holm_over_every_setting_and_comparison_at_the_required_seeds():
    rows = {"a": _decision_rows([-0.5, -0.6, -0.4], 10), "b": _decision_rows([-0.5, -0.6, -0.4], 10),
            "c": _decision_rows([-0.5, 0.6, 0.1], 10)}
    pairs = [(s, "row", "other") for s in rows]
    out = decide(pairs, rows, required_seeds=10)
    assert out.verdicts == {"a": HOLDS, "b": HOLDS, "c": DOES_NOT_HOLD}
    assert [c.lower for c in out.comparisons] == [True, True, False]
    assert all(c.p_holm >= c.test.p_value and c.test.n == 10 for c in out.comparisons)
    # one more required seed than the rows have: every setting waits, and nothing is adjusted
    waiting = decide(pairs, rows, required_seeds=11)
    assert set(waiting.verdicts.values()) == {PENDING} and all(c.p_holm is None for c in waiting.comparisons)
    assert decide([("a", None, "other")], rows, 10).verdicts == {"a": PENDING}
    # the best other method of the metric's phase stands for its role
    choices = {"a": {"csm": "row", "best_other": {"pre_ts": "other", "post_ts": "x"}}}
    assert comparison_pairs(choices, ["ce", BEST_OTHER]) == (("a", "row", "ce"), ("a", "row", "other"))
    assert comparison_pairs(choices, [BEST_OTHER], "ece_post_ts") == (("a", "row", "x"),)


def test_the_power_statement_is_the_protocols():
    """PROTOCOL.md, amendment 4: at n = 10 and sd 0.56 the half-width is 0.40 and the detectable difference 0.56 at
    alpha 0.05 and 0.72 at Holm's strictest level over 4 comparisons (0.0125)."""
    p = decision_power(0.56, 10, 4)
    assert (round(p.half_width, 2), round(p.detectable, 2), round(p.detectable_strictest, 2)) == (0.40, 0.56, 0.72)
    assert p.strictest_alpha == 0.0125 and p.detectable_strictest == detectable_difference(0.56, 10, 0.0125)


def test_the_plan_names_the_cells_as_the_benchmark_does_and_adds_stage_2_once_chosen():
    spec = load_spec(A4_SPEC)
    cells, pending = plan_cells(spec)
    names = [c.name for c in cells]
    assert len(names) == len(set(names)) and {c.status for c in cells} == {"ready"}
    # shared cells once, the generated-set and teacher cells per setting; stage 2 of CE at once
    assert "ce-s0" in names and "ls@smoothing=0.1-s2" in names and "csm@s=8-matched-s0" in names
    assert "kd@alpha=0.5,temperature=2-annotated-s1" in names and not any(n.startswith("kd") and "matched" in n
                                                                          for n in names)
    assert {c.seed for c in cells if c.stage == 2} == set(range(3, 10)) and {c.method for c in cells
                                                                              if c.stage == 2} == {"ce"}
    assert any("search step 'filtered' waits" in p for p in pending)
    # on data seed 1 the cells carry it in their names, as calibration_bench.py names them
    other = parse_spec(A4_SPEC.read_text().replace("data_seed = 0", "data_seed = 1"))
    assert "csm@s=8-matched-d1-s0" in [c.name for c in plan_cells(other)[0]]
    # stage 1 done in matched, s = 8 and LS 0.1 best: the filter step and stage 2's choices follow
    grid = [m for c in spec.methods if c.name != "kd" for m in c.configurations()]
    val = {m: (1.0 if m in ("csm@s=8", "ls@smoothing=0.1") else 3.0, 0.4) for m in grid + ["csm@s=4", "csm@s=8",
                                                                                           "csm"]}
    plan = setting_plan(spec, "matched", _rows(val))
    ready = plan.ready()
    assert [m for m, s in ready if s <= 2] == ["csm@filtered=1,s=8"] * 3
    # RegMixup's grid ties in ECE and NLL: its first point; the CSM row is still open
    assert {m for m, s in ready if s > 2} == {"ce", "regmixup@regmixup=2", "ls@smoothing=0.1"}
    val["csm@filtered=1,s=8"] = (2.0, 0.4)
    done = setting_plan(spec, "matched", _rows(val))
    assert done.choices["csm"] == "csm@s=8" and ("csm@s=8", 9) in done.ready() and not done.pending


def test_study_init_writes_a_spec_that_reads_back_and_states_its_power(tmp_path, capsys):
    from timm_csm.commands.study import main

    path = tmp_path / "study.toml"
    assert main(["init", str(path), "--dataset", "fashion_mnist", "--model", "resnet18", "--decision-seeds", "10",
                 "--settings", "matched", "annotated"]) == 0
    out = capsys.readouterr().out
    spec = load_spec(path)
    assert path.read_text() == template_text("fashion_mnist-resnet18", "fashion_mnist", "resnet18",
                                             settings=("matched", "annotated"), decision_seeds=range(10))
    assert spec.seeds.decision == tuple(range(10)) and spec.decision.comparisons() == 4
    assert (f"{detectable_difference(0.56, 10):.2f} at alpha 0.05 and {detectable_difference(0.56, 10, 0.0125):.2f} "
            "at Holm's strictest level 0.0125") in out
    # a spec is not overwritten, a flag of init is refused by plan, a bad model never writes: one line, status 2
    assert main(["init", str(path), "--dataset", "fashion_mnist", "--model", "resnet18"]) == 2
    assert main(["plan", str(path), "--model", "resnet18"]) == 2
    assert main(["init", str(tmp_path / "new.toml"), "--dataset", "x", "--model", "no_such_model"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3 and all(line.startswith("timm-csm-study: error: ") for line in err)
    assert "model.name: 'no_such_model' is not a timm model" in err[2] and not (tmp_path / "new.toml").exists()


#: the training options amendment 4's cells record (a cell.json's "config"), as far as the spec states them
A4_CONFIG = {"dataset": "fashion_mnist", "max_train_samples": 2500, "val_size": 2000, "data_seed": 0,
             "model": "resnet18", "epochs": 60, "decay_milestones": [30, 45], "lr": 0.1}


def _write_cell(folder, method, seed, config):
    folder.mkdir(parents=True)
    (folder / "cell.json").write_text(json.dumps({"method": method, "seed": seed, "setting": None,
                                                  "config": config}))
    (folder / "results.json").write_text(json.dumps({"test": {"pre_ts": {"ece": 0.05}},
                                                     "val": {"pre_ts": {"ece": 0.04, "nll": 0.3}}}))


def test_study_plan_reads_finished_cells_and_lists_what_they_leave(tmp_path, capsys):
    from timm_csm.commands.study import main

    cells = tmp_path / "cells"
    for seed in (0, 1, 2):
        _write_cell(cells / f"ce-s{seed}", "ce", seed, dict(A4_CONFIG, data_seed=None if seed else 0))
    assert main(["plan", str(A4_SPEC), "--cells", str(cells)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "stage 1: 63 cell(s) known, 3 done, 60 ready"
    assert "1  done   ce-s0" in lines and "1  ready  ls-s0" in lines and "2  ready  ce-s9" in lines
    assert lines[-1].startswith("pending: annotated:")


@pytest.mark.parametrize("change, error", [
    ({"model": "small_cnn"}, "model: the cell has 'small_cnn', the spec states 'resnet18'"),
    ({"decay_milestones": [30, 40]}, "decay_milestones: the cell has [30, 40], the spec states (30, 45)"),
    ({"data_seed": 1}, None),  # another real subset: not this study's cell, and not read
])
def test_study_plan_refuses_a_cell_of_another_study_and_a_folder_without_cells(change, error, tmp_path, capsys):
    from timm_csm.commands.study import main

    _write_cell(tmp_path / "cells" / "ce-s0", "ce", 0, dict(A4_CONFIG, **change))
    status = main(["plan", str(A4_SPEC), "--cells", str(tmp_path / "cells")])
    out, err = capsys.readouterr()
    if error is None:
        assert status == 0 and "1  ready  ce-s0" in out.splitlines()
    else:
        assert status == 2 and err.startswith("timm-csm-study: error: ") and error in err and not out
        assert "is not a cell of study 'fmnist-a4-resnet18'" in err
    for folder in (tmp_path / "no-such-folder", tmp_path):  # tmp_path holds the cells' folder, not cell folders
        assert main(["plan", str(A4_SPEC), "--cells", str(folder)]) == 2
        assert "holds no finished cell folder" in capsys.readouterr().err
