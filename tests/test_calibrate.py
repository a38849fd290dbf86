"""timm-csm-calibrate end to end on a timm user's model and image folder: the report's numbers re-derived from
the saved predictions and calibrators, the calibrated model loaded back as one module, the flat layout, and every
refusal as one line with no folder left behind."""
import json
import re

import numpy as np
import pytest
import torch

from calibrate_fixtures import MEAN, STD, pattern_images, save_weights, train_classifier
from csm_fixtures import CLASS_NAMES, class_patterns, tiny_timm_model, write_image_folder
from timm_csm.evaluation import calibrate
from timm_csm.metrics.interval_methods import INTERVAL_NOTE, NO_INTERVAL
from timm_csm.commands.calibrate import main
from timm_csm.calibration import load_calibrator
from timm_csm.io import save_model_file
from timm_csm.metrics import calibration_metrics, debiased_ce
from timm_csm.evaluation.model import CalibratedClassifier, load_trained_classifier


@pytest.fixture(scope="module")
def user_files(tmp_path_factory):
    """The user's folder and a small_cnn trained on other images of it (normalised with MEAN / STD at its own
    16 x 16), over-confident as a model trained with cross-entropy, saved as plain weights."""
    root = tmp_path_factory.mktemp("user")
    data = write_image_folder(root / "data")
    model = train_classifier("small_cnn", *pattern_images(30, seed=7, noise=150.0), num_classes=3, epochs=3,
                             lr=1e-2, batch_size=32)
    with torch.no_grad():
        model.get_classifier().weight.mul_(40)
    return data, save_weights(model, root / "small_cnn.safetensors")


def run_calibrate(user_files, output, **options):
    data, weights = user_files
    kwargs = dict(checkpoint=weights, num_classes=3, in_chans=1, data_config={"mean": MEAN, "std": STD},
                  calibration_split="val", test_split="test", output=output, log=lambda m: None)
    kwargs.update(options)
    return calibrate(kwargs.pop("model", "small_cnn"), kwargs.pop("dataset", data), **kwargs)


def test_report_numbers_and_the_calibrated_model(user_files, tmp_path):
    out = tmp_path / "calibrated"
    report = run_calibrate(user_files, out, calibrators=["temperature_scaling", "vector_scaling", "isotonic"],
                           class_names=CLASS_NAMES)
    names = sorted(p.name for p in out.iterdir())
    assert names == ["calibrated_model.json", "calibrator.safetensors", "calibrators", "model.safetensors",
                     "reliability.png", "report.json", "report.md", "risk_coverage.png",
                     "test_predictions.safetensors"]
    assert json.loads((out / "report.json").read_text()) == json.loads(json.dumps(report))
    assert report["test"]["n"] == 90 and report["calibration"]["n"] == 90
    from safetensors.torch import load_file
    saved = load_file(str(out / "test_predictions.safetensors"))
    logits, targets = saved["logits"], saved["targets"]
    before = calibration_metrics(logits, targets)
    assert report["uncalibrated"]["test"]["ece"] == pytest.approx(before["ece"], abs=1e-12)
    assert report["uncalibrated"]["test"]["debiased_ce"] == pytest.approx(debiased_ce(logits, targets), abs=1e-12)
    assert "| calibrator | accuracy | ece | aece | cece | mce | debiased_ce | nll |" in (out / "report.md").read_text()
    for name, row in report["calibrators"].items():
        calibrator = load_calibrator(out / "calibrators" / f"{name}.safetensors")
        after = calibration_metrics(calibrator.transform(logits), targets)
        assert row["test"]["nll"] == pytest.approx(after["nll"], abs=1e-9)
    assert report["calibrators"]["temperature_scaling"]["test"]["nll"] < before["nll"]  # over-confident head
    for base in ("none", "temperature_scaling"):
        assert set(report["conformal"][base]) == {"lac", "aps", "raps"}
        assert 0.6 < report["conformal"][base]["aps"]["coverage"] <= 1.0
    raps = report["conformal"]["none"]["raps"]
    assert raps["n_tuning"] == 27 and raps["n_calibration"] == 63 and raps["penalty"] > 0
    assert f"k_reg {raps['k_reg']} and penalty {raps['penalty']:g} tuned on 27" in (out / "report.md").read_text()
    # the temperature with its interval over refits on resampled calibration images; 90 of them: how far it moves
    ts = report["calibrators"]["temperature_scaling"]
    assert ts["temperature_interval"]["low"] <= ts["temperature"] <= ts["temperature_interval"]["high"]
    assert ts["post_ts_spread"]["n_val"] == 90 and "temperature_interval" not in report["calibrators"]["isotonic"]
    assert (f"temperature_scaling: T = {ts['temperature']:.2f} [{ts['temperature_interval']['low']:.2f}, "
            f"{ts['temperature_interval']['high']:.2f}], refitted on 200 resamples of the calibration images. Only "
            "90 calibration images:") in (out / "report.md").read_text()
    # on top of a calibrator, the sets refit it on half the calibration images and take the quantile on the rest
    on_ts = report["conformal"]["temperature_scaling"]["lac"]
    assert on_ts["n_calibrator"] == 45 and on_ts["n_calibration"] == 45 and on_ts["n_tuning"] == 0
    assert "| temperature_scaling | lac | - | 45 / - / 45 |" in (out / "report.md").read_text()
    # the model to take away: one module, the model then the calibrator of the lowest cross-validated NLL
    chosen, selection = report["calibrated_model"], report["selection"]
    assert chosen["kind"] == selection["chosen"] == min(selection["mean"], key=selection["mean"].get)
    model, transform, meta = load_trained_classifier(out, calibrated=True)
    assert isinstance(model, CalibratedClassifier) and meta["calibrator"].endswith("calibrator.safetensors")
    assert meta["class_names"] == CLASS_NAMES
    from timm_csm.data import open_image_split
    test = open_image_split(str(user_files[0]), "test")
    batch = _first_batch(test, transform)
    with torch.no_grad():
        expected = load_calibrator(out / "calibrator.safetensors").transform(logits[:len(batch)])
        assert torch.allclose(model(batch), expected, atol=1e-5)
    assert "| temperature_scaling |" in (out / "report.md").read_text()


def _first_batch(split, transform):
    from timm_csm.data import ImageCollator
    return ImageCollator(split.images, split.labels, transform, 0)(list(range(8)))["pixel_values"]


def test_a_flat_folder_with_a_held_out_fraction(user_files, tmp_path):
    data = write_image_folder(tmp_path / "flat", splits=(None,), n_per_class=20)
    logged = []
    report = run_calibrate((data, user_files[1]), tmp_path / "out", calibration_split=None, calibration_fraction=0.5,
                           test_split="train", calibrators=["histogram_binning"], conformal=["lac"], log=logged.append)
    assert report["calibration"]["n"] == 30 and report["test"]["n"] == 30
    assert report["class_names"] == CLASS_NAMES
    # the folder's one split is named 'train' (as the docs pass it): the warning names the folder's images instead
    assert any(line.endswith(f"is unknown: make sure it was not trained on the images of {data}") for line in logged)
    assert not any("'train'" in line for line in logged), logged


def run_model_file(user_files, tmp_path, train_split):
    """A train.py-style model file whose metadata says it trained on ``train_split`` of the user's folder."""
    from timm_csm.evaluation import load_classifier

    data, weights = user_files
    plain = load_classifier("small_cnn", checkpoint=weights, num_classes=3, in_chans=1,
                            data_config={"mean": MEAN, "std": STD}, class_names=CLASS_NAMES, native_size=16,
                            log=lambda m: None)
    path = tmp_path / "model_best.safetensors"
    save_model_file(path, plain.model.state_dict(), dict(plain.meta, dataset=str(data), train_split=train_split))
    return path


def test_the_training_split_is_refused_as_test_split(user_files, tmp_path):
    path = run_model_file(user_files, tmp_path, train_split="test")
    with pytest.raises(ValueError, match="'test' of .* is the split the model was trained on"):
        run_calibrate(user_files, tmp_path / "out", model=str(path), checkpoint=None)
    assert not (tmp_path / "out").exists()
    report = run_calibrate(user_files, tmp_path / "out", model=str(path), checkpoint=None,
                           allow_training_split=True, conformal=[])
    assert report["conformal"] == {}


@pytest.mark.parametrize("case,match", [
    ("pickle", "not a safetensors file"), ("json", "not a safetensors file"), ("missing", "does not exist"),
    ("names", "class names differ"), ("count", "outputs|does not fit"),
    ("small", "needs at least 12 samples for 3 classes"),
    ("binary", "two-class"), ("same_split", "never fitted on the test split"), ("unknown", "unknown calibrator"),
    ("not_a_folder", "is a file, not a folder"),
])
def test_bad_input_is_one_line_and_leaves_no_folder(user_files, tmp_path, case, match):
    data, weights = user_files
    out = tmp_path / "out"
    options = {}
    if case == "pickle":
        torch.save(tiny_timm_model().state_dict(), tmp_path / "w.pth")
        options["checkpoint"] = tmp_path / "w.pth"
    elif case == "json":
        (tmp_path / "w.json").write_text("{}")
        options["checkpoint"] = tmp_path / "w.json"
    elif case == "missing":
        options["checkpoint"] = tmp_path / "nothing.safetensors"
    elif case == "names":
        options["class_names"] = ["a", "b", "c"]
    elif case == "count":
        options["num_classes"] = 4
    elif case == "small":
        options["calibrators"] = ["matrix_scaling"]  # 12 parameters, 4 calibration images
        options.update(calibration_split=None, calibration_fraction=0.05)
    elif case == "binary":
        options["calibrators"] = ["platt"]
    elif case == "same_split":
        options["calibration_split"] = "test"
    elif case == "unknown":
        options["calibrators"] = ["platt_scaling"]
    elif case == "not_a_folder":
        (tmp_path / "file.txt").write_text("x")
        options["dataset"] = tmp_path / "file.txt"
    with pytest.raises((ValueError, FileNotFoundError), match=match) as info:
        run_calibrate(user_files, out, **options)
    assert "\n" not in str(info.value)
    assert not out.exists() and not any(p.name.startswith(".out") for p in tmp_path.iterdir())


def test_auto_chooses_by_cross_validation_and_every_number_has_an_interval(user_files, tmp_path):
    from safetensors.torch import load_file

    from timm_csm.metrics import bootstrap_metrics

    out = tmp_path / "auto"
    data, weights = user_files
    assert main(["--model", "small_cnn", "--checkpoint", str(weights), "--num-classes", "3", "--in-chans", "1",
                 "--mean", str(MEAN[0]), "--std", str(STD[0]), "--dataset", str(data), "--calibration-split", "val",
                 "--test-split", "test", "--calibrators", "auto", "--folds", "3", "--select-by", "ece",
                 "--bootstrap", "200", "--output", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    selection = report["selection"]
    assert selection["by"] == "ece" and selection["folds"] == 3 and sum(selection["fold_sizes"]) == 90
    chosen = min(selection["mean"], key=selection["mean"].get)
    assert selection["chosen"] == chosen == report["calibrated_model"]["kind"]
    assert "the lowest 3-fold cross-validated ECE" in report["calibrated_model"]["chosen_by"]
    assert set(selection["left_out"]) == {"platt", "beta"} and len(report["calibrators"]) == 7
    assert load_calibrator(out / "calibrator.safetensors").kind == load_calibrator(
        out / "calibrators" / f"{chosen}.safetensors").kind
    text = (out / "report.md").read_text()
    assert f"| {chosen} (chosen) |" in text and f"interval [low, high]: {INTERVAL_NOTE} bootstrap, 200 resamples" in text
    assert "not tried: beta (two-class models only), platt (two-class models only)" in text
    own_row = next(line for line in text.splitlines() if line.startswith("| set_size_temperature | aps |"))
    assert own_row.count("[") == 3  # coverage, mean set size and empty sets with their intervals
    # every number has its interval; the uncalibrated ones are the bootstrap of the saved predictions
    saved = load_file(str(out / "test_predictions.safetensors"))
    assert report["uncalibrated"]["intervals"]["test"] == json.loads(json.dumps(
        bootstrap_metrics(saved["logits"], saved["targets"], resamples=200, seed=0, selective=True)))
    assert set(report["uncalibrated"]["intervals"]["test"]) == set(report["uncalibrated"]["test"])
    for row in report["calibrators"].values():
        for split in ("test", "calibration_split"):
            assert set(row["intervals"][split]) == set(row[split])
            for key, iv in row["intervals"][split].items():  # a metric without an interval says why
                assert iv["low"] <= iv["high"] if iv["method"] else iv["reason"], key
    assert all(f"{name} has no interval: {why}." in text for name, why in NO_INTERVAL.items()
               if name in report["uncalibrated"]["test"])
    assert set(report["conformal"]) == {"none", *report["calibrators"], "set_size_temperature"}
    own = report["conformal"]["set_size_temperature"]["aps"]
    assert own["temperature"] > 0 and set(own["intervals"]) == {"coverage", "mean_set_size", "median_set_size",
                                                                "empty_sets"}
    assert report["conformal"][chosen]["aps"]["temperature"] is None  # on top of the calibrator: its logits


def test_command_line_prints_one_line_and_exits_2(user_files, tmp_path, capsys):
    data, _ = user_files
    rc = main(["--model", "test_resnet", "--checkpoint", str(tmp_path / "none.safetensors"), "--num-classes", "3",
               "--dataset", str(data), "--calibration-split", "val", "--test-split", "test",
               "--output", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("timm-csm-calibrate: error: --checkpoint")
    assert not (tmp_path / "o").exists()


def test_data_sources_a_timm_user_meets(tmp_path):
    from timm_csm.data import open_image_split
    from timm_csm.data.sources import dataset_split_names, detect_test_split

    flat = write_image_folder(tmp_path / "flat", splits=(None,), n_per_class=3)
    assert dataset_split_names(str(flat)) == ["train"]
    assert open_image_split(str(flat), "train").class_names == CLASS_NAMES
    assert detect_test_split(["train"], exclude=("train", None)) is None  # a flat folder trained with --val-fraction
    (flat / "zebra").mkdir()
    (flat / "aardvark").mkdir()  # empty, and first: the folder is still read as an image folder
    with pytest.raises(ValueError, match=r"class folder\(s\) \['aardvark', 'zebra'\] hold no images"):
        open_image_split(str(flat), "train")
    (tmp_path / "labels.csv").write_text("a,b\n")
    for read in (lambda: open_image_split(str(tmp_path / "labels.csv")),
                 lambda: dataset_split_names(str(tmp_path / "labels.csv"))):
        with pytest.raises(ValueError, match="labels.csv is a file, not a folder"):
            read()
    for path in ("../no_such_folder", "a/b/no_such_folder", "~/no_such_folder"):  # a Hub id has one '/'
        for read in (open_image_split, dataset_split_names):
            with pytest.raises(ValueError, match=f"^no such folder: {re.escape(path)}$"):
                read(path)


def test_eval_only_refuses_a_checkpoint_that_is_not_safetensors(tmp_path):
    from timm_csm.training import run

    (tmp_path / "x.json").write_text("{}")
    torch.save({"a": torch.zeros(1)}, tmp_path / "x.pth")
    for name in ("x.json", "x.pth"):
        with pytest.raises(ValueError, match=f"--checkpoint .*{name} is not a safetensors file"):
            run(dict(eval_only=True, checkpoint=str(tmp_path / name), output=str(tmp_path / "runs"),
                     progress=False))
    assert not (tmp_path / "runs").exists()


def test_odir_strengths_and_extra_reliability_diagrams_from_the_command_line(user_files, tmp_path):
    from timm_csm.metrics import reliability_table_from_points

    data, weights = user_files
    out = tmp_path / "o"
    rc = main(["--model", "small_cnn", "--checkpoint", str(weights), "--num-classes", "3", "--in-chans", "1",
               "--mean", str(MEAN[0]), "--std", str(STD[0]), "--dataset", str(data), "--calibration-split", "val", "--test-split", "test",
               "--calibrators", "dirichlet,isotonic", "--export", "dirichlet", "--reg-lambda", "0.01", "--reg-mu",
               "0.02", "--conformal", "",
               "--reliability", "adaptive,classwise", "--class-names", ",".join(CLASS_NAMES), "--output", str(out)])
    assert rc == 0
    assert (out / "reliability_adaptive.png").is_file() and (out / "reliability_classwise.png").is_file()
    report = json.loads((out / "report.json").read_text())
    assert report["odir"] == {"reg_lambda": 0.01, "reg_mu": 0.02}
    assert report["calibrated_model"]["kind"] == "dirichlet" and "selection" not in report
    dirichlet = load_calibrator(out / "calibrators" / "dirichlet.safetensors")
    assert (dirichlet.reg_lambda, dirichlet.reg_mu) == (0.01, 0.02)
    from safetensors.torch import load_file
    saved = load_file(str(out / "test_predictions.safetensors"))
    conf, pred = torch.softmax(saved["logits"].double(), dim=1).max(dim=1)
    adaptive = reliability_table_from_points(conf, (pred == saved["targets"]).double(), 15, equal_mass=True)
    # the same equal-mass bins as the report's adaptive ECE (which takes the float32 logits' softmax: 1e-9 apart)
    assert adaptive.ece == pytest.approx(report["uncalibrated"]["test"]["aece"], abs=1e-7)
    assert int(adaptive.count.sum()) == 90
    with pytest.raises(ValueError, match="reg_lambda and reg_mu must be >= 0"):
        run_calibrate(user_files, tmp_path / "bad", calibrators=["dirichlet"], reg_lambda=-1.0)
    with pytest.raises(ValueError, match="unknown reliability diagram 'smooth'"):
        run_calibrate(user_files, tmp_path / "bad", reliability=["smooth"])


def test_a_run_folder_is_calibrated_on_its_own_held_out_images(tmp_path, capsys):
    """timm-csm-train --test-fraction on a flat folder, then timm-csm-calibrate --model <run folder> alone: fitted on
    the run's validation images, scored on the very test images the run held out (same images, same logits), said
    in the first line; a folder changed since is refused in one line, with nothing written."""
    from safetensors.torch import load_file

    from timm_csm.training import run
    from timm_csm.training import parse_args

    data = write_image_folder(tmp_path / "flat", splits=(None,), n_per_class=40, noise=20.0)
    trained = run(parse_args(["--dataset", str(data), "--model", "small_cnn", "--epochs", "10", "-b", "16",
                              "--lr", "0.05", "--test-fraction", "0.2", "--val-fraction", "0.25", "--no-progress",
                              "--output", str(tmp_path / "runs"), "--experiment", "ce"]))
    folder = tmp_path / "runs" / "ce"
    assert main(["--model", str(folder), "--output", str(tmp_path / "out"), "--calibrators", "temperature_scaling",
                 "--bootstrap", "0", "--conformal", ""]) == 0
    first = capsys.readouterr().err.splitlines()[0]
    assert first == (f"calibrating on the run's {trained['n_val']} validation images and scoring its 24 held-out test "
                     f"images (held out as a seeded 0.2 of {data}, data seed 12345; both found again by their digests)")
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert (report["calibration"]["n"], report["test"]["n"]) == (trained["n_val"], trained["n_test"]) == (24, 24)
    ours, runs = (load_file(str(f / "test_predictions.safetensors")) for f in (tmp_path / "out", folder))
    assert torch.equal(ours["targets"], runs["targets"])
    assert torch.allclose(ours["logits"], runs["logits"], atol=1e-5)

    write_image_folder(tmp_path / "more", splits=(None,), n_per_class=1, seed=5)  # one image more in each class
    for image in (tmp_path / "more").glob("*/*.png"):
        image.rename(data / image.parent.name / f"extra-{image.name}")
    assert main(["--model", str(folder), "--output", str(tmp_path / "again")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "are no longer those it held out" in err[0] and not (tmp_path / "again").exists()
