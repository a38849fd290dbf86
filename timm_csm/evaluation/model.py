"""The classifier of a training run: timm's ``create_model`` with the run's options, weight loading, and the loader of
a finished run's classifier (:func:`load_trained_classifier`)."""
from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import torch.nn as nn

from ..io import is_state_file, load_state, read_model_meta, state_dict_mismatch

__all__ = ["check_model_name", "fixed_input_size", "create_train_model", "load_model_weights",
           "load_trained_classifier", "CalibratedClassifier", "CALIBRATED_MODEL_FILE", "CALIBRATOR_FILES"]

#: the description a calibrated-model folder carries (written by ``timm-csm-calibrate``)
CALIBRATED_MODEL_FILE = "calibrated_model.json"
#: calibrator files a folder is searched for with ``calibrated=True``, in order: the one ``timm-csm-calibrate``
#: exports, then the temperature a training run fitted
CALIBRATOR_FILES = ("calibrator.safetensors", "temperature.safetensors")


class CalibratedClassifier(nn.Module):
    """A classifier followed by a fitted post-hoc calibrator: ``forward(x)`` returns the calibrated logits
    ``calibrator.transform(model(x))`` (softmax gives the calibrated probabilities). The calibrator is applied
    outside autograd: this module is for inference."""

    def __init__(self, model: nn.Module, calibrator):
        super().__init__()
        self.model = model
        self.calibrator = calibrator

    def forward(self, x):
        return self.calibrator.transform(self.model(x).float())



def check_model_name(name: str) -> None:
    import timm

    from .. import models  # noqa: F401  (registers the small-image models)

    if timm.is_model(name):
        return
    ours = ", ".join(models.SMALL_IMAGE_MODELS)
    all_names = timm.list_models()
    close = difflib.get_close_matches(name, all_names, n=5, cutoff=0.6)
    raise ValueError(f"unknown model {name!r}. Small-image models: {ours}. Any of timm's {len(all_names)} "
                     f"architectures also works (timm.list_models('pattern*') lists them)"
                     + (f"; close matches: {', '.join(close)}" if close else ""))


def fixed_input_size(name: str) -> Tuple[bool, Optional[Tuple[int, int, int]]]:
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

    check_model_name(name)
    kwargs = dict(model_kwargs or {})
    kwargs.update(num_classes=num_classes, in_chans=in_chans)
    if drop:
        kwargs["drop_rate"] = drop
    if drop_path is not None:
        kwargs["drop_path_rate"] = drop_path
    fixed, _ = fixed_input_size(name)
    if fixed and img_size:
        kwargs.setdefault("img_size", img_size)
    if pretrained_path:
        if not os.path.isfile(pretrained_path):
            raise FileNotFoundError(f"--pretrained-path {pretrained_path} does not exist")
        kwargs["pretrained_cfg_overlay"] = dict(file=str(pretrained_path))
    try:
        model = timm.create_model(name, pretrained=pretrained, **kwargs)
    except (OSError, RuntimeError) as e:  # the Hub's not-found / offline errors (huggingface_hub's are OSErrors)
        if not pretrained or pretrained_path:
            raise
        raise ValueError(f"--pretrained {name}: its weights are not in the Hub cache and could not be downloaded "
                         f"({type(e).__name__}: {e}); go online once, or give a local file with --pretrained-path "
                         "FILE") from e
    if initial_checkpoint:
        if not os.path.exists(initial_checkpoint):
            raise FileNotFoundError(f"--initial-checkpoint {initial_checkpoint} does not exist")
        load_model_weights(model, initial_checkpoint)
    return model



def _shape_hint(model: nn.Module, state) -> str:
    """The channels and classes the weights were built with, where they differ from ``model``'s (read from the
    first convolution and the classifier that timm's ``pretrained_cfg`` names)."""
    cfg = getattr(model, "pretrained_cfg", None) or {}
    own = model.state_dict()
    hints = []
    for key, axis, flag in ((cfg.get("first_conv"), 1, "--in-chans"), (cfg.get("classifier"), 0, "--num-classes")):
        weight = f"{key}.weight" if isinstance(key, str) else None
        if weight in state and weight in own and state[weight].ndim > axis and \
                state[weight].shape[axis] != own[weight].shape[axis]:
            hints.append(f"{flag} {state[weight].shape[axis]} (the file's {weight})")
    return f"; the weights were built with {' and '.join(hints)}" if hints else ""


def load_model_weights(model: nn.Module, path, description: Optional[str] = None) -> None:
    """Load weights from a training-state file (its ``model`` entry), a model file, or any weight file timm's
    ``load_checkpoint`` reads (safetensors or torch; its EMA weights when it holds them, as timm does). Weights that
    do not fit ``model`` (another architecture, class count or channel count) are a one-line ``ValueError``
    (:func:`~timm_csm.io.state_dict_mismatch`) naming ``description`` (default: the model's class)."""
    if is_state_file(path):
        state = load_state(path)["model"]
    elif os.path.splitext(str(path))[-1].lower() in (".npz", ".npy"):  # a model-specific format timm loads itself
        from timm.models import load_checkpoint

        load_checkpoint(model, str(path))
        return
    else:
        from timm.models import load_state_dict

        state = load_state_dict(str(path))
    mismatch = state_dict_mismatch(model, state)
    if mismatch is not None:
        raise ValueError(f"{path} does not fit {description or type(model).__name__}: {mismatch}"
                         f"{_shape_hint(model, state)}")
    model.load_state_dict(state)


def _calibrated_folder_files(folder: Path, checkpoint: str):
    """(model file, calibrator file or None) of a folder: a ``timm-csm-calibrate`` output names both in its
    description, a run holds ``checkpoint`` and maybe ``temperature.safetensors``."""
    import json

    description = folder / CALIBRATED_MODEL_FILE
    if description.is_file():
        record = json.loads(description.read_text())
        return folder / record["model"], folder / record["calibrator"]
    found = next((folder / name for name in CALIBRATOR_FILES if (folder / name).is_file()), None)
    return folder / checkpoint, found


def trained_model_file(path, checkpoint: str = "model_best.safetensors") -> Path:
    """The model file of a run folder (``checkpoint`` in it) or of a ``timm-csm-calibrate`` output folder (the one
    its ``calibrated_model.json`` names); ``path`` itself when it is a file."""
    path = Path(path)
    return _calibrated_folder_files(path, checkpoint)[0] if path.is_dir() else path


def load_trained_classifier(path, checkpoint: str = "model_best.safetensors", calibrated: bool = False):
    """(model, eval transform, meta) of a finished run: ``path`` is its folder (``checkpoint`` in it, the best
    model by default) or a model / training-state file written by ``train.py``; or a ``timm-csm-calibrate`` output
    folder (its ``calibrated_model.json`` names the model file).

    The model is rebuilt from the file's metadata (architecture, classes, input channels and size, model kwargs),
    loaded with its weights and put in ``eval()`` mode; the transform is the evaluation transform of the run
    (resize and normalise with the stored mean and std, :class:`~timm_csm.data.BatchTransform`; timm's resize and
    centre crop, :class:`~timm_csm.data.SampleTransform`, for a run on timm's transforms), applied to uint8
    (N, C, H, W) images; ``meta`` is the stored metadata (the run's data options, class names, run id, epoch).

    ``calibrated=True`` returns a :class:`CalibratedClassifier`: the model followed by the folder's calibrator
    (``calibrator.safetensors`` of a ``timm-csm-calibrate`` output, else the ``temperature.safetensors`` a run
    fitted on its validation split); ``meta["calibrator"]`` names the file. A folder without one is a
    ``ValueError``.
    """
    from ..calibration import load_calibrator
    from ..data import create_timm_transforms, create_transforms

    path = Path(path)
    calibrator_file = None
    if path.is_dir():
        file, calibrator_file = _calibrated_folder_files(path, checkpoint)
    else:
        file = path
    if not file.is_file():
        raise FileNotFoundError(f"{file} does not exist (give a run folder holding {checkpoint}, or a model file)")
    if calibrated and calibrator_file is None:
        raise ValueError(f"{path} holds no fitted calibrator ({' or '.join(CALIBRATOR_FILES)}); run "
                         "timm-csm-calibrate on it, or load it with calibrated=False")
    meta = read_model_meta(file)
    if not meta or "num_classes" not in meta:
        raise ValueError(f"{file} carries no timm-csm run metadata; load it with timm.create_model and "
                         "load_model_weights instead")
    model = create_train_model(meta["model"], meta["num_classes"], meta["in_chans"], meta["img_size"],
                               model_kwargs=dict(meta.get("model_kwargs") or []))
    load_model_weights(model, file)
    if meta.get("transform") == "timm":
        _, eval_tf = create_timm_transforms(meta["img_size"], meta["mean"], meta["std"], meta["in_chans"],
                                            meta["interpolation"], meta["crop_pct"], crop_mode=meta.get("crop_mode"))
    else:
        _, eval_tf = create_transforms(meta["img_size"], meta["mean"], meta["std"], meta["in_chans"])
    model = model.eval()
    if calibrated:
        model = CalibratedClassifier(model, load_calibrator(calibrator_file)).eval()
        meta = dict(meta, calibrator=str(calibrator_file))
    return model, eval_tf, meta
