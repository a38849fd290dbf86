"""Calibrate a classifier a timm user already has, on the labelled images they already have, without training.

    timm-csm-calibrate --model runs/my-run --dataset ./holdout --calibration-split val --test-split test \\
        --calibrators temperature_scaling,dirichlet,isotonic --output calibrated/

    timm-csm-calibrate --model resnet18 --checkpoint resnet18.safetensors --num-classes 10 \\
        --input-size 1 28 28 --mean 0.1307 --std 0.3081 --dataset ./digits --test-split train \\
        --calibration-fraction 0.5 --output calibrated/

    timm-csm-calibrate --model runs/my-run --output calibrated/     # the run's own validation and test images

    calibrate("resnet18", "./holdout", checkpoint="resnet18.safetensors", num_classes=10,
              data_config={"input_size": (1, 28, 28), "mean": (0.1307,), "std": (0.3081,)},
              calibration_split="val", test_split="test", output="calibrated/")

The classifier (:mod:`timm_csm.training.classifier`) is a run folder or model file of ``train.py``, a timm model
name with weights (``checkpoint``: trained anywhere; ``pretrained_path``: timm's own; safetensors only), or an
``nn.Module`` with any callable ``transform``. A timm model's preprocessing is resolved as timm's ``validate.py``
resolves it, from the given values of timm's data config (``--input-size`` / ``--img-size``, ``--mean``,
``--std``, ``--crop-pct``, ``--crop-mode``, ``--interpolation``), then the model's ``pretrained_cfg``; for weights
trained elsewhere what is not given is a guess, said in one line (the images' own size, no resize or crop of
images at the input size, the architecture's mean and std). The data are anything ``train.py`` reads
(:func:`timm_csm.data.open_image_split`): image folders in timm's layouts (``<split>/<class>/*`` and the flat
``<class>/*``, read as split ``train``; classes in timm's natural order 1, 2, 10), ``datasets`` names and
folders, ``hfds/...``, ``torch/...``. The calibrators are fitted on the calibration split (``calibration_split``,
or a seeded ``calibration_fraction`` held out of the test split) and scored on the test split, never fitted on it.
Without ``test_split`` the model must be a run of ``train.py``: the calibrators are fitted on the run's validation
images and scored on the test images it held out (a flat folder's ``--test-fraction`` included), drawn again by the
run's seeded rule and checked against the digests its model file records
(:func:`~timm_csm.training.data.run_held_out_splits`); the first line of the log says so.

Checks, all before anything is written (the arguments before anything is loaded): the class names of the data
equal the checkpoint's (count only, said in the log, when the model carries none); the test split is not the split
the run trained on (unless ``allow_training_split``); the calibration split holds enough samples for each
calibrator; the weights fit the architecture (one line: the counts of missing, unexpected and misshapen keys). A
model at chance accuracy on the calibration split (not clearly above the share of its most frequent class:
wrong preprocessing, class order or weights) is refused with one line, exit status 2 and nothing written, rather
than reported as calibrated. With a ``test_split`` named, nothing of the training run's data options (its sample
limits, splits) is reused.

Output (written into a temporary folder renamed to ``output`` at the end, so a failure leaves nothing behind;
folders with the umask's mode, 0755 usually): ``report.json`` (every number: the metrics of
:func:`timm_csm.metrics.calibration_metrics`, classwise and adaptive ECE included, AURC / E-AURC / AUGRC, the
reliability tables and risk-coverage curves, conformal coverage with its expected range and set sizes (on top of
each calibrator: a copy of it fitted on half the calibration split, the quantile on the other half), also with
the sets' own temperature fitted for set size, the preprocessing; each number's 95% bootstrap interval under
``intervals``; the fold table of the calibrator's choice under ``selection``), ``report.md``, ``reliability.png``
(before and after each calibrator, four panels a row; ``reliability_adaptive.png`` / ``reliability_classwise.png``
on request), ``risk_coverage.png``, ``calibrators/<name>.safetensors``, ``test_predictions.safetensors``, and the
calibrated model to take away: ``model.safetensors`` (weights and metadata), ``calibrator.safetensors`` and
``calibrated_model.json``, loaded back as one module by ``load_trained_classifier(output, calibrated=True)``.

The exported calibrator is ``export`` when given, else the one of the listed calibrators (``auto``: every
registered one that applies) with the lowest k-fold cross-validated NLL or ECE on the calibration split
(``select_by``, ``folds``; :func:`timm_csm.calibration.select_calibrator`): the test split takes no part in the
choice.
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np
import torch

from .calibrate_checks import check_arguments, check_classes, check_splits, refuse_chance
from .calibrate_fit import choose_export, fit_and_score, fit_candidates
from .calibrate_report import prediction_curves, report_markdown, write_plots
from .calibration import CONFORMAL_METHODS, check_calibration_samples, list_calibrators
from .io import save_model_file, staging_folder, write_json_atomic, write_text_atomic
from .metrics import DEFAULT_N_BINS
from .metrics.interval_methods import INTERVAL_NOTE
from .metrics.intervals import DEFAULT_LEVEL, DEFAULT_RESAMPLES
from .training.classifier import Classifier, load_classifier, merge_data_config, require_safetensors
from .training.loop import predict
from .training.model import CALIBRATED_MODEL_FILE
from .training.shift import ShiftEvaluation, prediction_intervals, prediction_scores
from .training.shift_report import shift_figure, shift_markdown

__all__ = ["calibrate", "load_classifier", "Classifier", "require_safetensors"]


def _open(dataset, split, image_column, label_column, data_dir):
    from .data import open_image_split

    try:
        return open_image_split(str(dataset), split, image_column=image_column, label_column=label_column,
                                data_dir=data_dir)
    except (ValueError, ImportError):  # bad input, a missing optional package: their own one line
        raise
    except Exception as e:  # a missing dataset, an offline Hub: one line
        raise ValueError(f"dataset {str(dataset)!r}, split {split!r} could not be opened: {type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''}") from None


class _OneDevice:
    """What :func:`~timm_csm.training.loop.predict` asks of its accelerator, for one process in full precision on the
    ``device`` the caller names (any torch device, ``cuda:1`` included): no autocast, nothing to gather."""

    def __init__(self, device):
        self.device = torch.device(device)

    @staticmethod
    def autocast():
        return contextlib.nullcontext()

    @staticmethod
    def gather_for_metrics(tensors):
        return tensors


def _predict(classifier: Classifier, split, batch_size: int, device: str, workers: int):
    """(logits float32 (N, C), labels (N,)) of ``split`` through the classifier's eval transform, by the training
    library's :func:`~timm_csm.training.loop.predict`."""
    from torch.utils.data import DataLoader

    from .data import BatchTransform, ImageCollator, IndexDataset, LazyImages, pil_mode

    images, tf = split.images, classifier.transform
    if isinstance(tf, BatchTransform) and isinstance(images, LazyImages):  # one size, to be stacked into a batch
        images = images.with_output(pil_mode(tf.in_chans), tf.img_size)
    loader = DataLoader(IndexDataset(len(split)), batch_size=batch_size, shuffle=False, num_workers=workers,
                        collate_fn=ImageCollator(images, split.labels, tf, 0))
    return predict(classifier.model.to(device), loader, _OneDevice(device))


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


def _splits(dataset, test_split, calibration_split, calibration_fraction, seed, columns):
    """(calibration split, test split, their descriptions): the named calibration split, or a seeded fraction held
    out of the test split."""
    test_data = _open(dataset, test_split, *columns)
    if calibration_split is not None:
        cal_data = _open(dataset, calibration_split, *columns)
        if list(cal_data.class_names) != list(test_data.class_names):
            raise ValueError(f"the {calibration_split!r} and {test_split!r} splits name different classes")
        return cal_data, test_data, calibration_split, test_split
    order = torch.randperm(len(test_data), generator=torch.Generator().manual_seed(seed)).numpy()
    n_cal = int(round(calibration_fraction * len(test_data)))
    return (test_data.subset(np.sort(order[:n_cal])), test_data.subset(np.sort(order[n_cal:])),
            f"{calibration_fraction:g} of {test_split!r} (seed {seed})", f"the rest of {test_split!r}")


def _run_splits(model, checkpoint, dataset, data_dir, log):
    """(calibration split, test split, their descriptions, the dataset) of a run's own images: its validation images
    and its held-out test images, drawn again and digest-checked
    (:func:`~timm_csm.training.data.run_held_out_splits`), said in the command's first line."""
    from .data.sources import same_dataset
    from .io import read_model_meta
    from .training.data import run_held_out_splits
    from .training.model import trained_model_file

    file = trained_model_file(model, *([checkpoint] if checkpoint else []))
    meta = read_model_meta(file) if file.is_file() else None
    if not meta or not meta.get("dataset"):
        raise ValueError(f"{file} is not a model file of a train.py run: give --dataset and --test-split")
    if dataset is not None and not same_dataset(dataset, meta["dataset"]):
        raise ValueError(f"--dataset {dataset} is not the run's data ({meta['dataset']}): give --test-split (and "
                         "--calibration-split or --calibration-fraction) to score it")
    val, test, rule = run_held_out_splits(meta, data_dir)
    log(f"calibrating on the run's {len(val)} validation images and scoring its {len(test)} held-out test images "
        f"({rule}; both found again by their digests)")
    return (val, test, "the run's validation images", f"the run's held-out test images ({rule})", meta["dataset"])


def calibrate(model, dataset=None, *, output, test_split: Optional[str] = None, calibration_split: Optional[str] = None,
              calibration_fraction: Optional[float] = None, calibrators: Optional[Sequence[str]] = None,
              export: Optional[str] = None, conformal: Sequence[str] = CONFORMAL_METHODS, alpha: float = 0.1,
              checkpoint=None, pretrained_path=None, num_classes: Optional[int] = None,
              in_chans: Optional[int] = None, img_size: Optional[int] = None,
              data_config: Optional[Dict[str, Any]] = None, class_names: Optional[Sequence[str]] = None,
              transform: Optional[Callable] = None, allow_training_split: bool = False, n_bins: int = DEFAULT_N_BINS,
              batch_size: int = 128, seed: int = 0, device: str = "cpu", workers: int = 0,
              image_column: Optional[str] = None, label_column: Optional[str] = None,
              data_dir: Optional[str] = None, reg_lambda: float = 0.0, reg_mu: float = 0.0,
              reliability: Sequence[str] = (), select_by: str = "nll", folds: int = 5,
              bootstrap: int = DEFAULT_RESAMPLES, shift=None,
              shift_severities: Sequence[int] = (1, 2, 3, 4, 5), ood: Optional[str] = None,
              ood_split: Optional[str] = None, log: Callable[[str], None] = print) -> Dict[str, Any]:
    """Fit ``calibrators`` on the calibration split, score them on the test split and write the report and the
    calibrated model into ``output`` (see the module docstring); returns the report (``report.json``).
    ``data_config``: timm's data config keys (``input_size``, ``img_size``, ``in_chans``, ``mean``, ``std``,
    ``crop_pct``, ``crop_mode``, ``interpolation``; ``in_chans`` / ``img_size`` may also be given alone);
    ``transform``: for a module, any callable of one PIL image (converted to ``in_chans`` channels, RGB by
    default); ``calibrators``: registry names (default: those registered as default), or ``["auto"]``: every
    registered one that applies; ``export``: the calibrator to export (default: the lowest ``folds``-fold
    cross-validated ``select_by``, ``"nll"`` or ``"ece"``, on the calibration split); ``bootstrap``: resamples of
    the test (and calibration) samples behind the 95% interval of every number (0: none); ``reg_lambda`` /
    ``reg_mu``: the off-diagonal and intercept penalties (ODIR, Kull et al. 2019) of the calibrators registered
    with them (``list_calibrators(penalty="reg_lambda")``); ``reliability``: extra diagrams, ``adaptive`` and / or
    ``classwise``; ``shift`` (corruption names or ``"all"``) at ``shift_severities`` and
    ``ood`` (an image source of none of the model's classes, its ``ood_split``):
    :class:`~timm_csm.training.shift.ShiftEvaluation`."""
    calibrators = list_calibrators(default=True) if calibrators is None else list(calibrators)
    output, odir = Path(output), {"reg_lambda": reg_lambda, "reg_mu": reg_mu}
    given = merge_data_config(data_config, in_chans, img_size)
    check_arguments(model, output, calibrators, export, select_by, conformal, alpha, reliability, odir, dataset,
                     calibration_split, calibration_fraction, test_split, checkpoint, pretrained_path,
                     {"--n-bins": (n_bins, 1), "--batch-size": (batch_size, 1), "--folds": (folds, 2),
                      "--bootstrap": (bootstrap, 0), "--workers": (workers, 0)})
    from .data import image_geometry

    if test_split is None:
        cal_data, test_data, cal_source, test_source, dataset = _run_splits(model, checkpoint, dataset, data_dir, log)
    else:
        cal_data, test_data, cal_source, test_source = _splits(dataset, test_split, calibration_split,
                                                               calibration_fraction, seed,
                                                               (image_column, label_column, data_dir))
    if len(test_data) == 0:
        raise ValueError(f"the test split {test_split!r} has no images")
    classifier = load_classifier(model, checkpoint, pretrained_path, num_classes, class_names=class_names,
                                 transform=transform, data_config=given,
                                 native_size=image_geometry(test_data, seed)[1], log=log)
    check_splits(classifier, dataset, test_split, calibration_split, allow_training_split, log)
    check_classes(classifier, list(test_data.class_names), (classifier.meta or {}).get("num_classes"), log)
    shift_eval = ShiftEvaluation.create(shift, shift_severities, ood, ood_split, seed=seed, in_dataset=dataset,
                                        class_names=list(test_data.class_names), data_dir=data_dir)
    k = len(test_data.class_names)
    calibrators, left_out = fit_candidates(calibrators, export, k, len(cal_data), folds)
    cal_labels = torch.as_tensor(cal_data.labels)
    check_calibration_samples(calibrators, len(cal_labels), len(torch.unique(cal_labels)), k)
    log(f"predicting {len(cal_data)} calibration and {len(test_data)} test images")
    cal = _predict(classifier, cal_data, batch_size, device, workers)
    if cal[0].shape[1] != k:
        raise ValueError(f"the model has {cal[0].shape[1]} outputs, the data {k} classes")
    refuse_chance(cal, classifier)
    test = _predict(classifier, test_data, batch_size, device, workers)
    chosen, selection = choose_export(calibrators, export, cal, folds, select_by, seed, n_bins, odir, left_out, log)
    results = fit_and_score(calibrators, cal, test, n_bins, alpha, conformal, seed, log, odir, bootstrap)
    log(f"exported: {chosen['kind']} ({chosen['chosen_by']})")
    pre = classifier.preprocessing
    report: Dict[str, Any] = {
        "model": classifier.description, "dataset": str(dataset), "class_names": list(test_data.class_names),
        "calibration": {"source": cal_source, "n": len(cal_data)}, "test": {"source": test_source, "n": len(test_data)},
        "n_bins": n_bins, "alpha": alpha, "seed": seed, "odir": odir,
        "preprocessing": None if pre is None else dict(vars(pre), description=pre.describe()),
        "uncalibrated": {"test": prediction_scores(test[0], test[1], n_bins),
                         "curves": prediction_curves(test[0], test[1], n_bins)},
        "calibrators": results["rows"], "conformal": results["conformal"],
    }
    if results["conformal_left_out"]:
        report["conformal_left_out"] = results["conformal_left_out"]
    if bootstrap:
        report["uncalibrated"]["intervals"] = {"test": prediction_intervals(*test, n_bins, bootstrap, seed)}
        report["bootstrap"] = {"resamples": bootstrap, "seed": seed, "level": DEFAULT_LEVEL, "interval": INTERVAL_NOTE,
                               "resampled": "the samples of the test (and calibration) split"}
    if selection is not None:
        report["selection"] = selection
    if shift_eval is not None:
        report.update(shift_eval.run(lambda split: _predict(classifier, split, batch_size, device, workers),
                                     test_data, test, cal, {n: c for n, (c, _) in results["fitted"].items()},
                                     n_bins=n_bins, conformal=conformal, alpha=alpha, resamples=bootstrap,
                                     log=log, transform=classifier.transform))
    with staging_folder(output) as staging:
        (staging / "calibrators").mkdir()
        for name, (calibrator, _) in results["fitted"].items():
            calibrator.save(staging / "calibrators" / f"{name}.safetensors")
        report["calibrated_model"] = dict(_export(staging, classifier, chosen["kind"],
                                                  results["fitted"][chosen["kind"]][0], list(test_data.class_names)),
                                          **chosen)
        write_json_atomic(staging / CALIBRATED_MODEL_FILE, report["calibrated_model"])
        save_model_file(staging / "test_predictions.safetensors", {"logits": test[0], "targets": test[1]},
                        {"dataset": str(dataset), "test": test_source})
        write_json_atomic(staging / "report.json", report)
        write_text_atomic(staging / "report.md", report_markdown(report) + shift_markdown(report))
        write_plots(staging, test, results["fitted"], n_bins, log, reliability)
        shift_figure(staging, report, log)
    log(f"report: {output / 'report.md'}; calibrated model: {output} (load_trained_classifier(..., "
        "calibrated=True))")
    return report
