"""A classifier to score, from wherever it was trained, with the preprocessing its images get.

The classifier (:func:`load_classifier`) is a run folder or model file of ``train.py`` (architecture, input size,
normalisation and class names read from its metadata), a timm architecture name with weights (``checkpoint``: any
weights of it, trained anywhere; ``pretrained_path``: timm's own pretrained weights in a local file; safetensors
only, never unpickled), or an ``nn.Module`` with a ``transform`` (any callable of one image, as
``timm.data.create_transform`` returns; or a :class:`~timm_csm.data.BatchTransform` /
:class:`~timm_csm.data.SampleTransform`).

The preprocessing of a timm architecture (or of a module given without a transform) is resolved as timm's
``validate.py`` resolves it (:func:`resolve_preprocessing`): the given values of timm's data config
(``input_size`` or ``img_size``, ``mean``, ``std``, ``crop_pct``, ``crop_mode``, ``interpolation``) first, then
the model's ``pretrained_cfg`` at its test size. That config describes timm's pretrained weights, not weights
trained elsewhere: for those, every value not given is a guess, said in one line, and guessed so that nothing is
silently thrown away: the input size is the images' own when they share one (never 28 x 28 digits resized to 224),
and images already at the input size are neither resized nor cropped (crop_pct 1.0: timm's usual 0.875 - 0.95
would resize 28 to 29 or 32 and crop back to 28).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch.nn as nn

from ..io import safetensors_metadata
from .model import check_model_name, create_train_model, load_model_weights, load_trained_classifier

__all__ = ["Classifier", "Preprocessing", "load_classifier", "require_safetensors", "resolve_preprocessing",
           "check_data_config", "merge_data_config", "as_eval_transform", "DATA_CONFIG_KEYS", "CROP_MODES",
           "INTERPOLATIONS"]

#: the keys of timm's data config a user may give (``timm.data.resolve_data_config``'s ``args``)
DATA_CONFIG_KEYS = ("input_size", "img_size", "mean", "std", "crop_pct", "crop_mode", "interpolation")
#: timm's eval crop modes and resize interpolations (``timm.data.create_transform``)
CROP_MODES = ("center", "squash", "border")
INTERPOLATIONS = ("nearest", "bilinear", "bicubic", "box", "hamming", "lanczos")


@dataclass
class Preprocessing:
    """The evaluation preprocessing of a timm model: timm's eval transform of these values. ``guessed`` names the
    values neither given nor known from the weights."""

    in_chans: int
    img_size: int
    mean: List[float]
    std: List[float]
    interpolation: str
    crop_pct: float
    crop_mode: str
    guessed: List[str]

    def describe(self) -> str:
        if self.crop_pct == 1.0:
            resize = "crop_pct 1 (images at the input size untouched)"
        else:
            resize = (f"{self.interpolation} resize to {int(self.img_size / self.crop_pct)}, {self.crop_mode} crop to "
                      f"{self.img_size} (crop_pct {self.crop_pct:g})")
        return (f"input {self.in_chans}x{self.img_size}x{self.img_size}, mean {tuple(self.mean)}, "
                f"std {tuple(self.std)}, {resize}")


@dataclass
class Classifier:
    """A model ready to score images: ``transform`` maps the images to its input; ``class_names`` None when
    unknown; ``meta`` the timm-csm metadata (None for a module); ``preprocessing`` the resolved one (None for a
    run, which stores its own, or a module with its own transform)."""

    model: nn.Module
    transform: Callable
    class_names: Optional[List[str]]
    meta: Optional[Dict[str, Any]]
    description: str
    preprocessing: Optional[Preprocessing] = None


def require_safetensors(path, flag: str) -> Path:
    """``path`` as a Path when it is a readable safetensors file; else a one-line error naming ``flag``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{flag} {path} does not exist" + (" (it is a folder)" if path.is_dir() else ""))
    if safetensors_metadata(path) is None:
        raise ValueError(f"{flag} {path} is not a safetensors file (a pickle or JSON?); weights are read from "
                         "safetensors only, never unpickled: convert it with safetensors.torch.save_file")
    return path


def check_data_config(config: Dict[str, Any]) -> Dict[str, Any]:
    """The given values of timm's data config (None dropped), each checked: a one-line error for a bad one."""
    config = {k: v for k, v in (config or {}).items() if v is not None}
    unknown = sorted(set(config) - set(DATA_CONFIG_KEYS) - {"in_chans"})
    if unknown:
        raise ValueError(f"unknown data config keys {unknown}; known: {', '.join(DATA_CONFIG_KEYS)}")
    if "input_size" in config:
        size = tuple(int(v) for v in config["input_size"])
        if len(size) != 3 or min(size) < 1 or size[1] != size[2]:
            raise ValueError(f"--input-size takes C H W with H = W (square inputs), got {config['input_size']}")
        if config.get("in_chans") not in (None, size[0]) or config.get("img_size") not in (None, size[1]):
            raise ValueError(f"--input-size {size} contradicts --in-chans {config.get('in_chans')} / --img-size "
                             f"{config.get('img_size')}; give one")
        config["input_size"] = size
    if int(config.get("img_size", 1)) < 1:
        raise ValueError(f"--img-size must be positive, got {config['img_size']}")
    for key in ("mean", "std"):
        if key in config:
            config[key] = tuple(float(v) for v in config[key])
    if any(v <= 0 for v in config.get("std", ())):
        raise ValueError(f"--std must be positive, got {config['std']}")
    if ("mean" in config) != ("std" in config):
        raise ValueError("give --mean and --std together (the normalisation the model was trained with)")
    if not 0.0 < float(config.get("crop_pct", 1.0)) <= 1.0:
        raise ValueError(f"--crop-pct must lie in (0, 1], got {config['crop_pct']}")
    if config.get("crop_mode", "center") not in CROP_MODES:
        raise ValueError(f"--crop-mode must be one of {', '.join(CROP_MODES)}, got {config['crop_mode']!r}")
    if config.get("interpolation", "bilinear") not in INTERPOLATIONS:
        raise ValueError(f"--interpolation must be one of {', '.join(INTERPOLATIONS)}, got "
                         f"{config['interpolation']!r}")
    return config


def resolve_preprocessing(given: Dict[str, Any], pretrained_cfg: Optional[Dict[str, Any]], cfg_is_the_weights: bool,
                          native_size: Optional[int]) -> Preprocessing:
    """The preprocessing of a timm model (see the module docstring): ``given`` (checked by
    :func:`check_data_config`), ``pretrained_cfg`` the model's, ``cfg_is_the_weights`` whether it describes the
    weights (timm's own), ``native_size`` the side all the images share (None when they differ)."""
    from timm.data import resolve_data_config

    from ..models._cfg import _fit_channels

    given, cfg, guessed = check_data_config(given), dict(pretrained_cfg or {}), []
    args = dict(given)
    if "input_size" not in given and "in_chans" not in given:  # timm's: the config's channels, else 3
        args["in_chans"] = int((cfg.get("input_size") or (3,))[0])
    if "input_size" not in given and "img_size" not in given and not cfg_is_the_weights:
        if native_size:
            args["img_size"] = int(native_size)
            guessed.append("the input size (the images' own)")
        else:
            guessed.append("the input size (the architecture's default; the images differ in size)")
    resolved = resolve_data_config(args, pretrained_cfg=cfg, use_test_size=True)
    # timm takes the config's size with the config's channels; the channels given (or the config's) stand
    in_chans = int(given["input_size"][0]) if "input_size" in given else int(args["in_chans"])
    img_size = int(resolved["input_size"][-1])
    mean, std = _fit_channels(resolved["mean"], in_chans), _fit_channels(resolved["std"], in_chans)
    if "mean" not in given and not cfg_is_the_weights:
        guessed.append("mean and std (the architecture's default)")
    crop_pct = float(resolved["crop_pct"])
    if "crop_pct" not in given and native_size == img_size and not cfg_is_the_weights:
        crop_pct = 1.0  # the images have the input size: no resize, no crop
    elif "crop_pct" not in given and not cfg_is_the_weights:
        guessed.append(f"the resize (the architecture's crop_pct {crop_pct:g})")
    return Preprocessing(in_chans, img_size, list(mean), list(std), str(resolved["interpolation"]), crop_pct,
                         str(resolved.get("crop_mode") or "center"), guessed)


def as_eval_transform(transform, in_chans: Optional[int]):
    """``transform`` in the collators' contract: a :class:`~timm_csm.data.BatchTransform` or
    :class:`~timm_csm.data.SampleTransform` as it is (refused when random: training augmentation), any other
    callable as a per-image transform of PIL images converted to ``in_chans`` channels (``RGB`` by default, as
    timm's datasets give them)."""
    from ..data import SampleTransform

    if hasattr(transform, "apply") and hasattr(transform, "is_random"):
        if transform.is_random:
            raise ValueError(f"transform {transform!r} is random (training augmentation); give the evaluation one")
        return transform
    if not callable(transform):
        raise ValueError(f"transform must be callable (a PIL image -> tensor (C, H, W)), got {type(transform)}")
    return SampleTransform(transform, in_chans or 3, None, random=False)


def _timm_meta(name: str, num_classes: int, pre: Preprocessing, class_names) -> Dict[str, Any]:
    """The metadata ``load_trained_classifier`` rebuilds a plain timm model and its eval transform from."""
    return {"model": name, "num_classes": num_classes, "in_chans": pre.in_chans, "img_size": pre.img_size,
            "model_kwargs": [], "transform": "timm", "mean": pre.mean, "std": pre.std,
            "interpolation": pre.interpolation, "crop_pct": pre.crop_pct, "crop_mode": pre.crop_mode,
            "class_names": class_names, "dataset": None}


def _timm_transform(pre: Preprocessing):
    from ..data import create_timm_transforms

    return create_timm_transforms(pre.img_size, pre.mean, pre.std, pre.in_chans, pre.interpolation, pre.crop_pct,
                                  crop_mode=pre.crop_mode)[1]


def _log_preprocessing(what: str, pre: Preprocessing, log) -> None:
    if pre.guessed:
        log(f"guessed preprocessing ({what} carry no data config): {'; '.join(pre.guessed)}: {pre.describe()}; give "
            "--input-size, --mean, --std (--crop-pct, --interpolation) as the model was trained")
    else:
        log(f"preprocessing: {pre.describe()}")


def _check_against_run(given: Dict[str, Any], meta: Dict[str, Any], path: Path) -> None:
    """Given preprocessing values must equal those the run stored (it is the run's own preprocessing)."""
    stored = {"in_chans": meta["in_chans"], "img_size": meta["img_size"],
              "input_size": (meta["in_chans"], meta["img_size"], meta["img_size"]),
              "mean": tuple(meta["mean"]), "std": tuple(meta["std"]), "crop_pct": meta.get("crop_pct"),
              "interpolation": meta.get("interpolation"), "crop_mode": meta.get("crop_mode")}
    for key, value in given.items():
        broadcast = key in ("mean", "std") and len(value) == 1 and set(stored[key]) == {value[0]}
        if value != stored[key] and not broadcast:
            raise ValueError(f"{key} {value} differs from the {stored[key]} {path} stores: a run's preprocessing is "
                             "its own (these values apply to a timm model name)")


def _run_classifier(path: Path, checkpoint, names, given: Dict[str, Any], log) -> Classifier:
    if path.is_file():
        require_safetensors(path, "--model")
    loaded, eval_tf, meta = load_trained_classifier(path, **({"checkpoint": checkpoint} if checkpoint else {}))
    _check_against_run(given, meta, path)
    log(f"model: {meta['model']} from {path} ({meta['num_classes']} classes, input {meta['in_chans']}x"
        f"{meta['img_size']}, mean {meta['mean']}, std {meta['std']}, class names from the checkpoint)")
    stored = meta.get("class_names")
    if names is not None and stored is not None and names != list(stored):
        raise ValueError(f"--class-names {names[:5]} differ from the checkpoint's {list(stored)[:5]}")
    return Classifier(loaded, eval_tf, names or stored, meta, str(path))


def _module_classifier(model: nn.Module, transform, names, given: Dict[str, Any], native_size, log) -> Classifier:
    if transform is not None:
        if set(given) - {"in_chans"}:
            raise ValueError(f"transform= is the model's preprocessing; {', '.join(sorted(set(given) - {'in_chans'}))} "
                             "apply without it")
        tf = as_eval_transform(transform, given.get("in_chans"))
        return Classifier(model.eval(), tf, names, None, type(model).__name__)
    cfg = getattr(model, "pretrained_cfg", None)
    if not cfg and "input_size" not in given and "mean" not in given:
        raise ValueError("a model object needs transform= (a callable of one PIL image), or data_config= with "
                         "input_size, mean and std (timm's eval transform is built from it)")
    pre = resolve_preprocessing(given, cfg, cfg_is_the_weights=False, native_size=native_size)
    _log_preprocessing("the model's weights", pre, log)
    return Classifier(model.eval(), _timm_transform(pre), names, None, type(model).__name__, pre)


def merge_data_config(data_config: Optional[Dict[str, Any]], in_chans: Optional[int] = None,
                      img_size: Optional[int] = None) -> Dict[str, Any]:
    """``data_config`` with ``in_chans`` / ``img_size`` given alone added, checked (:func:`check_data_config`)."""
    config = dict(data_config or {})
    for key, value in (("in_chans", in_chans), ("img_size", img_size)):
        if value is None:
            continue
        if config.get(key) not in (None, value):
            raise ValueError(f"{key}={value} and data_config's {key} {config[key]} differ")
        config[key] = value
    return check_data_config(config)


def load_classifier(model, checkpoint=None, pretrained_path=None, num_classes: Optional[int] = None,
                    in_chans: Optional[int] = None, img_size: Optional[int] = None,
                    class_names: Optional[Sequence[str]] = None, transform: Optional[Callable] = None,
                    data_config: Optional[Dict[str, Any]] = None, native_size: Optional[int] = None,
                    log: Callable[[str], None] = print) -> Classifier:
    """The classifier (see the module docstring); ``data_config``: given values of timm's data config
    (:data:`DATA_CONFIG_KEYS`), ``in_chans`` / ``img_size`` its channels and size given alone; ``native_size``
    the side the images share (None: they differ or are unknown)."""
    names = list(class_names) if class_names is not None else None
    given = merge_data_config(data_config, in_chans, img_size)
    if isinstance(model, nn.Module):
        return _module_classifier(model, transform, names, given, native_size, log)
    if os.path.exists(str(model)):
        return _run_classifier(Path(model), checkpoint, names, given, log)
    check_model_name(str(model))
    if bool(checkpoint) == bool(pretrained_path):
        raise ValueError(f"timm model {model!r}: give its weights with exactly one of --checkpoint FILE.safetensors "
                         "or --pretrained-path FILE.safetensors")
    weights = require_safetensors(checkpoint or pretrained_path, "--checkpoint" if checkpoint else
                                  "--pretrained-path")
    num_classes = num_classes if num_classes is not None else (len(names) if names else None)
    if num_classes is None:
        raise ValueError(f"timm model {model!r}: give --num-classes (or --class-names)")
    from timm.models import get_pretrained_cfg

    cfg = get_pretrained_cfg(str(model))
    pre = resolve_preprocessing(given, cfg.to_dict() if cfg is not None else {},
                                cfg_is_the_weights=bool(pretrained_path), native_size=native_size)
    net = create_train_model(str(model), num_classes, pre.in_chans, pre.img_size)
    load_model_weights(net, weights, f"{model} with {num_classes} classes and {pre.in_chans} input channels")
    log(f"model: timm {model} with {weights} ({num_classes} classes); the data it was trained on is unknown")
    _log_preprocessing(f"the weights in {weights.name}", pre, log)
    return Classifier(net.eval(), _timm_transform(pre), names, _timm_meta(str(model), num_classes, pre, names),
                      f"{model} + {weights}", pre)
