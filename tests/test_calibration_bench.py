"""The calibration benchmark at toy scale (benchmarks/calibration_bench.py, its method table and its pages):
cached and resumable cells, the mean ± std table, the protocol's choices and verdicts, amendment 2's names."""
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from csm_testdata import save_digits_csm_folder

from benchmark_scripts import load_benchmark
from timm_csm.hub import content_fingerprint
from timm_csm.recipes import derive
from timm_csm.recipes.cells import CELL_META, RESULTS, verify_cell

bench = load_benchmark("calibration_bench")
table = load_benchmark("calibration_methods")
protocol_page = load_benchmark("calibration_protocol_page")

# toy recipe: 8x8 digits, a 2-stage small_cnn, one epoch on 240 images
TOY = ["--recipe", "noaug", "--dataset", "digits", "--model", "small_cnn", "--model-kwargs", "widths=[8,16]", "--epochs", "1",
       "--batch-size", "32", "--lr", "0.05", "--max-train-samples", "320", "--max-test-samples", "200",
       "--train-opt", "val_fraction=0.25", "hflip=0.0", "crop_pad=1", "--no-progress"]


@pytest.fixture(scope="module")
def csm_folder(tmp_path_factory):
    return save_digits_csm_folder(tmp_path_factory.mktemp("csm") / "csm-digits-aug")


def _row(text: str, label: str):
    """Cells of the first table row of ``label`` after the heading ``### Before temperature scaling``."""
    for line in text.splitlines():
        if line.startswith(f"| {label} |"):
            return [c.strip().strip("*") for c in line.strip("|").split("|")]
    raise AssertionError(f"no row {label!r} in\n{text}")


def _mean_sd(values):
    m = sum(values) / len(values)
    return m, math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def test_cells_run_in_pieces_resume_and_fill_the_table(tmp_path, csm_folder):
    out, report = tmp_path / "bench", tmp_path / "calibration.md"
    common = TOY + ["--output", str(out), "--report", str(report), "--csm-dataset", csm_folder,
                    "--methods", "ce", "csm", "csm_hard", "--seeds", "0", "1"]

    text = bench.main(common + ["--max-cells", "2"])  # seed-major: every method's seed 0 first
    done = sorted(p.parent.name for p in (out / "cells").glob("*/results.json"))
    assert done == ["ce-s0", "csm-s0"]
    assert "Pending cells (4): csm_hard-s0, ce-s1, csm-s1, csm_hard-s1." in text
    assert _row(text, "CE")[1] == "1"

    # a killed cell (training state, no results) resumes: no epoch is trained again, the evaluation is the same
    cell = out / "cells" / "ce-s0"
    first = json.loads((cell / "results.json").read_text())
    log_stamp = (cell / "log.json").stat().st_mtime_ns  # rewritten after every trained epoch
    (cell / "results.json").unlink()
    bench.main(common + ["--max-cells", "1"])
    again = json.loads((cell / "results.json").read_text())
    assert again["test"] == first["test"] and (cell / "log.json").stat().st_mtime_ns == log_stamp
    assert not (out / "cells" / "csm_hard-s0" / "results.json").exists()  # the resumed cell was the one new cell

    text = bench.main(common)
    stamps = {p: p.stat().st_mtime_ns for p in (out / "cells").glob("*/results.json")}
    assert len(stamps) == 6 and "Pending" not in text
    text = bench.main(common)  # everything cached: nothing retrains
    assert {p: p.stat().st_mtime_ns for p in (out / "cells").glob("*/results.json")} == stamps

    # the table is the mean ± sample std over the two seeds of each cell's results.json
    for method, label in (("ce", "CE"), ("csm", "CSM"), ("csm_hard", table.METHODS["csm_hard"].label)):
        res = [json.loads((out / "cells" / f"{method}-s{s}" / "results.json").read_text()) for s in (0, 1)]
        row = _row(text, label)
        assert row[1] == "2"
        for col, key in ((2, "accuracy"), (3, "ece"), (4, "aece"), (5, "cece")):
            m, sd = _mean_sd([100 * r["test"]["pre_ts"][key] for r in res])
            assert row[col] == f"{m:.2f} ± {sd:.2f}"
        m, sd = _mean_sd([r["test"]["pre_ts"]["nll"] for r in res])
        assert row[6] == f"{m:.4f} ± {sd:.4f}"
    post = text.split("### After temperature scaling")[1]
    res = [json.loads((out / "cells" / f"ce-s{s}" / "results.json").read_text()) for s in (0, 1)]
    m_ece, sd_ece = _mean_sd([100 * r["test"]["post_ts"]["ece"] for r in res])
    assert _row(post, "CE")[3] == f"{m_ece:.2f} ± {sd_ece:.2f}"
    m, sd = _mean_sd([r["temperature"] for r in res])
    assert _row(post, "CE")[7] == f"{m:.2f} ± {sd:.2f}"

    # the JSON rows carry the same numbers, per method and recipe; another recipe's rows are kept
    js = tmp_path / "calibration.json"
    js.write_text(json.dumps([{"method": "ce", "recipe": "other", "seeds": [0]}]))
    bench.main(common + ["--report-only", "--json", str(js)])
    rows = {(r["method"], r["recipe"]): r for r in json.loads(js.read_text())}
    assert set(rows) == {("ce", "other"), ("ce", "noaug"), ("csm", "noaug"), ("csm_hard", "noaug")}
    ce = rows["ce", "noaug"]
    assert ce["seeds"] == [0, 1] and ce["T"]["mean"] == pytest.approx(m) and ce["T"]["std"] == pytest.approx(sd)
    m, sd = _mean_sd([100 * r["test"]["post_ts"]["ece"] for r in res])
    assert ce["ece_post_ts"] == {"mean": pytest.approx(m), "std": pytest.approx(sd)}
    m, sd = _mean_sd([r["test"]["pre_ts"]["nll"] for r in res])
    assert ce["nll_pre_ts"] == {"mean": pytest.approx(m), "std": pytest.approx(sd)}
    assert set(ce) >= {f"{k}_{p}" for k in ("acc", "ece", "aece", "cece", "nll") for p in ("pre_ts", "post_ts")}

    # saved test predictions reproduce the reported metrics; the figure is drawn from them
    from safetensors.torch import load_file

    from timm_csm.metrics import calibration_metrics

    pred = load_file(str(out / "cells" / "csm-s1" / "test_predictions.safetensors"))
    res = json.loads((out / "cells" / "csm-s1" / "results.json").read_text())
    assert pred["logits"].shape == (200, 10) and pred["targets"].dtype == torch.int64
    assert calibration_metrics(pred["logits"], pred["targets"])["ece"] == pytest.approx(res["test"]["pre_ts"]["ece"])
    png = report.with_name("calibration_reliability.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.name in text

    # the cache is keyed by the recipe: another recipe in the same folder is refused, naming the difference
    with pytest.raises(ValueError, match="epochs"):
        bench.main(common + ["--epochs", "2"])
    # --report-only with another recipe leaves the other recipe's cells out
    text = bench.main(common + ["--report-only", "--lr", "0.01"])
    assert "No cell has finished yet." in text and "Left out (6" in text


def test_missing_csm_dataset_skips_the_csm_rows_and_the_report_keeps_other_sections(tmp_path):
    out, report = tmp_path / "bench", tmp_path / "calibration.md"
    report.write_text("## Choosing the recipe\n\nkept above\n")
    argv = TOY + ["--output", str(out), "--report", str(report), "--methods", "ce", "csm", "csm_hard",
                  "--seeds", "3", "--csm-dataset", str(tmp_path / "nowhere"), "--max-cells", "0"]
    text = bench.main(argv)
    assert "Not run: CSM dataset" in text and "hard-label copy is derived from it" in text
    assert "Pending cells (3): ce-s3, csm-s3, csm_hard-s3." in text
    assert not (out / "cells").exists()
    report.write_text(report.read_text() + "\n## Notes\n\nkept below\n")
    bench.main(argv)
    full = report.read_text()
    assert full.startswith("## Choosing the recipe\n\nkept above\n") and full.endswith("## Notes\n\nkept below\n")
    assert full.count("## Calibration benchmark") == 1 and full.count("Pending cells (3)") == 1


def test_recipes_are_the_profiles_classifier_recipes():
    from timm_csm.recipes import get_profile, training_options

    demo = get_profile("demo")
    augmented = table.base_recipe({"epochs": 3, "lr": None}, "augmented")
    assert augmented == dict(training_options(demo), epochs=3)  # None overrides are ignored
    assert augmented["max_train_samples"] == 2500 and augmented["crop_pad"] == 2
    assert augmented["weight_decay"] == 5e-4 and augmented["decay_milestones"] == [30, 45]
    assert bench.build_parser().parse_args([]).recipe == "matched"
    for setting in table.PROTOCOL_RECIPES:  # the protocol's settings: the demo classifier on one data seed
        assert table.base_recipe({}, setting) == dict(training_options(demo), val_size=2000, data_seed=0)
    with pytest.raises(ValueError, match="unknown recipe"):
        table.base_recipe({}, "paper")
    noaug = table.base_recipe({}, "noaug")
    assert noaug["hflip"] == 0.0 and noaug["weight_decay"] == 0.0 and "decay_milestones" not in noaug
    assert noaug["model_kwargs"] == {"widths": [16, 32, 64, 128, 256]}
    cfg = table.cell_config(noaug, table.METHODS["mixup"], 7, Path("x"))
    assert cfg["mixup"] == 0.4 and cfg["seed"] == 7 and "n_aug" not in cfg and "csm_dataset" not in cfg
    with pytest.raises(ValueError, match="needs the soft-label CSM dataset"):
        table.cell_config(noaug, table.METHODS["csm"], 0, Path("x"))


def test_csm_diagnostics_splits_seen_and_unseen_groups(tmp_path):
    """A CSM run trained on half of the groups: the diagnostics score the other half as unseen and reload the run's
    best checkpoint exactly (its real-test accuracy is the one train.py reported)."""
    from csm_testdata import DIGIT_NAMES, make_csm_dataset, save_csm_folder
    from timm_csm.data import load_digits
    from timm_csm.training import run

    diag = load_benchmark("csm_diagnostics")

    digits = load_digits("train")
    protos = np.stack([digits.images[digits.labels == c].mean(0) for c in range(10)])
    full = make_csm_dataset(DIGIT_NAMES, prototypes=protos, seeds_per_pair=2)
    seen = save_csm_folder(full.filter(lambda r: r["group_id"] < 45), tmp_path / "seen" / "csm-digits-aug")
    every = save_csm_folder(full, tmp_path / "all" / "csm-digits-aug")
    results = run(dict(dataset="digits", model="small_cnn", loss="csm", csm_dataset=seen, epochs=3, batch_size=32,
                       lr=0.05, hflip=0.0, crop_pad=0, max_train_samples=400, val_fraction=0.25, seed=0,
                       progress=False, output=str(tmp_path), experiment="csm"))
    rows = diag.diagnose([tmp_path / "csm"], diag.load_generated_rows([seen]), diag.load_generated_rows([every]))
    assert len(rows) == 1 and rows[0]["loss"] == "csm" and rows[0]["run"] == str(tmp_path / "csm")
    r = rows[0]
    assert r["real"]["accuracy"] == pytest.approx(results["test"]["pre_ts"]["accuracy"], abs=1e-9)
    assert r["seen"]["n"] == r["unseen"]["n"] == 45 * 8
    for part in ("seen", "unseen"):
        assert 0 <= r[part]["sq_err"] <= 2 and 0 < r[part]["n_interior"] <= r[part]["n"]
        assert r[part]["interior_target_conf"] < diag.INTERIOR
    assert f"| {tmp_path / 'csm'} | csm |" in diag.to_markdown(rows)
    png = diag.save_figure(rows, tmp_path / "diag.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    with pytest.raises(ValueError, match="nothing unseen"):
        diag.diagnose([tmp_path / "csm"], diag.load_generated_rows([every]), diag.load_generated_rows([seen]))



def test_boundary_cells_wait_for_the_decision_row_then_use_its_set(tmp_path, csm_folder, monkeypatch):
    import shutil

    out = tmp_path / "bench"
    monkeypatch.setattr(bench, "SETTINGS_ROOT", tmp_path / "settings")
    recipe = table.base_recipe(name="noaug")
    runs = bench.run_cells(recipe, ["csm_groups50"], [0], out, csm_dataset=csm_folder, setting="matched",
                           committed=None, max_cells=0)
    assert "chosen once both have every seed" in runs["skipped"]["csm_groups50-matched-s0"]
    # both variants finished at every seed, the filtered one lower on validation: its set is the source
    cells = out / "cells"
    for m, val_ece in (("csm", 0.03), ("csm_filtered", 0.02)):
        for s in table.PROTOCOL_SEEDS:
            d = cells / table.cell_name(m, s, "matched")
            d.mkdir(parents=True)
            (d / RESULTS).write_text(json.dumps(_cell(s, 0.02, val_ece)["results"]))
            (d / CELL_META).write_text(json.dumps({"method": m, "seed": s, "setting": "matched",
                                                         "config": {}, "seconds": 1.0}))
    runs = bench.run_cells(recipe, ["csm_groups50"], [0], out, csm_dataset=csm_folder, setting="matched",
                           committed=None, max_cells=0)
    assert runs["skipped"] == {}
    stamp = json.loads((out / "csm-groups50-matched" / "derived_from.json").read_text())
    assert stamp["source"] == str(out / "csm-filtered-matched") and stamp["derivation"] == "group_fraction=0.5"
    # the generator-steps set: blocked until built, then its own filtered copy
    runs = bench.run_cells(recipe, ["csm_gen2000"], [0], out, csm_dataset=csm_folder, setting="matched",
                           committed=None, max_cells=0)
    assert "not available" in runs["skipped"]["csm_gen2000-matched-s0"]
    shutil.copytree(csm_folder, tmp_path / "settings" / "matched-gen2000" / "csm" / "csm-fmnist-aug")
    runs = bench.run_cells(recipe, ["csm_gen2000"], [0], out, csm_dataset=csm_folder, setting="matched",
                           committed=None, max_cells=0)
    assert runs["skipped"] == {}
    stamp = json.loads((out / "csm-filtered-matched-gen2000" / "derived_from.json").read_text())
    assert stamp["source"] == str(tmp_path / "settings" / "matched-gen2000" / "csm" / "csm-fmnist-aug")
    summary = protocol_page.protocol_summary(protocol_page.protocol_cells(out, "matched", None), "matched")
    summary["rows"]["csm_groups50"] = summary["rows"]["csm"]
    text = "\n".join(protocol_page.boundary_section(summary))
    assert "| 50% of the groups | 5 |" in text and "| all groups, 4 000 steps (decision row) | 5 |" in text
    assert "lies below 0 (5 seeds): none." in text

def test_filtered_row_is_reported_from_its_derived_copy(tmp_path, csm_folder):
    out, report = tmp_path / "bench", tmp_path / "calibration.md"
    text = bench.main(TOY + ["--output", str(out), "--report", str(report), "--csm-dataset", csm_folder,
                             "--methods", "csm_filtered", "--seeds", "0"])
    cell = json.loads((out / "cells" / "csm_filtered-s0" / "cell.json").read_text())
    assert cell["config"]["csm_dataset"] == str(out / "csm-filtered")
    assert _row(text, table.METHODS["csm_filtered"].label)[1] == "1"  # one finished seed, not "left out"
    assert "Left out" not in text


# ---------------------------------------------------------------------------------------------------------------
# the protocol's settings (benchmarks/PROTOCOL.md)


def test_protocol_cells_are_shared_unless_they_use_the_setting():
    assert table.cell_name("ce", 3, "matched") == table.cell_name("ce", 3, "borrowed") == "ce-s3"
    assert table.cell_name("real_copies", 0, "matched") == "real_copies-s0"  # real images only: one cell
    assert table.cell_name("csm", 0, "matched") == "csm-matched-s0"
    assert table.cell_name("kd", 1, "borrowed") == "kd-borrowed-s1"
    assert set(table.NON_GENERATED) | {"csm", "csm_hard", "csm_filtered"} == set(table.PROTOCOL_METHODS)


def test_equal_images_controls_scale_epochs_and_milestones():
    recipe = table.base_recipe({}, "matched")
    ce = table.cell_config(recipe, table.METHODS["ce_eq"], 0, Path("x"))
    reg = table.cell_config(recipe, table.METHODS["regmixup_eq"], 0, Path("x"))
    assert (ce["epochs"], ce["decay_milestones"]) == (180, [90, 135])
    assert (reg["epochs"], reg["decay_milestones"], reg["regmixup"]) == (90, [45, 68], 20.0)
    kd = table.cell_config(recipe, table.METHODS["kd"], 0, Path("x"), {"teacher": "enc"})
    assert kd["teacher"] == "enc" and kd["loss"] == "kd"
    with pytest.raises(ValueError, match="needs a teacher"):
        table.cell_config(recipe, table.METHODS["kd"], 0, Path("x"))


def _cell(seed, ece, val_ece, acc=0.9, val_post=None):
    scores = {"accuracy": acc, "ece": ece, "aece": ece, "cece": ece / 3, "nll": 0.3, "brier": 0.15}
    return {"results": {"test": {"pre_ts": scores, "post_ts": dict(scores, ece=ece / 2)},
                        "val": {"pre_ts": {"ece": val_ece}, "post_ts": {"ece": val_post if val_post else val_ece}},
                        "temperature": 1.2, "checkpoint_epoch": 50}, "seconds": 10.0, "dir": Path("x")}


def test_protocol_summary_chooses_on_validation_and_never_on_test():
    seeds = range(5)
    cells = {
        "ce": {s: _cell(s, 0.045 + 0.001 * s, 0.040) for s in seeds},
        # the lowest test ECE of the non-generated methods, but not the lowest validation ECE
        "regmixup": {s: _cell(s, 0.010, 0.030) for s in seeds},
        "brier": {s: _cell(s, 0.020, 0.020) for s in seeds},
        "csm": {s: _cell(s, 0.012 + 0.0005 * s, 0.015) for s in seeds},
        # better on test, worse on validation: not the decision row
        "csm_filtered": {s: _cell(s, 0.005, 0.016) for s in seeds},
    }
    summary = protocol_page.protocol_summary(cells, "matched")
    assert "kd" not in summary["candidates"] and "kd" in protocol_page.protocol_summary(cells, "borrowed")["candidates"]
    assert summary["csm"] == "csm" and summary["best_other"]["pre_ts"] == "brier"
    interval = summary["pairs"]["ce"]["ece_pre_ts"]
    assert interval.n == 5 and interval.high < 0 and interval.mean == pytest.approx(100 * (0.013 - 0.047))
    lines = "\n".join(protocol_page.protocol_section("matched", summary, {}))
    assert "| CSM (decision row) | 5 |" in lines
    assert "ECE against CE, before TS (CE): -3.40" in lines
    # LS, MbLS ... have no seed yet, so the validation choices and every verdict wait for them
    assert "pending (the validation choices wait for every method's seeds)" in lines
    assert "CSM lower (interval excludes 0)" in protocol_page.verdict(summary["pairs"]["ce"]["ece_pre_ts"])
    assert "against the best other method, before TS (Brier (control))" in lines
    row = summary["rows"]["csm"][0]
    assert row["ece_pre_ts"] == pytest.approx(1.2) and row["val_ece_pre_ts"] == pytest.approx(1.5)
    assert row["epoch"] == 50 and row["T"] == 1.2


def test_protocol_verdict_waits_for_every_seed():
    assert "pending (3 of 5 seeds)" in protocol_page.verdict((3, -1.0, -2.0, -0.5))
    assert "no difference shown" in protocol_page.verdict((5, -1.0, -2.0, 0.5))
    assert "CSM higher" in protocol_page.verdict((5, 1.0, 0.5, 1.5))



def test_protocol_statement_needs_both_before_ts_verdicts():
    assert protocol_page.statement(["lower", "lower"]) == "holds"
    assert protocol_page.statement(["lower", "none"]) == "does not hold"
    assert protocol_page.statement(["lower", None]) == "pending"
    assert protocol_page.outcome((5, -1.0, -2.0, -0.5)) == "lower"
    assert protocol_page.outcome((4, -1.0, -2.0, -0.5)) is None
    seeds = range(5)
    cells = {m: {s: _cell(s, 0.045, 0.040) for s in seeds} for m in table.NON_GENERATED if m != "kd"}
    cells["csm"] = {s: _cell(s, 0.010 + 0.001 * s, 0.010) for s in seeds}
    cells["csm_filtered"] = {s: _cell(s, 0.010, 0.020) for s in seeds}
    lines = "\n".join(protocol_page.protocol_section("matched", protocol_page.protocol_summary(cells, "matched"), {}))
    statement = '**"CSM calibrates better" in `matched` (before TS, against CE and the best other method): holds.**'
    assert statement in lines
    # best on validation, as good as CSM on test
    cells["brier"] = {s: _cell(s, 0.010 + 0.001 * s + (0.002 if s % 2 else -0.002), 0.005) for s in seeds}
    lines = "\n".join(protocol_page.protocol_section("matched", protocol_page.protocol_summary(cells, "matched"), {}))
    assert "best other method): does not hold.**" in lines

# ---------------------------------------------------------------------------------------------------------------
# amendment 2: tuned methods by name, cell records, re-running a committed cell
# ---------------------------------------------------------------------------------------------------------------
def _toy_recipe():
    return table.base_recipe({"dataset": "digits", "model": "small_cnn", "model_kwargs": {"widths": [8, 16]},
                              "epochs": 1, "batch_size": 32, "lr": 0.05, "max_train_samples": 320,
                              "max_test_samples": 200, "val_fraction": 0.25, "hflip": 0.0, "crop_pad": 1,
                              "progress": False}, "noaug")


def test_tuned_names_are_canonical_and_set_the_option_they_name():
    assert table.tuned_name("csm", s=2.3, weight=1.0, n_aug=1, filtered=0) == "csm@s=2.3"
    assert table.tuned_name("ls", smoothing=0.05) == "ls"  # the method's own value: one name per configuration
    ls = table.get_method("ls@smoothing=0.2")
    assert ls.options == {"loss": "ls", "loss_kwargs": {"smoothing": 0.2}} and ls.label == "Label smoothing (eps 0.2)"
    assert table.get_method("regmixup@regmixup=2").options == {"loss": "ce", "regmixup": 2.0}
    kd = table.get_method("kd@alpha=0.5,temperature=2")
    assert kd.options["loss_kwargs"] == {"temperature": 2.0, "alpha": 0.5} and kd.teacher
    csm = table.get_method("csm@filtered=1,n_aug=2,s=4,weight=0.5")
    assert csm.data_key == "filtered@s=4" and csm.options["n_aug"] == 2
    assert csm.options["loss_kwargs"] == {"weight": 0.5}
    assert table.get_method("csm@s=auto").data_key == "soft"
    assert len(table.grid_methods("kd")) == 4 and table.grid_methods("ce") == ["ce"]
    assert table.csm_step_methods(1, {"s": 2.3}) == ["csm@s=2.3,weight=0.5", "csm@s=2.3", "csm@s=2.3,weight=2"]
    for bad, match in (("ls@margin=3", "has no option 'margin'"), ("ce@s=2", "applies to methods that read"),
                       ("csm@n_aug=1.5", "positive integer"), ("nope", "unknown method"),
                       ("ls@smoothing", "expected <axis>=<value>")):
        with pytest.raises(ValueError, match=match):
            table.get_method(bad)


def test_amendment_cells_record_what_they_depend_on_and_reproduce(tmp_path, csm_folder):
    out, home = tmp_path / "a2", tmp_path / "committed"
    bench.run_cells(_toy_recipe(), ["ls@smoothing=0.1", "csm@s=2.3"], [0], out, csm_dataset=csm_folder,
                    setting="matched", committed=home, amendment=2)
    ls = json.loads((home / "ls@smoothing=0.1-s0" / CELL_META).read_text())
    assert ls["config"]["loss_kwargs"] == {"smoothing": 0.1}
    # the cells fit the temperature by the paper's grid (training runs default to NLL), not a keyed option
    assert "ts_method" not in ls["config"]
    assert json.loads((home / "ls@smoothing=0.1-s0" / RESULTS).read_text())["ts_method"] == "grid_ece"
    record = ls["record"]
    assert record["amendment"] == 2 and record["torch_threads"] == torch.get_num_threads()
    assert record["torch"] == torch.__version__ and len(record["commit"]) == 40 and "generated_set" not in record
    csm = json.loads((home / "csm@s=2.3-matched-s0" / CELL_META).read_text())
    relabelled = csm["config"]["csm_dataset"]
    assert csm["record"]["generated_set"] == content_fingerprint(relabelled)
    assert csm["record"]["generated_set"] != content_fingerprint(csm_folder)  # other soft labels, same images
    from timm_csm.hub import load_csm_dataset
    q = np.asarray(load_csm_dataset(relabelled)["train"]["soft_label"])
    q_own = np.asarray(load_csm_dataset(csm_folder)["train"]["soft_label"])
    assert q.max(1).mean() < q_own.max(1).mean()  # s = 2.3 is softer than the set's own choice

    found = verify_cell("csm@s=2.3-matched-s0", roots=[home])
    assert found["results"] == [] and found["record"] == [] and found["added"] == []
    results = json.loads((home / "ls@smoothing=0.1-s0" / RESULTS).read_text())
    results["test"]["pre_ts"]["ece"] += 0.01
    (home / "ls@smoothing=0.1-s0" / RESULTS).write_text(json.dumps(results))
    del results["n_bins"]  # a key the committed results lack: named, not compared
    (home / "ls@smoothing=0.1-s0" / RESULTS).write_text(json.dumps(results))
    found = verify_cell("ls@smoothing=0.1-s0", roots=[home])
    assert [d.split(":")[0] for d in found["results"]] == ["test.pre_ts.ece"] and found["added"] == ["n_bins"]


def test_existing_configurations_compute_what_they_computed(tmp_path, csm_folder):
    """Amendment 2's running cells: the configuration of a name that existed before the stage 3-5 axes is the same
    dict as before them (written from the code of that time), set paths included."""
    teacher = tmp_path / "teacher"
    teacher.mkdir()
    (teacher / "model.safetensors").write_bytes(b"weights")
    names = ["csm@s=2.3", "ls@smoothing=0.1", "kd@alpha=0.5,temperature=2", "csm@filtered=1,n_aug=2,s=4,weight=0.5",
             "csm", "csm@filtered=1", "ce", "regmixup@regmixup=10"]
    todo, skipped = bench.prepare_cells(table.base_recipe({}, "matched"), names, [3], tmp_path / "out",
                                        csm_dataset=csm_folder, setting="annotated", teacher=str(teacher))
    out = str(tmp_path / "out")
    recipe = {"dataset": "fashion_mnist", "model": "small_cnn", "epochs": 60, "batch_size": 128, "lr": 0.1,
              "weight_decay": 0.0005, "sched": "multistep", "max_train_samples": 2500, "max_test_samples": None,
              "model_kwargs": {"widths": [16, 32, 64, 128, 256]}, "crop_pad": 2, "hflip": 0.5,
              "decay_milestones": [30, 45], "val_size": 2000, "data_seed": 0, "seed": 3, "experiment": "."}
    expected = {
        "csm@s=2.3": {"loss": "csm", "csm_dataset": f"{out}/csm-soft-annotated-s2.3", "n_aug": 1,
                      "output": f"{out}/cells/csm@s=2.3-annotated-s3"},
        "ls@smoothing=0.1": {"loss": "ls", "loss_kwargs": {"smoothing": 0.1},
                             "output": f"{out}/cells/ls@smoothing=0.1-s3"},
        "kd@alpha=0.5,temperature=2": {"loss": "kd", "loss_kwargs": {"temperature": 2.0, "alpha": 0.5},
                                       "teacher": str(teacher),
                                       "output": f"{out}/cells/kd@alpha=0.5,temperature=2-annotated-s3"},
        "csm@filtered=1,n_aug=2,s=4,weight=0.5": {
            "loss": "csm", "n_aug": 2, "loss_kwargs": {"weight": 0.5}, "csm_dataset": f"{out}/csm-filtered-annotated-s4",
            "output": f"{out}/cells/csm@filtered=1,n_aug=2,s=4,weight=0.5-annotated-s3"},
        "csm": {"loss": "csm", "csm_dataset": csm_folder, "n_aug": 1, "output": f"{out}/cells/csm-annotated-s3"},
        "csm@filtered=1": {"loss": "csm", "csm_dataset": f"{out}/csm-filtered-annotated", "n_aug": 1,
                           "output": f"{out}/cells/csm@filtered=1-annotated-s3"},
        "ce": {"loss": "ce", "output": f"{out}/cells/ce-s3"},
        "regmixup@regmixup=10": {"loss": "ce", "regmixup": 10.0, "output": f"{out}/cells/regmixup@regmixup=10-s3"},
    }
    assert skipped == {}
    assert {m: cfg for m, _, _, cfg, _ in todo} == {m: dict(recipe, **extra) for m, extra in expected.items()}


def _q(folder):
    from timm_csm.hub import load_csm_dataset

    return load_csm_dataset(str(folder))["train"]


def test_stage3_names_read_the_derived_labels_once(tmp_path, csm_folder):
    lam = table.get_method("csm@label=lambda,n_aug=2")
    assert lam.data_key == "soft@label=lambda" and lam.options["n_aug"] == 2
    assert table.tuned_name("csm", label="projection", s="auto", n_aug=2) == "csm@n_aug=2"
    assert table.get_method("csm@filtered=1,label=softmax").data_key == "filtered@label=softmax"
    for bad, match in (("csm@label=hard,s=4", "label=hard replaces"), ("ls@label=hard", "applies to methods"),
                       ("csm_hard@label=lambda", "the setting's generated set"), ("csm@label=soft", "one of")):
        with pytest.raises(ValueError, match=match):
            table.get_method(bad)
    names = ["csm@label=lambda,n_aug=2", "csm@filtered=1,label=hard", "csm@label=softmax"]
    todo, skipped = bench.prepare_cells(_toy_recipe(), names, [0, 1], tmp_path / "out", csm_dataset=csm_folder,
                                        setting="matched")
    paths = {m: cfg["csm_dataset"] for m, _, _, cfg, _ in todo}
    assert paths == {"csm@label=lambda,n_aug=2": str(tmp_path / "out" / "csm-soft-matched-lambda-labels"),
                     "csm@filtered=1,label=hard": str(tmp_path / "out" / "csm-filtered-matched-hard-labels")}
    assert set(skipped) == {"csm@label=softmax-matched-s0", "csm@label=softmax-matched-s1"}
    assert "softmax labels need the setting's annotator" in skipped["csm@label=softmax-matched-s0"]
    filtered = _q(tmp_path / "out" / "csm-filtered-matched")
    assert _q(paths["csm@filtered=1,label=hard"])["group_id"] == filtered["group_id"]  # labels of the filtered set
    stamp = (tmp_path / "out" / "csm-soft-matched-lambda-labels" / "derived_from.json").stat().st_mtime_ns
    bench.prepare_cells(_toy_recipe(), names[:1], [2], tmp_path / "out", csm_dataset=csm_folder, setting="matched")
    assert (tmp_path / "out" / "csm-soft-matched-lambda-labels" / "derived_from.json").stat().st_mtime_ns == stamp


def test_volume_axis_reads_the_larger_set_with_the_same_derivations(tmp_path, csm_folder):
    from csm_testdata import DIGIT_NAMES, make_csm_dataset, save_csm_folder

    larger = save_csm_folder(make_csm_dataset(DIGIT_NAMES, seeds_per_pair=2), tmp_path / "x2")
    assert table.tuned_name("csm", volume=2, s=2.3, weight=1.0) == "csm@s=2.3,volume=2"
    assert table.tuned_name("csm", volume=1) == "csm"
    with pytest.raises(ValueError, match="volume must be one of 1, 2, 4"):
        table.get_method("csm@volume=3")
    names = ["csm@volume=2", "csm@s=2.3,volume=2", "csm@filtered=1,volume=2", "csm@volume=4", "csm"]
    assert [table.get_method(m).data_key for m in names] == [
        "soft@volume=2", "soft@volume=2@s=2.3", "filtered@volume=2", "soft@volume=4", "soft"]
    out = tmp_path / "out"
    todo, skipped = bench.prepare_cells(_toy_recipe(), names, [0], out, csm_dataset=csm_folder, setting="matched",
                                        volume_datasets={2: larger, 4: str(tmp_path / "nowhere")})
    paths = {m: cfg["csm_dataset"] for m, _, _, cfg, _ in todo}
    assert paths == {"csm@volume=2": larger, "csm@s=2.3,volume=2": str(out / "csm-soft-matched-x2-s2.3"),
                     "csm@filtered=1,volume=2": str(out / "csm-filtered-matched-x2"), "csm": csm_folder}
    assert list(skipped) == ["csm@volume=4-matched-s0"] and "4x generated set" in skipped["csm@volume=4-matched-s0"]
    rescaled = _q(paths["csm@s=2.3,volume=2"])
    assert len(rescaled) == len(_q(larger)) == 2 * len(_q(csm_folder))
    assert rescaled["soft_label"] == _q(derive.derive_rescaled_dataset(larger, tmp_path / "ref", 2.3))["soft_label"]


def test_data_seeds_name_their_cells_and_read_their_subset(tmp_path):
    assert table.cell_name("ce", 0, "borrowed", 1) == "ce-d1-s0"
    assert table.cell_name("ce", 0, "borrowed", 0) == table.cell_name("ce", 0, "borrowed") == "ce-s0"
    assert table.cell_name("csm@s=4", 3, "borrowed", 2) == "csm@s=4-borrowed-d2-s3"
    recipe = table.base_recipe({"data_seed": 2}, "borrowed")
    todo, _ = bench.prepare_cells(recipe, ["ce", "regmixup@regmixup=10"], [0], tmp_path)
    assert [(d.name, cfg["data_seed"]) for _, _, d, cfg, _ in todo] == [("ce-d2-s0", 2), ("regmixup@regmixup=10-d2-s0", 2)]
    with pytest.raises(SystemExit):
        bench.main(["--recipe", "borrowed", "--data-seed", "1", "--methods", "ce", "--max-cells", "0"])
    text = bench.main(["--amendment", "2", "--recipe", "borrowed", "--data-seed", "1", "--methods", "ce",
                       "--max-cells", "0", "--output", str(tmp_path / "a2")])
    assert text.startswith("amendment 2, borrowed, data seed 1: ran 0 cell(s)")


def test_amendment4_cells_record_the_machine_the_pins_and_their_checkpoint(tmp_path, csm_folder, monkeypatch):
    from timm_csm.io import file_sha256, tensors_sha256
    from timm_csm.recipes.cells import INSTRUCTION_SET_PINS, instruction_set_problem, real_images_digests

    for name in INSTRUCTION_SET_PINS:
        monkeypatch.delenv(name, raising=False)
    problem = instruction_set_problem()  # never None here: the pins are read when torch starts, and were not set
    assert problem is not None and all(f"{k}={v}" in problem for k, v in INSTRUCTION_SET_PINS.items())
    out, home = tmp_path / "a4", tmp_path / "committed"
    recipe = _toy_recipe()
    bench.run_cells(recipe, ["ce"], [0], out, setting="matched", committed=home, amendment=4)
    meta = json.loads((home / "ce-s0" / CELL_META).read_text())
    record = meta["record"]
    assert record["amendment"] == 4 and record["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert record["pins"] == {k: None for k in INSTRUCTION_SET_PINS} and record["cpu"]
    assert record["numpy"] == np.__version__ and record["device"] == "cpu"
    assert record["real_images"] == real_images_digests(meta["config"])
    assert record["real_images"]["train"] != record["real_images"]["validation"]
    best = out / "cells" / "ce-s0" / "model_best.safetensors"
    assert meta["checkpoint_sha256"] == file_sha256(best) and meta["checkpoint_tensors_sha256"] == tensors_sha256(best)
    assert 0 < meta["cpu_seconds"]
    found = verify_cell("ce-s0", roots=[home])
    assert found["results"] == [] and found["record"] == []
    from timm_csm.recipes.cells import verify_and_log

    text, reproduced = verify_and_log("ce-s0", [home], tmp_path / "verify.json")
    entry = json.loads((tmp_path / "verify.json").read_text())[-1]
    assert reproduced and text == "ce-s0: reproduced exactly" and entry["reproduced"]
    assert entry["cpu_capability"] == torch.backends.cpu.get_cpu_capability()  # where the verdict holds
    assert entry["pins"] == {k: None for k in INSTRUCTION_SET_PINS}

    # the log names the commit the run started from, though the checkout moves on while the cell trains
    import subprocess

    import timm_csm.training as training

    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    (repo / "code.py").write_text("1\n")
    subprocess.run(git[:3] + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "code.py"], check=True)
    subprocess.run(git + ["commit", "-qm", "start"], check=True)
    start = subprocess.run(git + ["rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    train = training.run

    def train_while_the_checkout_moves(cfg):
        (repo / "code.py").write_text("2\n")
        subprocess.run(git + ["commit", "-qam", "later"], check=True)
        return train(cfg)

    monkeypatch.setattr(training, "run", train_while_the_checkout_moves)
    _, reproduced = verify_and_log("ce-s0", [home], tmp_path / "moved.json", repo=repo)
    entry = json.loads((tmp_path / "moved.json").read_text())[-1]
    assert reproduced and entry["commit"] == start and entry["clean"]


def test_amendment4_recipe_and_grids():
    recipe = table.a4_recipe()
    assert recipe["model"] == table.A4_BACKBONE["model"] and "model_kwargs" not in recipe
    assert (recipe["epochs"], recipe["decay_milestones"]) == (table.A4_BACKBONE["epochs"],
                                                            table.A4_BACKBONE["decay_milestones"])
    assert (recipe["val_size"], recipe["data_seed"], recipe["max_train_samples"]) == (2000, 0, 2500)
    for setting in table.A4_SETTINGS:
        names = table.stage1_methods(setting, amendment=4)
        per_method = {}
        for name in names:
            per_method[name.partition("@")[0]] = per_method.get(name.partition("@")[0], 0) + 1
        csm_search = 1 + sum(len(values) - 1 for _, values in table.A4_CSM_STEPS)
        assert max(max(per_method.values()), csm_search) == 4  # no method searches more configurations
        assert ("kd" in per_method) == (setting == "annotated") and "mbls" not in per_method


def test_verify_names_whose_cell_where_amendments_share_a_name(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for root in (table.COMMITTED_A2, table.COMMITTED_A4):
        (root / "ce-s0").mkdir(parents=True)
    with pytest.raises(SystemExit):
        bench.main(["--verify", "ce-s0"])
    assert "names a cell of amendment 4 and amendment 2: give --amendment N" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--verify", "ce-s1", "--amendment", "2"])
    assert "amendment 2 has no committed cell 'ce-s1'" in capsys.readouterr().err
