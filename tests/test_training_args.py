"""train.py's configuration: split names (detected, named, --val-split), --val-fraction, ``-c`` with a run's own
args.yaml (round trip) or timm's args.yaml, and resuming a state stored before --val-fraction."""
import json

import numpy as np
import pytest
import yaml

from timm_csm.io import load_state, save_state
from timm_csm.training import run
from timm_csm.training import load_data, parse_args


def _digits_split_folder(folder, splits):
    """A Hugging Face dataset folder (data/<split>-00000-of-00001.parquet) of digits images, one per split."""
    import datasets
    from PIL import Image

    from timm_csm.data import load_digits

    digits = load_digits("train")
    features = datasets.Features({"image": datasets.Image(),
                                  "label": datasets.ClassLabel(names=[str(i) for i in range(10)])})
    (folder / "data").mkdir(parents=True)
    for split, (start, stop) in splits.items():
        images = [Image.fromarray(digits.images[i, 0]) for i in range(start, stop)]
        ds = datasets.Dataset.from_dict({"image": images, "label": digits.labels[start:stop].tolist()},
                                        features=features)
        ds.to_parquet(str(folder / "data" / f"{split}-00000-of-00001.parquet"))
    return str(folder)


@pytest.fixture(scope="module")
def train_val_folder(tmp_path_factory):
    return _digits_split_folder(tmp_path_factory.mktemp("ds") / "tv", {"train": (0, 300), "validation": (300, 380)})


@pytest.fixture(scope="module")
def three_split_folder(tmp_path_factory):
    return _digits_split_folder(tmp_path_factory.mktemp("ds") / "tvt",
                                {"train": (0, 200), "validation": (200, 260), "test": (260, 300)})


def _flags(tmp_path, name, *extra):
    return ["--model", "small_cnn", "--epochs", "1", "-b", "32", "--lr", "0.05", "--hflip", "0", "--crop-pad", "1",
            "--decay-milestones", "1", "--seed", "0", "--no-progress", "--output", str(tmp_path),
            "--experiment", name, *extra]


def test_train_validation_layout_trains_and_reports_on_validation(tmp_path, train_val_folder):
    res = run(parse_args(_flags(tmp_path, "tv", "--dataset", train_val_folder)))
    assert (res["n_test"], res["n_train"] + res["n_val"]) == (80, 300) and res["n_val"] == 30
    assert yaml.safe_load((tmp_path / "tv" / "args.yaml").read_text())["test_split"] == "validation"


def test_a_named_split_the_dataset_lacks_is_an_error_naming_its_splits(train_val_folder):
    for flag in ("--test-split", "--val-split", "--train-split"):
        with pytest.raises(ValueError, match=rf"{flag} 'test'.*its splits are \['train', 'validation'\]"):
            load_data(parse_args(["--dataset", train_val_folder, flag, "test"]))
    no_test = load_data(parse_args(["--dataset", train_val_folder, "--val-split", "validation"]))
    assert no_test.test is None and len(no_test.val) == 80  # reports validation only
    with pytest.raises(ValueError, match=r"no split to score.*\['train', 'validation'\].*--test-split"):
        load_data(parse_args(["--dataset", train_val_folder, "--val-split", "validation", "--eval-only"]))
    with pytest.raises(ValueError, match="--val-split 'train' is the training split"):
        load_data(parse_args(["--dataset", train_val_folder, "--val-split", "train"]))


def test_val_split_names_the_validation_set(three_split_folder):
    data = load_data(parse_args(["--dataset", three_split_folder, "--val-split", "validation"]))
    assert (len(data.train), len(data.val), len(data.test)) == (200, 60, 40)
    held_out = load_data(parse_args(["--dataset", three_split_folder]))
    assert (len(held_out.train), len(held_out.val), len(held_out.test)) == (180, 20, 40)
    from timm_csm.data import load_digits

    assert np.array_equal(data.val.images[np.arange(60)][:, 0].numpy(), load_digits("train").images[200:260, 0])


def test_val_fraction_holds_out_that_share_of_the_training_split():
    data = load_data(parse_args(["--dataset", "digits", "--val-fraction", "0.2", "--max-train-samples", "500"]))
    assert (len(data.train), len(data.val)) == (400, 100)
    again = load_data(parse_args(["--dataset", "digits", "--val-fraction", "0.2", "--max-train-samples", "500"]))
    assert np.array_equal(data.val.images, again.val.images)  # seeded
    with pytest.raises(ValueError, match=r"--val-fraction must lie in \[0, 1\)"):
        load_data(parse_args(["--dataset", "digits", "--val-fraction", "1.5"]))


def _recorded(folder):
    cfg = yaml.safe_load((folder / "args.yaml").read_text())
    assert cfg.pop("timm_csm_version") and cfg.pop("run_id")
    return cfg


def test_a_runs_args_yaml_reads_back_to_the_same_configuration(tmp_path):
    run(parse_args(_flags(tmp_path, "a", "--dataset", "digits", "--max-train-samples", "200",
                          "--max-test-samples", "50", "--loss-kwargs", "margin=3", "--loss", "mbls")))
    again = run(parse_args(["-c", str(tmp_path / "a" / "args.yaml")]))
    assert again["output_dir"] == str(tmp_path / "a-1")
    first, second = _recorded(tmp_path / "a"), _recorded(tmp_path / "a-1")
    assert second.pop("config") == str(tmp_path / "a" / "args.yaml") and first.pop("config") is None
    assert first == second and first["loss_kwargs"] == {"margin": 3} and first["test_split"] == "test"


def test_a_timm_args_yaml_maps_the_shared_options_and_warns_about_the_others(tmp_path):
    timm_args = dict(model="resnet18", lr=0.02, epochs=7, batch_size=64, weight_decay=1e-4, sched="cosine",
                     seed=42, num_classes=10, input_size=[3, 32, 32], pretrained=False, clip_grad=None,
                     dataset="torch/cifar10", data_dir="/data", val_split="validation", aa="rand-m9-mstd0.5",
                     reprob=0.25, model_ema=True, channels_last=True, opt="adamw", warmup_epochs=2, output="",
                     checkpoint_hist=10, resume="", jsd_loss=False, aug_splits=0)  # the last two: timm's only
    path = tmp_path / "args.yaml"
    path.write_text(yaml.safe_dump(timm_args))
    with pytest.warns(UserWarning, match="timm train.py args.yaml") as caught:
        args = parse_args(["-c", str(path), "--epochs", "3"])
    assert len(caught) == 1
    ignored = str(caught[0].message).split("ignored: ")[1].split(", ")
    assert sorted(ignored) == ["aug_splits", "checkpoint_hist", "jsd_loss", "resume"]
    assert (args.aa, args.reprob) == ("rand-m9-mstd0.5", 0.25)  # timm's train transform options are ours too
    assert (args.model, args.lr, args.epochs, args.batch_size, args.weight_decay, args.sched, args.seed) == (
        "resnet18", 0.02, 3, 64, 1e-4, "cosine", 42)
    assert (args.num_classes, args.in_chans, args.img_size, args.opt, args.warmup_epochs) == (10, 3, 32, "adamw", 2)
    assert (args.dataset, args.data_dir, args.test_split, args.clip_grad, args.output) == (
        "torch/cifar10", "/data", None, 0.0, "output/train")
    path.write_text(yaml.safe_dump(dict(timm_args, dataset="hfds/org/flowers", lrr=0.1)))
    with pytest.warns(UserWarning), pytest.raises(ValueError, match=r"unknown option\(s\).*'lrr' \(did you mean"):
        parse_args(["-c", str(path)])
    path.write_text(yaml.safe_dump(dict(timm_args, dataset="hfds/org/flowers")))
    with pytest.warns(UserWarning):
        args = parse_args(["-c", str(path)])
    assert (args.dataset, args.test_split) == ("org/flowers", "validation")


def test_a_typo_in_our_own_yaml_is_an_error(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model: small_cnn\nbatch_sise: 16\n")
    with pytest.raises(ValueError, match=r"'batch_sise' \(did you mean 'batch_size'\?\)"):
        parse_args(["-c", str(path)])
    path.write_text("timm_csm_version: 0.1.0\nmodel: small_cnn\njsd_loss: true\n")  # a run's file: no timm keys
    with pytest.raises(ValueError, match=r"unknown option\(s\).*'jsd_loss'"):
        parse_args(["-c", str(path)])


def test_resuming_a_state_that_stored_the_fraction_as_val_split(tmp_path):
    part = run(parse_args(_flags(tmp_path, "old", "--dataset", "digits", "--max-train-samples", "200",
                                 "--max-test-samples", "50", "--val-fraction", "0.25")))
    last = tmp_path / "old" / "last.safetensors"
    state = load_state(last)
    config = state["meta"]["config"]
    config.pop("val_fraction")
    config.update(val_split=0.25, test_split="test")
    save_state(last, state)
    res = run(parse_args(["--resume", str(last), "--epochs", "2", "--no-progress"]))
    assert (res["n_train"], res["n_val"], res["output_dir"]) == (150, 50, part["output_dir"])
    assert len(res["history"]) == 2
    stored = json.loads(json.dumps(load_state(last)["meta"]["config"]))
    assert (stored["val_fraction"], stored["val_split"]) == (0.25, None)
    with pytest.raises(ValueError, match="--val-split 'validation' .*the run has None"):
        run(parse_args(["--resume", str(last), "--epochs", "3", "--val-split", "validation"]))


def test_the_timm_options_taken_as_they_are_are_options_here():
    from timm_csm.training.args import build_parser
    from timm_csm.training.timm_args import TIMM_SHARED_KEYS, TIMM_TRAIN_KEYS

    dests = {a.dest for a in build_parser()._actions}
    assert TIMM_SHARED_KEYS <= dests & TIMM_TRAIN_KEYS and len(TIMM_TRAIN_KEYS) > 150


def test_a_flat_folder_trains_with_a_held_out_fraction_and_reports_validation_only(tmp_path, capsys):
    """timm's plain layout (``<class>/*.png``, no split folders) is the training split: the run says in one line
    that there is no test split and reports its validation images; --eval-only scores another such folder whole,
    with the temperature the training run fitted, and never the folder the checkpoint trained on."""
    from csm_fixtures import write_image_folder

    flat = str(write_image_folder(tmp_path / "images", splits=(None,), n_per_class=20))
    with pytest.raises(ValueError, match="no test split .* holds out no validation images"):
        load_data(parse_args(["--dataset", flat, "--val-fraction", "0"]))
    res = run(parse_args(_flags(tmp_path, "flat", "--dataset", flat, "--val-fraction", "0.2")))
    notes = [line for line in capsys.readouterr().out.splitlines() if "no test split" in line]
    assert len(notes) == 1 and "the results are on the 12 validation images" in notes[0]
    assert res["test"] is None and (res["n_train"], res["n_val"], res["n_test"]) == (48, 12, 0)
    assert set(res["val"]) == {"pre_ts", "post_ts"} and res["temperature"] is not None
    run_dir = tmp_path / "flat"
    assert "No test split: the numbers are on the 12 validation images" in (run_dir / "results.md").read_text()
    assert (run_dir / "val_predictions.safetensors").is_file() and not (run_dir / "test_predictions.safetensors").exists()
    assert yaml.safe_load((run_dir / "args.yaml").read_text())["test_split"] is None
    checkpoint = str(run_dir / "model_best.safetensors")
    for extra, match in (((), "no split to score.*was trained on it"),
                         (("--test-split", "train"), "is the split .* was trained on")):
        with pytest.raises(ValueError, match=match):
            run(parse_args(["--eval-only", "--checkpoint", checkpoint, "--no-progress", *extra]))
    held_out = str(write_image_folder(tmp_path / "held_out", splits=(None,), n_per_class=10, seed=1))
    scored = run(parse_args(["--eval-only", "--checkpoint", checkpoint, "--dataset", held_out,
                             "--no-progress", "--output", str(tmp_path), "--experiment", "eval"]))
    assert (scored["n_test"], scored["n_val"]) == (30, 0)  # every image scored, none held out for TS
    assert scored["val"] is None and scored["temperature"] == res["temperature"]  # the training run's temperature
    assert scored["test"]["post_ts"] is not None and scored["checkpoint_epoch"] == res["checkpoint_epoch"]
    report = (tmp_path / "eval" / "results.md").read_text()
    assert "0 validation" not in report and "epoch None" not in report
    assert f"temperature {res['temperature']:.2f} fitted by run {res['run_id']} on its 12 validation images" in report
    after = [line for line in report.splitlines() if line.startswith("| ECE (%)")][0]
    assert after.split("|")[3].strip() != "-"  # the after-TS column is filled


def test_test_fraction_holds_out_the_same_seeded_test_split_of_a_flat_folder(tmp_path, three_split_folder):
    """--test-fraction: a seeded share of a flat folder is the test split, the same images whatever else the run
    draws (validation share, training subset); a dataset with a test split of its own refuses it."""
    from csm_fixtures import write_image_folder

    flat = str(write_image_folder(tmp_path / "images", splits=(None,), n_per_class=20))
    config = parse_args(["--dataset", flat, "--test-fraction", "0.2", "--val-fraction", "0.25"])
    data = load_data(config)
    assert (len(data.test), len(data.train), len(data.val)) == (12, 36, 12)
    from timm_csm.training.results import _shown_split

    assert config.test_split is None and _shown_split(config, True) == "held-out test (0.2)"  # the diagrams' title
    other = load_data(parse_args(["--dataset", flat, "--test-fraction", "0.2", "--max-train-samples", "20"]))
    assert np.array_equal(other.test.images.rows, data.test.images.rows) and len(other.train) == 18
    seen = set(data.train.images.rows) | set(data.val.images.rows)
    assert not seen & set(data.test.images.rows) and len(seen) == 48
    with pytest.raises(ValueError, match="--test-fraction 0.2: dataset .* has the test split 'test'"):
        load_data(parse_args(["--dataset", three_split_folder, "--test-fraction", "0.2"]))
