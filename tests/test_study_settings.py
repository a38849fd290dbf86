"""A study's matched setting built from its own training images (timm_csm.study.settings): the engine builds it
before the CSM cells and they read it, a rerun rebuilds nothing, the exported images are those the cells train on,
and the ``[settings.matched]`` table is validated in one line."""
from pathlib import Path

import pytest
from study_fixtures import tiny_spec

from timm_csm.recipes.cells import CELL_META, read_json
from timm_csm.study import parse_spec
from timm_csm.study.amendments import SpecError
from timm_csm.study.engine import run_study
from timm_csm.study.settings import BUILD_RECORD, CSM_NAME, matched_stages
from timm_csm.study.spec import MatchedSettingSpec

# 120 training and 48 validation images of scikit-learn's digits, one epoch: CE and CSM at s = 4, one tuning seed and
# two decision seeds; the matched setting from the smoke generator (4 steps: noise, accepted), 12 groups, an
# annotator of one epoch
SPEC = tiny_spec("tiny-matched", 120, 'method = "csm"\nsteps = [{ axis = "s", values = [4.0] }]\n', """
[settings.matched]
generator_profile = "smoke"
num_groups = 12
sampler_steps = 2
annotator_epochs = 1
accept_poor_generator = true
""")


def test_the_engine_builds_the_matched_setting_once_and_its_csm_cells_read_it(tmp_path):
    spec = tmp_path / "study.toml"
    spec.write_text(SPEC)
    output, lines = tmp_path / "run", []
    done = run_study(spec, output, "local", {"lanes": 1, "threads": 1}, log=lines.append, progress=False)
    assert not done.blocked and not done.pending
    root = output / "settings" / "matched"
    # the CSM cell reads the setting's set, its soft labels re-scaled to s = 4 once under the study's folder
    csm_cell = read_json(output / "cells" / "csm@s=4-matched-s0" / CELL_META)
    derived = Path(csm_cell["config"]["csm_dataset"])
    assert read_json(derived / "derived_from.json")["source"] == str(root / "csm" / CSM_NAME)
    # the generator and the annotator learned from exactly the images the cells train on
    real = read_json(root / "real" / "DONE.json")
    assert real["train_images"] == 120
    for cell in ("ce-s0", "csm@s=4-matched-s0"):
        recorded = read_json(output / "cells" / cell / CELL_META)["record"]["real_images"]
        assert recorded == {"train": real["train_digest"], "validation": real["validation_digest"]}
    builds = read_json(output / "settings" / BUILD_RECORD)["settings"]["matched"]
    assert builds["generated"]["images"] == 12 * 4
    assert all(builds[stage]["seconds"] > 0 and builds[stage]["cpu_seconds"] > 0
               for stage in ("generator", "generated", "csm"))
    markers = {p: p.stat().st_mtime_ns for p in root.glob("*/DONE.json")}
    again = []
    run_study(spec, output, "local", {"lanes": 1, "threads": 1}, log=again.append, progress=False)
    assert {p: p.stat().st_mtime_ns for p in root.glob("*/DONE.json")} == markers
    assert [line for line in again if line.startswith("[")] == [
        f"[{stage}] done: {root / stage}" for stage in ("generator", "generated", "csm")] + [
        f"[matched] built: {root} (record: {output / 'settings' / BUILD_RECORD})"]


def test_given_paths_win_and_defaults_follow_the_image_size(tmp_path):
    from timm_csm.study.settings import needs_matched_setting

    spec = parse_spec(SPEC)
    assert needs_matched_setting(spec, {}) and not needs_matched_setting(spec, {"soft": "my-set"})
    stages = {name: cmd for name, _, cmd in matched_stages(Path("out"), MatchedSettingSpec(), {"epochs": 30}, 8, 10,
                                                           python="py")}
    flag = lambda cmd, f: cmd[cmd.index(f) + 1]  # noqa: E731
    assert flag(stages["generator"], "--profile") == "digits" and flag(stages["generator"], "--steps") == "3000"
    assert flag(stages["generated"], "--num-groups") == str(75 * 45)
    assert flag(stages["csm"], "--reference-epochs") == "30"
    assert flag(stages["csm"], "--dataset") == flag(stages["generator"], "--dataset") == str(Path("out/real"))
    stages = {name: cmd for name, _, cmd in matched_stages(Path("out"), MatchedSettingSpec(), {"epochs": 30}, 28, 10,
                                                           python="py")}
    assert flag(stages["generator"], "--profile") == "fmnist" and flag(stages["generator"], "--steps") == "6000"
    with pytest.raises(ValueError, match="no CPU generator profile for 64 px"):
        matched_stages(Path("out"), MatchedSettingSpec(), {"epochs": 30}, 64, 10)


@pytest.mark.parametrize("table, message", [
    ('[settings.matched]\ngenerator_profile = "big"', "settings.matched.generator_profile: unknown 'big'"),
    ("[settings.matched]\nnum_lambdas = 1", "settings.matched.num_lambdas: expected an integer >= 2, got 1"),
    ('[settings.matched]\nscheduler = "euler"', "settings.matched.scheduler: unknown 'euler'"),
    ("[settings.matched]\nsteps = 3", "settings.matched.steps: unknown key"),
    ("[settings.borrowed]\nnum_groups = 3", "settings.borrowed: unknown key"),
])
def test_a_bad_settings_table_is_refused_in_one_line(table, message):
    text = SPEC[:SPEC.index("[settings.matched]")] + table + "\n"
    with pytest.raises(SpecError, match=message.replace("(", r"\(").replace(".", r"\.")) as e:
        parse_spec(text)
    assert "\n" not in str(e.value)
