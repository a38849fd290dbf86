"""The package's file layer: atomic writers (complete or absent, the umask's mode) and safetensors state files."""
import json
import os
import re
import stat

import numpy as np
import pytest
import torch

from timm_csm.io import (atomic_path, file_sha256, is_state_file, load_state, read_model_meta, remove_temp_files,
                         save_model_file, save_state, tensors_sha256, write_bytes_atomic, write_json_atomic,
                         write_text_atomic)


def _mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_writers_replace_whole_files_with_the_umask_mode(tmp_path):
    umask = os.umask(0o022)
    try:
        write_text_atomic(tmp_path / "a" / "t.txt", "first")
        write_text_atomic(tmp_path / "a" / "t.txt", "second")
        write_bytes_atomic(tmp_path / "b.bin", b"\x00\x01")
        write_json_atomic(tmp_path / "c.json", {"b": 1, "a": tmp_path}, sort_keys=True)
        save_model_file(tmp_path / "m.safetensors", {"w": torch.ones(2)}, {"run": "x"})
    finally:
        os.umask(umask)
    assert (tmp_path / "a" / "t.txt").read_text() == "second"
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\x01"
    text = (tmp_path / "c.json").read_text()
    assert json.loads(text) == {"a": str(tmp_path), "b": 1} and text.index('"a"') < text.index('"b"')
    for name in ("a/t.txt", "b.bin", "c.json", "m.safetensors"):  # safetensors' own save_file leaves 0o600
        assert _mode(tmp_path / name) == 0o644, name
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["b.bin", "c.json", "m.safetensors", "t.txt"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path):
    target = tmp_path / "report.md"
    write_text_atomic(target, "old")
    with pytest.raises(RuntimeError, match="disk"):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("disk full")
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["report.md"]


def test_remove_temp_files_deletes_only_leftovers(tmp_path):
    (tmp_path / ".x.json.0123456789ab.tmp").write_text("killed writer")
    (tmp_path / "keep.tmp").write_text("not ours")
    removed = remove_temp_files(tmp_path)
    assert [p.name for p in removed] == [".x.json.0123456789ab.tmp"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.tmp"]


def test_state_files_round_trip_optimizer_states_without_pickle(tmp_path):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=10)
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    sched.step()
    state = {"optimizer": opt.state_dict(), "sched": sched.state_dict(), "epoch": np.int64(3),
             "pair": (1, "a"), "none": None, "meta": {"run_id": "r1"}}
    path = tmp_path / "state.safetensors"
    save_state(path, state)
    back = load_state(path)
    assert is_state_file(path)
    assert back["epoch"] == 3 and back["pair"] == (1, "a") and back["none"] is None
    assert list(back["optimizer"]["state"]) == [0, 1]  # integer parameter ids survive JSON
    fresh = torch.optim.AdamW(torch.nn.Linear(3, 2).parameters(), lr=0.1)
    fresh.load_state_dict(back["optimizer"])
    torch.testing.assert_close(fresh.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])
    assert back["sched"]["last_epoch"] == sched.state_dict()["last_epoch"]
    assert read_model_meta(path) == {"run_id": "r1"}
    with open(path, "rb") as f:
        assert b"pickle" not in f.read(200)


def test_damaged_and_foreign_files_are_named(tmp_path):
    path = tmp_path / "state.safetensors"
    save_state(path, {"x": torch.zeros(3)})
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(ValueError, match="state.safetensors is not a readable safetensors file"):
        load_state(path)
    save_model_file(tmp_path / "model.safetensors", {"w": torch.ones(1)}, {"a": 1})
    with pytest.raises(ValueError, match="not a timm-csm state file"):
        load_state(tmp_path / "model.safetensors")
    assert not is_state_file(tmp_path / "model.safetensors")
    assert read_model_meta(tmp_path / "model.safetensors") == {"a": 1}
    torch.save({"w": torch.ones(1)}, tmp_path / "w.pth")
    assert read_model_meta(tmp_path / "w.pth") is None


def test_a_checkpoint_is_read_restored_and_converted_from_the_earlier_layout(tmp_path):
    """Today's file is read as is; a folder of the previous layout (also the .old a kill between its renames left)
    is read, restored, written as today's file and removed."""
    from csm_fixtures import as_earlier_checkpoint

    from timm_csm.io import CHECKPOINT_LAST, read_checkpoint, save_state

    last, folder = tmp_path / CHECKPOINT_LAST, tmp_path / "checkpoint"
    assert read_checkpoint(last, "test checkpoint", cache=False, earlier=folder) is None
    save_state(last, {"w": torch.arange(4.0), "opt": {"lr": 0.2}, "step": 2})
    restored = []
    state = read_checkpoint(last, "test checkpoint", cache=False, restore=restored.append, earlier=folder)
    assert torch.equal(state["w"], torch.arange(4.0)) and state["opt"] == {"lr": 0.2} and state["step"] == 2
    assert restored == [state]
    as_earlier_checkpoint(last, folder)
    folder.rename(tmp_path / "checkpoint.old")
    state = read_checkpoint(last, "test checkpoint", cache=False, earlier=folder)
    assert torch.equal(state["w"], torch.arange(4.0)) and state["step"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [CHECKPOINT_LAST]
    assert torch.equal(read_checkpoint(last, "test checkpoint", cache=False)["w"], torch.arange(4.0))
    as_earlier_checkpoint(last, folder)
    (folder / "state.json").unlink()  # neither today's layout nor the previous one
    with pytest.raises(ValueError, match=r"layout of an earlier version \(no state.json\).*fresh output folder"):
        read_checkpoint(last, "test checkpoint", cache=False, earlier=folder)


@pytest.mark.parametrize("damage", ["truncated", "pickled", "does not fit"])
def test_a_checkpoint_that_does_not_read_has_one_answer(tmp_path, damage):
    """A cache is named in the log and removed; anything else is an error naming it, and is left as it was."""
    from timm_csm.io import CHECKPOINT_LAST, read_checkpoint, save_state

    last, folder = tmp_path / CHECKPOINT_LAST, tmp_path / "checkpoint"
    restore = None
    if damage == "truncated":
        save_state(last, {"w": torch.zeros(8)})
        last.write_bytes(last.read_bytes()[:40])
        problem = re.escape(str(last)) + " is a damaged test checkpoint"
    elif damage == "pickled":
        folder.mkdir()
        (folder / "state.pt").write_bytes(b"pickle")
        problem = re.escape(str(folder / "state.pt")) + " is a test checkpoint in the pickled format"
    else:
        save_state(last, {"w": torch.zeros(8)})
        restore = lambda state: torch.nn.Linear(2, 2).load_state_dict(state)  # noqa: E731
        problem = re.escape(str(last)) + " is a damaged test checkpoint: it does not fit \\(RuntimeError"
    read = dict(restore=restore, earlier=folder, pickled=["state.pt"])
    with pytest.raises(ValueError, match=problem + ".*delete"):
        read_checkpoint(last, "test checkpoint", cache=False, **read)
    assert last.is_file() or folder.is_dir()
    lines = []
    assert read_checkpoint(last, "test checkpoint", cache=True, log=lines.append, **read) is None
    assert len(lines) == 1 and re.match(problem, lines[0]) and "starts over" in lines[0]
    assert list(tmp_path.iterdir()) == []


def test_a_staging_folder_appears_whole_with_the_umask_or_not_at_all(tmp_path):
    from timm_csm.io import staging_folder

    old = os.umask(0o022)
    try:
        with staging_folder(tmp_path / "out") as folder:
            (folder / "a.txt").write_text("a")
            assert not (tmp_path / "out").exists()
        assert (tmp_path / "out" / "a.txt").read_text() == "a"
        assert (tmp_path / "out").stat().st_mode & 0o777 == 0o755  # tempfile.mkdtemp's would be 0o700
        with pytest.raises(RuntimeError, match="disk"):
            with staging_folder(tmp_path / "failed") as folder:
                (folder / "half.txt").write_text("x")
                raise RuntimeError("disk full")
        assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    finally:
        os.umask(old)


def test_the_tensors_digest_is_the_weights_not_the_header(tmp_path):
    """The file's sha256 changes with the header (a run's id, and the metadata order safetensors picks per process);
    the tensors' digest changes only with a name, dtype, shape or byte of the weights."""
    weights = {"b": torch.arange(3.0), "a": torch.ones(2, 2)}
    save_model_file(tmp_path / "one.safetensors", weights, {"run_id": "one"})
    save_model_file(tmp_path / "two.safetensors", weights, {"run_id": "two"})
    assert file_sha256(tmp_path / "one.safetensors") != file_sha256(tmp_path / "two.safetensors")
    assert tensors_sha256(tmp_path / "one.safetensors") == tensors_sha256(tmp_path / "two.safetensors")
    for other in ({"b": torch.arange(3.0), "a": torch.ones(4)}, {"b": torch.arange(3.0), "c": torch.ones(2, 2)},
                  {"b": torch.arange(3.0), "a": torch.ones(2, 2, dtype=torch.float64)},
                  {"b": torch.arange(3.0).flip(0), "a": torch.ones(2, 2)}):
        save_model_file(tmp_path / "other.safetensors", other, {"run_id": "one"})
        assert tensors_sha256(tmp_path / "other.safetensors") != tensors_sha256(tmp_path / "one.safetensors")
    (tmp_path / "cut.safetensors").write_bytes((tmp_path / "one.safetensors").read_bytes()[:-4])
    with pytest.raises(ValueError, match="cut.safetensors is not a readable safetensors file"):
        tensors_sha256(tmp_path / "cut.safetensors")
