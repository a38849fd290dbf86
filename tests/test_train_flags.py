"""timm's training flags in train.py: --sync-bn (and the all-reduce batch norm), --grad-accum-steps, --model-ema,
--channels-last, --torchcompile, the trackers (--log-with, --log-wandb), summary.csv, and timm's args.yaml keys."""
import csv
import importlib.util
import json
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import yaml
from safetensors.torch import load_file

from gloo_launch import SCRIPTS, launch_two_processes
from timm_csm.io import load_state
from timm_csm.training import run
from timm_csm.training import (AllReduceBatchNorm, ClassificationTask, check_training_options,
                               convert_sync_batchnorm, parse_args, prepare_training, train_one_epoch)

ROOT = Path(__file__).resolve().parents[1]


#: a run of a few seconds: small_cnn on 256 digits (192 to train: 6 batches of 32), 100 test images
_RUN = dict(dataset="digits", model="small_cnn", epochs=1, batch_size=32, lr=0.05, hflip=0.0, crop_pad=1,
            max_train_samples=256, max_test_samples=100, val_fraction=0.25, seed=0, progress=False,
            decay_milestones=[1])


def _config(tmp_path, name, **overrides):
    return {**_RUN, "output": str(tmp_path), "experiment": name, **overrides}


def _weights(path):
    return load_file(str(path))


def _max_weight_diff(a_path, b_path) -> float:
    a, b = _weights(a_path), _weights(b_path)
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a if a[k].is_floating_point())


# ---------------------------------------------------------------------------------------------------------------
# --sync-bn
# ---------------------------------------------------------------------------------------------------------------
def test_all_reduce_batch_norm_on_two_processes_is_batch_norm_of_the_concatenated_batch(tmp_path):
    """Forward, input / weight / bias gradients, running statistics (two steps) and the eval output of each process's
    half equal nn.BatchNorm2d on the whole batch; timm's BatchNormAct2d converts with its activation."""
    launch_two_processes(SCRIPTS / "sync_bn_worker.py", tmp_path / "sbn.json")
    found = json.loads((tmp_path / "sbn.json").read_text())
    assert found["num_processes"] == 2
    assert (found["plain"]["converted"], found["act"]["converted"]) == ("AllReduceBatchNorm", "AllReduceBatchNormAct")
    for layer in ("plain", "act"):
        assert found[layer]["num_batches_tracked"] == 2
        for key, value in found[layer].items():
            if key not in ("converted", "num_batches_tracked"):
                assert value < 1e-5, (layer, key, value)


def test_convert_sync_batchnorm_keeps_the_tensors_and_picks_torchs_layer_on_cuda():
    import timm

    model = timm.create_model("small_cnn", num_classes=10, in_chans=1)
    params = {n: id(p) for n, p in model.named_parameters()}
    keys = list(model.state_dict())
    x = torch.randn(6, 1, 8, 8)
    ref = model(x)
    converted = convert_sync_batchnorm(model)
    assert converted is model and list(model.state_dict()) == keys
    assert {n: id(p) for n, p in model.named_parameters()} == params
    kinds = {type(m) for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)}
    assert kinds == {AllReduceBatchNorm}
    assert torch.allclose(model(x), ref, atol=1e-6)  # no process group: a plain batch norm
    on_cuda = convert_sync_batchnorm(timm.create_model("small_cnn", num_classes=10, in_chans=1), device="cuda")
    assert {type(m) for m in on_cuda.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)} == {
        nn.SyncBatchNorm}


def test_sync_bn_two_processes_match_one_process_on_a_batch_norm_model(tmp_path, capsys):
    """small_cnn (BatchNorm): 1 process with batch 32 = 2 gloo processes with batch 16 and --sync-bn."""
    common = dict(epochs=2, max_train_samples=192, hflip=0.5, sync_bn=True)
    one = run(_config(tmp_path, "p1", **common))
    assert "--sync-bn: one process" in capsys.readouterr().out
    launch_two_processes(
        ROOT / "train.py", "--dataset", "digits", "--model", "small_cnn", "--sync-bn", "--epochs", "2", "-b", "16",
        "--lr", "0.05", "--hflip", "0.5", "--crop-pad", "1", "--max-train-samples", "192", "--max-test-samples",
        "100", "--val-fraction", "0.25", "--seed", "0", "--no-progress", "--decay-milestones", "1",
        "--output", tmp_path, "--experiment", "p2")
    two = json.loads((tmp_path / "p2" / "results.json").read_text())
    assert (one["num_processes"], two["num_processes"]) == (1, 2)
    assert _max_weight_diff(tmp_path / "p1" / "model_best.safetensors", tmp_path / "p2" / "model_best.safetensors") \
        < 1e-4
    logits = [_weights(tmp_path / p / "test_predictions.safetensors")["logits"] for p in ("p1", "p2")]
    assert float((logits[0] - logits[1]).abs().max()) < 1e-4
    history = json.loads((tmp_path / "p2" / "log.json").read_text())
    for e in range(2):
        assert history[e]["train_loss"] == pytest.approx(one["history"][e]["train_loss"], rel=1e-4)


# ---------------------------------------------------------------------------------------------------------------
# --grad-accum-steps
# ---------------------------------------------------------------------------------------------------------------
def test_two_accumulated_batches_of_16_equal_one_batch_of_32(tmp_path):
    """GroupNorm (no batch statistics), no augmentation: the same samples and one update per 32 either way."""
    common = dict(epochs=2, crop_pad=0, model_kwargs=[("norm_layer", "groupnorm")])
    big = run(_config(tmp_path, "b32", batch_size=32, **common))
    accumulated = run(_config(tmp_path, "b16x2", batch_size=16, grad_accum_steps=2, **common))
    assert [r["step"] for r in big["history"]] == [r["step"] for r in accumulated["history"]] == [6, 12]
    assert _max_weight_diff(tmp_path / "b32" / "last.safetensors", tmp_path / "b16x2" / "last.safetensors") < 1e-5
    assert accumulated["test"]["pre_ts"]["nll"] == pytest.approx(big["test"]["pre_ts"]["nll"], abs=1e-5)


def test_a_short_last_group_is_its_own_update():
    """5 batches, 2 per update: updates after batches 2, 4 and 5 (the last divided by 1), as timm."""
    torch.manual_seed(0)
    task, loader = _tiny_task(), _batches(5, 4)
    ref = _tiny_task()
    args = parse_args(["--grad-accum-steps", "2", "--clip-grad", "0", "--no-progress", "--lr", "0.1"])
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    opt, _ = prepare_training(args, task, _sgd(task), accelerator)
    _, updates = train_one_epoch(task, opt, loader, accelerator, 0, args)
    assert updates == 3
    # by hand: mean-loss gradients of batches (0, 1), (2, 3), (4)
    ref_opt = _sgd(ref)
    for group in ((0, 1), (2, 3), (4,)):
        ref_opt.zero_grad()
        for i in group:
            (ref(loader[i])["loss"] / len(group)).backward()
        ref_opt.step()
    for a, b in zip(task.model.parameters(), ref.model.parameters()):
        assert torch.allclose(a, b, atol=1e-6)


# ---------------------------------------------------------------------------------------------------------------
# --model-ema
# ---------------------------------------------------------------------------------------------------------------
def test_model_ema_validates_selects_evaluates_and_resumes_the_ema(tmp_path):
    ema = dict(model_ema=True, model_ema_decay=0.9, model_ema_warmup=True, checkpoint_hist=2, epochs=2)
    full = run(_config(tmp_path, "full", **ema))
    run(_config(tmp_path, "part", **dict(ema, epochs=1)))
    resumed = run(_config(tmp_path, None, resume=str(tmp_path / "part" / "last.safetensors"), **ema))
    a, b = load_state(tmp_path / "full" / "last.safetensors"), load_state(tmp_path / "part" / "last.safetensors")
    assert a["ema"].keys() == a["model"].keys()
    for key in a["ema"]:
        assert torch.equal(a["ema"][key], b["ema"][key]), key
    assert any(not torch.equal(a["ema"][k], a["model"][k]) for k in a["model"] if a["model"][k].is_floating_point())
    assert resumed["test"] == full["test"]
    # validation and selection on the EMA: model_best is the EMA of the best epoch, and the final evaluation of it
    # reproduces that epoch's EMA validation metrics (not the model's own)
    best = full["checkpoint_epoch"]
    row = full["history"][best]
    best_ema = load_state(tmp_path / "full" / f"checkpoint-{best}.safetensors")["ema"]
    weights = _weights(tmp_path / "full" / "model_best.safetensors")
    assert all(torch.equal(weights[k], best_ema[k]) for k in weights)
    assert full["val"]["pre_ts"]["nll"] == pytest.approx(row["val_nll"], abs=1e-6)
    assert row["val_nll"] != pytest.approx(row["val_online_nll"], abs=1e-4)
    # summary.csv of the resumed run: each epoch once
    rows = list(csv.DictReader((tmp_path / "part" / "summary.csv").open()))
    assert [int(r["epoch"]) for r in rows] == [0, 1]


# ---------------------------------------------------------------------------------------------------------------
# --channels-last, --torchcompile (on the training step itself)
# ---------------------------------------------------------------------------------------------------------------
def _tiny_task():
    import timm

    from timm_csm.losses import create_loss

    torch.manual_seed(0)
    return ClassificationTask(timm.create_model("small_cnn", num_classes=10, in_chans=3), create_loss("ce"))


def _batches(n: int, size: int):
    g = torch.Generator().manual_seed(1)
    return [{"pixel_values": torch.randn(size, 3, 8, 8, generator=g), "labels": torch.randint(0, 10, (size,),
                                                                                              generator=g),
             "index": torch.arange(size)} for _ in range(n)]


def _sgd(task):
    return torch.optim.SGD(task.model.parameters(), lr=0.1)


def _train(flags, record=None):
    from accelerate import Accelerator

    task = _tiny_task()
    if record is not None:
        conv = next(m for m in task.model.modules() if isinstance(m, nn.Conv2d))
        conv.register_forward_pre_hook(lambda m, inp: record.append(
            (inp[0].is_contiguous(memory_format=torch.channels_last), m.weight.is_contiguous(
                memory_format=torch.channels_last))))
    args = parse_args(["--no-progress", *flags])
    accelerator = Accelerator(cpu=True)
    opt, _ = prepare_training(args, task, _sgd(task), accelerator)
    train_one_epoch(task, opt, _batches(3, 8), accelerator, 0, args)
    return task


def test_channels_last_puts_the_model_and_the_batches_in_that_layout():
    seen = []
    task = _train(["--channels-last"], seen)
    assert seen and all(inp and weight for inp, weight in seen)
    plain_seen = []
    plain = _train([], plain_seen)
    assert not any(inp for inp, _ in plain_seen)
    for a, b in zip(task.model.parameters(), plain.model.parameters()):
        assert torch.allclose(a, b, atol=1e-5)


def test_torchcompile_compiles_the_training_forward():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    compiled = _train(["--torchcompile", "eager"])
    assert type(compiled.forward_module).__name__ == "OptimizedModule"
    assert counters["stats"]["unique_graphs"] >= 1
    plain = _train([])
    for a, b in zip(compiled.model.parameters(), plain.model.parameters()):
        assert torch.allclose(a, b, atol=1e-6)
    assert parse_args(["--torchcompile"]).torchcompile == "inductor"  # timm: the flag alone is inductor


# ---------------------------------------------------------------------------------------------------------------
# trackers and summary.csv
# ---------------------------------------------------------------------------------------------------------------
def _scalars(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    values = {}
    for events in sorted(folder.rglob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events))
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            values.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    return values


def test_trackers_get_the_step_loss_the_epochs_and_the_final_metrics_and_summary_csv_is_timms(tmp_path):
    res = run(_config(tmp_path, "tb", epochs=2, log_with="tensorboard"))
    scalars = _scalars(tmp_path / "tb")
    assert [s for s, _ in scalars["train/loss"]] == list(range(1, 13))  # 6 updates per epoch
    assert [s for s, _ in scalars["val_nll"]] == [6, 12]
    assert scalars["test/pre_ts/accuracy"] == [(12, pytest.approx(res["test"]["pre_ts"]["accuracy"]))]
    assert scalars["test/post_ts/ece"][0][1] == pytest.approx(res["test"]["post_ts"]["ece"])
    assert scalars["temperature"][0][1] == pytest.approx(res["temperature"])
    rows = list(csv.DictReader((tmp_path / "tb" / "summary.csv").open()))
    assert list(rows[0])[:5] == ["epoch", "train_loss", "eval_loss", "eval_top1", "eval_top5"]
    assert list(rows[0])[-1] == "lr" and "eval_ece" in rows[0]
    for row, logged in zip(rows, res["history"]):
        assert float(row["eval_top1"]) == pytest.approx(100 * logged["val_accuracy"])
        assert float(row["eval_loss"]) == pytest.approx(logged["val_nll"])
        assert float(row["eval_top1"]) <= float(row["eval_top5"]) <= 100
        assert float(row["lr"]) == pytest.approx(logged["lr"])


def test_log_wandb_is_accelerates_wandb_tracker_and_needs_wandb():
    from timm_csm.training import tracker_names

    args = parse_args(["--log-wandb", "--log-with", "tensorboard"])
    if importlib.util.find_spec("wandb") is None:
        with pytest.raises(ValueError, match=r"--log-wandb: the wandb package is not installed \(pip install wandb\)"):
            check_training_options(args)
    else:
        assert tracker_names(args) == ["tensorboard", "wandb"]
    with pytest.raises(ValueError, match="unknown tracker 'tensorbord'"):
        check_training_options(parse_args(["--log-with", "tensorbord"]))


# ---------------------------------------------------------------------------------------------------------------
# errors and timm's args.yaml
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("overrides, match", [
    (dict(grad_accum_steps=0), "--grad-accum-steps must be >= 1"),
    (dict(model_ema_decay=1.5), r"--model-ema-decay must lie in \[0, 1\)"),
    (dict(torchcompile="nope"), "--torchcompile 'nope': torch has no such backend"),
])
def test_bad_flag_values_are_errors_before_training(tmp_path, overrides, match):
    with pytest.raises(ValueError, match=match):
        run(_config(tmp_path, "err", **overrides))
    assert not (tmp_path / "err").exists()


def test_a_timm_args_yaml_maps_these_flags(tmp_path):
    timm_args = dict(model="resnet18", sync_bn=True, model_ema=True, model_ema_decay=0.999, model_ema_warmup=True,
                     grad_accum_steps=4, channels_last=True, torchcompile="inductor", torchcompile_mode=None,
                     log_wandb=False, model_ema_force_cpu=False, dataset="torch/cifar10")
    path = tmp_path / "args.yaml"
    path.write_text(yaml.safe_dump(timm_args))
    with pytest.warns(UserWarning, match="timm train.py args.yaml") as caught:
        args = parse_args(["-c", str(path)])
    assert str(caught[0].message).split("ignored: ")[1] == "model_ema_force_cpu"
    assert (args.sync_bn, args.model_ema, args.model_ema_decay, args.model_ema_warmup, args.grad_accum_steps,
            args.channels_last, args.torchcompile, args.log_wandb) == (True, True, 0.999, True, 4, True, "inductor",
                                                                       False)
