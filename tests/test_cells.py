"""Folders keyed by a configuration (timm_csm.recipes.cache.KeyedFolder) and the benchmark cells built on them
(timm_csm.recipes.cells): done, refused with the differing options, resumed, compared on a re-run."""
import json

import pytest

from timm_csm.recipes import cells
from timm_csm.recipes.cache import KeyedFolder, StageCache


def test_keyed_folder_tells_done_other_and_new(tmp_path):
    folder = KeyedFolder(tmp_path / "stage", {"epochs": 3, "path": tmp_path})
    assert folder.state() == "new" and folder.recorded() is None
    folder.write(seconds=1.5)
    assert json.loads(folder.marker_path.read_text()) == {"config": {"epochs": 3, "path": str(tmp_path)},
                                                          "seconds": 1.5}
    assert folder.state() == "done"  # paths compare as the marker stores them
    other = KeyedFolder(tmp_path / "stage", {"epochs": 4, "path": tmp_path})
    assert other.state() == "other" and other.differences() == ["epochs"]
    with pytest.raises(ValueError, match=r"differ in \['epochs'\]"):
        other.check()
    with pytest.raises(ValueError, match="must record its configuration"):
        other.write({"config": {"epochs": 3}})
    whole = KeyedFolder(tmp_path / "derived", {"source": "a"}, "derived_from.json", config_field=None)
    whole.write()
    assert json.loads(whole.marker_path.read_text()) == {"source": "a"} and whole.state() == "done"


def test_stage_cache_runs_a_stage_once_per_configuration(tmp_path):
    cache, ran = StageCache(tmp_path, log=lambda m: None), []
    for _ in range(2):
        with cache.stage("export", {"n": 1}) as stage:
            if not stage.done:
                ran.append(stage.folder)
    assert len(ran) == 1 and KeyedFolder(ran[0], {"n": 1}).state() == "done"
    with cache.stage("export", {"n": 2}) as stage:
        assert not stage.done and stage.folder != ran[0]


def test_committed_cell_is_done_and_checked_against_the_config(tmp_path):
    cfg = {"loss": "ce", "seed": 0, "epochs": 60, "output": "anywhere"}
    home = tmp_path / "committed" / "ce-s0"
    home.mkdir(parents=True)
    (home / cells.RESULTS).write_text("{}")
    (home / cells.CELL_META).write_text(json.dumps({"method": "ce", "seed": 0,
                                                    "config": cells.keyed_options(cfg)}))
    assert "output" not in cells.keyed_options(cfg)  # where a cell writes does not key it
    assert cells.cell_state(tmp_path / "cells" / "ce-s0", cfg, home) == "done"
    with pytest.raises(ValueError, match="differ in \\['epochs'\\]"):
        cells.cell_state(tmp_path / "cells" / "ce-s0", dict(cfg, epochs=61), home)
    assert cells.cell_state(tmp_path / "cells" / "ce-s0", cfg) == "new"
    (tmp_path / "cells" / "ce-s0").mkdir(parents=True)
    (tmp_path / "cells" / "ce-s0" / "last.safetensors").write_bytes(b"")
    assert cells.cell_state(tmp_path / "cells" / "ce-s0", cfg) == "partial"


def test_differences_name_every_changed_leaf_but_where_a_cell_ran():
    committed = {"test": {"pre_ts": {"ece": 0.1, "nll": 0.3}}, "history": [1, 2], "seconds": 5, "run_id": "a"}
    now = {"test": {"pre_ts": {"ece": 0.2, "nll": 0.3}}, "history": [1, 3], "seconds": 9, "run_id": "b"}
    assert cells.differences(committed, now) == ["history[1]: committed 2, now 3",
                                                 "test.pre_ts.ece: committed 0.1, now 0.2"]


def test_keys_the_committed_results_lack_are_added_not_differences():
    committed = {"test": {"pre_ts": {"ece": 0.1}}, "n_val": 20}
    now = {"test": {"pre_ts": {"ece": 0.1, "debiased_ce": 0.05}}, "n_val": 20, "temperature_interval": {"low": 1}}
    assert cells.differences(committed, now) == []
    assert cells.added_keys(committed, now) == ["temperature_interval", "test.pre_ts.debiased_ce"]
    assert cells.differences(now, committed) == ["temperature_interval: committed {'low': 1}, now None",
                                                 "test.pre_ts.debiased_ce: committed 0.05, now None"]
