"""Train any timm classifier with any registered calibration loss (CSM included) and evaluate its calibration.

    accelerate launch train.py --model swin_tiny --dataset cifar10 --loss csm --csm-dataset org/csm-cifar10-aug

Pipeline of one run (``run(config)``; ``main(argv)`` is the command line):

1. data: ``--dataset`` (embedded ``fashion_mnist`` / ``digits``, ``cifar10`` / ``cifar100`` or any Hugging Face
   dataset name or folder) is loaded into memory; a seeded ``--val-split`` fraction of the training split is held
   out for checkpoint selection, stateful-loss hooks and temperature scaling. CSM companions come from
   ``--csm-dataset`` (the published generated dataset) through :class:`~timm_csm.data.CSMCollator`.
2. training (defaults: the CIFAR recipe of the CSM paper: SGD 0.1 without Nesterov, momentum 0.9, weight decay
   5e-4 on every parameter, LR x0.1 at epochs 80 and 120 of 200, batch 128, gradient-norm clip 2, seed 12345):
   * plain losses: one forward pass, ``loss(logits, y)`` (``index=`` for per-sample-state losses);
   * CSM (``is_csm`` losses): one forward pass on the real batch and one on the companions (separate batch-norm
     statistics, as the method specifies), one backward pass of ``loss(logits_real, y, logits_gen, q_gen)``;
   * Mixup (``--mixup ALPHA``): the loss on mixed images and soft targets;
   * RegMixup (``--regmixup ALPHA``): ``(loss(f(x), y) + w * CE(f(x~), y~)) / 2``, clean and mixed in one pass
     (the released code's mean over both halves; ``--regmixup-reduction sum`` drops the 1/2);
   * RankMixup (``needs_mixed`` losses "mrl", "mndcg"): clean and mixed copies in two passes.
   After each epoch: validation logits (gathered over processes), the loss's ``on_epoch_end`` hook, the
   scheduler step, the per-epoch log, ``last.safetensors`` (model, optimizer, scheduler, loss state, RNG) and
   ``model_best.safetensors`` when ``--select-by`` improves.
3. evaluation of the best checkpoint on the test split, before and after temperature scaling fitted on the
   validation split (``--ts-method``), optionally PIECE (``--piece``): ``results.json``, ``results.md``,
   reliability diagrams.

Batches are sharded by :class:`~timm_csm.data.GlobalBatchSampler`: each process takes its slice of a global
batch of ``num_processes * batch_size`` samples, with augmentation and companion randomness keyed per sample, so a
run on R processes with batch B sees the same samples, crops and companions as one process with batch R*B.
"""
from __future__ import annotations

import argparse
import csv
import difflib
import io
import json
import os
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn as nn

from .io import is_state_file, load_state, read_model_meta, save_model_file, save_state, write_text_atomic

__all__ = ["build_parser", "parse_args", "run", "main", "evaluate_checkpoint", "read_model_meta", "save_state", "load_state",
           "save_model_file", "load_model_weights", "create_train_model", "create_criterion", "load_data", "predict",
           "results_markdown", "TrainingModule", "end_process_group"]

PAPER_SEED = 12345
CHECKPOINT_LAST = "last.safetensors"
CHECKPOINT_BEST = "model_best.safetensors"
_EMBEDDED = ("fashion_mnist", "digits")
_HUB_ALIASES = ("cifar10", "cifar100")


# ---------------------------------------------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------------------------------------------
def _key_value(text: str) -> Tuple[str, Any]:
    """Parse ``key=value``; the value is read as YAML (numbers, booleans, lists), else kept as a string."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    key, value = text.split("=", 1)
    import yaml

    try:
        parsed = yaml.safe_load(value)
    except yaml.YAMLError:
        parsed = value
    return key.strip(), parsed


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; flag names follow timm's train.py where they overlap."""
    p = argparse.ArgumentParser(
        prog="train.py", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Train a timm classifier with a calibration loss (CSM and baselines); evaluate calibration "
                    "before and after temperature scaling. Run with `accelerate launch train.py ...` for several "
                    "processes.")
    p.add_argument("-c", "--config", default=None, metavar="FILE",
                   help="YAML file of defaults (keys are the flag names, with - or _); flags override it")

    g = p.add_argument_group("Dataset")
    g.add_argument("--dataset", default="cifar10",
                   help="fashion_mnist, digits, cifar10, cifar100, or a Hugging Face dataset name or folder")
    g.add_argument("--train-split", default="train", help="split to train on (the validation set is cut from it)")
    g.add_argument("--test-split", default="test", help="split to report test metrics on")
    g.add_argument("--image-column", default=None, help="image column (detected when omitted)")
    g.add_argument("--label-column", default=None, help="label column (detected when omitted)")
    g.add_argument("--val-split", type=float, default=0.1,
                   help="fraction of the training split held out (seeded) for validation and temperature scaling")
    g.add_argument("--max-train-samples", type=int, default=None,
                   help="use a seeded random subset of this many training images (before the validation split)")
    g.add_argument("--max-test-samples", type=int, default=None, help="use a seeded subset of the test split")
    g.add_argument("-j", "--workers", type=int, default=0, help="DataLoader worker processes")
    g.add_argument("--pin-mem", action="store_true", help="pin CPU memory of batches (GPU training)")

    g = p.add_argument_group("Model")
    g.add_argument("--model", default="resnet50_cifar", help="any timm.list_models() name or a registered alias")
    g.add_argument("--pretrained", action="store_true", help="start from pretrained weights (timm / Hub cache)")
    g.add_argument("--pretrained-path", default=None, help="local pretrained weight file for --pretrained")
    g.add_argument("--initial-checkpoint", default="", help="load these model weights after creation")
    g.add_argument("--num-classes", type=int, default=None, help="number of classes (default: the dataset's)")
    g.add_argument("--img-size", type=int, default=None,
                   help="input size (default: fixed-size models' config, else the dataset's image size)")
    g.add_argument("--in-chans", type=int, default=None, help="input channels (default: the dataset's)")
    g.add_argument("--mean", type=float, nargs="+", default=None,
                   help="normalisation mean (default: the training data's, or the pretrained config's)")
    g.add_argument("--std", type=float, nargs="+", default=None, help="normalisation std (see --mean)")
    g.add_argument("--drop", type=float, default=0.0, help="dropout rate before the classifier")
    g.add_argument("--drop-path", type=float, default=None, help="drop-path rate (models that support it)")
    g.add_argument("--model-kwargs", nargs="*", type=_key_value, default=[], metavar="KEY=VALUE",
                   help="extra keyword arguments for timm.create_model")

    g = p.add_argument_group("Optimizer and schedule")
    g.add_argument("-b", "--batch-size", type=int, default=128, help="real images per process and step")
    g.add_argument("-vb", "--validation-batch-size", type=int, default=None, help="evaluation batch size")
    g.add_argument("--epochs", type=int, default=200)
    g.add_argument("--opt", default="momentum",
                   help="timm optimizer name; 'momentum' is SGD without Nesterov (the paper), 'sgd' is Nesterov")
    g.add_argument("--lr", type=float, default=0.1)
    g.add_argument("--momentum", type=float, default=0.9)
    g.add_argument("--weight-decay", type=float, default=5e-4)
    g.add_argument("--filter-bias-and-bn", action=argparse.BooleanOptionalAction, default=False,
                   help="exempt biases and norm weights from weight decay (timm's default; the paper decays all)")
    g.add_argument("--clip-grad", type=float, default=2.0, help="gradient clipping threshold (0 or less: off)")
    g.add_argument("--clip-mode", default="norm", choices=("norm", "value"))
    g.add_argument("--sched", default="multistep", help="timm scheduler: multistep, step, cosine, plateau, ...")
    g.add_argument("--decay-milestones", type=int, nargs="+", default=[80, 120])
    g.add_argument("--decay-epochs", type=float, default=100, help="period of the 'step' scheduler")
    g.add_argument("--decay-rate", type=float, default=0.1)
    g.add_argument("--warmup-epochs", type=int, default=0)
    g.add_argument("--warmup-lr", type=float, default=1e-5)
    g.add_argument("--min-lr", type=float, default=0.0)

    g = p.add_argument_group("Augmentation and mixing")
    g.add_argument("--hflip", type=float, default=0.5, help="horizontal flip probability")
    g.add_argument("--crop-pad", type=int, default=4, help="zero padding of the random crop (0: no crop)")
    g.add_argument("--smoothing", type=float, default=0.0,
                   help="label smoothing: with --loss ce it selects the 'ls' loss; with --mixup it smooths the "
                        "mixed targets")
    g.add_argument("--mixup", type=float, default=0.0, help="Mixup alpha (0: off); trains on mixed images only")
    g.add_argument("--mixup-mode", default="batch", choices=("batch", "elem"), help="one lambda per batch or per image")
    g.add_argument("--regmixup", type=float, default=0.0,
                   help="RegMixup alpha (0: off; 20 for CIFAR-10, 10 for CIFAR-100)")
    g.add_argument("--regmixup-weight", type=float, default=1.0, help="weight eta of RegMixup's mixed term")
    g.add_argument("--regmixup-reduction", default="mean", choices=("mean", "sum"),
                   help="RegMixup: 'mean' (clean + eta * mixed) / 2, the released code's mean over the 2B batch; "
                        "'sum' clean + eta * mixed, the paper's equation")
    g.add_argument("--rankmixup-alpha", type=float, default=2.0, help="Mixup alpha of RankMixup losses (mrl, mndcg)")
    g.add_argument("--num-mixup", type=int, default=None,
                   help="mixed copies per sample for RankMixup losses (default: 1 for mrl, 3 for mndcg)")

    g = p.add_argument_group("Calibration")
    g.add_argument("--loss", default="ce", help="registered loss (timm_csm.losses.list_losses())")
    g.add_argument("--loss-kwargs", nargs="*", type=_key_value, default=[], metavar="KEY=VALUE",
                   help="keyword arguments of the loss, e.g. --loss-kwargs margin=6 alpha=0.1")
    g.add_argument("--csm-dataset", default=None,
                   help="generated CSM dataset (Hub name or folder); required by the csm losses")
    g.add_argument("--n-aug", type=int, default=1, help="interior group members per real image besides the endpoint")
    g.add_argument("--csm-weight", type=float, default=1.0, help="weight of the generated-batch term of CSM")
    g.add_argument("--ts-method", default="grid_ece", choices=("grid_ece", "nll"),
                   help="temperature fit on the validation split: grid 0.1..10 by ECE (paper) or NLL (Guo)")
    g.add_argument("--n-bins", type=int, default=15, help="confidence bins of ECE-type metrics")
    g.add_argument("--select-by", default="acc", choices=("acc", "nll", "ece"),
                   help="validation metric that picks the best checkpoint")
    g.add_argument("--piece", action="store_true",
                   help="also report the proximity-informed ECE (PIECE) from penultimate features")

    g = p.add_argument_group("Checkpoints and output")
    g.add_argument("--output", default="output/train", help="parent folder of the experiment folders")
    g.add_argument("--experiment", default=None,
                   help="experiment folder name under --output ('.': --output itself, refused when it holds "
                        "another run; default: <dataset>-<model>-<loss>; with --eval-only, eval-<dataset>-<split> "
                        "beside the checkpoint). A folder that holds a run gives way to <name>-1, <name>-2, ...; "
                        "--resume continues in the resumed run's folder")
    g.add_argument("--resume", default="",
                   help="continue the run of this last.safetensors, in its folder and with its stored configuration "
                        "(flags that conflict with it are errors; --epochs may extend it)")
    g.add_argument("--auto-resume", action="store_true",
                   help="resume the run in the experiment folder itself when it left a last.safetensors, else "
                        "start the run there (instead of a new numbered folder)")
    g.add_argument("--checkpoint-hist", type=int, default=0,
                   help="also keep the N most recent per-epoch checkpoints checkpoint-<epoch>.safetensors")
    g.add_argument("--eval-only", action="store_true", help="only evaluate --checkpoint (no training)")
    g.add_argument("--checkpoint", default=None,
                   help="weights to evaluate with --eval-only (model_best.safetensors, last.safetensors, or a "
                        "timm weight file with --model etc.)")
    g.add_argument("--log-with", default=None, help="accelerate tracker (tensorboard, wandb, ...) when installed")
    g.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                   help="progress bar on the main process")

    g = p.add_argument_group("Run")
    g.add_argument("--seed", type=int, default=PAPER_SEED)
    g.add_argument("--amp", action="store_true", help="mixed precision (accelerate); see --amp-dtype")
    g.add_argument("--amp-dtype", default="float16", choices=("float16", "bfloat16"))
    g.add_argument("--cpu", action="store_true", help="train on the CPU even when an accelerator is present")
    return p


def _dest_names(parser: argparse.ArgumentParser) -> Dict[str, argparse.Action]:
    return {a.dest: a for a in parser._actions if a.dest not in ("help",)}


def _load_yaml_config(path: str, parser: argparse.ArgumentParser) -> Dict[str, Any]:
    import yaml

    with open(path) as f:
        cfg = yaml.safe_load(f) or {}
    if not isinstance(cfg, dict):
        raise ValueError(f"config {path} must be a mapping of flag names to values")
    cfg.pop("run_id", None)  # a run's args.yaml works as a config; its run id stays with that run
    return _normalise_keys(cfg, parser, f"config {path}")


def _normalise_keys(cfg: Dict[str, Any], parser: argparse.ArgumentParser, where: str) -> Dict[str, Any]:
    dests = _dest_names(parser)
    out, unknown = {}, []
    for k, v in cfg.items():
        key = str(k).lstrip("-").replace("-", "_")
        if key not in dests or key == "config":
            unknown.append(k)
            continue
        if key in ("model_kwargs", "loss_kwargs") and isinstance(v, dict):
            v = list(v.items())
        out[key] = v
    if unknown:
        close = {u: difflib.get_close_matches(str(u).replace("-", "_"), list(dests), n=1) for u in unknown}
        hint = "; ".join(f"{u!r}" + (f" (did you mean {c[0]!r}?)" if c else "") for u, c in close.items())
        raise ValueError(f"unknown option(s) in {where}: {hint}")
    return out


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """Parse the command line: ``-c FILE`` sets defaults from YAML, then flags override them."""
    parser = build_parser()
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("-c", "--config", default=None)
    known, _ = pre.parse_known_args(argv)
    if known.config:
        parser.set_defaults(**_load_yaml_config(known.config, parser))
    args = parser.parse_args(argv)
    # which options were given explicitly (flags or config): eval-only lets a checkpoint's metadata fill the rest
    probe = build_parser()
    for action in probe._actions:
        action.default = argparse.SUPPRESS
    explicit = set(vars(probe.parse_args(argv)).keys())
    if known.config:
        explicit |= set(_load_yaml_config(known.config, parser))
    args._explicit = sorted(explicit - {"config"})
    return args


def _resolve_config(config) -> argparse.Namespace:
    """A full Namespace from a Namespace or a dict of option names (missing ones take the defaults)."""
    parser = build_parser()
    if isinstance(config, argparse.Namespace):
        if not hasattr(config, "_explicit"):  # built by hand: options that differ from the defaults count as given
            defaults = vars(parser.parse_args([]))
            explicit = sorted(k for k, v in vars(config).items() if k not in defaults or defaults[k] != v)
            config = argparse.Namespace(**dict(defaults, **vars(config)), _explicit=explicit)
        return config
    if not isinstance(config, dict):
        raise TypeError(f"config must be an argparse.Namespace or a dict, got {type(config).__name__}")
    given = _normalise_keys(config, parser, "run() config")
    args = parser.parse_args([])
    for k, v in given.items():
        setattr(args, k, v)
    args._explicit = sorted(given)
    return args


# ---------------------------------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------------------------------
@dataclass
class DataSplits:
    train: Any  # ImageArrays
    val: Any
    test: Any
    class_names: List[str]


def _subset(arrays, n: Optional[int], seed: int, salt: int):
    from .data import derive_seed

    if n is None or n >= len(arrays):
        return arrays
    if n < 1:
        raise ValueError(f"a subset needs at least one sample, got {n}")
    g = torch.Generator().manual_seed(derive_seed(seed, salt))
    return arrays.subset(torch.randperm(len(arrays), generator=g)[:n].sort().values.numpy())


def _load_split(args, split: str):
    from .data import load_image_arrays

    name = args.dataset
    known = name in _EMBEDDED or name in _HUB_ALIASES or os.path.isdir(name) or "/" in name
    try:
        return load_image_arrays(name, split, image_column=args.image_column, label_column=args.label_column)
    except ValueError:
        raise  # missing / undetectable column, bad images: already a clear message
    except Exception as e:  # not found locally, on the Hub, or offline
        if not known:
            raise ValueError(f"unknown dataset {name!r}; available: {', '.join(_EMBEDDED)} (embedded), "
                             f"{', '.join(_HUB_ALIASES)} (Hub or cache), or a Hugging Face dataset name or folder "
                             f"({type(e).__name__}: {e})") from e
        raise ValueError(f"dataset {name!r}, split {split!r} could not be loaded: {type(e).__name__}: {e}") from e


def load_data(args) -> DataSplits:
    """Training / validation / test arrays for ``args`` (seeded subset and validation split)."""
    train = _load_split(args, args.train_split)
    test = _load_split(args, args.test_split)
    if list(test.class_names) != list(train.class_names):
        raise ValueError(f"the {args.test_split!r} split names classes {test.class_names[:10]}, the "
                         f"{args.train_split!r} split {train.class_names[:10]}")
    train = _subset(train, args.max_train_samples, args.seed, 1)
    test = _subset(test, args.max_test_samples, args.seed, 2)
    if not 0.0 <= args.val_split < 1.0:
        raise ValueError(f"--val-split must lie in [0, 1), got {args.val_split}")
    n_val = int(round(args.val_split * len(train)))
    if args.val_split > 0 and n_val == 0:
        raise ValueError(f"--val-split {args.val_split} of {len(train)} images leaves no validation image")
    from .data import derive_seed

    g = torch.Generator().manual_seed(derive_seed(args.seed, 0))
    order = torch.randperm(len(train), generator=g).numpy()
    val = train.subset(np.sort(order[:n_val]))
    train = train.subset(np.sort(order[n_val:]))
    if len(train) == 0:
        raise ValueError("no training images left after the validation split")
    return DataSplits(train, val, test, list(train.class_names))


def _load_csm_groups(args, class_names):
    """The generated dataset of ``--csm-dataset`` (folder, installed name or Hub id), grouped for sampling."""
    from .data import CSMGroups
    from .hub import load_csm_dataset

    dd = load_csm_dataset(args.csm_dataset)
    ds = dd["train"] if hasattr(dd, "keys") and "train" in dd else dd
    return CSMGroups.from_dataset(ds, class_names=class_names)


# ---------------------------------------------------------------------------------------------------------------
# model, loss, optimiser
# ---------------------------------------------------------------------------------------------------------------
class TrainingModule(nn.Module):
    """Calls the classifier once per input batch inside a single forward, so that CSM's real and generated
    batches (and RankMixup's clean and mixed copies) keep separate batch-norm statistics while a distributed
    wrapper sees one forward and one backward per step."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, *batches: torch.Tensor):
        if len(batches) == 1:
            return self.model(batches[0])
        return tuple(self.model(x) for x in batches)


def _check_model_name(name: str) -> None:
    import timm

    from . import models  # noqa: F401  (registers the small-image models)

    if timm.is_model(name):
        return
    ours = ", ".join(models.SMALL_IMAGE_MODELS)
    all_names = timm.list_models()
    close = difflib.get_close_matches(name, all_names, n=5, cutoff=0.6)
    raise ValueError(f"unknown model {name!r}. Small-image models: {ours}. Any of timm's {len(all_names)} "
                     f"architectures also works (timm.list_models('pattern*') lists them)"
                     + (f"; close matches: {', '.join(close)}" if close else ""))


def _fixed_input_size(name: str) -> Tuple[bool, Optional[Tuple[int, int, int]]]:
    from timm.models import get_pretrained_cfg

    cfg = get_pretrained_cfg(name)
    if cfg is None:
        return False, None
    return bool(getattr(cfg, "fixed_input_size", False)), tuple(cfg.input_size) if cfg.input_size else None


def create_train_model(name: str, num_classes: int, in_chans: int, img_size: Optional[int], pretrained=False,
                       pretrained_path=None, initial_checkpoint="", drop=0.0, drop_path=None,
                       model_kwargs: Optional[Dict[str, Any]] = None) -> nn.Module:
    """``timm.create_model`` with the options of this script; fixed-size models (ViT, Swin) get ``img_size``."""
    import timm

    _check_model_name(name)
    kwargs = dict(model_kwargs or {})
    kwargs.update(num_classes=num_classes, in_chans=in_chans)
    if drop:
        kwargs["drop_rate"] = drop
    if drop_path is not None:
        kwargs["drop_path_rate"] = drop_path
    fixed, _ = _fixed_input_size(name)
    if fixed and img_size:
        kwargs.setdefault("img_size", img_size)
    if pretrained_path:
        kwargs["pretrained_cfg_overlay"] = dict(file=str(pretrained_path))
    model = timm.create_model(name, pretrained=pretrained, **kwargs)
    if initial_checkpoint:
        if not os.path.exists(initial_checkpoint):
            raise FileNotFoundError(f"--initial-checkpoint {initial_checkpoint} does not exist")
        load_model_weights(model, initial_checkpoint)
    return model


def _mix_mode(args, criterion) -> str:
    if getattr(criterion, "is_csm", False):
        mode = "csm"
    elif getattr(criterion, "needs_mixed", False):
        mode = "rankmixup"
    elif args.mixup > 0:
        mode = "mixup"
    elif args.regmixup > 0:
        mode = "regmixup"
    else:
        mode = "plain"
    conflicts = [flag for flag, on in (("--mixup", args.mixup > 0), ("--regmixup", args.regmixup > 0)) if on]
    if mode in ("csm", "rankmixup") and conflicts:
        raise ValueError(f"--loss {args.loss} builds its own batches; drop {' and '.join(conflicts)}")
    if len(conflicts) > 1:
        raise ValueError("choose one of --mixup and --regmixup")
    if mode == "csm" and not args.csm_dataset:
        raise ValueError(f"--loss {args.loss} needs --csm-dataset (the generated CSM dataset)")
    if mode != "csm" and args.csm_dataset:
        raise ValueError(f"--csm-dataset is used by the csm losses only; --loss {args.loss} is not one")
    return mode


def create_criterion(args, num_train: int):
    """The training loss from ``--loss`` / ``--loss-kwargs`` (``--smoothing`` with ce selects 'ls')."""
    from .losses import create_loss, get_loss_entrypoint

    name = args.loss
    kwargs = dict(args.loss_kwargs or [])
    if args.smoothing > 0 and args.mixup <= 0:
        if name == "ce":
            name = "ls"
        if name == "ls":
            kwargs.setdefault("smoothing", args.smoothing)
        else:
            raise ValueError(f"--smoothing applies to --loss ce / ls (or to --mixup targets), not to {name!r}")
    entry = get_loss_entrypoint(name)  # unknown names: ValueError listing the registered losses
    if getattr(entry, "is_csm", False) or name.startswith("csm"):
        kwargs.setdefault("weight", args.csm_weight)
    if getattr(entry, "needs_index", False):
        kwargs.setdefault("num_samples", num_train)
    return create_loss(name, **kwargs)


def _create_optimizer(args, model):
    from timm.optim import create_optimizer_v2

    return create_optimizer_v2(model, opt=args.opt, lr=args.lr, weight_decay=args.weight_decay,
                               momentum=args.momentum, filter_bias_and_bn=args.filter_bias_and_bn)


def _create_scheduler(args, optimizer):
    from timm.scheduler import create_scheduler_v2

    scheduler, _ = create_scheduler_v2(
        optimizer, sched=args.sched, num_epochs=args.epochs, decay_epochs=args.decay_epochs,
        decay_milestones=list(args.decay_milestones), decay_rate=args.decay_rate, min_lr=args.min_lr,
        warmup_lr=args.warmup_lr, warmup_epochs=args.warmup_epochs)
    return scheduler


# ---------------------------------------------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------------------------------------------
def _make_accelerator(args, out_dir: Optional[Path]):
    """An ``Accelerator`` for ``args``; its trackers (``--log-with``) only with the run folder ``out_dir``."""
    from accelerate import Accelerator

    kwargs = {}
    if args.amp:
        kwargs["mixed_precision"] = "bf16" if args.amp_dtype == "bfloat16" else "fp16"
    if args.cpu:
        kwargs["cpu"] = True
    if args.log_with and out_dir is not None:
        kwargs["log_with"] = args.log_with
        kwargs["project_dir"] = str(out_dir)
    return Accelerator(**kwargs)


def _experiment_dir(args) -> Path:
    """The experiment folder a new run asks for (a taken one gives way to ``<name>-1``, ...; see run_dir)."""
    if args.experiment:
        return Path(args.output) / args.experiment
    if args.eval_only and args.checkpoint and "output" not in args._explicit:  # beside the checkpoint
        return Path(args.checkpoint).parent / f"eval-{Path(str(args.dataset)).name}-{args.test_split}"
    name = f"{Path(str(args.dataset)).name}-{args.model}-{args.loss}"
    return Path(args.output) / name


def _resolve_input(args, data: DataSplits, pretrained_cfg=None):
    """(img_size, in_chans, mean, std) from flags, the model config and the data."""
    from .data import channel_stats

    in_chans = args.in_chans or int(data.train.images.shape[1])
    fixed, cfg_size = _fixed_input_size(args.model)
    if args.img_size:
        img_size = int(args.img_size)
    elif fixed and cfg_size:
        img_size = int(cfg_size[-1])
    else:
        img_size = int(data.train.images.shape[-1])
    if args.mean is not None or args.std is not None:
        if args.mean is None or args.std is None:
            raise ValueError("give both --mean and --std")
        mean, std = tuple(args.mean), tuple(args.std)
    elif args.pretrained and pretrained_cfg is not None:
        from .models._cfg import _fit_channels

        mean = _fit_channels(pretrained_cfg.get("mean", (0.5,)), in_chans)
        std = _fit_channels(pretrained_cfg.get("std", (0.5,)), in_chans)
    else:
        mean, std = channel_stats(data.train.images, in_chans)
    for what, v in (("mean", mean), ("std", std)):
        if len(v) not in (1, in_chans):
            raise ValueError(f"--{what} has {len(v)} values for {in_chans} input channels")
    return img_size, in_chans, tuple(float(m) for m in mean), tuple(float(s) for s in std)


def _eval_loader(arrays, transform, batch_size: int, args, accelerator):
    from torch.utils.data import DataLoader

    from .data import ImageCollator, IndexDataset

    loader = DataLoader(IndexDataset(len(arrays)), batch_size=batch_size, shuffle=False,
                        collate_fn=ImageCollator(arrays.images, arrays.labels, transform, args.seed),
                        num_workers=args.workers, pin_memory=args.pin_mem)
    return accelerator.prepare_data_loader(loader)


@torch.no_grad()
def predict(model: nn.Module, loader, accelerator, features: bool = False):
    """Logits (N, K), labels (N,) and optionally penultimate features (N, D) over ``loader``, gathered from
    every process in dataset order (float32 on the CPU)."""
    was_training = model.training
    model.eval()
    logits_all, labels_all, feats_all = [], [], []
    for batch in loader:
        x = batch["pixel_values"].to(accelerator.device)
        y = batch["labels"].to(accelerator.device)
        with accelerator.autocast():
            if features:
                fmap = model.forward_features(x)
                feats = model.forward_head(fmap, pre_logits=True)
                logits = model.forward_head(fmap)
            else:
                logits = model(x)
        gathered = accelerator.gather_for_metrics((logits.float(), y) + ((feats.float(),) if features else ()))
        logits_all.append(gathered[0].cpu())
        labels_all.append(gathered[1].cpu())
        if features:
            feats_all.append(gathered[2].cpu())
    model.train(was_training)
    out = (torch.cat(logits_all), torch.cat(labels_all))
    return out + ((torch.cat(feats_all),) if features else ())


def _metric_row(prefix: str, metrics: Dict[str, float]) -> Dict[str, float]:
    return {f"{prefix}_{k}": float(v) for k, v in metrics.items()}


_SELECT = {"acc": ("val_accuracy", max), "nll": ("val_nll", min), "ece": ("val_ece", min)}


def _is_better(value: float, best: Optional[float], select_by: str) -> bool:
    if best is None:
        return True
    return value > best if _SELECT[select_by][1] is max else value < best


def _write_log(out_dir: Path, rows: List[Dict[str, Any]]) -> None:
    write_text_atomic(out_dir / "log.json", json.dumps(rows, indent=1))
    keys: List[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=keys)
    w.writeheader()
    w.writerows(rows)
    write_text_atomic(out_dir / "log.csv", buf.getvalue())


def _rng_state() -> Dict[str, Any]:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = list(torch.cuda.get_rng_state_all())
    return state


def _set_rng_state(state: Dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(list(state["cuda"]))


def _model_meta(args, data_info: Dict[str, Any]) -> Dict[str, Any]:
    keys = ("model", "dataset", "image_column", "label_column", "train_split", "test_split", "val_split",
            "max_train_samples", "max_test_samples", "seed", "loss", "model_kwargs")
    meta = {k: getattr(args, k) for k in keys}
    meta["model_kwargs"] = [list(kv) for kv in (args.model_kwargs or [])]
    meta.update(data_info)
    return meta


def _save_training_state(path: Path, model, optimizer, scheduler, criterion, epoch: int, best: Dict[str, Any],
                         history: List[Dict[str, Any]], meta: Dict[str, Any]) -> None:
    save_state(path, {
        "model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
        "loss": criterion.state_dict(), "rng": _rng_state(), "epoch": epoch, "best": best, "history": history,
        "meta": meta,
    })


def _train_one_epoch(args, mode, train_module, model, criterion, optimizer, loader, accelerator, epoch: int,
                     regmix_loss=None):
    from tqdm.auto import tqdm

    from .losses import regmixup_objective

    train_module.train()
    device = accelerator.device
    total = torch.zeros((), dtype=torch.float64, device=device)
    steps = 0
    terms_sum: Dict[str, float] = {}
    params = [p for p in model.parameters() if p.requires_grad]
    bar = tqdm(loader, desc=f"epoch {epoch}", leave=False, dynamic_ncols=True,
               disable=not (args.progress and accelerator.is_main_process))
    for batch in bar:
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        x, y = batch["pixel_values"], batch["labels"]
        if mode == "csm":
            logits, logits_gen = train_module(x, batch["mix_pixel_values"])
            loss = criterion(logits, y, logits_gen, batch["mix_targets"])
        elif mode == "rankmixup":
            logits, logits_mix = train_module(x, batch["mix_pixel_values"])
            loss = criterion(logits, y, logits_mix, batch["mix_targets"])
        elif mode == "regmixup":
            both = train_module(torch.cat([x, batch["mix_pixel_values"]]))
            logits, logits_mix = both[:len(x)], both[len(x):]
            if getattr(criterion, "needs_index", False):
                clean = criterion(logits, y, index=batch["index"])
            else:
                clean = criterion(logits, y)
            loss = regmixup_objective(clean, regmix_loss(logits_mix, batch["mix_targets"]), args.regmixup_weight,
                                      args.regmixup_reduction)
        else:  # plain or mixup (soft targets in batch["labels"])
            logits = train_module(x)
            if getattr(criterion, "needs_index", False):
                loss = criterion(logits, y, index=batch["index"])
            else:
                loss = criterion(logits, y)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"non-finite training loss {float(loss)} at epoch {epoch}, step {steps}")
        optimizer.zero_grad(set_to_none=True)
        accelerator.backward(loss)
        if args.clip_grad and args.clip_grad > 0:
            if args.clip_mode == "norm":
                accelerator.clip_grad_norm_(params, args.clip_grad)
            else:
                accelerator.clip_grad_value_(params, args.clip_grad)
        optimizer.step()
        total += loss.detach().double()
        steps += 1
        for k, v in (getattr(criterion, "terms", None) or {}).items():
            terms_sum[k] = terms_sum.get(k, 0.0) + float(v)
        if steps % 10 == 0:
            bar.set_postfix(loss=f"{float(total) / steps:.4f}")
    bar.close()
    mean_loss = float(accelerator.reduce(total / max(steps, 1), reduction="mean"))
    row = {"train_loss": mean_loss}
    row.update({f"train_{k}": v / max(steps, 1) for k, v in terms_sum.items()})
    return row


def _build_train_loader(args, mode, data: DataSplits, train_tf, accelerator, companions=None):
    from torch.utils.data import DataLoader

    from .data import (CSMCollator, GlobalBatchSampler, ImageCollator, IndexDataset, MixupCollator,
                       RankMixupCollator, RegMixupCollator)

    images, labels, k = data.train.images, data.train.labels, len(data.class_names)
    if mode == "csm":
        collator = CSMCollator(images, labels, train_tf, companions, seed=args.seed)
    elif mode == "mixup":
        collator = MixupCollator(images, labels, train_tf, k, alpha=args.mixup, mode=args.mixup_mode,
                                 smoothing=args.smoothing, seed=args.seed)
    elif mode == "regmixup":
        collator = RegMixupCollator(images, labels, train_tf, k, alpha=args.regmixup, seed=args.seed)
    elif mode == "rankmixup":
        num_mixup = args.num_mixup or (3 if args.loss == "mndcg" else 1)
        collator = RankMixupCollator(images, labels, train_tf, k, alpha=args.rankmixup_alpha, num_mixup=num_mixup,
                                     seed=args.seed)
    else:
        collator = ImageCollator(images, labels, train_tf, seed=args.seed)
    sampler = GlobalBatchSampler(len(images), args.batch_size, accelerator.num_processes, accelerator.process_index,
                                 shuffle=True, seed=args.seed, drop_last=True)
    loader = DataLoader(IndexDataset(len(images)), batch_sampler=sampler, collate_fn=collator,
                        num_workers=args.workers, pin_memory=args.pin_mem,
                        generator=torch.Generator().manual_seed(args.seed))
    return loader, sampler


def _checkpoint_meta_args(args) -> None:
    """For --eval-only: fill options the user did not give from the checkpoint's metadata."""
    state = read_model_meta(args.checkpoint)
    if not state:
        return
    for k, v in state.items():
        if k in ("model", "dataset", "image_column", "label_column", "train_split", "test_split", "val_split",
                 "max_train_samples", "max_test_samples", "seed", "loss", "num_classes", "in_chans", "img_size"):
            if k not in args._explicit and hasattr(args, k):
                setattr(args, k, v)
        if k == "model_kwargs" and "model_kwargs" not in args._explicit:
            args.model_kwargs = [tuple(kv) for kv in v]
        if k in ("mean", "std") and k not in args._explicit:
            setattr(args, k, list(v))


def load_model_weights(model: nn.Module, path) -> None:
    """Load weights from a training-state file (its ``model`` entry), a model file, or any weight file timm's
    ``load_checkpoint`` reads (safetensors or torch)."""
    if is_state_file(path):
        model.load_state_dict(load_state(path)["model"])
        return
    from timm.models import load_checkpoint

    load_checkpoint(model, str(path))


def _load_resumed(args) -> Dict[str, Any]:
    """The training state of ``--resume``, with its stored configuration restored into ``args``."""
    from .training import restore_config

    if not os.path.exists(args.resume):
        raise FileNotFoundError(f"--resume {args.resume} does not exist")
    state = load_state(args.resume)
    meta = state.get("meta") or {}
    if "config" not in meta or "run_id" not in meta:
        raise ValueError(f"--resume {args.resume}: the state stores no run configuration (written by an earlier "
                         "timm-csm); it cannot be resumed, start a new run")
    folder, explicit = Path(args.resume).resolve().parent, set(args._explicit)
    named = Path(args.output) / args.experiment if "experiment" in explicit and args.experiment else None
    if (named is not None and named.resolve() != folder) or (named is None and "output" in explicit and Path(
            args.output).resolve() not in (folder, folder.parent)):
        raise ValueError(f"--resume continues in the resumed run's folder {folder}; --output / --experiment name "
                         f"another ({named or args.output})")
    state["restored"] = restore_config(args, meta["config"])
    return state


def _prepare_args(args) -> Optional[Dict[str, Any]]:
    """Complete and check ``args`` before anything is built: a checkpoint's metadata (eval-only), the configuration
    of a resumed run (``--resume``, or ``--auto-resume`` finding one); returns the resumed state (None: new run)."""
    if args.eval_only:
        if not args.checkpoint:
            raise ValueError("--eval-only needs --checkpoint PATH")
        if not os.path.exists(args.checkpoint):
            raise FileNotFoundError(f"--checkpoint {args.checkpoint} does not exist")
        _checkpoint_meta_args(args)
    elif args.auto_resume and not args.resume and (_experiment_dir(args) / CHECKPOINT_LAST).exists():
        args.resume = str(_experiment_dir(args) / CHECKPOINT_LAST)
    resume_state = _load_resumed(args) if args.resume and not args.eval_only else None
    for name, value in (("batch_size", args.batch_size), ("epochs", args.epochs), ("n_bins", args.n_bins)):
        if value is None or value < (0 if name == "epochs" else 1):
            raise ValueError(f"--{name.replace('_', '-')} must be positive, got {value}")
    return resume_state


def _take_run_dir(args, accelerator, resume_state):
    """(lock, folder, run id): the main process takes the run folder (see :mod:`timm_csm.training.run_dir`), every
    process learns which; the lock is None on the other processes. A refusal is raised on every process."""
    from accelerate.utils import broadcast_object_list

    from .training import claim_run_dir, new_run_id

    lock, message = None, [None, None, None]  # folder, run id, error
    if accelerator.is_main_process:
        try:
            if resume_state is not None:
                run_id = resume_state["meta"]["run_id"]
                lock = claim_run_dir(Path(args.resume).parent, run_id, resumes=run_id)
            else:
                run_id, auto = new_run_id(), args.auto_resume and not args.eval_only
                fixed = args.experiment is not None and Path(args.experiment) == Path(".")
                lock = claim_run_dir(_experiment_dir(args), run_id, numbered=not (fixed or auto),
                                     replace_unfinished=auto)
            message = [str(lock.path), run_id, None]
        except ValueError as e:
            message[2] = str(e)
    broadcast_object_list(message)
    if message[2] is not None:
        raise ValueError(message[2])
    return lock, Path(message[0]), message[1]


def _build(args):
    """Data, loss, batch mode, CSM companions, model and transforms: everything that can fail before training."""
    data = load_data(args)
    k = len(data.class_names)
    if args.num_classes is not None and args.num_classes != k:
        raise ValueError(f"--num-classes {args.num_classes} but the dataset has {k} classes")
    criterion = create_criterion(args, len(data.train)) if not args.eval_only else None
    mode = _mix_mode(args, criterion) if not args.eval_only else "plain"
    companions = None
    if mode == "csm":
        from .data import CSMCompanionSampler

        groups = _load_csm_groups(args, data.class_names)
        companions = CSMCompanionSampler(groups, n_aug=args.n_aug, num_classes=k)
    model = create_train_model(args.model, k, args.in_chans or int(data.train.images.shape[1]), args.img_size,
                               pretrained=args.pretrained, pretrained_path=args.pretrained_path,
                               initial_checkpoint=args.initial_checkpoint, drop=args.drop, drop_path=args.drop_path,
                               model_kwargs=dict(args.model_kwargs or []))
    img_size, in_chans, mean, std = _resolve_input(args, data, getattr(model, "pretrained_cfg", None))
    from .data import create_transforms

    train_tf, eval_tf = create_transforms(img_size, mean, std, in_chans, crop_padding=args.crop_pad,
                                          hflip=args.hflip)
    data_info = {"num_classes": k, "in_chans": in_chans, "img_size": img_size, "mean": list(mean), "std": list(std),
                 "class_names": data.class_names}
    return data, criterion, mode, companions, model, train_tf, eval_tf, data_info


def run(config) -> Dict[str, Any]:
    """Train (unless ``eval_only``) and evaluate; returns the results dict also written to results.json.

    ``config``: an ``argparse.Namespace`` from :func:`parse_args` or a dict of option names (``"batch_size"`` or
    ``"batch-size"``); options not given take the command-line defaults. The run writes into a folder of its own
    (:mod:`timm_csm.training.run_dir`), under a run id recorded in args.yaml, the training states, the model files
    and results.json; ``resume`` continues a run in its folder with its stored configuration.
    """
    args = _resolve_config(config)
    resume_state = _prepare_args(args)
    from accelerate.utils import set_seed

    import timm_csm  # noqa: F401  (registers models)

    _check_model_name(args.model)
    if not args.eval_only:
        from .losses import get_loss_entrypoint

        get_loss_entrypoint(args.loss)  # unknown names list the registered losses
    accelerator = _make_accelerator(args, None)
    _check_resumed_processes(resume_state, accelerator)
    set_seed(args.seed)
    data, criterion, mode, companions, model, train_tf, eval_tf, data_info = _build(args)
    lock, out_dir, args._run_id = _take_run_dir(args, accelerator, resume_state)
    try:
        if args.log_with:  # trackers write into the run folder, known only now
            accelerator = _make_accelerator(args, out_dir)
        from .training import config_record

        meta = dict(_model_meta(args, data_info), run_id=args._run_id, config=config_record(args),
                    num_processes=accelerator.num_processes)
        if accelerator.is_main_process:
            import yaml

            write_text_atomic(out_dir / "args.yaml", yaml.safe_dump(dict(run_id=args._run_id, **meta["config"]),
                                                                    sort_keys=False))
        eval_bs = args.validation_batch_size or args.batch_size
        val_loader = _eval_loader(data.val, eval_tf, eval_bs, args, accelerator) if len(data.val) else None
        test_loader = _eval_loader(data.test, eval_tf, eval_bs, args, accelerator)
        history: List[Dict[str, Any]] = []
        best: Dict[str, Any] = {"value": None, "epoch": None, "metric": args.select_by}
        if not args.eval_only:
            history, best = _train(args, mode, model, criterion, data, train_tf, accelerator, out_dir, meta,
                                   companions, val_loader, resume_state)
            accelerator.wait_for_everyone()
            weights_path = _load_best(model, out_dir, best, args._run_id)
        else:
            load_model_weights(model, args.checkpoint)
            weights_path = Path(args.checkpoint)
        model = model.to(accelerator.device)
        results = _evaluate(args, model, val_loader, test_loader, accelerator, out_dir, data, best, weights_path)
        results["history"] = history
        accelerator.wait_for_everyone()
        for tracker in accelerator.trackers:
            tracker.finish()
        return results
    finally:
        if lock is not None:
            lock.release()


def _check_resumed_processes(resume_state, accelerator) -> None:
    """A resumed run continues on as many processes as it was trained on; say which options it took back."""
    trained_on = (resume_state or {}).get("meta", {}).get("num_processes", accelerator.num_processes)
    if trained_on != accelerator.num_processes:
        raise ValueError(f"--resume: the run was trained on {trained_on} processes, this launch has "
                         f"{accelerator.num_processes}; --batch-size is per process, so the global batch would "
                         f"change. Launch {trained_on} processes")
    restored = (resume_state or {}).get("restored")
    if restored:
        accelerator.print(f"--resume: {', '.join(restored)} taken from the resumed run's configuration")


def _load_best(model, out_dir: Path, best: Dict[str, Any], run_id: str) -> Optional[Path]:
    """Load this run's best checkpoint into ``model``; its path, or None when no epoch was selected (the model is
    evaluated as it is, e.g. ``--epochs 0``). A model file of another run or epoch is an error, never evaluated."""
    if best.get("epoch") is None:
        return None
    path = out_dir / CHECKPOINT_BEST
    meta = (read_model_meta(path) if path.exists() else None) or {}
    found = (meta.get("run_id"), meta.get("epoch"))
    if found != (run_id, best["epoch"]):
        raise ValueError(f"{path} is not this run's best checkpoint: it holds run {found[0]}, epoch {found[1]}; "
                         f"expected run {run_id}, epoch {best['epoch']}")
    load_model_weights(model, path)
    return path


def _probe_schedule(args, epochs: int) -> Dict[str, Any]:
    """The state of a fresh schedule of ``epochs`` epochs (on a throw-away optimizer)."""
    probe = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=args.lr)
    return _create_scheduler(argparse.Namespace(**dict(vars(args), epochs=epochs)), probe).state_dict()


def _restore_scheduler(args, scheduler, resume_state, start_epoch: int, accelerator) -> None:
    """Load the resumed scheduler state. When ``--epochs`` extends the run, the schedule is rebuilt for the new
    total: the settings that depend on the number of epochs (a cosine's length, ...) are those of a schedule of
    ``--epochs`` epochs, and the next epoch takes that schedule's lr; trained epochs keep the lr they had."""
    planned = int(resume_state["meta"]["config"]["epochs"])
    state = dict(resume_state["scheduler"])
    changed = {}
    if args.epochs != planned:
        old = _probe_schedule(args, planned)
        changed = {k: v for k, v in _probe_schedule(args, args.epochs).items() if k not in old or old[k] != v}
    scheduler.load_state_dict(dict(state, **changed))
    if changed:
        scheduler.step(start_epoch)
        accelerator.print(f"--epochs {args.epochs} extends the run from {planned} epochs: the {args.sched} schedule "
                          f"is rebuilt for {args.epochs} epochs; epoch {start_epoch} starts at lr "
                          f"{scheduler.optimizer.param_groups[0]['lr']:.6g}")
    elif args.epochs != planned:
        accelerator.print(f"--epochs {args.epochs} extends the run from {planned} epochs: the {args.sched} schedule "
                          "does not depend on the number of epochs and continues as it was")


def _train(args, mode, model, criterion, data, train_tf, accelerator, out_dir, meta, companions, val_loader,
           resume_state):
    from .metrics import calibration_metrics

    optimizer = _create_optimizer(args, model)
    scheduler = _create_scheduler(args, optimizer)
    start_epoch = 0
    history: List[Dict[str, Any]] = []
    best: Dict[str, Any] = {"value": None, "epoch": None, "metric": args.select_by}
    if resume_state is not None:
        model.load_state_dict(resume_state["model"])
        optimizer.load_state_dict(resume_state["optimizer"])
        start_epoch = int(resume_state["epoch"]) + 1
        _restore_scheduler(args, scheduler, resume_state, start_epoch, accelerator)
        criterion.load_state_dict(resume_state["loss"])
        _set_rng_state(resume_state["rng"])
        history = list(resume_state["history"])
        best = dict(resume_state["best"])
    criterion = criterion.to(accelerator.device)
    train_module = TrainingModule(model)
    train_module, optimizer = accelerator.prepare(train_module, optimizer)
    loader, sampler = _build_train_loader(args, mode, data, train_tf, accelerator, companions)
    regmix_loss = None
    if mode == "regmixup":
        from .losses import create_loss

        regmix_loss = create_loss("ce")
    if args.log_with:
        cfg = {kk: v for kk, v in vars(args).items()
               if not kk.startswith("_") and isinstance(v, (int, float, str, bool))}
        accelerator.init_trackers(out_dir.name, config=cfg)
    select_key = _SELECT[args.select_by][0]
    for epoch in range(start_epoch, args.epochs):
        t0 = time.time()
        sampler.set_epoch(epoch)
        lr = optimizer.param_groups[0]["lr"]
        row: Dict[str, Any] = {"epoch": epoch, "lr": lr}
        row.update(_train_one_epoch(args, mode, train_module, model, criterion, optimizer, loader, accelerator,
                                    epoch, regmix_loss))
        if hasattr(criterion, "sync"):  # per-sample loss state (ASLP) written by each process for its samples
            criterion.sync(accelerator)
        if val_loader is not None:
            val_logits, val_y = predict(model, val_loader, accelerator)
            row.update(_metric_row("val", calibration_metrics(val_logits, val_y, n_bins=args.n_bins)))
            if hasattr(criterion, "on_epoch_end"):
                criterion.on_epoch_end(val_logits.to(accelerator.device), val_y.to(accelerator.device))
        scheduler.step(epoch + 1, row.get(select_key))
        row["epoch_time"] = round(time.time() - t0, 3)
        history.append(row)
        improved = _is_better(row.get(select_key, 0.0), best["value"], args.select_by) if val_loader is not None \
            else True
        if improved:
            best = {"value": row.get(select_key), "epoch": epoch, "metric": args.select_by}
        if accelerator.is_main_process:
            if improved:
                save_model_file(out_dir / CHECKPOINT_BEST, model.state_dict(), dict(meta, epoch=epoch, best=best))
            _save_training_state(out_dir / CHECKPOINT_LAST, model, optimizer, scheduler, criterion, epoch, best,
                                 history, meta)
            if args.checkpoint_hist > 0:
                _save_training_state(out_dir / f"checkpoint-{epoch}.safetensors", model, optimizer, scheduler,
                                     criterion, epoch, best, history, meta)
                stale = out_dir / f"checkpoint-{epoch - args.checkpoint_hist}.safetensors"
                if stale.exists():
                    stale.unlink()
            _write_log(out_dir, history)
            shown = {kk: (round(v, 4) if isinstance(v, float) else v) for kk, v in row.items()
                     if kk in ("epoch", "lr", "train_loss", "val_accuracy", "val_ece", "val_nll", "epoch_time")}
            accelerator.print(json.dumps(shown))
        if args.log_with:
            accelerator.log({kk: v for kk, v in row.items() if isinstance(v, (int, float))}, step=epoch)
        accelerator.wait_for_everyone()
    return history, best


# ---------------------------------------------------------------------------------------------------------------
# evaluation and reports
# ---------------------------------------------------------------------------------------------------------------
_REPORT_ROWS = (("accuracy", "Accuracy (%)", 100), ("ece", "ECE (%)", 100), ("aece", "AECE (%)", 100),
                ("cece", "Classwise ECE (%)", 100), ("mce", "MCE (%)", 100), ("oe", "Over-confidence (%)", 100),
                ("ue", "Under-confidence (%)", 100), ("nll", "NLL", 1), ("brier", "Brier", 1),
                ("piece", "PIECE (%)", 100))


def _fmt(v, scale):
    return "-" if v is None else f"{v * scale:.2f}" if scale == 100 else f"{v:.4f}"


def results_markdown(results: Dict[str, Any]) -> str:
    """A markdown report: a one-line summary table to paste, then every metric before and after TS."""
    pre, post = results["test"]["pre_ts"], results["test"].get("post_ts")
    t = results.get("temperature")
    lines = [f"# {results['model']} on {results['dataset']} ({results['loss']})", ""]
    lines += ["| dataset | model | loss | acc | ECE | AECE | ECE (TS) | AECE (TS) | T |",
              "|---|---|---|---|---|---|---|---|---|",
              f"| {results['dataset']} | {results['model']} | {results['loss']} | {_fmt(pre['accuracy'], 100)} | "
              f"{_fmt(pre['ece'], 100)} | {_fmt(pre['aece'], 100)} | "
              f"{_fmt(post['ece'] if post else None, 100)} | {_fmt(post['aece'] if post else None, 100)} | "
              f"{'-' if t is None else f'{t:.2f}'} |", ""]
    lines += [f"Test split: {results['n_test']} images; temperature fitted on {results['n_val']} validation "
              f"images ({results['ts_method']}); {results['n_bins']} bins; checkpoint: epoch "
              f"{results.get('checkpoint_epoch')} selected by validation {results.get('select_by')}; run "
              f"{results.get('run_id')}.", ""]
    lines += ["| metric | before TS | after TS |", "|---|---|---|"]
    for key, label, scale in _REPORT_ROWS:
        if key in pre:
            lines.append(f"| {label} | {_fmt(pre.get(key), scale)} | {_fmt(post.get(key) if post else None, scale)} |")
    return "\n".join(lines) + "\n"


def _piece(test_logits, test_y, test_feats, ref_feats, n_bins: int, prox=None) -> Tuple[float, torch.Tensor]:
    """PIECE of the test logits; proximity to the validation features (the calibration set), as ProCal."""
    from .metrics import piece, proximity

    if prox is None:
        prox = proximity(test_feats, ref_feats)
    return float(piece(test_logits, test_y, test_feats, n_conf_bins=n_bins, prox=prox)), prox


def _evaluate(args, model, val_loader, test_loader, accelerator, out_dir: Path, data: DataSplits,
              best: Dict[str, Any], weights_path) -> Dict[str, Any]:
    from .metrics import calibration_metrics

    want_feats = bool(args.piece)
    test_out = predict(model, test_loader, accelerator, features=want_feats)
    test_logits, test_y = test_out[0], test_out[1]
    pre = calibration_metrics(test_logits, test_y, n_bins=args.n_bins)
    results: Dict[str, Any] = {
        "dataset": str(args.dataset), "model": args.model, "loss": args.loss, "n_train": len(data.train),
        "n_val": len(data.val), "n_test": len(data.test), "n_bins": args.n_bins, "ts_method": args.ts_method,
        "select_by": args.select_by, "checkpoint": None if weights_path is None else str(weights_path),
        "checkpoint_epoch": best.get("epoch"),
        "num_processes": accelerator.num_processes, "output_dir": str(out_dir), "run_id": args._run_id,
        "temperature": None, "test": {"pre_ts": {k: float(v) for k, v in pre.items()}, "post_ts": None},
        "val": None,
    }
    post_logits, ts = None, None
    if val_loader is not None:
        from .calibration import TemperatureScaling

        val_out = predict(model, val_loader, accelerator, features=want_feats)
        val_logits, val_y = val_out[0], val_out[1]
        results["val"] = {"pre_ts": {k: float(v) for k, v in
                                     calibration_metrics(val_logits, val_y, n_bins=args.n_bins).items()},
                          "post_ts": None}
        try:
            ts = TemperatureScaling(method=args.ts_method, n_bins=args.n_bins).fit(val_logits, val_y)
        except ValueError as e:  # e.g. fewer validation samples than classes: report pre-TS metrics only
            warnings.warn(f"temperature scaling skipped: {e}")
        if ts is not None:
            post_logits = ts.transform(test_logits)
            results["temperature"] = float(ts.temperature)
            results["test"]["post_ts"] = {k: float(v) for k, v in
                                          calibration_metrics(post_logits, test_y, n_bins=args.n_bins).items()}
            results["val"]["post_ts"] = {k: float(v) for k, v in calibration_metrics(
                ts.transform(val_logits), val_y, n_bins=args.n_bins).items()}
            if accelerator.is_main_process:
                ts.save(str(out_dir / "temperature.safetensors"))
        if want_feats:
            val_feats, test_feats = val_out[2], test_out[2]
            value, prox = _piece(test_logits, test_y, test_feats, val_feats, args.n_bins)
            results["test"]["pre_ts"]["piece"] = value
            if post_logits is not None:
                results["test"]["post_ts"]["piece"] = _piece(post_logits, test_y, test_feats, val_feats,
                                                             args.n_bins, prox)[0]
    elif want_feats:
        warnings.warn("--piece needs a validation split (the reference set of the proximity); skipped")
    if accelerator.is_main_process:
        out_dir.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out_dir / "results.json", json.dumps(results, indent=2))
        write_text_atomic(out_dir / "results.md", results_markdown(results))
        # test logits and labels, so that reports can redraw or re-score them without the model
        save_model_file(out_dir / "test_predictions.safetensors", {"logits": test_logits, "targets": test_y},
                        {"temperature": results["temperature"], "run_id": args._run_id})
        _reliability_plots(out_dir, test_logits, test_y, post_logits, results, args.n_bins)
        accelerator.print(results_markdown(results))
    return results


def _reliability_plots(out_dir: Path, test_logits, test_y, post_logits, results, n_bins: int) -> None:
    try:
        from .metrics.plots import reliability_diagram, reliability_diagrams
    except ImportError as e:  # matplotlib is an optional extra
        warnings.warn(f"reliability diagrams skipped ({e})")
        return
    name = f"{results['model']} / {results['loss']}"
    reliability_diagram(test_logits, test_y, str(out_dir / "reliability_before.png"), n_bins=n_bins,
                        title=f"{name}: before TS")
    if post_logits is not None:
        t = results["temperature"]
        reliability_diagram(post_logits, test_y, str(out_dir / "reliability_after.png"), n_bins=n_bins,
                            title=f"{name}: after TS (T={t:.2f})")
        reliability_diagrams({"before TS": (test_logits, test_y), f"after TS (T={t:.2f})": (post_logits, test_y)},
                             str(out_dir / "reliability.png"), n_bins=n_bins)


def evaluate_checkpoint(checkpoint, **options) -> Dict[str, Any]:
    """Evaluate a saved checkpoint (``--eval-only --checkpoint``); ``options`` as in :func:`run`."""
    return run(dict(options, eval_only=True, checkpoint=str(checkpoint)))


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """Command-line entry point (``train.py`` / ``accelerate launch train.py``)."""
    try:
        return run(parse_args(argv))
    except (ValueError, FileNotFoundError) as e:
        print(f"train.py: error: {e}", file=sys.stderr)
        raise SystemExit(2)
    finally:
        end_process_group()


def end_process_group() -> None:
    """Destroy the default ``torch.distributed`` process group if one is initialised (no-op otherwise).

    A process that exits with a live gloo group can abort (SIGABRT): gloo's worker thread
    (``ProcessGroupGloo::runLoop``) frees the last work object while the interpreter finalises. Entry points call
    this before they exit, also on errors, as accelerate's ``Accelerator.end_training`` does.
    """
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
