"""A study's page from its cell folders (``timm-csm-study report``) and the logging verify of one cell
(``timm-csm-study verify``): cells written by the library's own writers, the decision read back from the page."""
import json

import pytest

from benchmark_scripts import load_benchmark
from timm_csm.commands.study import main
from timm_csm.io import write_json_atomic
from timm_csm.recipes.cells import RESULTS, cell_folder, git, read_json, run_cell
from timm_csm.study import parse_spec
from timm_csm.study.methods import cell_name, get_method

SPEC = """
[study]
name = "tiny"
settings = ["matched"]
[data]
dataset = "digits"
train_size = 320
val_size = 80
[model]
name = "small_cnn"
recipe = "demo"
[seeds]
tuning = [0, 1]
decision = [0, 1, 2, 3]
[methods.ce]
[methods.ls]
grid = { smoothing = [0.05, 0.1] }
[search]
method = "csm"
steps = [{ axis = "s", values = [4.0, "auto"] }]
[decision]
others = ["ce", "best_other"]
[report]
verify_log = "verify.json"
"""
#: validation ECE (the choices) and test ECE before TS (the decision) of each configuration, in points; CSM at
#: s = 4 is the row, label smoothing 0.1 the best other method
VALUES = {"ce": (5.0, 6.0), "ls": (3.0, 4.0), "ls@smoothing=0.1": (2.0, 3.0), "csm@s=4": (1.0, 2.0),
          "csm": (1.5, 2.5)}


def _write_cell(root, spec, method, seed, val_ece, test_ece):
    """A finished cell folder as the benchmark's cells write it: ``cell.json`` by its keyed folder, then
    ``results.json``; the test ECE varies by seed so the paired differences have a spread."""
    setting = spec.settings[0]
    d = root / cell_name(method, seed, setting)
    cfg = {"dataset": spec.data.dataset, "max_train_samples": spec.data.train_size, "val_size": spec.data.val_size,
           "data_seed": 0, "model": spec.model.name, "seed": seed, **get_method(method).options}
    folder = cell_folder(d, cfg)
    d.mkdir(parents=True)
    folder.write({"method": method, "seed": seed, "setting": setting if get_method(method).per_setting else None,
                  "config": folder.config, "record": {"commit": "0" * 40, "clean": True, "torch_threads": 1},
                  "finished": True, "seconds": 60.0, "cpu_seconds": 30.0})
    test = (test_ece + 0.05 * seed) / 100
    write_json_atomic(d / RESULTS, {
        "test": {"pre_ts": {"ece": test, "accuracy": 0.9}, "post_ts": {"ece": test / 2, "accuracy": 0.9}},
        "val": {ph: {"ece": val_ece / 100, "nll": 0.3} for ph in ("pre_ts", "post_ts")},
        "temperature": 1.2, "checkpoint_epoch": 3})


def test_the_page_of_a_few_cell_folders_states_the_decision_they_make(tmp_path):
    spec_path = tmp_path / "tiny.toml"
    spec_path.write_text(SPEC)
    spec = parse_spec(SPEC)
    root = tmp_path / "cells"
    for method, (val, test) in VALUES.items():
        for seed in spec.seeds.tuning:
            _write_cell(root, spec, method, seed, val, test)
    main(["plan", str(spec_path), "--cells", str(root)])  # stage 2's cells are known once stage 1 has chosen
    main(["report", str(spec_path), "--cells", str(root)])
    text = (tmp_path / "tiny.md").read_text()
    assert "- `matched`: 6 cell(s) can run now, next `ce` seed 2" in text and ": pending.**" in text
    for method in ("ce", "ls@smoothing=0.1", "csm@s=4"):
        for seed in spec.seeds.decision[len(spec.seeds.tuning):]:
            _write_cell(root, spec, method, seed, *VALUES[method])
    main(["report", str(spec_path), "--cells", str(root)])
    text = (tmp_path / "tiny.md").read_text()
    # CSM at s = 4 sits 4 points below CE and 1 below LS 0.1 at every seed: both hold under Holm
    assert "| matched | CE | -4.00 [-4.00, -4.00] (n=4) |" in text
    assert "| matched | Label smoothing (eps 0.1) | -1.00 [-1.00, -1.00] (n=4) |" in text
    assert '**"CSM calibrates better" in `matched`: holds.**' in text
    assert "Choices: CSM row CSM (s 4); best other method before TS Label smoothing (eps 0.1)" in text
    assert (tmp_path / "tiny_decision.png").stat().st_size > 0
    # the cost of each method, its configurations together: its cells' CPU seconds (30 each; no build record)
    assert "| CSM | 6 | 0.05 | 0.5 | - | - |" in text and "| CE | 4 | 0.03 | 0.5 | - | - |" in text
    rows = {r["method"]: r for r in read_json(tmp_path / "tiny.json")}
    assert rows["ce"]["seeds"] == [0, 1, 2, 3] and len(rows["ce"]["per_seed"]) == 4
    assert rows["ce"]["ece_pre_ts"]["mean"] == pytest.approx(6.0 + 0.05 * 1.5)


def test_ce_as_the_best_other_method_is_one_row_of_the_decision_counted_as_registered(tmp_path):
    spec_path = tmp_path / "tiny.toml"
    spec_path.write_text(SPEC)
    spec = parse_spec(SPEC)
    root = tmp_path / "cells"
    values = {**VALUES, "ce": (2.5, 6.0), "ls": (3.0, 4.0), "ls@smoothing=0.1": (4.0, 3.0)}  # CE best on validation
    for method, (val, test) in values.items():
        for seed in spec.seeds.tuning:
            _write_cell(root, spec, method, seed, val, test)
    for method in ("ce", "csm@s=4"):
        for seed in spec.seeds.decision[len(spec.seeds.tuning):]:
            _write_cell(root, spec, method, seed, *values[method])
    main(["report", str(spec_path), "--cells", str(root)])
    text = (tmp_path / "tiny.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| matched | CE")]
    assert rows == ["| matched | CE (also the best other method; counted 2 times in Holm's family, as registered) | "
                    "-4.00 [-4.00, -4.00] (n=4) | 0.0000 | yes | 0.00 | 0.00 / 0.00 |"]
    assert '**"CSM calibrates better" in `matched`: holds.**' in text


def test_a_cell_of_another_study_is_refused_by_name(tmp_path):
    spec = parse_spec(SPEC)
    _write_cell(tmp_path / "cells", spec, "ce", 0, 5.0, 6.0)
    other = parse_spec(SPEC.replace("train_size = 320", "train_size = 640"))
    from timm_csm.study.report import study_cells

    with pytest.raises(ValueError, match="ce-s0 is not a cell of study 'tiny': max_train_samples"):
        study_cells(other, [tmp_path / "cells"])


def test_verify_appends_its_own_record_and_a_changed_result_shows_as_a_difference(tmp_path):
    table = load_benchmark("calibration_methods")
    # one epoch on 96 digits, no bootstrap: seconds per run
    recipe = table.base_recipe({"dataset": "digits", "model": "small_cnn", "model_kwargs": {"widths": [8, 16]},
                                "epochs": 1, "batch_size": 32, "lr": 0.05, "max_train_samples": 96,
                                "max_test_samples": 64, "val_fraction": 0.25, "hflip": 0.0, "crop_pad": 1,
                                "bootstrap": 0, "progress": False}, "noaug")
    home = tmp_path / "committed"
    cfg = table.cell_config(recipe, table.get_method("ce"), 0, tmp_path / "cache" / "ce-s0")
    run_cell(cfg, tmp_path / "cache" / "ce-s0", "ce", 0, committed=home / "ce-s0", amendment=2)
    spec_path = tmp_path / "tiny.toml"
    spec_path.write_text(SPEC)
    main(["verify", str(spec_path), "ce-s0", "--cells", str(home)])
    log = read_json(tmp_path / "verify.json")
    assert len(log) == 1 and log[0]["cell"] == "ce-s0" and log[0]["reproduced"] and log[0]["differences"] == []
    assert log[0]["commit"] == git("rev-parse", "HEAD") and isinstance(log[0]["clean"], bool)
    assert "transcribed" not in log[0]  # written by the tool
    committed = read_json(home / "ce-s0" / RESULTS)
    before = committed["test"]["pre_ts"]["ece"]
    committed["test"]["pre_ts"]["ece"] = before + 0.01
    write_json_atomic(home / "ce-s0" / RESULTS, committed, indent=1)
    main(["verify", str(spec_path), "ce-s0", "--cells", str(home)])
    log = read_json(tmp_path / "verify.json")
    assert len(log) == 2 and not log[1]["reproduced"]
    assert log[1]["differences"] == [f"test.pre_ts.ece: committed {before + 0.01!r}, now {before!r}"]
    from timm_csm.study.report import verify_lines

    lines = verify_lines(tmp_path / "verify.json")
    assert lines[2].endswith(": reproduced exactly.") and ": 1 difference(s), 1 of them numbers" in lines[3]


def test_report_and_verify_refuse_bad_input_in_one_line(tmp_path, capsys):
    spec_path = tmp_path / "tiny.toml"
    spec_path.write_text(SPEC)
    for argv, message in ((["report", str(spec_path)], "report needs --cells"),
                          (["verify", str(spec_path), "--cells", str(tmp_path)], "verify needs the cell's name"),
                          (["plan", str(spec_path), "ce-s0"], "a cell name belongs to verify"),
                          (["report", str(spec_path), "--cells", str(tmp_path / "nowhere")], "is not a folder")):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1
    with pytest.raises(Exception, match="report.sections: unknown section 'costs'"):
        parse_spec(SPEC + 'sections = ["costs"]\n')


def test_amendment_2s_page_and_rows_regenerate_byte_for_byte_from_the_committed_cells(tmp_path):
    from pathlib import Path

    import shutil

    bench = Path(__file__).resolve().parents[1] / "benchmarks"
    # the spec and the records its [report] table names, beside the page as in benchmarks/ (the page links them)
    for name in ("study_fmnist_a2.toml", "cells_a2_verify.json", "cells_a2_labels.json", "settings_a2.json"):
        shutil.copy(bench / name, tmp_path / name)
    page = tmp_path / "calibration_a2.md"
    assert main(["report", str(tmp_path / "study_fmnist_a2.toml"), "--cells", str(bench / "cells_a2"),
                 "--page", str(page)]) in (None, 0)
    assert page.read_bytes() == (bench / "calibration_a2.md").read_bytes()
    assert page.with_suffix(".json").read_bytes() == (bench / "calibration_a2.json").read_bytes()
