"""timm-csm-calibrate on a model trained elsewhere: digits at 28 x 28 in class folders 1 ... 10 and a small_cnn
trained on other digits with MNIST's normalisation, saved as plain weights. The model's own preprocessing given as
timm's validate.py flags reproduces its logits exactly (no resize, no 28 -> 29 -> 28 crop, timm's class order);
without them the guess is one line and keeps the images' size; a model at chance is refused; the Python route
takes any callable transform; the exported calibrator is chosen on the calibration split; weights of another
architecture are one short line; arguments are refused before anything loads; folders get the umask's mode."""
import json
import os

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from calibrate_fixtures import FOLDER_NAMES, MEAN, STD, digits_28, normalise, save_weights, train_classifier, \
    write_digit_folder
from timm_csm.evaluation import calibrate, load_classifier
from timm_csm.commands.calibrate import main
from timm_csm.calibration import create_calibrator, load_calibrator, select_calibrator
from timm_csm.calibration.selection import fold_assignment


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    """(folder with val / test splits, the trained model, its weights file)."""
    root = tmp_path_factory.mktemp("digits")
    images, labels = digits_28("train")
    model = train_classifier("small_cnn", images[:400], labels[:400], num_classes=10)
    return write_digit_folder(root / "folder"), model, save_weights(model, root / "small_cnn.safetensors")


def command(digits, out, *flags):
    folder, _, weights = digits
    return main(["--model", "small_cnn", "--checkpoint", str(weights), "--num-classes", "10", "--dataset",
                 str(folder), "--calibration-split", "val", "--test-split", "test", "--output", str(out), *flags])


def own_logits(model, folder, split, mean=MEAN, std=STD):
    """The model's logits of a split read as timm reads the folder (natural class order), normalised with
    ``mean`` / ``std`` (its own: MNIST's) at the images' 28 x 28."""
    from PIL import Image
    from timm.data.readers.reader_image_folder import ReaderImageFolder

    samples = ReaderImageFolder(str(folder / split)).samples
    images = torch.from_numpy(np.stack([np.asarray(Image.open(p)) for p, _ in samples])[:, None])
    with torch.no_grad():
        return model(normalise(images, mean, std)), torch.tensor([t for _, t in samples])


def test_the_models_own_preprocessing_reproduces_its_logits(digits, tmp_path, capsys):
    folder, model, _ = digits
    out = tmp_path / "out"
    rc = command(digits, out, "--input-size", "1", "28", "28", "--mean", str(MEAN[0]), "--std", str(STD[0]),
                 "--crop-pct", "1.0", "--interpolation", "bilinear", "--conformal", "")
    assert rc == 0
    assert "guessed" not in capsys.readouterr().err
    saved = load_file(str(out / "test_predictions.safetensors"))
    expected, labels = own_logits(model, folder, "test")
    assert torch.equal(saved["targets"], labels)
    assert torch.allclose(saved["logits"], expected, atol=1e-4)
    report = json.loads((out / "report.json").read_text())
    assert report["class_names"] == FOLDER_NAMES  # 1, 2, ..., 10: timm's order, not 1, 10, 2
    assert report["uncalibrated"]["test"]["accuracy"] > 0.85
    assert report["preprocessing"]["guessed"] == [] and report["preprocessing"]["img_size"] == 28


def test_without_a_data_config_the_guess_keeps_the_images_and_says_so_in_one_line(digits, tmp_path, capsys):
    folder, model, _ = digits
    out = tmp_path / "out"
    assert command(digits, out, "--conformal", "") == 0  # small_cnn's config: 1 channel
    guesses = [line for line in capsys.readouterr().err.splitlines() if "guess" in line]
    assert len(guesses) == 1 and "input 1x28x28" in guesses[0] and "mean and std" in guesses[0]
    assert "crop_pct 1 (images at the input size untouched)" in guesses[0]
    report = json.loads((out / "report.json").read_text())
    pre = report["preprocessing"]
    assert (pre["img_size"], pre["crop_pct"], pre["mean"], pre["std"]) == (28, 1.0, [0.286], [0.353])
    assert "guessed: " in (out / "report.md").read_text()
    # nothing but the guessed normalisation: the images at their own size, neither resized nor cropped
    saved = load_file(str(out / "test_predictions.safetensors"))
    assert torch.allclose(saved["logits"], own_logits(model, folder, "test", (0.286,), (0.353,))[0], atol=1e-4)


def test_an_architecture_of_224_pixels_keeps_the_folders_28(tmp_path):
    """resnet weights trained on 28 x 28 images and saved without a data config: 28 is used, not 224, and only
    timm's own pretrained weights (--pretrained-path) take the pretrained_cfg as it is."""
    import timm

    weights = save_weights(timm.create_model("resnet10t", num_classes=10, in_chans=1), tmp_path / "r.safetensors")
    lines = []
    own = load_classifier("resnet10t", checkpoint=weights, num_classes=10, in_chans=1, native_size=28,
                          log=lines.append)
    assert (own.preprocessing.img_size, own.preprocessing.crop_pct) == (28, 1.0)
    assert [line for line in lines if "guess" in line] == [lines[-1]] and "input 1x28x28" in lines[-1]
    lines.clear()
    timms = load_classifier("resnet10t", pretrained_path=weights, num_classes=10, in_chans=1, native_size=28,
                            log=lines.append)
    pre = timms.preprocessing
    assert (pre.img_size, pre.crop_pct, pre.interpolation, pre.guessed) == (224, 0.95, "bicubic", [])
    assert not any("guess" in line for line in lines)
    assert own.meta["crop_pct"] == 1.0 and own.meta["img_size"] == 28  # what the exported model is rebuilt with


def test_a_model_at_chance_is_refused_in_one_line_with_nothing_written(digits, tmp_path, capsys):
    import timm

    blind = timm.create_model("small_cnn", num_classes=10, in_chans=1)
    with torch.no_grad():
        blind.get_classifier().weight.zero_()
        blind.get_classifier().bias.zero_()  # every image gets class 0: accuracy = the share of class 0
    folder, _, _ = digits
    weights = save_weights(blind, tmp_path / "blind.safetensors")
    rc = main(["--model", "small_cnn", "--checkpoint", str(weights), "--num-classes", "10", "--dataset", str(folder),
               "--calibration-split", "val", "--test-split", "test", "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err[-1].startswith("timm-csm-calibrate: error: accuracy ") and "at chance" in err[-1]
    assert "guessed" in err[-1] and len(err[-1]) < 500
    assert not (tmp_path / "out").exists() and not any(p.name.startswith(".out") for p in tmp_path.iterdir())


def test_the_python_route_takes_any_callable_transform(digits, tmp_path):
    from timm.data import create_transform

    from timm_csm.data import BatchTransform

    folder, model, _ = digits
    expected, labels = own_logits(model, folder, "test")

    def plain(image):  # a PIL image, converted to in_chans channels
        return normalise(torch.from_numpy(np.array(image))[None, None])[0]

    transforms = {"function": plain, "batch": BatchTransform(28, MEAN, STD, in_chans=1),
                  "timm": create_transform((1, 28, 28), mean=MEAN, std=STD, crop_pct=1.0),
                  "none": None}  # the timm model object's own config, with the normalisation given
    for name, transform in transforms.items():
        out = tmp_path / name
        given = {"data_config": {"mean": MEAN, "std": STD}} if transform is None else {"transform": transform}
        calibrate(model, folder, output=out, in_chans=1, calibration_split="val", test_split="test", conformal=[],
                  log=lambda m: None, **given)
        saved = load_file(str(out / "test_predictions.safetensors"))
        assert torch.equal(saved["targets"], labels)
        assert torch.allclose(saved["logits"], expected, atol=1e-4), name
    with pytest.raises(ValueError, match="random"):
        calibrate(model, folder, output=tmp_path / "x", calibration_split="val", test_split="test",
                  transform=BatchTransform(28, MEAN, STD, 1, hflip=0.5), log=lambda m: None)


def test_the_exported_calibrator_is_chosen_on_the_calibration_split(digits, tmp_path):
    folder, model, weights = digits
    names = ["histogram_binning", "temperature_scaling", "vector_scaling"]
    out = tmp_path / "out"
    report = calibrate("small_cnn", folder, output=out, checkpoint=weights, num_classes=10,
                       data_config={"input_size": (1, 28, 28), "mean": MEAN, "std": STD}, calibrators=names,
                       calibration_split="val", test_split="test", conformal=[], folds=3, log=lambda m: None)
    record, selection = report["calibrated_model"], report["selection"]
    cal_logits, cal_labels = own_logits(model, folder, "val")
    best, table = select_calibrator(cal_logits, cal_labels, names, folds=3, seed=0)
    for name in names:
        assert selection["scores"][name] == pytest.approx(table["scores"][name], abs=1e-4)
    assert selection["folds"] == 3 and selection["by"] == "nll" and selection["left_out"] == {}
    assert record["kind"] == selection["chosen"] == best != names[0]
    assert "cross-validated NLL on the calibration split" in record["chosen_by"]
    exported = load_calibrator(out / "calibrator.safetensors")
    assert torch.equal(exported.transform(cal_logits), load_calibrator(out / "calibrators" / f"{best}.safetensors")
                       .transform(cal_logits))
    text = (out / "report.md").read_text()
    assert f"({best}: the lowest 3-fold" in text and f"| {best} (chosen) |" in text
    forced = calibrate("small_cnn", folder, output=tmp_path / "forced", checkpoint=weights, num_classes=10,
                       data_config={"mean": MEAN, "std": STD}, calibrators=names, export="histogram_binning",
                       calibration_split="val", test_split="test", conformal=[], log=lambda m: None)
    assert forced["calibrated_model"]["kind"] == "histogram_binning" and "selection" not in forced


def test_cross_validation_fits_on_folds_the_held_out_part_never_sees():
    g = torch.Generator().manual_seed(0)
    logits = 4 * torch.randn(300, 5, generator=g, dtype=torch.float64)
    labels = torch.multinomial(torch.softmax(logits / 4, 1), 1, generator=g).squeeze(1)  # over-confident by 4
    _, table = select_calibrator(logits, labels, ["temperature_scaling_nll"], folds=3, seed=1)
    folds = fold_assignment(labels, 3, seed=1)
    nll = []
    for k in range(3):
        fit, test = folds != k, folds == k
        held_out = create_calibrator("temperature_scaling_nll").fit(logits[fit], labels[fit]).transform(logits[test])
        nll.append(torch.nn.functional.cross_entropy(held_out.double(), labels[test]).item())
    assert table["scores"]["temperature_scaling_nll"] == pytest.approx(nll, abs=1e-9)
    assert table["mean"]["temperature_scaling_nll"] == pytest.approx(sum(nll) / 3, abs=1e-9)
    assert sum(nll) / 3 < torch.nn.functional.cross_entropy(logits, labels).item()


def test_weights_of_another_architecture_are_one_short_line(digits, tmp_path):
    folder, _, weights = digits
    for model, match in (("resnet10t", r"\d+ keys missing \(.*\); \d+ unexpected"),
                         ("small_cnn", r"of another shape .*built with --num-classes 10")):
        with pytest.raises(ValueError, match=match) as info:
            calibrate(model, folder, output=tmp_path / "out", checkpoint=weights,
                      num_classes=10 if model == "resnet10t" else 3, in_chans=1, calibration_split="val",
                      test_split="test", log=lambda m: None)
        assert "\n" not in str(info.value) and len(str(info.value)) < 400
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("options,match", [
    ({"calibration_fraction": 1.5, "calibration_split": None}, "--calibration-fraction must lie in"),
    ({"alpha": 0}, "--alpha must lie in"), ({"export": "dirichlet"}, "--export 'dirichlet' is not one of"),
    ({"data_config": {"input_size": (1, 28, 32)}}, "square"), ({"data_config": {"mean": (0.5,)}}, "together"),
    ({"data_config": {"crop_pct": 1.5}}, "crop-pct"), ({"batch_size": 0}, "--batch-size must be at least 1"),
    ({"calibrators": ["auto", "isotonic"]}, "give it alone"), ({"folds": 1}, "--folds must be at least 2"),
    ({"folds": 2.5}, "--folds must be at least 2, a whole number"), ({"select_by": "brier"}, "--select-by must be"),
    ({"bootstrap": -1}, "--bootstrap must be at least 0"), ({"calibrators": ["auto"], "export": "nope"}, "unknown"),
])
def test_arguments_are_refused_before_anything_loads(tmp_path, options, match):
    """The data folder and the weights do not exist: the argument is refused before either is looked at."""
    weights = save_weights(torch.nn.Linear(1, 1), tmp_path / "w.safetensors")
    kwargs = dict(output=tmp_path / "out", checkpoint=weights, num_classes=10, calibration_split="val",
                  test_split="test", log=lambda m: None)
    kwargs.update(options)
    with pytest.raises(ValueError, match=match) as info:
        calibrate("small_cnn", tmp_path / "no-such-folder", **kwargs)
    assert "\n" not in str(info.value)


def test_output_folders_take_the_umask(digits, tmp_path):
    old = os.umask(0o022)
    try:
        assert command(digits, tmp_path / "a" / "out", "--in-chans", "1", "--conformal", "lac") == 0
    finally:
        os.umask(old)
    for folder in (tmp_path / "a", tmp_path / "a" / "out", tmp_path / "a" / "out" / "calibrators"):
        assert folder.stat().st_mode & 0o777 == 0o755, folder
    assert (tmp_path / "a" / "out" / "report.md").stat().st_mode & 0o777 == 0o644
