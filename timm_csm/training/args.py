"""The command line of ``train.py``: the grouped argument parser, YAML configs (``-c FILE``) and run configs.

Flag names follow timm's ``train.py`` where they overlap. A YAML file gives defaults (keys are flag names, with
``-`` or ``_``); flags override it. The file may be a run's own args.yaml (it reads back to the same configuration;
its :data:`CONFIG_MARKER` key tells it apart), a hand-written one (an unknown key is an error naming it), or the
args.yaml timm's ``train.py`` writes per run: the options both scripts share are taken
(:mod:`~timm_csm.training.timm_args`), timm's others are named in one warning and ignored. :func:`resolve_config` completes a ``dict`` or hand-built ``Namespace`` with the
defaults and records which options were given explicitly (``_explicit``), so that ``--eval-only`` can fill the rest
from a checkpoint and ``--resume`` can refuse conflicting ones.
"""
from __future__ import annotations

import argparse
import difflib
import warnings
from typing import Any, Dict, Optional, Sequence, Tuple

from ..io import read_model_meta
from .timm_args import TIMM_TRAIN_KEYS, from_timm_args

__all__ = ["PAPER_SEED", "CONFIG_MARKER", "TIMM_TRAIN_KEYS", "HelpFormatter", "build_parser", "parse_args",
           "resolve_config", "fill_from_checkpoint", "upgrade_stored_config"]

PAPER_SEED = 12345
#: the key that marks the args.yaml a run writes (its value: the timm-csm version)
CONFIG_MARKER = "timm_csm_version"
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


def _add_dataset(p: argparse.ArgumentParser) -> None:
    """The "Dataset" flags."""
    g = p.add_argument_group("Dataset")
    g.add_argument("--dataset", default="cifar10",
                   help="fashion_mnist, digits, cifar10, cifar100, or a Hugging Face dataset name or folder")
    g.add_argument("--train-split", default="train", help="split to train on")
    g.add_argument("--val-split", default=None,
                   help="split used as the validation set (checkpoint selection, temperature scaling) instead of "
                        "holding out --val-fraction of the training split")
    g.add_argument("--test-split", default=None,
                   help="split to report test metrics on (default: 'test', else 'validation', else 'val')")
    g.add_argument("--image-column", default=None, help="image column (detected when omitted)")
    g.add_argument("--label-column", default=None, help="label column (detected when omitted)")
    g.add_argument("--val-fraction", type=float, default=0.1,
                   help="fraction of the training split held out (seeded) for validation and temperature scaling "
                        "when no --val-split is given")
    g.add_argument("--max-train-samples", type=int, default=None,
                   help="use a seeded random subset of this many training images (before the validation split)")
    g.add_argument("--val-size", type=int, default=None,
                   help="draw this many validation images from the training split outside the training subset "
                        "(before --max-train-samples, with --data-seed), instead of holding out --val-fraction of "
                        "the subset: every --max-train-samples and --seed then shares one validation set")
    g.add_argument("--data-seed", type=int, default=None,
                   help="seed of the data draws (training and test subsets, validation images); default: --seed. "
                        "Fix it to vary only the training (initialisation, order, augmentation) across seeds")
    g.add_argument("--max-test-samples", type=int, default=None, help="use a seeded subset of the test split")
    g.add_argument("--data-dir", default=None, help="root folder of a timm torch/<name> dataset (torchvision files)")
    g.add_argument("-j", "--workers", type=int, default=0, help="DataLoader worker processes")
    g.add_argument("--pin-mem", action="store_true", help="pin CPU memory of batches (GPU training)")


def _add_model(p: argparse.ArgumentParser) -> None:
    """The "Model" flags."""
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
    g.add_argument("--std", type=float, nargs="+", default=None, help="normalisation std (default: as --mean)")
    g.add_argument("--drop", type=float, default=0.0, help="dropout rate before the classifier")
    g.add_argument("--drop-path", type=float, default=None,
                   help="drop-path rate (models that support it; default: the model's)")
    g.add_argument("--model-kwargs", nargs="*", type=_key_value, default=[], metavar="KEY=VALUE",
                   help="extra keyword arguments for timm.create_model")
    g.add_argument("--sync-bn", action="store_true",
                   help="batch-norm statistics over the global batch of all processes (torch's SyncBatchNorm on "
                        "CUDA, an all-reduce batch norm elsewhere); one process: no change")
    g.add_argument("--channels-last", action="store_true", help="model and inputs in torch.channels_last layout")
    g.add_argument("--model-ema", action="store_true",
                   help="keep an exponential moving average of the weights (timm's ModelEmaV3); validation, "
                        "model_best and the test evaluation use it")
    g.add_argument("--model-ema-decay", type=float, default=0.9998, help="decay of --model-ema")
    g.add_argument("--model-ema-warmup", action="store_true",
                   help="warm the --model-ema decay up over the first updates (timm's schedule)")


def _add_optimizer(p: argparse.ArgumentParser) -> None:
    """The "Optimizer and schedule" flags."""
    g = p.add_argument_group("Optimizer and schedule")
    g.add_argument("-b", "--batch-size", type=int, default=128, help="real images per process and step")
    g.add_argument("-vb", "--validation-batch-size", type=int, default=None,
                   help="evaluation batch size (default: --batch-size)")
    g.add_argument("--grad-accum-steps", type=int, default=1,
                   help="batches per optimizer update (the update's batch: steps x processes x --batch-size)")
    g.add_argument("--epochs", type=int, default=200, help="epochs to train")
    g.add_argument("--opt", default="momentum",
                   help="timm optimizer name; 'momentum' is SGD without Nesterov (the paper), 'sgd' is Nesterov")
    g.add_argument("--lr", type=float, default=0.1, help="base learning rate")
    g.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    g.add_argument("--weight-decay", type=float, default=5e-4, help="weight decay")
    g.add_argument("--filter-bias-and-bn", action=argparse.BooleanOptionalAction, default=False,
                   help="exempt biases and norm weights from weight decay (timm's default; the paper decays all)")
    g.add_argument("--clip-grad", type=float, default=2.0, help="gradient clipping threshold (0 or less: off)")
    g.add_argument("--clip-mode", default="norm", choices=("norm", "value"),
                   help="clip the gradients' global norm or each value")
    g.add_argument("--sched", default="multistep", help="timm scheduler: multistep, step, cosine, plateau, ...")
    g.add_argument("--decay-milestones", type=int, nargs="+", default=[80, 120],
                   help="multistep: epochs where the learning rate is multiplied by --decay-rate")
    g.add_argument("--decay-epochs", type=float, default=100, help="period of the 'step' scheduler")
    g.add_argument("--decay-rate", type=float, default=0.1, help="factor of each learning-rate decay")
    g.add_argument("--warmup-epochs", type=int, default=0, help="epochs of linear learning-rate warm-up")
    g.add_argument("--warmup-lr", type=float, default=1e-5, help="learning rate the warm-up starts from")
    g.add_argument("--min-lr", type=float, default=0.0, help="lowest learning rate of the schedule")


def _add_input(p: argparse.ArgumentParser) -> None:
    """The "Input and transforms" flags: the pad-crop recipe's and timm's train transform's (same names)."""
    g = p.add_argument_group("Input and transforms")
    g.add_argument("--input-size", type=int, nargs=3, default=None, metavar="N",
                   help="input (channels, height, width), as timm: sets --in-chans and --img-size (square)")
    g.add_argument("--transform", default="auto", choices=("auto", "cifar", "timm"),
                   help="cifar: resize, zero-padded random crop, flip (the paper's CIFAR recipe, batched); timm: "
                        "timm.data.create_transform (RandomResizedCrop, --aa, --reprob, ...); auto: timm's when one "
                        "of its flags is given or the input is at least 96 px")
    g.add_argument("--no-aug", action="store_true", help="train on the eval transform (no augmentation)")
    g.add_argument("--hflip", type=float, default=0.5, help="horizontal flip probability")
    g.add_argument("--crop-pad", type=int, default=4, help="cifar: zero padding of the random crop (0: no crop)")
    g.add_argument("--scale", type=float, nargs=2, default=[0.08, 1.0], metavar="PCT",
                   help="timm: RandomResizedCrop area range")
    g.add_argument("--ratio", type=float, nargs=2, default=[3.0 / 4.0, 4.0 / 3.0], metavar="RATIO",
                   help="timm: RandomResizedCrop aspect-ratio range")
    g.add_argument("--vflip", type=float, default=0.0, help="timm: vertical flip probability")
    g.add_argument("--color-jitter", type=float, default=0.4, help="timm: colour jitter factor (off with --aa)")
    g.add_argument("--aa", default=None, help="timm: AutoAugment / RandAugment policy, e.g. rand-m9-mstd0.5")
    g.add_argument("--reprob", type=float, default=0.0, help="timm: random erasing probability")
    g.add_argument("--remode", default="pixel", help="timm: random erasing mode")
    g.add_argument("--recount", type=int, default=1, help="timm: random erasing count")
    g.add_argument("--interpolation", default="", help="timm: eval resize interpolation (default: the model's)")
    g.add_argument("--train-interpolation", default="random", help="timm: train crop interpolation")
    g.add_argument("--crop-pct", type=float, default=None, help="timm: eval centre-crop fraction (default: the model's)")


def _add_mixing(p: argparse.ArgumentParser) -> None:
    """The "Augmentation and mixing" flags."""
    g = p.add_argument_group("Augmentation and mixing")
    g.add_argument("--smoothing", type=float, default=0.0,
                   help="label smoothing: with --loss ce it selects the 'ls' loss; with --mixup it smooths the "
                        "mixed targets")
    g.add_argument("--mixup", type=float, default=0.0, help="Mixup alpha (0: off); trains on mixed images only")
    g.add_argument("--mixup-mode", default="batch", choices=("batch", "pair", "elem"),
                   help="one lambda per batch, per pair (timm's Mixup only) or per image")
    g.add_argument("--cutmix", type=float, default=0.0,
                   help="CutMix alpha (0: off), through timm's Mixup, with --mixup as its mixup alpha")
    g.add_argument("--cutmix-minmax", type=float, nargs=2, default=None, help="timm Mixup: CutMix box ratio range")
    g.add_argument("--mixup-prob", type=float, default=1.0, help="timm Mixup: probability of mixing a batch")
    g.add_argument("--mixup-switch-prob", type=float, default=0.5,
                   help="timm Mixup: probability of CutMix instead of Mixup when both are on")
    g.add_argument("--regmixup", type=float, default=0.0,
                   help="RegMixup alpha (0: off; 20 for CIFAR-10, 10 for CIFAR-100)")
    g.add_argument("--regmixup-weight", type=float, default=1.0, help="weight eta of RegMixup's mixed term")
    g.add_argument("--regmixup-reduction", default="mean", choices=("mean", "sum"),
                   help="RegMixup: 'mean' (clean + eta * mixed) / 2, the released code's mean over the 2B batch; "
                        "'sum' clean + eta * mixed, the paper's equation")
    g.add_argument("--rankmixup-alpha", type=float, default=2.0, help="Mixup alpha of RankMixup losses (mrl, mndcg)")
    g.add_argument("--num-mixup", type=int, default=None,
                   help="mixed copies per sample for RankMixup losses (default: 1 for mrl, 3 for mndcg)")


def _add_calibration(p: argparse.ArgumentParser) -> None:
    """The "Calibration" flags."""
    g = p.add_argument_group("Calibration")
    g.add_argument("--loss", default="ce", help="registered loss (timm_csm.losses.list_losses())")
    g.add_argument("--loss-kwargs", nargs="*", type=_key_value, default=[], metavar="KEY=VALUE",
                   help="keyword arguments of the loss, e.g. --loss-kwargs margin=6 alpha=0.1")
    g.add_argument("--csm-dataset", default=None,
                   help="generated CSM dataset (Hub name or folder); required by the csm losses")
    g.add_argument("--teacher", default=None,
                   help="teacher of --loss kd: a reference-encoder folder or a trained run folder / model file")
    g.add_argument("--n-aug", type=int, default=1, help="interior group members per real image besides the endpoint")
    g.add_argument("--csm-weight", type=float, default=1.0, help="weight of the generated-batch term of CSM")
    g.add_argument("--ts-method", default="grid_ece", choices=("grid_ece", "nll"),
                   help="temperature fit on the validation split: grid 0.1..10 by ECE (paper) or NLL (Guo)")
    g.add_argument("--n-bins", type=int, default=15, help="confidence bins of ECE-type metrics")
    g.add_argument("--select-by", default="acc", choices=("acc", "nll", "ece"),
                   help="validation metric that picks the best checkpoint")
    g.add_argument("--piece", action="store_true",
                   help="also report the proximity-informed ECE (PIECE) from penultimate features")


def _add_output(p: argparse.ArgumentParser) -> None:
    """The "Checkpoints and output" flags."""
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
    g.add_argument("--log-with", default=None,
                   help="accelerate trackers, comma-separated (tensorboard, wandb, ..., all); each must be installed")
    g.add_argument("--log-wandb", action="store_true", help="log to Weights & Biases (as --log-with wandb)")
    g.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                   help="progress bar on the main process")


def _add_run(p: argparse.ArgumentParser) -> None:
    """The "Run" flags."""
    g = p.add_argument_group("Run")
    g.add_argument("--seed", type=int, default=PAPER_SEED,
                   help="seed of the initialisation, the validation split, augmentation and companions")
    g.add_argument("--amp", action="store_true", help="mixed precision (accelerate); see --amp-dtype")
    g.add_argument("--amp-dtype", default="float16", choices=("float16", "bfloat16"), help="precision of --amp")
    g.add_argument("--cpu", action="store_true", help="train on the CPU even when an accelerator is present")
    g.add_argument("--torchcompile", nargs="?", const="inductor", default=None, metavar="BACKEND",
                   help="torch.compile the training forward with this backend (the flag alone: inductor)")
    g.add_argument("--torchcompile-mode", default=None,
                   help="torch.compile mode, e.g. reduce-overhead (default: torch's)")

class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The ``--help`` of every timm-csm command: the description as written, and each option's help ending with its
    default once: not when the help says it in words (or ``BooleanOptionalAction`` added it), nor for a switch,
    which is off unless given."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text or "when omitted" in text or not action.option_strings or (
                action.default is argparse.SUPPRESS) or (
                action.nargs == 0 and action.default is False):
            return text
        return f"{text} (default: {'none' if action.default in (None, '') else '%(default)s'})"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; flag names follow timm's train.py where they overlap."""
    p = argparse.ArgumentParser(
        formatter_class=HelpFormatter,
        description="Train a timm classifier with a calibration loss (CSM and baselines); evaluate its calibration\n"
                    "before and after temperature scaling. Several processes: accelerate launch -m timm_csm.train ...")
    p.add_argument("-c", "--config", default=None, metavar="FILE",
                   help="YAML file of defaults (keys are the flag names, with - or _); flags override it")
    for add_group in (_add_dataset, _add_model, _add_input, _add_optimizer, _add_mixing, _add_calibration, _add_output,
                      _add_run):
        add_group(p)
    return p


def _dest_names(parser: argparse.ArgumentParser) -> Dict[str, argparse.Action]:
    return {a.dest: a for a in parser._actions if a.dest not in ("help",)}


def _option_key(key) -> str:
    """An option name as its ``dest``: ``--batch-size`` / ``batch-size`` / ``batch_size`` -> ``batch_size``."""
    return str(key).lstrip("-").replace("-", "_")


def _load_yaml_config(path: str, parser: argparse.ArgumentParser) -> Dict[str, Any]:
    """The options of YAML file ``path``: a run's args.yaml (marked by :data:`CONFIG_MARKER`) or a hand-written file
    (unknown keys are errors naming them), or timm's args.yaml (see :func:`_from_timm`)."""
    import yaml

    with open(path) as f:
        cfg = yaml.safe_load(f) or {}
    if not isinstance(cfg, dict):
        raise ValueError(f"config {path} must be a mapping of flag names to values")
    ours = cfg.pop(CONFIG_MARKER, None) is not None
    for key in ("run_id", "config"):  # a run's id stays with that run; the config file is this invocation's
        cfg.pop(key, None)
    cfg = upgrade_stored_config(cfg)
    if not ours and set(map(_option_key, cfg)) & (TIMM_TRAIN_KEYS - set(_dest_names(parser))):
        cfg, ignored = from_timm_args({_option_key(k): v for k, v in cfg.items()})
        if ignored:
            warnings.warn(f"config {path} is a timm train.py args.yaml; its options without a counterpart here "
                          f"are ignored: {', '.join(sorted(ignored))}", UserWarning, stacklevel=3)
    return _normalise_keys(cfg, parser, f"config {path}")


def _normalise_keys(cfg: Dict[str, Any], parser: argparse.ArgumentParser, where: str) -> Dict[str, Any]:
    dests = _dest_names(parser)
    out, unknown = {}, []
    for k, v in cfg.items():
        key = _option_key(k)
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
    from_file = _load_yaml_config(known.config, parser) if known.config else {}
    parser.set_defaults(**from_file)
    args = parser.parse_args(argv)
    # which options were given explicitly (flags or config): eval-only lets a checkpoint's metadata fill the rest
    probe = build_parser()
    for action in probe._actions:
        action.default = argparse.SUPPRESS
    explicit = set(vars(probe.parse_args(argv)).keys())
    explicit |= set(from_file)
    args._explicit = sorted(explicit - {"config"})
    return args


def resolve_config(config) -> argparse.Namespace:
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


def upgrade_stored_config(cfg: Dict[str, Any]) -> Dict[str, Any]:
    """A stored configuration (args.yaml, a training state's or a model file's metadata) in today's option names:
    runs before ``--val-fraction`` stored the held-out fraction as a number under ``val_split``."""
    cfg = dict(cfg)
    if isinstance(cfg.get("val_split"), (int, float)) and not isinstance(cfg["val_split"], bool):
        cfg.setdefault("val_fraction", float(cfg.pop("val_split")))
        cfg["val_split"] = None
    return cfg


# the run options stored with every model file and training state (``model_kwargs`` besides), which an eval-only
# run takes from its checkpoint when they are not given
RUN_META_KEYS = ("model", "dataset", "image_column", "label_column", "train_split", "test_split", "val_split",
                 "val_fraction", "val_size", "max_train_samples", "max_test_samples", "seed", "data_seed", "loss")


def fill_from_checkpoint(args) -> Dict[str, Any]:
    """For --eval-only: fill options the user did not give from the checkpoint's metadata; returns the run-data
    options so taken (``RUN_META_KEYS`` that were set), for the log."""
    state = upgrade_stored_config(read_model_meta(args.checkpoint) or {})
    taken = {}
    for k, v in state.items():
        if k in RUN_META_KEYS or k in ("num_classes", "in_chans", "img_size"):
            if k not in args._explicit and hasattr(args, k):
                setattr(args, k, v)
                if k in RUN_META_KEYS and v is not None:
                    taken[k] = v
        if k == "model_kwargs" and "model_kwargs" not in args._explicit:
            args.model_kwargs = [tuple(kv) for kv in v]
        if k in ("mean", "std") and k not in args._explicit:
            setattr(args, k, list(v))
    return taken
