"""Amendment 4's shift cells (benchmarks/amendment4_shift.py, on amendment 3's cells and page): which decision cells a
shift cell evaluates, which must be trained again for their checkpoints, the checkpoint's digest check, and the page
at 10 seeds, on constructed cells."""
import dataclasses
import hashlib
import json

import pytest

from benchmark_scripts import load_benchmark
from timm_csm.recipes.cells import CELL_META, INSTRUCTION_SET_PINS

load_benchmark("calibration_bench")
a3_cells = load_benchmark("amendment3_cells")
a3_page = load_benchmark("amendment3_page")
shift4 = load_benchmark("amendment4_shift")

CHOICES = {"csm": "csm@s=8", "best_other": {"pre_ts": "mixup@mixup=0.1", "post_ts": "ce"},
           "chosen": {"regmixup": "regmixup@regmixup=2"}}


def _source(tmp_path, methods, seeds=range(2)):
    """An amendment-4 source over constructed committed cells: every method's cells in both settings, the CE and
    Mixup cells shared by the settings (one folder), CSM's per setting."""
    committed = tmp_path / "committed"
    found = {}
    for setting in ("matched", "annotated"):
        for method in methods:
            for seed in seeds:
                name = f"{method}-{setting}-s{seed}" if method.startswith("csm") else f"{method}-s{seed}"
                (committed / name).mkdir(parents=True, exist_ok=True)
                (committed / name / CELL_META).write_text(json.dumps({"seed": seed}))
                found.setdefault(setting, {}).setdefault(method, {})[seed] = {"dir": committed / name}
    return dataclasses.replace(shift4.A4, committed=committed, checkpoints=tmp_path / "runs",
                               output=tmp_path / "shift", cells=lambda setting, *_: found.get(setting, {}),
                               choices=lambda setting, cells: CHOICES)


def test_a_lost_checkpoint_is_listed_once_for_re_training_and_a_kept_one_for_its_shift_cell(tmp_path):
    source = _source(tmp_path, ["ce", "mixup@mixup=0.1", "csm@s=8", "ls"])
    lost = a3_cells.lost_checkpoints(source)
    # seed by seed, a shared cell once (under the first setting), the per-setting CSM cells in each; LS is no row
    assert lost[:4] == [("matched", "ce", 0), ("matched", "csm@s=8", 0), ("matched", "mixup@mixup=0.1", 0),
                        ("annotated", "csm@s=8", 0)]
    assert len(lost) == 8 and not any(m == "ls" for _, m, _ in lost)
    assert a3_cells.next_cells(source) == []
    kept = source.checkpoint("ce-s1")
    kept.parent.mkdir(parents=True)
    kept.write_bytes(b"weights")
    assert a3_cells.next_cells(source) == []  # its run has not finished: no results.json beside it yet
    assert ("matched", "ce", 1) in a3_cells.lost_checkpoints(source)  # so re-running the cell resumes that run
    (kept.parent / "results.json").write_text("{}")
    assert a3_cells.next_cells(source) == ["ce-s1"]
    assert ("matched", "ce", 1) not in a3_cells.lost_checkpoints(source)
    kept.unlink()  # a finished run whose checkpoint is gone: to re-make, not to evaluate
    assert a3_cells.next_cells(source) == [] and ("matched", "ce", 1) in a3_cells.lost_checkpoints(source)
    kept.write_bytes(b"weights")
    commands = shift4.remake_commands(source)
    assert len(commands) == 7 and commands[0].endswith("--recipe matched --methods 'ce' --seeds 0")
    # the record shows the checkpoint at its default place, not this machine's
    assert str(source.checkpoint("ce-s1", shown=True)) == "runs/protocol_a4/cells/ce-s1/model_best.safetensors"


def test_a_re_made_checkpoint_counts_when_its_run_reproduced_the_committed_results(tmp_path):
    """Its file's sha256 cannot be the recorded one (the header holds the run's id), so the run beside it vouches for
    it: the header must name that run and its best epoch, and the run's results must be the committed ones."""
    import torch

    from timm_csm.io import save_model_file

    source = _source(tmp_path, ["ce"], seeds=[0])
    committed = source.committed / "ce-s0"
    checkpoint = source.checkpoint("ce-s0")
    checkpoint.parent.mkdir(parents=True)
    save_model_file(checkpoint, {"w": torch.ones(2)}, {"run_id": "first", "epoch": 5})
    (committed / CELL_META).write_text(json.dumps({"seed": 0, "checkpoint_sha256": a3_cells.file_sha256(checkpoint)}))
    save_model_file(checkpoint, {"w": torch.ones(2)}, {"run_id": "again", "epoch": 5})  # the re-made file
    numbers = {"test": {"ece": 0.05}, "checkpoint_epoch": 5}
    (committed / "results.json").write_text(json.dumps(dict(numbers, run_id="first", history=[{}])))
    with pytest.raises(SystemExit, match="no run beside it re-made it"):
        a3_cells._check_checkpoint("ce-s0", committed, checkpoint)
    run_results = checkpoint.parent / "results.json"
    run_results.write_text(json.dumps(dict(numbers, run_id="again")))
    digest, found_by = a3_cells._check_checkpoint("ce-s0", committed, checkpoint)
    assert found_by == "re-run" and digest == a3_cells.file_sha256(checkpoint)
    run_results.write_text(json.dumps(dict(numbers, run_id="another run")))  # the header names another run
    with pytest.raises(SystemExit, match="no run beside it re-made it"):
        a3_cells._check_checkpoint("ce-s0", committed, checkpoint)
    run_results.write_text(json.dumps({"test": {"ece": 0.06}, "checkpoint_epoch": 5, "run_id": "again"}))
    with pytest.raises(SystemExit, match="did not reproduce the committed results"):
        a3_cells._check_checkpoint("ce-s0", committed, checkpoint)
    # a cell that recorded its weights' digest: the re-made file counts by its weights, the run's results still
    # compared
    from timm_csm.io import tensors_sha256

    run_results.write_text(json.dumps(dict(numbers, run_id="again")))
    (committed / CELL_META).write_text(json.dumps({"seed": 0, "checkpoint_sha256": "0" * 64,
                                                   "checkpoint_tensors_sha256": tensors_sha256(checkpoint)}))
    assert a3_cells._check_checkpoint("ce-s0", committed, checkpoint)[1] == "tensors"
    save_model_file(checkpoint, {"w": torch.zeros(2)}, {"run_id": "again", "epoch": 5})
    with pytest.raises(SystemExit, match="holds other weights"):
        a3_cells._check_checkpoint("ce-s0", committed, checkpoint)


def test_a_shift_cell_evaluates_only_the_checkpoint_the_committed_cell_recorded(tmp_path, monkeypatch):
    source = _source(tmp_path, ["ce"], seeds=[3])
    checkpoint = source.checkpoint("ce-s3")
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_bytes(b"re-made weights")
    meta = source.committed / "ce-s3" / CELL_META
    meta.write_text(json.dumps({"seed": 3, "checkpoint_sha256": hashlib.sha256(b"the first weights").hexdigest()}))
    with pytest.raises(SystemExit, match="did not reproduce"):
        a3_cells.run_cell("ce-s3", source)
    assert not (source.output / "ce-s3").exists() and not (source.committed / "ce-s3" / a3_cells.SHIFT_FILE).exists()
    meta.write_text(json.dumps({"seed": 3, "checkpoint_sha256": hashlib.sha256(b"re-made weights").hexdigest()}))
    assert a3_cells._check_checkpoint("ce-s3", source.committed / "ce-s3", checkpoint) == (hashlib.sha256(
        b"re-made weights").hexdigest(), "sha256")
    # the same checkpoint, but the run that re-made it computed other results: refused
    (source.committed / "ce-s3" / "results.json").write_text(json.dumps({"test": {"ece": 0.05}}))
    (checkpoint.parent / "results.json").write_text(json.dumps({"test": {"ece": 0.06}}))
    with pytest.raises(SystemExit, match="did not reproduce the committed results"):
        a3_cells.run_cell("ce-s3", source)
    # the same results; the committed copy also holds the training history, which the run's file lacks
    (source.committed / "ce-s3" / "results.json").write_text(json.dumps({"test": {"ece": 0.05}, "history": [{}]}))
    (checkpoint.parent / "results.json").write_text(json.dumps({"test": {"ece": 0.05}}))
    a3_cells._check_checkpoint("ce-s3", source.committed / "ce-s3", checkpoint)
    # the right checkpoint, but the instruction set not pinned (the test's process): refused before any run
    for pin in INSTRUCTION_SET_PINS:
        monkeypatch.delenv(pin, raising=False)
    with pytest.raises(SystemExit, match="instruction set pinned"):
        a3_cells.run_cell("ce-s3", source)
    assert not (source.output / "ce-s3").exists()


def test_the_page_decides_at_ten_seeds_with_holm_over_twenty_and_four(tmp_path):
    source = _source(tmp_path, [], seeds=[])
    page = a3_page.write_page(tmp_path / "shift_a4.md", source, shift4.TEXT).read_text()
    assert page.startswith("# Calibration under shift and out of distribution on resnet18 (PROTOCOL.md amendment 4)")
    assert "paired over 10 seeds" in page and "Holm over 20" in page and "Holm over 4" in page
    assert "python benchmarks/amendment4_shift.py --run CELL" in page and "amendment 3, clarification" not in page
    assert "over the 10 seeds" in page


def test_the_shift_record_names_the_training_cells_real_images_not_its_generated_set(tmp_path):
    committed = tmp_path / "csm@s=4-matched-s0"
    committed.mkdir()
    cell = json.loads((shift4.a4.EARLIER_SETS / committed.name / CELL_META).read_text())
    (committed / CELL_META).write_text(json.dumps(cell))
    record = a3_cells.shift_record(committed, 4, seconds={"shift": 1.0})
    assert record["amendment"] == 4 and record["seconds"] == {"shift": 1.0}
    assert record["real_images"] == cell["record"]["real_images"]  # the data the cell trained on, not a default's
    assert "generated_set" not in record and "teacher" not in record


def test_the_page_names_the_shift_cells_whose_checkpoint_was_re_made():
    assert a3_page.checkpoint_lines({"ce-s3": {}, "ce-s4": {"checkpoint_found_by": "sha256"}}) == []
    (line, _) = a3_page.checkpoint_lines({"ce-s3": {}, "ce-s0": {"checkpoint_found_by": "re-run"},
                                          "ce-s1": {"checkpoint_found_by": "tensors"}})
    assert line.startswith("Checkpoints: 1 kept from their training cells") and line.endswith(": ce-s0, ce-s1.")
