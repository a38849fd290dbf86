"""End-to-end training: CE and CSM, the mixing baselines, resume, eval-only, errors, and 2 processes over gloo."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from csm_testdata import make_csm_dataset, save_csm_folder, save_digits_csm_folder, write_parquet_folder
from gloo_launch import launch_two_processes
from timm_csm.io import load_state
from timm_csm.metrics import METRIC_KEYS
from timm_csm.metrics.interval_methods import INTERVAL_NOTE
from timm_csm.training import run
from timm_csm.trainer import STATE_KEYS
from timm_csm.training import build_parser, parse_args

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def csm_folder(tmp_path_factory):
    return save_digits_csm_folder(tmp_path_factory.mktemp("csm") / "csm-digits-aug")


def _config(tmp_path, name, **overrides):
    cfg = dict(dataset="digits", model="small_cnn", epochs=1, batch_size=32, lr=0.05, hflip=0.0, crop_pad=1,
               max_train_samples=320, max_test_samples=200, val_fraction=0.25, seed=0, progress=False,
               output=str(tmp_path), experiment=name, decay_milestones=[1])
    cfg.update(overrides)
    return cfg


def _recompute_test_metrics(out_dir, n_bins=15):
    """Rebuild the best model from model_best.safetensors and score the test split independently of the loop."""
    import timm

    from timm_csm.data import BatchTransform, load_digits
    from timm_csm.metrics import calibration_metrics

    from safetensors import safe_open
    from timm.models import load_checkpoint

    path = out_dir / "model_best.safetensors"
    with safe_open(str(path), framework="pt") as f:
        meta = json.loads(f.metadata()["timm_csm_meta"])
    model = timm.create_model(meta["model"], num_classes=meta["num_classes"], in_chans=meta["in_chans"],
                              **dict(meta["model_kwargs"])).eval()
    load_checkpoint(model, str(path), strict=True)  # a plain state dict: timm loads it as any weight file
    test = load_digits("test")
    g = torch.Generator()
    from timm_csm.data import derive_seed

    g.manual_seed(derive_seed(meta["seed"], 2))
    idx = torch.randperm(len(test), generator=g)[:meta["max_test_samples"]].sort().values.numpy()
    x = BatchTransform(meta["img_size"], meta["mean"], meta["std"], meta["in_chans"]).apply(
        torch.from_numpy(test.images[idx]))
    with torch.no_grad():
        logits = model(x)
    labels = torch.from_numpy(test.labels[idx])
    return calibration_metrics(logits, labels, n_bins=n_bins), logits, labels


def test_help_is_grouped_and_has_the_flags():
    text = build_parser().format_help()
    for group in ("Dataset:", "Model:", "Optimizer and schedule:", "Augmentation and mixing:", "Calibration:",
                  "Checkpoints and output:"):
        assert group in text
    for flag in ("--model", "--pretrained", "--initial-checkpoint", "--resume", "--num-classes", "--img-size",
                 "--in-chans", "--batch-size", "--epochs", "--opt", "--lr", "--momentum", "--weight-decay", "--sched",
                 "--decay-milestones", "--decay-rate", "--warmup-epochs", "--clip-grad", "--smoothing", "--mixup",
                 "--seed", "--output", "--experiment", "--checkpoint-hist", "--workers", "--amp", "--loss",
                 "--loss-kwargs", "--csm-dataset", "--n-aug", "--csm-weight", "--val-fraction", "--val-split",
                 "--ts-method", "--n-bins", "--select-by", "--eval-only", "--checkpoint", "--piece", "--dataset"):
        assert flag in text, flag


def test_yaml_config_then_flags(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("model: small_cnn\nbatch-size: 16\nloss_kwargs: {margin: 6}\nepochs: 3\n")
    args = parse_args(["-c", str(cfg), "--epochs", "5"])
    assert (args.model, args.batch_size, args.epochs) == ("small_cnn", 16, 5)
    assert dict(args.loss_kwargs) == {"margin": 6}
    assert {"model", "batch_size", "epochs"} <= args.explicit
    cfg.write_text("bach_size: 16\n")
    with pytest.raises(ValueError, match="did you mean 'batch_size'"):
        parse_args(["-c", str(cfg)])
    assert dict(parse_args(["--loss-kwargs", "margin=10", "kind=l2"]).loss_kwargs) == {"margin": 10, "kind": "l2"}


def test_ce_end_to_end_outputs_match_an_independent_evaluation(tmp_path):
    res = run(_config(tmp_path, "ce", epochs=2))
    out = tmp_path / "ce"
    for f in ("results.json", "results.md", "log.csv", "log.json", "last.safetensors", "model_best.safetensors",
              "temperature.safetensors", "reliability_before.png", "reliability_after.png", "args.yaml"):
        assert (out / f).exists(), f
    assert json.loads((out / "results.json").read_text())["test"] == res["test"]
    assert len(res["history"]) == 2 and res["n_test"] == 200 and res["n_val"] == 80 and res["n_train"] == 240
    # the report's numbers are those of the selected checkpoint, recomputed outside the training loop
    ref, logits, labels = _recompute_test_metrics(out)
    for key in ("accuracy", "ece", "aece", "nll", "brier"):
        assert res["test"]["pre_ts"][key] == pytest.approx(ref[key], abs=1e-5), key
    best_epoch = max(range(2), key=lambda e: (res["history"][e]["val_accuracy"], -e))
    assert res["checkpoint_epoch"] == best_epoch
    # temperature scaling: accuracy unchanged, T by NLL (a training run's default), NLL-consistent transform, with
    # its bootstrap interval; 80 validation images: the report says how far the after-TS numbers move with T
    post = res["test"]["post_ts"]
    assert post["accuracy"] == res["test"]["pre_ts"]["accuracy"]
    t, interval, spread = res["temperature"], res["temperature_interval"], res["post_ts_spread"]
    assert res["ts_method"] == "nll" and interval["low"] <= t <= interval["high"] and interval["resamples"] == 200
    assert spread["n_val"] == 80 and spread["ece"]["low"] <= spread["ece"]["high"]
    text = (out / "results.md").read_text()
    assert f"temperature {t:.2f} [{interval['low']:.2f}, {interval['high']:.2f}] fitted on 80 validation" in text
    assert f"Only 80 validation images: refitted on 200 resamples of them, the temperature moves within " \
        f"[{interval['low']:.2f}, {interval['high']:.2f}], and with it the test ECE after TS within " \
        f"[{spread['ece']['low'] * 100:.2f}, {spread['ece']['high'] * 100:.2f}] %" in text
    from timm_csm.metrics import calibration_metrics

    assert post["nll"] == pytest.approx(calibration_metrics(logits / t, labels)["nll"], abs=1e-5)
    assert "| digits | small_cnn | ce |" in (out / "results.md").read_text()
    # every number has its bootstrap interval: those of the test split are the bootstrap of the saved predictions
    from safetensors.torch import load_file

    from timm_csm.metrics import bootstrap_metrics

    saved = load_file(str(out / "test_predictions.safetensors"))
    assert res["intervals"]["test"]["pre_ts"] == bootstrap_metrics(saved["logits"], saved["targets"], resamples=1000)
    assert res["bootstrap"] == {"resamples": 1000, "seed": 0, "level": 0.95, "interval": INTERVAL_NOTE,
                                "resampled": "the samples of each split"}
    for split in ("test", "val"):
        for phase in ("pre_ts", "post_ts"):
            assert set(res["intervals"][split][phase]) == set(res[split][phase]), (split, phase)
    low, high = (res["intervals"]["test"]["pre_ts"]["ece"][k] * 100 for k in ("low", "high"))
    assert f"| ECE (%) | {res['test']['pre_ts']['ece'] * 100:.2f} [{low:.2f}, {high:.2f}] |" in \
        (out / "results.md").read_text()
    from timm_csm.training.reporting import comparison_markdown

    acc = res["intervals"]["test"]["pre_ts"]["accuracy"]
    assert f"| CE | before | {res['test']['pre_ts']['accuracy'] * 100:.2f} [{acc['low'] * 100:.2f}, " \
        f"{acc['high'] * 100:.2f}] |" in comparison_markdown({"ce": res})
    lr_log = [row["lr"] for row in res["history"]]
    assert lr_log == pytest.approx([0.05, 0.005])  # milestone at epoch 1, decay 0.1


def test_a_run_shorter_than_the_default_milestones_still_decays_and_records_them(tmp_path, capsys):
    config = _config(tmp_path, "short", epochs=3, max_train_samples=64, max_test_samples=32, bootstrap=0)
    del config["decay_milestones"]  # the defaults, 80 and 120 of 200 epochs: 2 and 2 of 3
    res = run(config)
    assert [row["lr"] for row in res["history"]] == pytest.approx([0.05, 0.0005, 0.0005])  # timm: from epoch m - 1
    assert "scaled to 2 2, the same share of the run" in capsys.readouterr().out
    assert "decay_milestones:\n- 2\n- 2\n" in (Path(res["output_dir"]) / "args.yaml").read_text()
    with pytest.raises(ValueError, match=r"^--decay-milestones 1 4 lies beyond --epochs 3"):
        run(_config(tmp_path, "refused", epochs=3, decay_milestones=[1, 4]))
    assert not (tmp_path / "refused").exists()


def test_csm_end_to_end(tmp_path, csm_folder):
    res = run(_config(tmp_path / "csm", ".", loss="csm", csm_dataset=csm_folder, n_aug=2))
    assert (tmp_path / "csm" / "results.json").exists() and res["output_dir"] == str(tmp_path / "csm")
    row = res["history"][0]
    assert row["train_loss"] == pytest.approx(row["train_ce"] + row["train_gen"], rel=1e-4)
    assert 0 < row["train_gen"] < 2  # a Brier-type term
    assert res["test"]["pre_ts"]["accuracy"] > 0.3


def test_resume_equals_uninterrupted(tmp_path, csm_folder):
    extra = dict(loss="csm", csm_dataset=csm_folder, crop_pad=2, hflip=0.5, max_train_samples=200)
    full = run(_config(tmp_path, "full", epochs=2, **extra))
    run(_config(tmp_path, "part", epochs=1, **extra))
    resumed = run(_config(tmp_path, None, epochs=2, resume=str(tmp_path / "part" / "last.safetensors"), **extra))
    a, b = load_state(tmp_path / "full" / "last.safetensors"), load_state(tmp_path / "part" / "last.safetensors")
    assert b["epoch"] == 1  # the one schema (its last finished epoch) and the classifier's own entries
    assert set(b) - set(STATE_KEYS) == {"loss", "best", "meta"} and set(STATE_KEYS) - set(b) == {"ema", "step"}
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    for key in a["optimizer"]["state"]:
        assert torch.equal(a["optimizer"]["state"][key]["momentum_buffer"],
                           b["optimizer"]["state"][key]["momentum_buffer"])
    assert resumed["test"] == full["test"] and resumed["temperature"] == full["temperature"]
    assert [r["train_loss"] for r in resumed["history"]] == [r["train_loss"] for r in full["history"]]
    # CSM options are part of the resumed configuration: other values are refused, flag by flag
    other = save_digits_csm_folder(tmp_path / "csm-other-aug")
    conflict = r"--csm-dataset '.*csm-other-aug' \(the run has .*; --n-aug 2 \(the run has 1\)"
    with pytest.raises(ValueError, match=conflict):
        run(_config(tmp_path, None, epochs=2, resume=str(tmp_path / "part" / "last.safetensors"),
                    **dict(extra, csm_dataset=other, n_aug=2)))


def test_eval_only_reproduces_and_reports_piece(tmp_path):
    trained = run(_config(tmp_path, "base"))
    best = tmp_path / "base" / "model_best.safetensors"
    res = run(dict(eval_only=True, checkpoint=str(best), output=str(tmp_path), experiment="eval", piece=True,
                   progress=False))
    assert res["model"] == "small_cnn" and res["dataset"] == "digits"  # from the checkpoint's metadata
    for key in ("accuracy", "ece", "nll"):
        assert res["test"]["pre_ts"][key] == pytest.approx(trained["test"]["pre_ts"][key], abs=1e-6)
    assert res["temperature"] == trained["temperature"]
    for stage in ("pre_ts", "post_ts"):
        assert res["test"][stage]["piece"] >= res["test"][stage]["ece"] - 1e-9  # PIECE >= ECE
    assert (tmp_path / "eval" / "results.md").read_text().count("PIECE") == 1
    for stage in ("pre_ts", "post_ts"):
        piece_interval = res["intervals"]["test"][stage]["piece"]
        assert piece_interval["low"] <= piece_interval["high"]
    # the full training state works too (one epoch: the last checkpoint is the best)
    from_last = run(dict(eval_only=True, checkpoint=str(tmp_path / "base" / "last.safetensors"), progress=False,
                         output=str(tmp_path), experiment="eval_last"))
    assert from_last["test"]["pre_ts"] == pytest.approx(trained["test"]["pre_ts"])


@pytest.mark.parametrize("options", [
    dict(mixup=0.4), dict(regmixup=10.0), dict(loss="mrl"), dict(loss="mndcg"), dict(loss="adafocal"),
    dict(loss="aslp", loss_kwargs=[("warmup_epochs", 0)]), dict(smoothing=0.1), dict(loss="mbls"),
    dict(val_fraction=0.0),
])
def test_baseline_modes_train(tmp_path, options):
    res = run(_config(tmp_path, "m", max_train_samples=160, max_test_samples=64, **options))
    assert np.isfinite(res["history"][0]["train_loss"])
    assert 0.0 <= res["test"]["pre_ts"]["ece"] <= 1.0
    if options.get("val_fraction") == 0.0:  # no validation split: last epoch kept, no temperature
        assert res["temperature"] is None and res["test"]["post_ts"] is None and res["checkpoint_epoch"] == 0
        assert "| - | - |" in (tmp_path / "m" / "results.md").read_text()


def test_swin_tiny_trains_on_32px_fashion_mnist(tmp_path):
    res = run(dict(dataset="fashion_mnist", model="swin_tiny", epochs=1, batch_size=8, lr=0.01, max_train_samples=24,
                   max_test_samples=8, val_fraction=0.5, progress=False, output=str(tmp_path), experiment="swin"))
    args = yaml.safe_load((tmp_path / "swin" / "args.yaml").read_text())
    assert args["model"] == "swin_tiny"
    from timm_csm.io import read_model_meta

    meta = read_model_meta(tmp_path / "swin" / "model_best.safetensors")
    assert (meta["img_size"], meta["in_chans"]) == (32, 1)
    assert res["n_test"] == 8 and np.isfinite(res["history"][0]["train_loss"])


@pytest.mark.parametrize("overrides,match", [
    (dict(model="resnet18_cifra"), "unknown model 'resnet18_cifra'.*small_cnn"),
    (dict(loss="focall"), "unknown loss 'focall'; known losses: .*focal"),
    (dict(dataset="no_such_dataset"), "unknown dataset 'no_such_dataset'; available: fashion_mnist, digits"),
    (dict(loss="csm"), "needs --csm-dataset"),
    (dict(loss="csm", n_aug=7), "n_aug=7 is larger than the 6 interior members"),
    (dict(mixup=0.2, regmixup=10.0), "--regmixup mixes its own copy"),
])
def test_errors_before_training(tmp_path, csm_folder, overrides, match):
    if overrides.get("loss") == "csm" and "n_aug" in overrides:
        overrides["csm_dataset"] = csm_folder
    with pytest.raises(ValueError, match=match):
        run(_config(tmp_path, "err", **overrides))
    assert not (tmp_path / "err" / "last.safetensors").exists()


def test_dataset_errors_label_column_and_class_names(tmp_path, csm_folder):
    import datasets
    from PIL import Image

    folder = tmp_path / "nolabel"
    ds = datasets.Dataset.from_dict({"image": [Image.new("L", (8, 8)) for _ in range(4)], "caption": ["x"] * 4},
                                    features=datasets.Features({"image": datasets.Image(),
                                                                "caption": datasets.Value("string")}))
    write_parquet_folder(ds, folder)
    with pytest.raises(ValueError, match="no label column found.*columns are \\['image', 'caption'\\]"):
        run(_config(tmp_path, "err", dataset=str(folder)))
    wrong = make_csm_dataset([f"c{i}" for i in range(10)], n_lambdas=4)
    with pytest.raises(ValueError, match="class names of the CSM dataset differ.*'c0' != '0'"):
        run(_config(tmp_path, "err", loss="csm", csm_dataset=save_csm_folder(wrong, tmp_path / "csm-wrong-aug")))
    assert not (tmp_path / "err" / "last.safetensors").exists()


def _reported_metrics(results):
    """Every number a run reports: the temperature, the split sizes, the checkpoint's epoch, and each metric of
    each split (test, validation) before and after temperature scaling."""
    out = {k: results[k] for k in ("temperature", "n_train", "n_val", "n_test", "checkpoint_epoch")}
    for split in ("test", "val"):
        for phase in ("pre_ts", "post_ts"):
            out.update({f"{split}/{phase}/{k}": v for k, v in results[split][phase].items()})
    return out


def test_two_processes_match_one(tmp_path, csm_folder):
    """2 gloo processes with batch 16 each = 1 process with batch 32: same samples, crops and companions per
    step; GroupNorm keeps the statistics per sample, so the runs agree up to float reduction order, on every metric
    of every split. The same checkpoint evaluated on 2 processes reports exactly the 1-process numbers: every
    validation and test image is scored once (48 and 200 images in global batches of 32: the last batch of each is
    evened out with copies, which gathering drops)."""
    common = dict(loss="csm", csm_dataset=csm_folder, crop_pad=1, hflip=0.5, epochs=2, max_train_samples=192,
                  model_kwargs=[("norm_layer", "groupnorm")])
    one = run(_config(tmp_path, "p1", batch_size=32, **common))
    launch_two_processes(
        ROOT / "train.py", "--dataset", "digits", "--model", "small_cnn", "--model-kwargs", "norm_layer=groupnorm",
        "--epochs", "2", "-b", "16", "--lr", "0.05", "--hflip", "0.5", "--crop-pad", "1", "--max-train-samples", "192",
        "--max-test-samples", "200", "--val-fraction", "0.25", "--seed", "0", "--no-progress", "--decay-milestones",
        "1", "--loss", "csm", "--csm-dataset", csm_folder, "--output", tmp_path, "--experiment", "p2")
    two = json.loads((tmp_path / "p2" / "results.json").read_text())
    assert two["num_processes"] == 2 and one["num_processes"] == 1
    assert (one["n_test"], one["n_val"]) == (200, 48)
    reported = _reported_metrics(one)
    assert len(reported) == 5 + 4 * len(METRIC_KEYS) and reported.keys() == _reported_metrics(two).keys()
    for key, value in _reported_metrics(two).items():
        assert value == pytest.approx(reported[key], abs=1e-4), key
    for e in range(2):
        logged = two_history(tmp_path)[e]
        shown = {k: v for k, v in one["history"][e].items() if k.startswith(("train_", "val_"))}
        assert len(shown) > 10
        for key, value in shown.items():
            assert logged[key] == pytest.approx(value, rel=1e-4, abs=1e-4), (e, key)

    launch_two_processes(ROOT / "train.py", "--eval-only", "--checkpoint", tmp_path / "p1" / "model_best.safetensors",
                         "-b", "16", "--no-progress", "--output", tmp_path, "--experiment", "e2")
    evaluated = json.loads((tmp_path / "e2" / "results.json").read_text())
    assert evaluated["num_processes"] == 2 and _reported_metrics(evaluated) == reported


def two_history(tmp_path):
    return json.loads((tmp_path / "p2" / "log.json").read_text())


# ---------------------------------------------------------------------------------------------------------------
# run folders: ownership, lock, run id, resumed configuration, damaged files, process-group shutdown
# ---------------------------------------------------------------------------------------------------------------
def _run_ids(folder):
    """The run id of every file of a run folder that records one."""
    import yaml

    from timm_csm.io import read_model_meta
    from safetensors import safe_open

    with safe_open(str(folder / "test_predictions.safetensors"), framework="pt") as f:
        predictions = json.loads(f.metadata()["timm_csm_meta"])["run_id"]
    return {"args.yaml": yaml.safe_load((folder / "args.yaml").read_text())["run_id"],
            "results.json": json.loads((folder / "results.json").read_text())["run_id"],
            "last": load_state(folder / "last.safetensors")["meta"]["run_id"],
            "model_best": read_model_meta(folder / "model_best.safetensors")["run_id"],
            "test_predictions": predictions}


def _snapshot(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file() and p.name != ".run.lock"}


def test_a_new_run_never_writes_into_or_evaluates_another_runs_folder(tmp_path):
    first = run(_config(tmp_path, "x", epochs=2))
    x = tmp_path / "x"
    ids = _run_ids(x)
    assert set(ids.values()) == {first["run_id"]} and len(first["run_id"]) == 12
    before = _snapshot(x)
    # the same experiment again: a fresh numbered folder, evaluated on its own model
    second = run(_config(tmp_path, "x", epochs=1, lr=0.2, seed=1))
    assert second["output_dir"] == str(tmp_path / "x-1") and second["checkpoint"] == str(tmp_path / "x-1" /
                                                                                            "model_best.safetensors")
    assert set(_run_ids(tmp_path / "x-1").values()) == {second["run_id"]} != {first["run_id"]}
    ref, _, _ = _recompute_test_metrics(tmp_path / "x-1")
    assert second["test"]["pre_ts"]["accuracy"] == pytest.approx(ref["accuracy"])
    # --epochs 0 evaluates its own untrained model, not a checkpoint found in a folder
    zero = run(_config(tmp_path, "x", epochs=0))
    assert zero["output_dir"] == str(tmp_path / "x-2") and zero["checkpoint"] is None
    assert zero["checkpoint_epoch"] is None and not (tmp_path / "x-2" / "model_best.safetensors").exists()
    assert _snapshot(x) == before  # args.yaml, last, logs and results of the first run untouched
    # a fixed folder holding a run is refused, naming the way out
    with pytest.raises(ValueError, match=r"x holds another run's files \(args.yaml, last.safetensors.*--resume"):
        run(_config(x, ".", epochs=0))
    assert _snapshot(x) == before
    # a model_best of another run in a run's folder is never evaluated
    (tmp_path / "x-1" / "model_best.safetensors").write_bytes(before["model_best.safetensors"])
    with pytest.raises(ValueError, match=f"not this run's best checkpoint: it holds run {first['run_id']}"):
        run(dict(resume=str(tmp_path / "x-1" / "last.safetensors"), progress=False))


def test_a_folder_in_use_is_refused_and_a_new_run_takes_the_next(tmp_path):
    from timm_csm.training import claim_run_dir

    held = claim_run_dir(tmp_path / "busy", "feedc0ffee00")
    try:
        with pytest.raises(ValueError, match=r"busy is in use by run feedc0ffee00 \(pid \d+"):
            run(_config(tmp_path / "busy", ".", epochs=0))
        assert run(_config(tmp_path, "busy", epochs=0))["output_dir"] == str(tmp_path / "busy-1")
    finally:
        held.release()
    assert run(_config(tmp_path / "busy", ".", epochs=0))["output_dir"] == str(tmp_path / "busy")  # released


def test_auto_resume_continues_the_folders_run_or_replaces_one_that_never_finished_an_epoch(tmp_path):
    one = run(_config(tmp_path / "a", ".", epochs=1))
    two = run(_config(tmp_path / "a", ".", epochs=2, auto_resume=True))
    assert two["run_id"] == one["run_id"] and len(two["history"]) == 2
    assert two["history"][0] == one["history"][0]
    dead = tmp_path / "dead"
    dead.mkdir()
    (dead / "args.yaml").write_text("run_id: 0123456789ab\n")  # killed in its first epoch
    with pytest.raises(ValueError, match="holds another run's files"):
        run(_config(dead, ".", epochs=0))
    fresh = run(_config(dead, ".", epochs=0, auto_resume=True))
    assert fresh["run_id"] != "0123456789ab" and fresh["output_dir"] == str(dead)


def test_resume_restores_the_whole_configuration_and_extends_the_schedule(tmp_path):
    import math

    import yaml

    first = run(_config(tmp_path, "cos", epochs=3, sched="cosine", batch_size=48, lr=0.08))
    last = tmp_path / "cos" / "last.safetensors"
    (tmp_path / "cos" / ".log.json.0badc0ffee00.tmp").write_text("left by a kill")
    res = run(parse_args(["--resume", str(last), "--epochs", "5", "--no-progress"]))
    saved = yaml.safe_load((tmp_path / "cos" / "args.yaml").read_text())
    assert (saved["batch_size"], saved["lr"], saved["sched"], saved["epochs"]) == (48, 0.08, "cosine", 5)
    assert saved["max_test_samples"] == 200 and res["n_test"] == first["n_test"] == 200  # the test subset is kept
    assert saved["run_id"] == res["run_id"] == first["run_id"] and res["dataset"] == "digits"
    assert res["history"][:3] == first["history"]
    # epochs 3 and 4 follow a cosine over the new total (not the finished schedule's final lr 0)
    lrs = [row["lr"] for row in res["history"]]
    assert lrs[3:] == pytest.approx([0.04 * (1 + math.cos(math.pi * e / 5)) for e in (3, 4)])
    assert not list((tmp_path / "cos").glob("*.tmp"))  # a killed writer's leftover is removed
    with pytest.raises(ValueError, match=r"--batch-size 16 \(the run has 48\); --lr 0.2 \(the run has 0.08\)"):
        run(parse_args(["--resume", str(last), "--lr", "0.2", "-b", "16"]))
    with pytest.raises(ValueError, match="--epochs 4: .* can extend a resumed run, not shorten it"):
        run(parse_args(["--resume", str(last), "--epochs", "4"]))
    with pytest.raises(ValueError, match="continues in the resumed run's folder"):
        run(parse_args(["--resume", str(last), "--output", str(tmp_path / "elsewhere"), "--experiment", "e"]))


def test_damaged_files_are_named_and_outputs_are_world_readable(tmp_path):
    import os
    import stat

    old = os.umask(0o022)
    try:
        run(_config(tmp_path, "ok", epochs=1))
    finally:
        os.umask(old)
    for name in ("args.yaml", "results.json", "log.json", "last.safetensors", "model_best.safetensors"):
        assert stat.S_IMODE((tmp_path / "ok" / name).stat().st_mode) == 0o644, name
    for name, option in (("model_best.safetensors", "checkpoint"), ("last.safetensors", "resume")):
        damaged = tmp_path / f"cut-{name}"
        data = (tmp_path / "ok" / name).read_bytes()
        damaged.write_bytes(data[:len(data) // 2])
        cfg = dict(eval_only=True, checkpoint=str(damaged)) if option == "checkpoint" else dict(resume=str(damaged))
        with pytest.raises(ValueError, match=f"cut-{name} is not a readable safetensors file \\(truncated"):
            run(dict(cfg, output=str(tmp_path), experiment="bad", progress=False))


def test_entry_points_end_their_process_group_also_on_errors(tmp_path):
    """train.py's main, hub_scripts/generate.py and the 2-process test workers destroy their process group before
    the process exits: one left alive can abort the process in gloo's worker thread during shutdown."""
    import runpy
    import sys

    import torch.distributed as dist

    from gloo_launch import run_worker
    from timm_csm.commands.train import main

    def failing_worker():
        raise RuntimeError("worker failed")

    argv = sys.argv
    calls = [lambda: main(["--model", "no_such_model", "--output", str(tmp_path)]),
             lambda: runpy.run_path(str(ROOT / "hub_scripts" / "generate.py"), run_name="__main__"),
             lambda: run_worker(failing_worker)]
    try:
        sys.argv = ["generate.py", "--generator", str(tmp_path / "missing"), "--num-groups", "1", "--output",
                    str(tmp_path / "gen")]
        for i, call in enumerate(calls):
            dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg{i}", rank=0, world_size=1)
            with pytest.raises((SystemExit, RuntimeError, OSError, ValueError)):
                call()
            assert not dist.is_initialized(), i
    finally:
        sys.argv = argv
        if dist.is_initialized():
            dist.destroy_process_group()
