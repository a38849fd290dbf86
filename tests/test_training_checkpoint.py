"""CheckpointSaver: last after every epoch, best replaced only by a strictly better epoch, a bounded history, and a
write killed mid-file leaves the previous files intact."""
import errno
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from timm_csm.io import load_state, read_model_meta, remove_temp_files
from timm_csm.training import CheckpointSaver

ROOT = Path(__file__).resolve().parents[1]


def _state(epoch, saver, size=4):
    return {"model": {"w": torch.full((size,), float(epoch))}, "epoch": epoch, "best": saver.best,
            "meta": {"run_id": "r1"}}


@pytest.mark.parametrize("select_by,values,best_epochs", [
    ("acc", [0.5, 0.4, 0.6, 0.6, 0.7], [0, 0, 2, 2, 4]),  # higher is better; a tie is not better
    ("ece", [0.3, 0.2, 0.25, 0.2, 0.1], [0, 1, 1, 1, 4]),  # lower is better
])
def test_best_is_replaced_only_when_better(tmp_path, select_by, values, best_epochs):
    saver = CheckpointSaver(tmp_path, select_by)
    key = {"acc": "val_accuracy", "ece": "val_ece"}[select_by]
    for epoch, (value, best_epoch) in enumerate(zip(values, best_epochs)):
        improved = saver.update(epoch, {key: value})
        assert improved == (best_epoch == epoch)
        saver.save(epoch, _state(epoch, saver), improved)
        assert saver.best == {"value": values[best_epoch], "epoch": best_epoch, "metric": select_by}
        assert read_model_meta(tmp_path / "model_best.safetensors")["epoch"] == best_epoch
        assert load_state(tmp_path / "last.safetensors")["epoch"] == epoch
    assert float(load_state(tmp_path / "last.safetensors")["model"]["w"][0]) == len(values) - 1


def test_without_validation_every_epoch_is_the_best(tmp_path):
    saver = CheckpointSaver(tmp_path, "acc")
    assert saver.update(0, {}, validated=False) and saver.update(1, {}, validated=False)
    assert saver.best == {"value": None, "epoch": 1, "metric": "acc"}


def test_history_keeps_the_most_recent_epochs(tmp_path):
    saver = CheckpointSaver(tmp_path, "acc", max_history=2)
    for epoch in range(5):
        saver.save(epoch, _state(epoch, saver), saver.update(epoch, {"val_accuracy": 0.1}))
        kept = sorted(p.name for p in tmp_path.glob("checkpoint-*.safetensors"))
        assert kept == [f"checkpoint-{e}.safetensors" for e in range(max(0, epoch - 1), epoch + 1)]
    assert load_state(tmp_path / "checkpoint-4.safetensors")["epoch"] == 4


def _history(folder):
    return sorted(p.name for p in folder.glob("checkpoint-*.safetensors"))


def _check_states(folder, epochs):
    for epoch in epochs:
        state = load_state(folder / f"checkpoint-{epoch}.safetensors")
        assert state["epoch"] == epoch and float(state["model"]["w"][0]) == epoch


def test_history_links_the_last_state_written_once_per_epoch(tmp_path, monkeypatch):
    """The history entry of an epoch is a hard link of that epoch's last.safetensors: one state write per epoch.
    last.safetensors is replaced by a new file every epoch, so each entry keeps its own epoch's state."""
    from timm_csm.io import atomic, model_file, state_file

    written, save = [], atomic.save_safetensors_atomic

    def counting_save(path, *args):
        written.append(Path(path).name)
        save(path, *args)

    for writer in (model_file, state_file):  # the model file's and the state file's one writer
        monkeypatch.setattr(writer, "save_safetensors_atomic", counting_save)
    saver = CheckpointSaver(tmp_path, "acc", max_history=2)
    for epoch in range(4):
        written.clear()
        saver.save(epoch, _state(epoch, saver), saver.update(epoch, {"val_accuracy": 0.1}))
        assert written == (["model_best.safetensors"] if epoch == 0 else []) + ["last.safetensors"]
        assert os.path.samefile(tmp_path / f"checkpoint-{epoch}.safetensors", tmp_path / "last.safetensors")
        _check_states(tmp_path, range(max(0, epoch - 1), epoch + 1))
    assert _history(tmp_path) == ["checkpoint-2.safetensors", "checkpoint-3.safetensors"]
    assert not os.path.samefile(tmp_path / "checkpoint-2.safetensors", tmp_path / "last.safetensors")
    saver.save(3, _state(3, saver), False)  # an epoch saved again (a resumed run) replaces its entry
    _check_states(tmp_path, [2, 3])
    assert remove_temp_files(tmp_path) == []


@pytest.mark.parametrize("code", [errno.EXDEV, errno.EPERM, errno.EOPNOTSUPP])
def test_history_is_a_copy_where_the_filesystem_gives_no_link(tmp_path, monkeypatch, code):
    """Another device, or a filesystem without hard links (os.link fails as there: this machine has links)."""
    def no_link(src, dst):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "link", no_link)
    saver = CheckpointSaver(tmp_path, "acc", max_history=2)
    for epoch in range(3):
        saver.save(epoch, _state(epoch, saver), saver.update(epoch, {"val_accuracy": 0.1}))
    assert _history(tmp_path) == ["checkpoint-1.safetensors", "checkpoint-2.safetensors"]
    _check_states(tmp_path, [1, 2])
    assert not os.path.samefile(tmp_path / "checkpoint-2.safetensors", tmp_path / "last.safetensors")
    assert remove_temp_files(tmp_path) == []


def test_other_link_errors_are_errors(tmp_path, monkeypatch):
    def failing_link(src, dst):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "link", failing_link)
    saver = CheckpointSaver(tmp_path, "acc", max_history=2)
    with pytest.raises(OSError, match=os.strerror(errno.EIO)):
        saver.save(0, _state(0, saver), saver.update(0, {"val_accuracy": 0.1}))
    assert _history(tmp_path) == [] and remove_temp_files(tmp_path) == []


def test_a_resumed_saver_keeps_the_stored_best(tmp_path):
    saver = CheckpointSaver(tmp_path, "nll", best={"value": 0.5, "epoch": 3, "metric": "nll"})
    assert not saver.update(4, {"val_nll": 0.6}) and saver.best["epoch"] == 3
    assert saver.update(5, {"val_nll": 0.4}) and saver.best["epoch"] == 5


def test_bad_options_are_refused(tmp_path):
    with pytest.raises(ValueError, match="select_by must be one of"):
        CheckpointSaver(tmp_path, "loss")
    with pytest.raises(ValueError, match="max_history must be >= 0"):
        CheckpointSaver(tmp_path, "acc", max_history=-1)


def test_a_killed_write_leaves_the_previous_files(tmp_path):
    """The second epoch's files exceed the file-size limit: the kernel kills the writer (SIGXFSZ) mid-file."""
    script = textwrap.dedent(f"""
        import resource, signal, sys
        import torch
        sys.path.insert(0, {str(ROOT)!r})
        from timm_csm.training import CheckpointSaver

        saver = CheckpointSaver({str(tmp_path)!r}, "acc", max_history=1)
        def state(epoch, size):
            return {{"model": {{"w": torch.full((size,), float(epoch))}}, "epoch": epoch, "best": saver.best,
                    "meta": {{"run_id": "r1"}}}}
        saver.save(0, state(0, 16), saver.update(0, {{"val_accuracy": 0.5}}))
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # Python ignores it; the default action kills the process
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, 1 << 16))
        saver.save(1, state(1, 1 << 16), saver.update(1, {{"val_accuracy": 0.9}}))
        print("not killed")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGXFSZ, proc.stdout + proc.stderr
    assert read_model_meta(tmp_path / "model_best.safetensors")["epoch"] == 0
    assert load_state(tmp_path / "last.safetensors")["epoch"] == 0
    assert float(load_state(tmp_path / "checkpoint-0.safetensors")["model"]["w"][0]) == 0.0
    left = remove_temp_files(tmp_path)
    assert len(left) == 1 and left[0].name.startswith(".model_best.safetensors.")
