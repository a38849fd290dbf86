"""Shift and OOD evaluation in both commands at toy size: timm-csm-train --eval-shift / --ood and timm-csm-calibrate
--shift / --ood write the table, the figure and the OOD scores; a cell re-derived from the saved model; every
refusal one line with nothing written."""
import json

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import save_file

from calibrate_fixtures import calibrate_pattern_model, pattern_model_files
from csm_fixtures import write_image_folder
from timm_csm.commands.calibrate import main as calibrate_main
from timm_csm.data import derive_seed, load_digits
from timm_csm.data.corruptions import create_corruption
from timm_csm.metrics import bootstrap_metrics, calibration_metrics
from timm_csm.evaluation.model import load_trained_classifier
from timm_csm.evaluation.shift import SHIFT_METRICS
from timm_csm.training import run

KEYS = set(SHIFT_METRICS) | {"conformal", "intervals"}  # the commands bootstrap 1 000 resamples by default


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    """An image folder of three shape classes, none of them a digit: the OOD source of the digits model."""
    return write_image_folder(tmp_path_factory.mktemp("shapes") / "shapes", splits=("test",), n_per_class=10)


def _config(tmp_path, name, **overrides):
    cfg = dict(dataset="digits", model="small_cnn", epochs=1, batch_size=32, lr=0.05, hflip=0.0, crop_pad=1,
               max_train_samples=320, max_test_samples=120, val_fraction=0.25, seed=0, progress=False,
               output=str(tmp_path), experiment=name, decay_milestones=[1])
    cfg.update(overrides)
    return cfg


def test_train_writes_the_shift_table_figure_and_ood_scores(tmp_path, shapes):
    res = run(_config(tmp_path, "run", eval_shift="rotate,gaussian_noise", shift_severities=[5, 1],
                      ood=str(shapes), bootstrap=200))
    out = tmp_path / "run"
    assert json.loads((out / "results.json").read_text())["shift"] == json.loads(json.dumps(res["shift"]))
    shift = res["shift"]
    assert shift["severities"] == [1, 5] and shift["methods"] == ["uncalibrated", "temperature_scaling"]
    for name in ("rotate", "gaussian_noise"):
        for s in ("1", "5"):
            for method, cell in shift["table"][name][s].items():
                assert set(cell) == KEYS and set(cell["conformal"]) == {"lac", "aps", "raps"}, (name, s, method)
    assert shift["clean"]["uncalibrated"]["ece"] == pytest.approx(res["test"]["pre_ts"]["ece"], abs=1e-12)
    assert shift["clean"]["temperature_scaling"]["nll"] == pytest.approx(res["test"]["post_ts"]["nll"], abs=1e-12)
    for s in ("1", "5"):  # the summary is the mean over the corruptions, the worst the highest ECE
        cells = [shift["table"][n][s]["temperature_scaling"] for n in ("rotate", "gaussian_noise")]
        summary = shift["summary"][s]["temperature_scaling"]
        assert summary["mean"]["ece"] == pytest.approx(np.mean([c["ece"] for c in cells]), abs=1e-12)
        assert summary["worst"]["ece"] == max(c["ece"] for c in cells)
    assert shift["summary"]["5"]["uncalibrated"]["mean"]["accuracy"] < shift["clean"]["uncalibrated"]["accuracy"]
    # a cell re-derived from the saved model: the test subset under rotate 5, through the model's eval transform
    model, transform, meta = load_trained_classifier(out / "model_best.safetensors")
    test = load_digits("test")
    rows = torch.randperm(len(test), generator=torch.Generator().manual_seed(derive_seed(0, 2)))[:120].sort().values
    images = create_corruption("rotate", 5, seed=0).batch(torch.from_numpy(test.images[rows.numpy()]))
    with torch.no_grad():
        logits = model(transform.apply(images))
    expected = calibration_metrics(logits, torch.from_numpy(test.labels[rows.numpy()]))
    assert shift["table"]["rotate"]["5"]["uncalibrated"]["ece"] == pytest.approx(expected["ece"], abs=1e-6)
    # its intervals: the bootstrap of the cell's own predictions, with the command's seed and resamples
    labels = torch.from_numpy(test.labels[rows.numpy()])
    expected = bootstrap_metrics(logits, labels, 15, resamples=200, seed=0, selective=True)
    cell = shift["table"]["rotate"]["5"]["uncalibrated"]["intervals"]
    assert set(cell) == set(SHIFT_METRICS) and shift["bootstrap"]["resamples"] == 200
    assert all(cell[k][end] == pytest.approx(expected[k][end], abs=1e-6) for k in cell for end in ("low", "high"))
    for s in ("1", "5"):  # a severity's interval is that of the mean over corruptions: inside the cells' range
        mean_iv = shift["summary"][s]["uncalibrated"]["intervals"]["ece"]
        cells = [shift["table"][n][s]["uncalibrated"]["intervals"]["ece"] for n in ("rotate", "gaussian_noise")]
        assert min(c["low"] for c in cells) <= mean_iv["low"] <= mean_iv["high"] <= max(c["high"] for c in cells)
    ood = res["ood"]
    for method in ("uncalibrated", "temperature_scaling"):
        for kind, iv in ood["intervals"][method].items():
            assert all(0 <= iv[k]["low"] <= iv[k]["high"] <= 1 for k in iv), (method, kind)

    assert ood["n_out"] == 30 and ood["n_in"] == 120 and ood["split"] == "test"
    for method in ("uncalibrated", "temperature_scaling"):
        assert set(ood["methods"][method]) == {"msp", "max_logit", "energy", "entropy"}
        for m in ood["methods"][method].values():
            assert set(m) == {"auroc", "aupr_in", "aupr_out", "fpr95"} and all(0 <= v <= 1 for v in m.values())
    text = (out / "results.md").read_text()
    assert "## Under corruption: 2 corruptions" in text and "| 5 | " in text and "## Out of distribution" in text
    assert shift["applied"] in text and shift["applied"].startswith("Corruptions are applied at the model's input")
    assert "Brackets: 95% bootstrap intervals" in text and " [" in text.split("## Out of distribution")[1]
    assert (out / "shift.png").stat().st_size > 10_000


def _digit_named_folder(root):
    """A folder whose only class is named as one of the digits' classes."""
    (root / "test" / "3").mkdir(parents=True)
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(root / "test" / "3" / "0.png")
    return root


@pytest.mark.parametrize("overrides, match", [
    (dict(eval_shift="fogg"), "unknown corruption 'fogg'; known corruptions: brightness"),
    (dict(eval_shift="fog", shift_severities=[0, 2]), r"severities must be among \[1, 2, 3, 4, 5\], got 0"),
    (dict(ood="digits"), "--ood digits is the dataset the model is evaluated on"),
    (dict(ood="FOLDER"), r"names the model's classes \['3'\]"),
])
def test_train_refusals_write_nothing(tmp_path, overrides, match):
    if overrides.get("ood") == "FOLDER":
        overrides["ood"] = str(_digit_named_folder(tmp_path / "named"))
    with pytest.raises(ValueError, match=match) as e:
        run(_config(tmp_path, "refused", **overrides))
    assert "\n" not in str(e.value) and not (tmp_path / "refused").exists()


def test_eval_only_refuses_a_shift_through_unknown_preprocessing(tmp_path):
    import timm

    weights = tmp_path / "plain.safetensors"  # a weight file without train.py's metadata: no normalisation known
    save_file(timm.create_model("small_cnn", num_classes=10, in_chans=1).state_dict(), str(weights))
    options = dict(eval_only=True, checkpoint=str(weights), dataset="digits", model="small_cnn", in_chans=1,
                   output=str(tmp_path), experiment="eval", eval_shift="fog", progress=False)
    with pytest.raises(ValueError, match="need the model's preprocessing and .* records no normalisation"):
        run(options)
    assert not (tmp_path / "eval").exists()


@pytest.fixture(scope="module")
def user_files(tmp_path_factory):
    return pattern_model_files(tmp_path_factory.mktemp("user"))


def _calibrate(user_files, output, **options):
    return calibrate_pattern_model(user_files, output, **options)


def test_calibrate_writes_the_shift_table_figure_and_ood_scores(user_files, tmp_path):
    out = tmp_path / "out"
    report = _calibrate(user_files, out, calibrators=["temperature_scaling", "vector_scaling"], shift="contrast",
                        shift_severities=[2], ood="digits", conformal=["lac"])
    assert json.loads((out / "report.json").read_text()) == json.loads(json.dumps(report))
    shift = report["shift"]
    assert shift["methods"] == ["uncalibrated", "temperature_scaling", "vector_scaling"]
    assert set(shift["table"]["contrast"]["2"]["vector_scaling"]) == KEYS
    assert shift["clean"]["vector_scaling"]["ece"] == pytest.approx(
        report["calibrators"]["vector_scaling"]["test"]["ece"], abs=1e-12)
    assert shift["clean"]["temperature_scaling"]["conformal"]["lac"]["coverage"] == \
        report["conformal"]["temperature_scaling"]["lac"]["coverage"]
    assert report["ood"]["n_out"] == 359 and report["ood"]["split"] == "test"  # the digits' test split
    assert set(report["ood"]["methods"]) == set(shift["methods"])
    text = (out / "report.md").read_text()
    assert "## Under corruption: 1 corruptions x severities [2]" in text and "| contrast (" in text
    assert shift["applied"] in text and shift["applied"].startswith("Corruptions are applied at the model's input")
    assert "| vector_scaling | energy |" in text
    assert (out / "shift.png").is_file()


def test_calibrate_refusals(user_files, tmp_path, capsys):
    data, weights = user_files
    with pytest.raises(ValueError, match="is the dataset the model is evaluated on"):
        _calibrate(user_files, tmp_path / "out", ood=str(data))
    assert not (tmp_path / "out").exists()
    rc = calibrate_main(["--model", "small_cnn", "--checkpoint", str(weights), "--num-classes", "3", "--in-chans",
                         "1", "--dataset", str(data), "--calibration-split", "val",
                         "--test-split", "test", "--output", str(tmp_path / "out"), "--shift",
                         "--shift-severities", "1", "9"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err[-1].startswith("timm-csm-calibrate: error: corruption severities must be among")
    assert not (tmp_path / "out").exists()
