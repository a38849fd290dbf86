"""The configuration of a training run: :class:`TrainConfig`, one typed field per option of ``timm-csm-train``.

Every field carries its flag's help and argparse settings in its metadata (:func:`timm_csm.options.option`, the
mechanism of every configuration of the package), and :func:`~timm_csm.training.args.build_parser` builds the command
line from them (the shape of Hugging Face's ``HfArgumentParser`` over ``TrainingArguments``): the options, their
types and defaults are written once. A
configuration comes from the command line (:func:`~timm_csm.training.args.parse_args`), a dict
(:meth:`TrainConfig.from_dict`), a YAML file (:meth:`TrainConfig.from_yaml`) or Python
(``TrainConfig(dataset="digits", epochs=5)``); the functions of :mod:`timm_csm.training` take it.

A YAML file gives options by flag name (with ``-`` or ``_``). It may be a run's own args.yaml (it reads back to the
same configuration; its :data:`CONFIG_MARKER` key tells it apart), a hand-written one (an unknown key is an error
naming the closest option), or the args.yaml timm's ``train.py`` writes per run: the options both scripts share are
taken (:mod:`~timm_csm.training.timm_args`), timm's others are named in one warning and ignored.

``explicit`` records which options were given (flags, file keys, dict keys), so that ``--eval-only`` can fill the
rest from a checkpoint and ``--resume`` can refuse conflicting ones; a configuration built in Python counts the
options that differ from their defaults.
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, FrozenSet, List, Mapping, Optional, Tuple

from ..calibration.temperature import PAPER_TEMPERATURE_METHOD, TEMPERATURE_METHODS
from ..metrics.binning import DEFAULT_N_BINS
from ..options import comma_separated, key_value, option, option_types as _field_types
from .checkpoint import SELECT_METRICS
from .timm_args import TIMM_TRAIN_KEYS, from_timm_args

__all__ = ["PAPER_SEED", "TRAINING_TEMPERATURE_METHOD", "PAPER_TEMPERATURE_METHOD", "CONFIG_MARKER", "CSM_FORWARDS",
           "TrainConfig", "option", "option_names", "option_types", "read_yaml_options", "upgrade_stored_config"]

PAPER_SEED = 12345
#: the temperature fit of a training run unless it names one: the NLL (Guo et al.), a smooth objective whose
#: minimum moves little between resamples of a few hundred validation images, where the paper's grid-ECE rule
#: (``grid_ece``) can jump (a 250-image validation split chose T = 0.30 by ECE, 0.75 by NLL)
TRAINING_TEMPERATURE_METHOD = "nll"
#: the key that marks the args.yaml a run writes (its value: the timm-csm version)
CONFIG_MARKER = "timm_csm_version"
#: how a CSM step runs its real batch and its generated companions (``--csm-forward``; the first is the default)
CSM_FORWARDS = ("two-pass", "concat")


_dataset = functools.partial(option, group="Dataset")
_model = functools.partial(option, group="Model")
_input = functools.partial(option, group="Input and transforms")
_optim = functools.partial(option, group="Optimizer and schedule")
_mixing = functools.partial(option, group="Augmentation and mixing")
_calibration = functools.partial(option, group="Calibration")
_shift = functools.partial(option, group="Shift and out-of-distribution")
_output = functools.partial(option, group="Checkpoints and output")
_run = functools.partial(option, group="Run")


@dataclass
class TrainConfig:
    """The options of a training run (:func:`timm_csm.training.run`), one field per flag of ``timm-csm-train`` (same
    name with ``_``, same default; ``timm-csm-train --help`` describes each). ``explicit``: the options given
    explicitly; None (a configuration built in Python) counts those that differ from their defaults."""

    # the invocation's YAML file (-c); recorded in args.yaml, never read back from it
    config: Optional[str] = option(
        None, short="-c", metavar="FILE", help="YAML file of defaults (keys are the flag names, with - or _); flags "
                                               "override it")

    # Dataset
    dataset: str = _dataset("cifar10", help="fashion_mnist, digits, cifar10, cifar100, a Hugging Face dataset, folder")
    train_split: str = _dataset("train", help="split to train on")
    val_split: Optional[str] = _dataset(None, help="split used as the validation set (checkpoint selection, "
                                                   "temperature scaling) instead of holding out --val-fraction of the "
                                                   "training split")
    test_split: Optional[str] = _dataset(None, help="split to report test metrics on (default: 'test', else "
                                                    "'validation', else 'val')")
    image_column: Optional[str] = _dataset(None, help="image column (detected when omitted)")
    label_column: Optional[str] = _dataset(None, help="label column (detected when omitted)")
    val_fraction: float = _dataset(0.1, help="fraction of the training split held out (seeded) for validation and "
                                             "temperature scaling when no --val-split is given")
    test_fraction: Optional[float] = _dataset(None, help="a dataset with no test split (a flat <class>/<image> "
                                                          "folder): hold out this seeded fraction of the training "
                                                          "split (with --data-seed) as the test split, as "
                                                          "datasets' train_test_split; default: report on the "
                                                          "validation images")
    max_train_samples: Optional[int] = _dataset(None, help="use a seeded random subset of this many training images "
                                                           "(before the validation split)")
    val_size: Optional[int] = _dataset(None, help="draw this many validation images from the training split outside "
                                                  "the training subset (before --max-train-samples, with "
                                                  "--data-seed), instead of holding out --val-fraction of the subset: "
                                                  "every --max-train-samples and --seed then shares one validation "
                                                  "set")
    data_seed: Optional[int] = _dataset(None, help="seed of the data draws (training and test subsets, validation "
                                                   "images); default: --seed. Fix it to vary only the training "
                                                   "(initialisation, order, augmentation) across seeds")
    max_test_samples: Optional[int] = _dataset(None, help="use a seeded subset of the test split")
    data_dir: Optional[str] = _dataset(None, help="root folder of a timm torch/<name> dataset (torchvision files)")
    workers: int = _dataset(0, short="-j", help="DataLoader worker processes")
    pin_mem: bool = _dataset(False, help="pin CPU memory of batches (GPU training)")

    # Model
    model: str = _model("resnet50_cifar", help="any timm.list_models() name or a registered alias")
    pretrained: bool = _model(False, help="start from pretrained weights (timm / Hub cache)")
    pretrained_path: Optional[str] = _model(None, help="local pretrained weight file for --pretrained")
    initial_checkpoint: str = _model("", help="load these model weights after creation")
    num_classes: Optional[int] = _model(None, help="number of classes (default: the dataset's)")
    img_size: Optional[int] = _model(None, help="input size (default: fixed-size models' config, else the dataset's "
                                                "image size)")
    in_chans: Optional[int] = _model(None, help="input channels (default: the dataset's)")
    mean: Optional[List[float]] = _model(None, help="normalisation mean (default: the training data's, or the "
                                                    "pretrained config's)")
    std: Optional[List[float]] = _model(None, help="normalisation std (default: as --mean)")
    drop: float = _model(0.0, help="dropout rate before the classifier")
    drop_path: Optional[float] = _model(None, help="drop-path rate (models that support it; default: the model's)")
    model_kwargs: List[Tuple[str, Any]] = _model(
        [], nargs="*", metavar="KEY=VALUE", type=key_value, help="extra keyword arguments for timm.create_model")
    sync_bn: bool = _model(False, help="batch-norm statistics over the global batch of all processes (torch's "
                                             "SyncBatchNorm on CUDA, an all-reduce batch norm elsewhere); one "
                                             "process: no change")
    channels_last: bool = _model(False, help="model and inputs in torch.channels_last layout")
    model_ema: bool = _model(False, help="keep an exponential moving average of the weights (timm's "
                                               "ModelEmaV3); validation, model_best and the test evaluation use it")
    model_ema_decay: float = _model(0.9998, help="decay of --model-ema")
    model_ema_warmup: bool = _model(False, help="warm the --model-ema decay up over the first updates (timm's "
                                                      "schedule)")

    # Input and transforms
    input_size: Optional[List[int]] = _input(
        None, nargs=3, metavar="N", help="input (C, H, W), as timm's: sets --in-chans and a square --img-size")
    transform: str = _input(
        "auto", choices=("auto", "cifar", "timm"), help="cifar: resize, zero-padded random crop, flip (the paper's "
                                                        "CIFAR recipe, batched); timm: timm.data.create_transform "
                                                        "(RandomResizedCrop, --aa, --reprob, ...); auto: timm's when "
                                                        "one of its flags is given or the input is at least 96 px")
    no_aug: bool = _input(False, help="train on the eval transform (no augmentation)")
    hflip: float = _input(0.5, help="horizontal flip probability")
    crop_pad: int = _input(4, help="cifar: zero padding of the random crop (0: no crop)")
    scale: List[float] = _input(
        [0.08, 1.0], nargs=2, metavar="PCT", help="timm: RandomResizedCrop area range")
    ratio: List[float] = _input(
        [3.0 / 4.0, 4.0 / 3.0], nargs=2, metavar="RATIO", help="timm: RandomResizedCrop aspect-ratio range")
    vflip: float = _input(0.0, help="timm: vertical flip probability")
    color_jitter: float = _input(0.4, help="timm: colour jitter factor (off with --aa)")
    aa: Optional[str] = _input(None, help="timm: AutoAugment / RandAugment policy, e.g. rand-m9-mstd0.5")
    reprob: float = _input(0.0, help="timm: random erasing probability")
    remode: str = _input("pixel", help="timm: random erasing mode")
    recount: int = _input(1, help="timm: random erasing count")
    interpolation: str = _input("", help="timm: eval resize interpolation (default: the model's)")
    train_interpolation: str = _input("random", help="timm: train crop interpolation")
    crop_pct: Optional[float] = _input(None, help="timm: eval centre-crop fraction (default: the model's)")

    # Optimizer and schedule
    batch_size: int = _optim(128, short="-b", help="real images per process and step")
    validation_batch_size: Optional[int] = _optim(
        None, short="-vb", help="evaluation batch size (default: --batch-size)")
    grad_accum_steps: int = _optim(1, help="batches per optimizer update (its batch: steps x processes x --batch-size)")
    epochs: int = _optim(200, help="epochs to train")
    opt: str = _optim("momentum", help="timm optimizer name; 'momentum' is SGD without Nesterov (the paper), 'sgd' is "
                                       "Nesterov")
    lr: float = _optim(0.1, help="base learning rate")
    momentum: float = _optim(0.9, help="SGD momentum")
    weight_decay: float = _optim(0.0005, help="weight decay")
    filter_bias_and_bn: bool = _optim(
        False, action=argparse.BooleanOptionalAction, help="exempt biases and norm weights from weight decay (timm's "
                                                           "default; the paper decays all)")
    clip_grad: float = _optim(2.0, help="gradient clipping threshold (0 or less: off)")
    clip_mode: str = _optim("norm", choices=("norm", "value"), help="clip the gradients' global norm or each value")
    sched: str = _optim("multistep", help="timm scheduler: multistep, step, cosine, plateau, ...")
    decay_milestones: List[int] = _optim([80, 120], help="multistep: epochs where the learning rate is multiplied by "
                                                         "--decay-rate")
    decay_epochs: float = _optim(100, help="period of the 'step' scheduler")
    decay_rate: float = _optim(0.1, help="factor of each learning-rate decay")
    warmup_epochs: int = _optim(0, help="epochs of linear learning-rate warm-up")
    warmup_lr: float = _optim(1e-05, help="learning rate the warm-up starts from")
    min_lr: float = _optim(0.0, help="lowest learning rate of the schedule")

    # Augmentation and mixing
    smoothing: float = _mixing(0.0, help="label smoothing: with --loss ce it selects the 'ls' loss; with --mixup it "
                                         "smooths the mixed targets")
    mixup: float = _mixing(0.0, help="Mixup alpha (0: off); trains on mixed images only")
    mixup_mode: str = _mixing(
        "batch", choices=("batch", "pair", "elem"), help="one lambda per batch, per pair (timm's Mixup only) or per "
                                                         "image")
    cutmix: float = _mixing(0.0, help="CutMix alpha (0: off), through timm's Mixup, with --mixup as its mixup alpha")
    cutmix_minmax: Optional[List[float]] = _mixing(
        None, nargs=2, help="timm Mixup: CutMix box ratio range")
    mixup_prob: float = _mixing(1.0, help="timm Mixup: probability of mixing a batch")
    mixup_switch_prob: float = _mixing(0.5, help="timm Mixup: probability of CutMix instead of Mixup when both are on")
    regmixup: float = _mixing(0.0, help="RegMixup alpha (0: off; 20 for CIFAR-10, 10 for CIFAR-100)")
    regmixup_weight: float = _mixing(1.0, help="weight eta of RegMixup's mixed term")
    regmixup_reduction: str = _mixing(
        "mean", choices=("mean", "sum"), help="RegMixup: 'mean' (clean + eta * mixed) / 2, the released code's mean "
                                              "over the 2B batch; 'sum' clean + eta * mixed, the paper's equation")
    rankmixup_alpha: float = _mixing(2.0, help="Mixup alpha of RankMixup losses (mrl, mndcg)")
    num_mixup: Optional[int] = _mixing(None, help="mixed copies per sample for RankMixup losses (default: 1 for mrl, "
                                                  "3 for mndcg)")

    # Calibration
    loss: str = _calibration("ce", help="registered loss (timm_csm.losses.list_losses())")
    loss_kwargs: List[Tuple[str, Any]] = _calibration(
        [], nargs="*", metavar="KEY=VALUE", type=key_value, help="keyword arguments of the loss, e.g. --loss-kwargs "
                                                                  "margin=6 alpha=0.1")
    csm_dataset: Optional[str] = _calibration(None, help="generated CSM dataset (Hub name or folder); required by the "
                                                         "csm losses")
    teacher: Optional[str] = _calibration(None, help="teacher of --loss kd: a reference-encoder folder or a trained "
                                                     "run folder / model file")
    n_aug: int = _calibration(1, help="interior group members per real image besides the endpoint")
    csm_weight: float = _calibration(1.0, help="weight of the generated-batch term of CSM")
    csm_forward: str = _calibration(CSM_FORWARDS[0], choices=CSM_FORWARDS, help=(
        "CSM step: 'two-pass' (the real batch, then its companions: batch-norm statistics per batch, the paper's) or "
        "'concat' (one forward, statistics over both; the loss unchanged in form; benchmarks/csm_step.md)"))
    calibrators: List[str] = _calibration(
        ["temperature_scaling"], type=comma_separated, nargs=None, metavar="NAME[,NAME...]",
        help="post-hoc calibrators fitted on the validation split and scored on the test split, comma-separated "
             "names of timm_csm.calibration.list_calibrators(): results.md, the shift and OOD tables show each; "
             "temperature_scaling is the run's temperature (after TS, temperature.safetensors)")
    ts_method: str = _calibration(
        TRAINING_TEMPERATURE_METHOD, choices=TEMPERATURE_METHODS,
        help=f"temperature_scaling's fit on the validation split: NLL (Guo et al.; steady on few images) or "
             f"{PAPER_TEMPERATURE_METHOD}, the grid 0.1..10 by validation ECE (the paper's protocol, which the "
             "recipes' profiles and the benchmark cells keep)")
    n_bins: int = _calibration(DEFAULT_N_BINS, help="confidence bins of ECE-type metrics")
    select_by: str = _calibration(
        "acc", choices=tuple(SELECT_METRICS), help="validation metric that picks the best checkpoint")
    piece: bool = _calibration(False, help="also report the proximity-informed ECE (PIECE) from penultimate "
                                                 "features")
    bootstrap: int = _calibration(1000, help="bootstrap resamples of the test and validation samples behind the "
                                             "interval (level 0.95) of every reported metric (0: none)")

    # Shift and out-of-distribution
    eval_shift: Optional[str] = _shift(
        None, nargs="?", const="all", metavar="NAMES",
        help="also evaluate the test split under corruptions, before and after each calibrator: 'all' (the flag "
             "alone) or comma-separated names of timm_csm.data.corruptions.list_corruptions()")
    shift_severities: List[int] = _shift([1, 2, 3, 4, 5], help="the corruption severities of --eval-shift (1-5)")
    ood: Optional[str] = _shift(None, help="an out-of-distribution image source (any --dataset form) whose images "
                                           "are scored against the test images: AUROC, AUPR and FPR at 95 percent TPR "
                                           "of four scores, before and after each calibrator")
    ood_split: Optional[str] = _shift(None, help="the split of --ood (default: its test split, else 'train')")

    # Checkpoints and output
    output: str = _output("output/train", help="parent folder of the experiment folders")
    experiment: Optional[str] = _output(None, help="experiment folder name under --output ('.': --output itself, "
                                                   "refused when it holds another run; default: "
                                                   "<dataset>-<model>-<loss>; with --eval-only, "
                                                   "eval-<dataset>-<split> beside the checkpoint). A folder that "
                                                   "holds a run gives way to <name>-1, <name>-2, ...; --resume "
                                                   "continues in the resumed run's folder")
    resume: str = _output("", help="continue the run of this last.safetensors, in its folder and with its stored "
                                   "configuration (flags that conflict with it are errors; --epochs may extend it)")
    auto_resume: bool = _output(False, help="resume the run in the experiment folder itself when it left a "
                                                  "last.safetensors, else start the run there (instead of a new "
                                                  "numbered folder)")
    checkpoint_hist: int = _output(0, help="also keep the N most recent per-epoch checkpoints "
                                           "checkpoint-<epoch>.safetensors")
    eval_only: bool = _output(False, help="only evaluate --checkpoint (no training)")
    checkpoint: Optional[str] = _output(None, help="weights to evaluate with --eval-only (model_best.safetensors, "
                                                   "last.safetensors, or a timm weight file with --model etc.)")
    log_with: Optional[str] = _output(None, help="accelerate trackers, comma-separated (tensorboard, wandb, ..., "
                                                 "all); each must be installed")
    log_wandb: bool = _output(False, help="log to Weights & Biases (as --log-with wandb)")
    progress: bool = _output(
        True, action=argparse.BooleanOptionalAction, help="progress bar on the main process")
    reliability_diagrams: bool = _output(
        True, action=argparse.BooleanOptionalAction,
        help="draw the reliability diagrams (PNG files beside results.json; the numbers do not depend on them)")

    # Run
    seed: int = _run(PAPER_SEED, help="seed of the initialisation, the validation split, augmentation and companions")
    amp: bool = _run(False, help="mixed precision (accelerate); see --amp-dtype")
    amp_dtype: str = _run(
        "float16", choices=("float16", "bfloat16"), help="precision of --amp")
    cpu: bool = _run(False, help="train on the CPU even when an accelerator is present")
    torchcompile: Optional[str] = _run(
        None, nargs="?", const="inductor", metavar="BACKEND", help="torch.compile the training forward with this "
                                                                   "backend (the flag alone: inductor)")
    torchcompile_mode: Optional[str] = _run(None, help="torch.compile mode, e.g. reduce-overhead (default: torch's)")

    explicit: Optional[FrozenSet[str]] = field(default=None, repr=False)

    def __post_init__(self):
        self.calibrators = comma_separated(self.calibrators)  # a dict's or a YAML file's "a,b" as the flag's
        if self.explicit is None:
            defaults = _defaults()
            self.explicit = frozenset(k for k, v in self.options().items() if v != defaults[k])
        else:
            self.explicit = frozenset(self.explicit)

    def options(self) -> Dict[str, Any]:
        """``{option: value}`` of every option, in the command line's order (``explicit`` aside)."""
        return {name: getattr(self, name) for name in option_names()}

    @classmethod
    def from_dict(cls, options: Mapping[str, Any], where: str = "the configuration") -> "TrainConfig":
        """The configuration of the options in ``options`` (keys: ``batch_size``, ``batch-size`` or
        ``--batch-size``; ``model_kwargs`` / ``loss_kwargs`` as dicts or ``(key, value)`` pairs), the others at their
        defaults; those given are ``explicit``. An unknown key is a ``ValueError`` naming the closest option."""
        given = _normalise_keys(options, where)
        return cls(**given, explicit=frozenset(given))

    @classmethod
    def from_namespace(cls, namespace: argparse.Namespace,
                       explicit: Optional[FrozenSet[str]] = None) -> "TrainConfig":
        """The configuration of an ``argparse.Namespace`` of :func:`~timm_csm.training.args.build_parser`'s options
        (missing ones at their defaults; attributes starting with ``_`` are ignored). ``explicit`` default: the
        namespace's ``_explicit`` when it has one, else the options that differ from their defaults."""
        values = {k: v for k, v in vars(namespace).items() if not k.startswith("_")}
        if explicit is None:
            explicit = getattr(namespace, "_explicit", None)
        return cls(**_normalise_keys(values, "the namespace", with_config=True), explicit=explicit)

    @classmethod
    def from_yaml(cls, path) -> "TrainConfig":
        """The configuration of a YAML file, as ``-c FILE`` reads it (see the module docstring); its keys are
        ``explicit``. A string value of a numeric option is parsed as its flag's would be (YAML reads ``1e-3`` as a
        string)."""
        given = read_yaml_options(str(path))
        for key, value in given.items():
            kind, many = option_types()[key]
            if isinstance(value, str) and not many and kind in (int, float):
                given[key] = kind(value)
        return cls(**given, explicit=frozenset(given))


@functools.lru_cache(maxsize=None)
def option_names() -> Tuple[str, ...]:
    """The options of :class:`TrainConfig`, in the command line's order."""
    return tuple(f.name for f in dataclasses.fields(TrainConfig) if f.name != "explicit")


def _defaults() -> Dict[str, Any]:
    return {f.name: f.default_factory() if f.default is dataclasses.MISSING else f.default
            for f in dataclasses.fields(TrainConfig) if f.name != "explicit"}


def option_types() -> Dict[str, Tuple[type, bool]]:
    """``{option: (value type, whether a list of them)}`` of :class:`TrainConfig`
    (:func:`timm_csm.options.option_types`)."""
    return _field_types(TrainConfig)


def _option_key(key) -> str:
    """An option name as its field: ``--batch-size`` / ``batch-size`` / ``batch_size`` -> ``batch_size``."""
    return str(key).lstrip("-").replace("-", "_")


def _normalise_keys(options: Mapping[str, Any], where: str, with_config: bool = False) -> Dict[str, Any]:
    """``options`` under their field names, key=value options as ``(key, value)`` pairs; an unknown key is a
    ``ValueError`` naming the closest option, as is ``config`` (the YAML file of a command line) unless
    ``with_config``."""
    names = option_names()
    out, unknown = {}, []
    for k, v in options.items():
        key = _option_key(k)
        if key not in names or (key == "config" and not with_config):
            unknown.append(k)
            continue
        if key in ("model_kwargs", "loss_kwargs") and isinstance(v, dict):
            v = list(v.items())
        out[key] = v
    if unknown:
        close = {u: difflib.get_close_matches(str(u).replace("-", "_"), list(names), n=1) for u in unknown}
        hint = "; ".join(f"{u!r}" + (f" (did you mean {c[0]!r}?)" if c else "") for u, c in close.items())
        raise ValueError(f"unknown option(s) in {where}: {hint}")
    return out


def read_yaml_options(path: str) -> Dict[str, Any]:
    """The options of YAML file ``path`` under their field names: a run's args.yaml (marked by
    :data:`CONFIG_MARKER`; its run id and config file are that run's) or a hand-written file (unknown keys are
    errors naming them), or timm's args.yaml (:func:`~timm_csm.training.timm_args.from_timm_args`)."""
    import yaml

    with open(path) as f:
        cfg = yaml.safe_load(f) or {}
    if not isinstance(cfg, dict):
        raise ValueError(f"config {path} must be a mapping of flag names to values")
    ours = cfg.pop(CONFIG_MARKER, None) is not None
    for key in ("run_id", "config"):  # a run's id stays with that run; the config file is this invocation's
        cfg.pop(key, None)
    cfg = upgrade_stored_config(cfg)
    if not ours and set(map(_option_key, cfg)) & (TIMM_TRAIN_KEYS - set(option_names())):
        cfg, ignored = from_timm_args({_option_key(k): v for k, v in cfg.items()})
        if ignored:
            warnings.warn(f"config {path} is a timm train.py args.yaml; its options without a counterpart here "
                          f"are ignored: {', '.join(sorted(ignored))}", UserWarning, stacklevel=3)
    return _normalise_keys(cfg, f"config {path}")


def upgrade_stored_config(cfg: Dict[str, Any]) -> Dict[str, Any]:
    """A stored configuration (args.yaml, a training state's or a model file's metadata) in today's option names:
    runs before ``--val-fraction`` stored the held-out fraction as a number under ``val_split``."""
    cfg = dict(cfg)
    if isinstance(cfg.get("val_split"), (int, float)) and not isinstance(cfg["val_split"], bool):
        cfg.setdefault("val_fraction", float(cfg.pop("val_split")))
        cfg["val_split"] = None
    return cfg
