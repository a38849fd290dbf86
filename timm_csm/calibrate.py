"""Calibrate a classifier a timm user already has, on the labelled images they already have, without training.

    timm-csm-calibrate --model runs/my-run --dataset ./holdout --calibration-split val --test-split test \\
        --calibrators temperature_scaling,dirichlet,isotonic --output calibrated/

    calibrate("resnet18", "./holdout", checkpoint="resnet18.safetensors", num_classes=10, img_size=32,
              calibration_split="val", test_split="test", output="calibrated/")

The classifier is a run folder or model file of ``train.py`` (architecture, input size, normalisation and class
names read from its metadata), a timm model name with weights (``checkpoint`` / ``pretrained_path``: safetensors
only, never unpickled), or an ``nn.Module`` (with ``class_names`` and ``transform`` given). The data are anything
``train.py`` reads (:func:`timm_csm.data.open_image_split`): image folders in timm's layouts (``<split>/<class>/*``
and the flat ``<class>/*``, read as split ``train``), ``datasets`` names and folders, ``hfds/...``, ``torch/...``.
The calibrators are fitted on the calibration split (``calibration_split``, or a seeded ``calibration_fraction``
held out of the test split) and scored on the test split, never fitted on it.

Checks before anything is written: the class names of the data equal the checkpoint's (count only, said in the
log, when the model carries none); the test split is not the split the run trained on (unless
``allow_training_split``); the calibration split holds enough samples for each calibrator. Nothing of the training
run's data options (its sample limits, splits) is reused: the log says what was read from the checkpoint.

``--calibrators auto`` fits every registered calibrator that applies and puts first (and exports) the one with the
lowest k-fold cross-validated NLL or ECE on the calibration split (:func:`timm_csm.calibration.select_calibrator`).

Output (written into a temporary folder renamed to ``output`` at the end, so a failure leaves nothing behind):
``report.json`` (every number: the metrics of :func:`timm_csm.metrics.calibration_metrics`, classwise and
adaptive ECE included, AURC / E-AURC / AUGRC, the reliability tables and risk-coverage curves, conformal coverage
and set sizes, also with the sets' own temperature fitted for set size; each number's 95% bootstrap interval
under ``intervals``; with ``auto`` the fold table under ``selection``), ``report.md``, ``reliability.png`` (before
and after each calibrator; ``reliability_adaptive.png`` / ``reliability_classwise.png`` on request),
``risk_coverage.png``,
``calibrators/<name>.safetensors``, ``test_predictions.safetensors``, and the calibrated model to take away: ``model.safetensors`` (weights and
metadata), ``calibrator.safetensors`` (the first calibrator listed, the chosen one with ``auto``) and
``calibrated_model.json``, loaded back as one module by ``load_trained_classifier(output, calibrated=True)``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np
import torch
import torch.nn as nn

from .calibration import (BINARY_CALIBRATORS, CONFORMAL_METHODS, SELECTION_METRICS, ConformalClassifier,
                          auto_candidates, create_calibrator, fold_table_markdown, select_calibrator)
from .io import safetensors_metadata, save_model_file, write_json_atomic, write_text_atomic
from .metrics import bootstrap_metrics, calibration_metrics, reliability_table
from .metrics.intervals import DEFAULT_LEVEL, DEFAULT_RESAMPLES
from .metrics.selective import risk_coverage_from_points, selective_metrics_from_points
from .training.args import HelpFormatter
from .training.model import (CALIBRATED_MODEL_FILE, check_model_name, create_train_model, load_model_weights,
                             load_trained_classifier)

__all__ = ["calibrate", "load_classifier", "Classifier", "main", "require_safetensors"]


@dataclass
class Classifier:
    """A model ready to score images: ``transform`` maps uint8 images to its input; ``class_names`` None when
    unknown; ``meta`` the timm-csm metadata (None for a plain timm model or module)."""

    model: nn.Module
    transform: Callable
    class_names: Optional[List[str]]
    meta: Optional[Dict[str, Any]]
    description: str


def require_safetensors(path, flag: str) -> Path:
    """``path`` as a Path when it is a readable safetensors file; else a one-line error naming ``flag``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{flag} {path} does not exist" + (" (it is a folder)" if path.is_dir() else ""))
    if safetensors_metadata(path) is None:
        raise ValueError(f"{flag} {path} is not a safetensors file (a pickle or JSON?); weights are read from "
                         "safetensors only, never unpickled: convert it with safetensors.torch.save_file")
    return path


def _timm_meta(name: str, model: nn.Module, num_classes: int, in_chans: int, img_size: int,
               class_names: Optional[List[str]]) -> Dict[str, Any]:
    """The metadata ``load_trained_classifier`` rebuilds a plain timm model from (timm's eval transform)."""
    from timm.data import resolve_data_config

    cfg = resolve_data_config({"input_size": (in_chans, img_size, img_size)},
                              pretrained_cfg=dict(getattr(model, "pretrained_cfg", None) or {}), verbose=False)
    mean, std = list(cfg["mean"]), list(cfg["std"])
    if in_chans == 1 and len(mean) == 3:
        mean, std = [float(np.mean(mean))], [float(np.mean(std))]
    return {"model": name, "num_classes": num_classes, "in_chans": in_chans, "img_size": img_size,
            "model_kwargs": [], "transform": "timm", "mean": mean, "std": std,
            "interpolation": cfg["interpolation"], "crop_pct": cfg["crop_pct"], "class_names": class_names,
            "dataset": None}


def load_classifier(model, checkpoint=None, pretrained_path=None, num_classes: Optional[int] = None,
                    in_chans: int = 3, img_size: Optional[int] = None, class_names: Optional[Sequence[str]] = None,
                    transform: Optional[Callable] = None, log: Callable[[str], None] = print) -> Classifier:
    """The classifier of :func:`calibrate` (see the module docstring for what ``model`` may be)."""
    from .data import create_timm_transforms

    names = list(class_names) if class_names is not None else None
    if isinstance(model, nn.Module):
        if transform is None:
            raise ValueError("a model object needs transform= (uint8 images -> model input)")
        return Classifier(model.eval(), transform, names, None, type(model).__name__)
    if os.path.exists(str(model)):
        path = Path(model)
        if path.is_file():
            require_safetensors(path, "--model")
        loaded, eval_tf, meta = load_trained_classifier(path, **({"checkpoint": checkpoint} if checkpoint else {}))
        log(f"model: {meta['model']} from {path} ({meta['num_classes']} classes, input {meta['in_chans']}x"
            f"{meta['img_size']}, mean {meta['mean']}, std {meta['std']}, class names from the checkpoint); "
            "nothing else of its training run is used")
        stored = meta.get("class_names")
        if names is not None and stored is not None and names != list(stored):
            raise ValueError(f"--class-names {names[:5]} differ from the checkpoint's {list(stored)[:5]}")
        return Classifier(loaded, eval_tf, names or stored, meta, str(path))
    check_model_name(str(model))
    if bool(checkpoint) == bool(pretrained_path):
        raise ValueError(f"timm model {model!r}: give its weights with exactly one of --checkpoint FILE.safetensors "
                         "or --pretrained-path FILE.safetensors")
    weights = require_safetensors(checkpoint or pretrained_path, "--checkpoint" if checkpoint else
                                  "--pretrained-path")
    if num_classes is None:
        num_classes = len(names) if names else None
    if num_classes is None:
        raise ValueError(f"timm model {model!r}: give --num-classes (or --class-names)")
    net = create_train_model(str(model), num_classes, in_chans, img_size)
    try:
        load_model_weights(net, weights)
    except RuntimeError as e:  # shape mismatches: the classes or architecture differ
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        raise ValueError(f"{weights} does not fit {model} with {num_classes} classes and {in_chans} channels: "
                         f"{lines[1] if len(lines) > 1 else lines[0]}") from None
    size = img_size or int((getattr(net, "pretrained_cfg", None) or {}).get("input_size", (3, 224, 224))[-1])
    meta = _timm_meta(str(model), net, num_classes, in_chans, size, names)
    _, eval_tf = create_timm_transforms(size, meta["mean"], meta["std"], in_chans, meta["interpolation"],
                                        meta["crop_pct"])
    log(f"model: timm {model} with {weights} ({num_classes} classes, input {in_chans}x{size}, timm's eval "
        f"transform, mean {meta['mean']}, std {meta['std']}); the data it was trained on is unknown")
    return Classifier(net.eval(), eval_tf, names, meta, f"{model} + {weights}")


def _check_splits(classifier: Classifier, dataset, test_split: str, calibration_split: Optional[str],
                  allow_training_split: bool, log) -> None:
    from .data.sources import same_dataset

    meta = classifier.meta or {}
    if not meta.get("dataset"):
        log(f"the training data of {classifier.description} is unknown: make sure {test_split!r} was not used "
            "to train it")
        return
    if not same_dataset(meta["dataset"], dataset):
        return
    trained = meta.get("train_split") or "train"
    if test_split == trained:
        if not allow_training_split:
            raise ValueError(f"--test-split {test_split!r} of {dataset} is the split the model was trained on; "
                             "name a held-out split, or pass --allow-training-split to score it anyway")
        log(f"warning: scoring on {test_split!r}, the split the model was trained on (--allow-training-split)")
    if calibration_split == trained:
        log(f"warning: the calibration split {calibration_split!r} is the training split: its predictions are "
            "over-confident compared with new data")


def _open(dataset, split, image_column, label_column, data_dir):
    from .data import open_image_split

    try:
        return open_image_split(str(dataset), split, image_column=image_column, label_column=label_column,
                                data_dir=data_dir)
    except ValueError:
        raise
    except Exception as e:  # a missing dataset, an offline Hub: one line
        raise ValueError(f"dataset {str(dataset)!r}, split {split!r} could not be opened: {type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''}") from None


def _check_classes(classifier: Classifier, data_names: List[str], num_outputs: Optional[int], log) -> None:
    if classifier.class_names is not None:
        if list(classifier.class_names) != list(data_names):
            diff = [(i, m, d) for i, (m, d) in enumerate(zip(classifier.class_names, data_names)) if m != d][:3]
            raise ValueError(f"the data's class names differ from the model's: {len(data_names)} vs "
                             f"{len(classifier.class_names)} classes, first differences (index, model, data) "
                             f"{diff}; output i is the model's i-th class name and the data's classes are read in sorted order "
                             "(folder names): rename the class folders (or the label column's names) to the model's, "
                             "or give the dataset the model was trained on")
    else:
        log(f"class names not checked (the model carries none): the data's {len(data_names)} classes are taken "
            "in order as the model's outputs")
    if num_outputs is not None and num_outputs != len(data_names):
        raise ValueError(f"the model has {num_outputs} outputs, the data {len(data_names)} classes")


def _predict(classifier: Classifier, split, batch_size: int, device: str, workers: int):
    """(logits float32 (N, C), labels (N,)) of ``split`` through the classifier's eval transform."""
    from torch.utils.data import DataLoader

    from .data import BatchTransform, ImageCollator, IndexDataset, LazyImages, pil_mode

    images = split.images
    if isinstance(classifier.transform, BatchTransform) and isinstance(images, LazyImages):
        meta = classifier.meta or {}
        images = images.with_output(pil_mode(meta.get("in_chans")), (meta["img_size"],) * 2)
    loader = DataLoader(IndexDataset(len(split)), batch_size=batch_size, shuffle=False, num_workers=workers,
                        collate_fn=ImageCollator(images, split.labels, classifier.transform, 0))
    model = classifier.model.to(device).eval()
    logits, labels = [], []
    with torch.no_grad():
        for batch in loader:
            logits.append(model(batch["pixel_values"].to(device)).float().cpu())
            labels.append(batch["labels"].cpu())
    return torch.cat(logits), torch.cat(labels)


def _scores(logits, labels, n_bins: int) -> Dict[str, float]:
    out = {k: float(v) for k, v in calibration_metrics(logits, labels, n_bins=n_bins).items()}
    conf, pred = torch.softmax(logits.double(), dim=1).max(dim=1)
    out.update(selective_metrics_from_points(conf, (pred == labels).double()))
    return out


def _curves(logits, labels, n_bins: int) -> Dict[str, Any]:
    conf, pred = torch.softmax(logits.double(), dim=1).max(dim=1)
    return {"reliability": reliability_table(logits, labels, n_bins).to_dict(),
            "risk_coverage": risk_coverage_from_points(conf, (pred == labels).double()).to_dict()}


#: the calibrators with the off-diagonal / intercept (ODIR) penalty of Kull et al. (2019)
ODIR_CALIBRATORS = ("dirichlet", "matrix_scaling")


def _intervals(logits, labels, n_bins: int, bootstrap: int, seed: int) -> Dict[str, Dict[str, float]]:
    """The percentile intervals of every number of :func:`_scores` (``bootstrap`` resamples)."""
    return bootstrap_metrics(logits, labels, n_bins, resamples=bootstrap, seed=seed, selective=True)


#: the conformal sets with their own temperature, fitted for set size (a key of the report's "conformal")
OWN_TEMPERATURE = "set_size_temperature"


def _fit_all(names: Sequence[str], cal, test, n_bins: int, alpha: float, conformal: Sequence[str], seed: int,
             log, odir: Dict[str, float], bootstrap: int = 0) -> Dict[str, Any]:
    """Fit each calibrator on ``cal`` (``odir``: the penalty strengths of :data:`ODIR_CALIBRATORS`), score it on
    ``test`` (with ``bootstrap`` resamples: the intervals of every number); conformal sets on top of each (and of
    none), and with their own temperature fitted for set size (:data:`OWN_TEMPERATURE`)."""
    fitted, rows = {}, {}
    for name in names:
        calibrator = create_calibrator(name, **(odir if name in ODIR_CALIBRATORS else {})).fit(*cal)
        out = calibrator.transform(test[0])
        fitted[name] = (calibrator, out)
        rows[name] = {"test": _scores(out, test[1], n_bins), "curves": _curves(out, test[1], n_bins),
                      "calibration_split": _scores(calibrator.transform(cal[0]), cal[1], n_bins)}
        if bootstrap:
            rows[name]["intervals"] = {
                "test": _intervals(out, test[1], n_bins, bootstrap, seed),
                "calibration_split": _intervals(calibrator.transform(cal[0]), cal[1], n_bins, bootstrap, seed)}
        log(f"{name}: test ECE {rows[name]['test']['ece']:.4f}, NLL {rows[name]['test']['nll']:.4f}, "
            f"accuracy {rows[name]['test']['accuracy']:.4f}")
    sets: Dict[str, Dict[str, Any]] = {}
    for base in ["none", *names, OWN_TEMPERATURE]:
        calibrator = fitted[base][0] if base in fitted else None
        temperature = "set_size" if base == OWN_TEMPERATURE else None
        for method in conformal:
            cp = ConformalClassifier(method, alpha=alpha, calibrator=calibrator, seed=seed,
                                     temperature=temperature).fit(*cal)
            sets.setdefault(base, {})[method] = cp.evaluate(*test, bootstrap=bootstrap, seed=seed)
    return {"fitted": fitted, "rows": rows, "conformal": sets}


def _select(cal, k: int, folds: int, by: str, seed: int, n_bins: int, odir: Dict[str, float], log):
    """``--calibrators auto``: the applicable registered calibrators, the one chosen by ``folds``-fold
    cross-validated ``by`` on the calibration split first; and the report's ``selection``."""
    candidates, left_out = auto_candidates(k, len(cal[1]), folds)
    chosen, table = select_calibrator(cal[0], cal[1], candidates, folds=folds, by=by, seed=seed, n_bins=n_bins,
                                      options={name: odir for name in ODIR_CALIBRATORS})
    log(f"calibrators by {folds}-fold cross-validated {by.upper()} on the calibration split (chosen: {chosen}; "
        f"left out: {left_out or 'none'}):\n{fold_table_markdown(table)}")
    return [chosen] + [name for name in candidates if name != chosen], dict(table, left_out=left_out)


def _check_calibration_size(names: Sequence[str], cal_labels, num_classes: int) -> None:
    n = len(cal_labels)
    for name in names:
        if name in BINARY_CALIBRATORS and num_classes != 2:
            raise ValueError(f"calibrator {name!r} is for two-class models; this one has {num_classes} classes")
    if n < num_classes or len(torch.unique(cal_labels)) < 2:
        raise ValueError(f"the calibration split has {n} samples of {len(torch.unique(cal_labels))} classes; "
                         f"the calibrators need at least {num_classes} samples (one per class) of several classes")
    if "matrix_scaling" in names or "dirichlet" in names:
        if n < num_classes * (num_classes + 1):
            raise ValueError(f"matrix_scaling / dirichlet fit {num_classes * (num_classes + 1)} parameters and "
                             f"the calibration split has {n} samples; use more samples, or temperature_scaling / "
                             "vector_scaling")


def _markdown(report: Dict[str, Any]) -> str:
    keys = ("accuracy", "ece", "aece", "cece", "mce", "nll", "brier", "aurc", "eaurc", "augrc")
    boot = report.get("bootstrap")
    shown = (f" Each number with its {boot['level']:.0%} interval [low, high]: {boot['interval']} bootstrap, "
             f"{boot['resamples']} resamples of the test images (seed {boot['seed']})." if boot else "")
    lines = [f"# Calibration of {report['model']}", "",
             f"Data: {report['dataset']}, calibration split {report['calibration']['source']} "
             f"({report['calibration']['n']} images), test split {report['test']['source']} "
             f"({report['test']['n']} images), {report['n_bins']} bins. Lower is better except accuracy." + shown, "",
             "| calibrator | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
    for name, row in [("uncalibrated", report["uncalibrated"]), *report["calibrators"].items()]:
        intervals = (row.get("intervals") or {}).get("test", {})
        lines.append(f"| {name} | " + " | ".join(_cell(row["test"][k], intervals.get(k), 4) for k in keys) + " |")
    if report.get("selection"):
        table = report["selection"]
        lines += ["", f"Chosen by {table['folds']}-fold cross-validated {table['by'].upper()} on the calibration split "
                  f"(stratified folds, seed {table['seed']}; left out: "
                  + (", ".join(f"{k} ({v})" for k, v in table["left_out"].items()) or "none") + "):", "",
                  fold_table_markdown(table)]
    lines += ["", f"Conformal sets at alpha = {report['alpha']} (target coverage {1 - report['alpha']:.2f}); "
              f"`{OWN_TEMPERATURE}`: the sets' own temperature T, fitted for set size on half of the calibration "
              "split, the quantile on the other half:", "",
              "| calibrator | method | T | coverage | mean set size | empty sets |", "|---|---|---|---|---|---|"]
    for base, methods in report["conformal"].items():
        for method, r in methods.items():
            iv = r.get("intervals") or {}
            t = "-" if r.get("temperature") is None else f"{r['temperature']:g}"
            lines.append(f"| {base} | {method} | {t} | {_cell(r['coverage'], iv.get('coverage'), 4)} | "
                         f"{_cell(r['mean_set_size'], iv.get('mean_set_size'), 3)} | "
                         f"{_cell(r['empty_sets'], iv.get('empty_sets'), 4)} |")
    lines += ["", f"Calibrated model: `{report['calibrated_model']['model']}` + "
              f"`{report['calibrated_model']['calibrator']}` ({report['calibrated_model']['kind']}), loaded by "
              "`timm_csm.training.load_trained_classifier(folder, calibrated=True)`."]
    return "\n".join(lines) + "\n"


def _cell(value: float, interval: Optional[Dict[str, float]], digits: int) -> str:
    """``value [low, high]`` (the value alone without an interval)."""
    if interval is None:
        return f"{value:.{digits}f}"
    return f"{value:.{digits}f} [{interval['low']:.{digits}f}, {interval['high']:.{digits}f}]"


RELIABILITY_KINDS = ("adaptive", "classwise")


def _extra_diagrams(folder: Path, runs, n_bins: int, kinds: Sequence[str]) -> None:
    """``reliability_<kind>.png`` for each requested kind: ``adaptive`` (equal-mass bins of the top-label
    confidence) and ``classwise`` (the one-vs-rest pairs (p_ik, 1[y_i = k]) of every class in equal-width bins)."""
    from .metrics import reliability_table_from_points
    from .metrics.plots import table_diagrams

    for kind in kinds:
        tables = {}
        for name, (logits, labels) in runs.items():
            probs = torch.softmax(logits.double(), dim=1)
            if kind == "adaptive":
                conf, pred = probs.max(dim=1)
                tables[name] = reliability_table_from_points(conf, (pred == labels).double(), n_bins,
                                                             equal_mass=True)
            else:
                hits = torch.nn.functional.one_hot(labels, probs.shape[1]).double()
                tables[name] = reliability_table_from_points(probs, hits, n_bins)
        table_diagrams(tables, folder / f"reliability_{kind}.png", title=f"{kind} reliability")


def _plots(folder: Path, test, fitted, n_bins: int, log, reliability: Sequence[str] = ()) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        from .metrics.plots import reliability_diagrams
    except ImportError as e:
        log(f"plots skipped ({e}; pip install matplotlib)")
        return
    runs = {"uncalibrated": (test[0], test[1])}
    runs.update({name: (out, test[1]) for name, (_, out) in fitted.items()})
    reliability_diagrams(runs, str(folder / "reliability.png"), n_bins=n_bins)
    _extra_diagrams(folder, runs, n_bins, reliability)
    fig, ax = plt.subplots(figsize=(5, 4))
    for name, (logits, labels) in runs.items():
        conf, pred = torch.softmax(logits.double(), dim=1).max(dim=1)
        curve = risk_coverage_from_points(conf, (pred == labels).double())
        ax.plot(curve.coverage.numpy(), curve.risk.numpy(), label=name)
    ax.set_xlabel("coverage")
    ax.set_ylabel("selective risk")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(folder / "risk_coverage.png", dpi=120)
    plt.close(fig)


def _export(folder: Path, classifier: Classifier, name: str, calibrator, data_names: List[str]) -> Dict[str, Any]:
    record = {"calibrator": "calibrator.safetensors", "kind": name, "class_names": data_names}
    calibrator.save(folder / "calibrator.safetensors")
    if classifier.meta is None:  # a module object: weights only (rebuild it yourself)
        save_model_file(folder / "model.safetensors", classifier.model.state_dict(), {"class_names": data_names})
        return dict(record, model="model.safetensors", loadable=False)
    meta = dict(classifier.meta, class_names=data_names)
    state = {k: v for k, v in classifier.model.state_dict().items()}
    save_model_file(folder / "model.safetensors", state, meta)
    return dict(record, model="model.safetensors", loadable=True)


def calibrate(model, dataset, *, output, test_split: str, calibration_split: Optional[str] = None,
              calibration_fraction: Optional[float] = None, calibrators: Sequence[str] = ("temperature_scaling",),
              conformal: Sequence[str] = CONFORMAL_METHODS, alpha: float = 0.1, checkpoint=None,
              pretrained_path=None, num_classes: Optional[int] = None, in_chans: int = 3,
              img_size: Optional[int] = None, class_names: Optional[Sequence[str]] = None,
              transform: Optional[Callable] = None, allow_training_split: bool = False, n_bins: int = 15,
              batch_size: int = 128, seed: int = 0, device: str = "cpu", workers: int = 0,
              image_column: Optional[str] = None, label_column: Optional[str] = None,
              data_dir: Optional[str] = None, reg_lambda: float = 0.0, reg_mu: float = 0.0,
              reliability: Sequence[str] = (), select_by: str = "nll", folds: int = 5,
              bootstrap: int = DEFAULT_RESAMPLES, log: Callable[[str], None] = print) -> Dict[str, Any]:
    """Fit ``calibrators`` on the calibration split, score them on the test split and write the report and the
    calibrated model into ``output`` (see the module docstring); returns the report (``report.json``).
    ``reg_lambda`` / ``reg_mu``: the off-diagonal and intercept penalties of ``dirichlet`` and ``matrix_scaling``
    (ODIR, Kull et al. 2019); ``reliability``: extra diagrams, ``adaptive`` and / or ``classwise``.
    ``calibrators=["auto"]``: every registered calibrator that applies, the one with the lowest ``folds``-fold
    cross-validated ``select_by`` (``"nll"`` or ``"ece"``) on the calibration split first, and exported
    (:func:`timm_csm.calibration.select_calibrator`; the fold table is the report's ``selection``).
    ``bootstrap``: resamples of the test (and calibration) samples behind the 95% interval of every number (0:
    none)."""
    output = Path(output)
    if output.exists():
        raise ValueError(f"--output {output} exists; choose a new folder (nothing is overwritten)")
    calibrators = list(calibrators)
    if not calibrators:
        raise ValueError("give at least one calibrator (--calibrators NAME[,NAME...])")
    auto = calibrators == ["auto"]
    if "auto" in calibrators and not auto:
        raise ValueError("--calibrators auto chooses among every registered calibrator: give it alone")
    if auto and (select_by not in SELECTION_METRICS or isinstance(folds, bool) or not isinstance(folds, int)
                 or folds < 2):
        raise ValueError(f"--calibrators auto needs --select-by in {SELECTION_METRICS} and --folds >= 2, got "
                         f"{select_by!r} and {folds!r}")
    if isinstance(bootstrap, bool) or not isinstance(bootstrap, int) or bootstrap < 0:
        raise ValueError(f"--bootstrap must be an integer >= 0, got {bootstrap!r}")
    given = [] if auto else calibrators
    for name in given:
        create_calibrator(name)  # unknown names list the registered ones
    odir = {"reg_lambda": reg_lambda, "reg_mu": reg_mu}
    for name in given:
        create_calibrator(name, **(odir if name in ODIR_CALIBRATORS else {}))  # bad strengths: one line
    for kind in reliability:
        if kind not in RELIABILITY_KINDS:
            raise ValueError(f"unknown reliability diagram {kind!r}; known: {', '.join(RELIABILITY_KINDS)}")
    for method in conformal:
        if method not in CONFORMAL_METHODS:
            raise ValueError(f"unknown conformal method {method!r}; known: {', '.join(CONFORMAL_METHODS)}")
    if (calibration_split is None) == (calibration_fraction is None):
        raise ValueError("give exactly one of --calibration-split NAME or --calibration-fraction F (held out of the "
                         "test split)")
    if calibration_split is not None and calibration_split == test_split:
        raise ValueError(f"--calibration-split and --test-split are both {test_split!r}; calibrators are never "
                         "fitted on the test split: use --calibration-fraction to hold part of it out")
    classifier = load_classifier(model, checkpoint, pretrained_path, num_classes, in_chans, img_size, class_names,
                                 transform, log)
    _check_splits(classifier, dataset, test_split, calibration_split, allow_training_split, log)
    test_data = _open(dataset, test_split, image_column, label_column, data_dir)
    num_outputs = (classifier.meta or {}).get("num_classes")
    _check_classes(classifier, list(test_data.class_names), num_outputs, log)
    if calibration_split is not None:
        cal_data = _open(dataset, calibration_split, image_column, label_column, data_dir)
        if list(cal_data.class_names) != list(test_data.class_names):
            raise ValueError(f"the {calibration_split!r} and {test_split!r} splits name different classes")
        cal_source, test_source = calibration_split, test_split
    else:
        if not 0.0 < float(calibration_fraction) < 1.0:
            raise ValueError(f"--calibration-fraction must lie in (0, 1), got {calibration_fraction}")
        order = torch.randperm(len(test_data), generator=torch.Generator().manual_seed(seed)).numpy()
        n_cal = int(round(calibration_fraction * len(test_data)))
        cal_data = test_data.subset(np.sort(order[:n_cal]))
        test_data = test_data.subset(np.sort(order[n_cal:]))
        cal_source = f"{calibration_fraction:g} of {test_split!r} (seed {seed})"
        test_source = f"the rest of {test_split!r}"
    k = len(test_data.class_names)
    _check_calibration_size(given, torch.as_tensor(cal_data.labels), k)
    if len(test_data) == 0:
        raise ValueError(f"the test split {test_split!r} has no images")
    log(f"predicting {len(cal_data)} calibration and {len(test_data)} test images")
    cal = _predict(classifier, cal_data, batch_size, device, workers)
    test = _predict(classifier, test_data, batch_size, device, workers)
    if cal[0].shape[1] != k:
        raise ValueError(f"the model has {cal[0].shape[1]} outputs, the data {k} classes")
    selection = None
    if auto:
        calibrators, selection = _select(cal, k, folds, select_by, seed, n_bins, odir, log)
    results = _fit_all(calibrators, cal, test, n_bins, alpha, conformal, seed, log, odir, bootstrap)
    report: Dict[str, Any] = {
        "model": classifier.description, "dataset": str(dataset), "class_names": list(test_data.class_names),
        "calibration": {"source": cal_source, "n": len(cal_data)}, "test": {"source": test_source, "n": len(test_data)},
        "n_bins": n_bins, "alpha": alpha, "seed": seed, "odir": odir,
        "uncalibrated": {"test": _scores(test[0], test[1], n_bins), "curves": _curves(test[0], test[1], n_bins)},
        "calibrators": results["rows"], "conformal": results["conformal"],
    }
    if bootstrap:
        report["uncalibrated"]["intervals"] = {"test": _intervals(test[0], test[1], n_bins, bootstrap, seed)}
        report["bootstrap"] = {"resamples": bootstrap, "seed": seed, "level": DEFAULT_LEVEL, "interval": "percentile",
                               "resampled": "the samples of the test (and calibration) split"}
    if selection is not None:
        report["selection"] = selection
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    try:
        (staging / "calibrators").mkdir()
        for name, (calibrator, _) in results["fitted"].items():
            calibrator.save(staging / "calibrators" / f"{name}.safetensors")
        first = calibrators[0]
        report["calibrated_model"] = _export(staging, classifier, first, results["fitted"][first][0],
                                             list(test_data.class_names))
        write_json_atomic(staging / CALIBRATED_MODEL_FILE, report["calibrated_model"])
        save_model_file(staging / "test_predictions.safetensors", {"logits": test[0], "targets": test[1]},
                        {"dataset": str(dataset), "test": test_source})
        write_json_atomic(staging / "report.json", report)
        write_text_atomic(staging / "report.md", _markdown(report))
        _plots(staging, test, results["fitted"], n_bins, log, reliability)
        os.replace(staging, output)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    log(f"report: {output / 'report.md'}; calibrated model: {output} (load_trained_classifier(..., "
        "calibrated=True))")
    return report


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="timm-csm-calibrate", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("--model", required=True, help="a train.py run folder or model file, or a timm model name")
    p.add_argument("--checkpoint", default=None, help="weights (safetensors) of a timm model name, or the file "
                                                      "to use in a run folder")
    p.add_argument("--pretrained-path", default=None, help="weights (safetensors) of a timm model name")
    p.add_argument("--dataset", required=True, help="image folder, datasets name or folder, hfds/..., torch/...")
    p.add_argument("--calibration-split", default=None, help="the split the calibrators are fitted on")
    p.add_argument("--calibration-fraction", type=float, default=None,
                   help="hold out this seeded fraction of the test split for fitting instead")
    p.add_argument("--test-split", required=True, help="the split the report scores (a flat <class>/* folder is "
                                                       "split 'train')")
    p.add_argument("--calibrators", default="temperature_scaling",
                   help="comma-separated registry names; the first is exported as the calibrated model; 'auto': "
                        "every one that applies, chosen by cross-validation on the calibration split (--select-by, "
                        "--folds)")
    p.add_argument("--select-by", default="nll", choices=SELECTION_METRICS,
                   help="--calibrators auto: the held-out metric of the cross-validation")
    p.add_argument("--folds", type=int, default=5, help="--calibrators auto: folds of the calibration split")
    p.add_argument("--bootstrap", type=int, default=DEFAULT_RESAMPLES,
                   help="bootstrap resamples behind the 95%% interval of every number of the report (0: none)")
    p.add_argument("--conformal", default=",".join(CONFORMAL_METHODS), help="conformal methods ('' for none)")
    p.add_argument("--alpha", type=float, default=0.1, help="conformal miscoverage level")
    p.add_argument("--output", required=True, help="a new folder for the report and the calibrated model")
    p.add_argument("--reg-lambda", type=float, default=0.0, help="dirichlet / matrix_scaling: the off-diagonal "
                   "weight penalty (ODIR, Kull et al. 2019)")
    p.add_argument("--reg-mu", type=float, default=0.0, help="dirichlet / matrix_scaling: the intercept penalty")
    p.add_argument("--reliability", default="", help="extra reliability diagrams, comma-separated: adaptive "
                   "(equal-mass bins), classwise (one-vs-rest pairs of every class)")
    p.add_argument("--num-classes", type=int, default=None, help="classes of a timm model name (default: the run's)")
    p.add_argument("--in-chans", type=int, default=3, help="input channels of a timm model name")
    p.add_argument("--img-size", type=int, default=None, help="input size (default: the run's or the model's)")
    p.add_argument("--allow-training-split", action="store_true",
                   help="score the split the model was trained on (refused otherwise)")
    p.add_argument("--n-bins", type=int, default=15, help="confidence bins of ECE-type metrics")
    p.add_argument("--batch-size", type=int, default=128, help="images per prediction batch")
    p.add_argument("--seed", type=int, default=0, help="seed of the calibration split and of the calibrators")
    p.add_argument("--device", default="cpu", help="torch device of the model")
    p.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    p.add_argument("--image-column", default=None, help="image column (detected when omitted)")
    p.add_argument("--label-column", default=None, help="label column (detected when omitted)")
    p.add_argument("--data-dir", default=None, help="root folder of a timm torch/<name> dataset")
    p.add_argument("--class-names", default=None, help="comma-separated names of the model's outputs, in output "
                   "order (a plain timm model carries none); the data's classes must carry the same names in the "
                   "same sorted order, so map by renaming class folders")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``timm-csm-calibrate``: bad input is one line on stderr and exit status 2."""
    args = _parser().parse_args(argv)
    try:
        calibrate(args.model, args.dataset, output=args.output, test_split=args.test_split,
                  calibration_split=args.calibration_split, calibration_fraction=args.calibration_fraction,
                  calibrators=[c for c in args.calibrators.split(",") if c],
                  conformal=[c for c in args.conformal.split(",") if c], alpha=args.alpha,
                  checkpoint=args.checkpoint, pretrained_path=args.pretrained_path, num_classes=args.num_classes,
                  in_chans=args.in_chans, img_size=args.img_size, allow_training_split=args.allow_training_split,
                  n_bins=args.n_bins, batch_size=args.batch_size, seed=args.seed, device=args.device,
                  workers=args.workers, image_column=args.image_column, label_column=args.label_column,
                  data_dir=args.data_dir, reg_lambda=args.reg_lambda, reg_mu=args.reg_mu,
                  reliability=[r for r in args.reliability.split(",") if r], select_by=args.select_by,
                  folds=args.folds, bootstrap=args.bootstrap,
                  class_names=args.class_names.split(",") if args.class_names else None,
                  log=lambda m: print(m, file=sys.stderr))
    except (ValueError, FileNotFoundError) as e:
        print(f"timm-csm-calibrate: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
