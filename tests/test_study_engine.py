"""A study run from its spec (timm_csm.study.engine, ``timm-csm-study run``): a tiny two-method, two-seed study end to
end on the local executor and on a local Ray instance with equal numbers, the spec refused once changed without an
amendment, the chooser given nothing of the test split, a killed cell resumed, and the cells' options those the
amendments' cells ran with."""
import json
import math
import os
import shutil
from importlib.util import find_spec
from pathlib import Path

import pytest

from study_fixtures import tiny_spec
from benchmark_scripts import load_benchmark
from timm_csm.extras import MissingExtra
from timm_csm.recipes.cells import CELL_META, INSTRUCTION_SET_PINS, RESULTS, differences, keyed_options, read_json
from timm_csm.study import load_spec, spec_digest
from timm_csm.study.amendments import SpecError
from timm_csm.study.engine import STUDY_FILE, choice_rows, run_study, study_choices
from timm_csm.study.executors import create_executor
from timm_csm.study.methods import get_method
from timm_csm.study.options import cell_options, study_recipe

ROOT = Path(__file__).resolve().parents[1]

# 48 training and 48 validation images of scikit-learn's digits, a 2-stage small_cnn, one epoch: CE against LS,
# whose smoothing stage 1 chooses on validation (seed 0), then both at decision seed 1
TINY_SPEC = tiny_spec("tiny", 48, 'method = "ls"\nsteps = [{ axis = "smoothing", values = [0.05, 0.2] }]\n')
AMENDMENT = """
[[amendment]]
date = 2026-12-08
reason = "a stricter family-wise level"
[amendment.set.decision]
family_alpha = 0.01
"""


@pytest.fixture(scope="module")
def spec_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("spec") / "tiny.toml"
    path.write_text(TINY_SPEC)
    return path


@pytest.fixture(scope="module")
def local_study(spec_path, tmp_path_factory):
    output = tmp_path_factory.mktemp("local")
    # one lane: a second worker's start (importing torch) costs more than these cells; Ray runs two side by side,
    # so the comparison also shows that the numbers do not depend on how many cells run at once
    environment = {k: os.environ.get(k) for k in INSTRUCTION_SET_PINS}
    done = run_study(spec_path, output, "local", {"lanes": 1, "threads": 1}, progress=False, pin_instruction_set=True)
    assert {k: os.environ.get(k) for k in INSTRUCTION_SET_PINS} == environment  # the pins were the workers' alone
    return output, done


@pytest.fixture(scope="module")
def ray_session():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def _cells(output):
    return {d.name: (read_json(d / RESULTS), read_json(d / CELL_META)) for d in sorted((output / "cells").iterdir())}


def test_a_study_runs_both_stages_and_ray_gives_every_number_the_local_run_gives(local_study, spec_path, ray_session,
                                                                                  tmp_path):
    output, done = local_study
    chosen = study_choices(load_spec(spec_path), output)["matched"]["csm"]  # the searched row: LS's choice
    assert chosen in ("ls", "ls@smoothing=0.2")
    expected = {"ce-s0", "ls-s0", "ls@smoothing=0.2-s0", "ce-s1", f"{chosen}-s1"}
    assert (done.ran, done.done, done.known, done.pending, dict(done.blocked)) == (5, 5, 5, (), {})
    local = _cells(output)
    assert set(local) == expected
    digest = spec_digest(TINY_SPEC)
    assert all(meta["record"]["spec_digest"] == digest and meta["finished"] for _, meta in local.values())
    # the workers ran with the instruction set pinned
    assert all(meta["record"]["pins"] == INSTRUCTION_SET_PINS and meta["record"]["cpu_capability"] == "AVX2"
               for _, meta in local.values())
    assert read_json(output / STUDY_FILE)["spec"] == TINY_SPEC

    on_ray = run_study(spec_path, tmp_path, "ray", {"threads": 1}, progress=False, pin_instruction_set=True)
    assert on_ray.ran == 5
    remote = _cells(tmp_path)
    assert set(remote) == expected
    for name, (results, meta) in local.items():
        assert differences(results, remote[name][0]) == [], name  # every number but where and how fast it ran
        assert meta["record"] == remote[name][1]["record"] and meta["config"] == remote[name][1]["config"]

    # run again: every cell is done, nothing runs
    again = run_study(spec_path, output, "local", progress=False)
    assert (again.ran, again.done) == (0, 5)


def test_a_changed_spec_is_refused_and_a_dated_amendment_accepted(local_study, spec_path, tmp_path, capsys,
                                                                   monkeypatch):
    from timm_csm.commands.study import main

    output, _ = local_study
    changed = tmp_path / "changed.toml"
    changed.write_text(TINY_SPEC.replace("decision = [0, 1]", "decision = [0, 1, 2]"))
    with pytest.raises(SpecError, match=r"spec changed after its first cell .*seeds\.decision .*append the change as "
                                        r"a dated \[\[amendment\]\]"):
        run_study(changed, output, progress=False)
    assert main(["run", str(changed), "--output", str(output)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("timm-csm-study: error: spec changed after its first cell")

    amended = tmp_path / "amended.toml"
    amended.write_text(TINY_SPEC + AMENDMENT)
    assert main(["run", str(amended), "--output", str(output)]) == 0
    out = capsys.readouterr().out
    assert "ran 0 cell(s); 5 of the 5 known are done" in out and f"timm-csm-study run {amended}" in out
    # without Ray, the ray executor is one line naming its extra, before anything runs
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None if name == "ray" else find_spec(name, *a))
    with pytest.raises(MissingExtra, match=r"the ray executor needs ray \(the \[ray\] extra\).*timm-csm\[ray\]"):
        create_executor("ray")
    assert main(["run", str(spec_path), "--output", str(output), "--executor", "ray"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install 'timm-csm[ray]'" in err[0]

    # a cell recorded under another spec: refused, naming it
    foreign = tmp_path / "foreign"
    shutil.copytree(output, foreign, ignore=shutil.ignore_patterns("*.safetensors"))
    (foreign / STUDY_FILE).unlink()
    meta = read_json(foreign / "cells" / "ce-s1" / CELL_META)
    meta["record"]["spec_digest"] = spec_digest(TINY_SPEC.replace("tiny", "other"))
    (foreign / "cells" / "ce-s1" / CELL_META).write_text(json.dumps(meta))
    with pytest.raises(SpecError, match="^cell ce-s1: spec changed after its first cell"):
        run_study(spec_path, foreign, progress=False)


def test_the_chooser_is_given_nothing_of_the_test_split(local_study, spec_path, tmp_path):
    output, _ = local_study
    spec = load_spec(spec_path)
    before = study_choices(spec, output)
    rows = choice_rows(spec, output)["matched"]
    assert set(rows) == {"ce", "ls", "ls@smoothing=0.2"} and all(
        set(row) - {"seed"} and all(k == "seed" or k.startswith("val_") for k in row) for r in rows.values()
        for row in r)
    # every test-split number poisoned: the choices stand
    poisoned = tmp_path / "poisoned"
    shutil.copytree(output, poisoned, ignore=shutil.ignore_patterns("*.safetensors"))
    for path in (poisoned / "cells").glob(f"*/{RESULTS}"):
        results = read_json(path)
        results["test"] = {phase: {k: math.nan for k in scores} for phase, scores in results["test"].items()}
        path.write_text(json.dumps(results))
    assert study_choices(spec, poisoned) == before
    # the validation numbers decide: the loser's made the best, the choice follows
    loser = next(c for c in ("ls", "ls@smoothing=0.2") if c != before["matched"]["csm"])
    path = poisoned / "cells" / f"{loser}-s0" / RESULTS
    results = read_json(path)
    results["val"]["pre_ts"]["ece"] = 0.0
    path.write_text(json.dumps(results))
    assert study_choices(spec, poisoned)["matched"]["csm"] == loser


def test_a_killed_cell_resumes_from_its_last_checkpoint(local_study, spec_path, ray_session, tmp_path):
    output, _ = local_study
    killed = tmp_path / "killed"
    shutil.copytree(output, killed)
    cell = killed / "cells" / "ce-s1"
    finished = read_json(cell / RESULTS)
    (cell / RESULTS).unlink()  # as a kill after the last epoch's checkpoint leaves it
    meta = read_json(cell / CELL_META)
    (cell / CELL_META).write_text(json.dumps(dict(meta, finished=False)))
    done = run_study(spec_path, killed, "ray", {"threads": 1}, progress=False, pin_instruction_set=True)
    assert (done.ran, done.done) == (1, 5)
    assert "resuming from" in (cell / "cell.log").read_text()
    assert read_json(cell / CELL_META)["record"]["resumed"] is True
    assert differences(finished, read_json(cell / RESULTS)) == []


@pytest.mark.parametrize("spec_file, cells, names", [
    ("study_fmnist_a4.toml", "cells_a4", ["ce-s0", "ls@smoothing=0.1-s0"]),
    ("study_fmnist_a2.toml", "cells_a2", ["ce-s0", "ls@smoothing=0.1-s0"]),
])
def test_a_spec_of_an_amendment_gives_the_options_its_cells_ran_with(spec_file, cells, names, tmp_path):
    table = load_benchmark("calibration_methods")
    recipe = study_recipe(load_spec(ROOT / "benchmarks" / spec_file))
    amendment_recipe = table.a4_recipe() if "a4" in spec_file else table.base_recipe(name="matched")
    assert recipe == amendment_recipe
    for name in names:
        committed = read_json(ROOT / "benchmarks" / cells / name / CELL_META)
        options = cell_options(recipe, get_method(committed["method"]), committed["seed"], tmp_path / name)
        assert keyed_options(options) == committed["config"]
    # a CSM cell reads the setting's set: the benchmark's options are the library's
    paths = {"soft@s=4": "sets/csm-soft-matched-s4"}
    assert table.cell_config(amendment_recipe, get_method("csm@s=4"), 0, tmp_path, paths) == cell_options(
        recipe, get_method("csm@s=4"), 0, tmp_path, paths)


def test_a_setting_s_generated_set_and_teacher_reach_the_methods_that_read_them(tmp_path):
    from csm_testdata import save_digits_csm_folder

    from timm_csm.study.engine import setting_data

    soft = save_digits_csm_folder(tmp_path / "csm-digits-aug")
    sources = {"matched": {"soft": str(soft), "teacher": str(tmp_path / "encoder")}}
    recipe = {"dataset": "digits"}
    assert setting_data(get_method("ce"), None, sources, tmp_path, recipe) == ({}, None)
    assert setting_data(get_method("csm"), "matched", sources, tmp_path, recipe) == ({"soft": str(soft)}, None)
    paths, why = setting_data(get_method("csm@filtered=1"), "matched", sources, tmp_path, recipe)
    assert why is None and paths == {"filtered": str(tmp_path / "csm-filtered-matched")}
    assert (tmp_path / "csm-filtered-matched").is_dir()  # derived once, under the study's folder
    assert setting_data(get_method("kd"), "matched", sources, tmp_path, recipe) == ({"teacher": sources["matched"][
        "teacher"]}, None)
    for method, why in (("csm", "annotated: no generated set given (--generated annotated=DIR)"),
                        ("kd", "annotated: no teacher given (--teacher annotated=DIR)")):
        assert setting_data(get_method(method), "annotated", sources, tmp_path, recipe) == ({}, why)


def test_a_run_that_leaves_cells_it_cannot_run_exits_1_and_says_so(tmp_path, capsys):
    from timm_csm.commands.study import main

    # KD reads the setting's teacher, which an "annotated" setting is not built with: the run cannot finish
    spec = tmp_path / "kd.toml"
    spec.write_text(TINY_SPEC.replace('settings = ["matched"]', 'settings = ["annotated"]').replace(
        '[methods.ce]\n', '[methods.ce]\n\n[methods.kd]\n'))
    assert main(["run", str(spec), "--output", str(tmp_path / "out")]) == 1
    out = capsys.readouterr().out
    assert "not run:" in out and "incomplete:" in out and "decision is not reached" in out
