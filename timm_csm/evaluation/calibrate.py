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

The options are the fields of :class:`~timm_csm.evaluation.CalibrateConfig` (given as ``config=`` or as keywords),
the flags of ``timm-csm-calibrate``. The classifier (:mod:`timm_csm.evaluation.classifier`) is a run folder or model
file of ``train.py``, a timm model name with weights (``checkpoint``: trained anywhere; ``pretrained_path``: timm's
own; safetensors only), or an ``nn.Module`` with any callable ``transform``. A timm model's preprocessing is resolved as timm's ``validate.py``
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
run's seeded rule and checked against the digests its model file records (``held_out``, the training library's
rule :func:`timm_csm.training.run_held_out_splits`, which ``timm-csm-calibrate`` passes); the first line of the
log says so.

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

import dataclasses
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import torch

from ..calibration import check_calibration_samples, list_calibrators
from ..io import save_model_file, staging_folder, write_json_atomic, write_text_atomic
from ..metrics.interval_methods import INTERVAL_NOTE
from ..metrics.intervals import DEFAULT_LEVEL
from ..options import option_fields
from .calibrators import choose_export, fit_and_score, fit_candidates
from .checks import check_arguments, check_classes, check_splits, refuse_chance
from .classifier import Classifier, load_classifier, merge_data_config
from .config import CalibrateConfig
from .model import CALIBRATED_MODEL_FILE
from .predict import predict_split
from .report import prediction_curves, report_markdown, write_plots
from .shift import ShiftEvaluation, prediction_intervals, prediction_scores
from .shift_report import shift_figure, shift_markdown

__all__ = ["calibrate"]


def _open(dataset, split, image_column, label_column, data_dir):
    from ..data import open_image_split

    try:
        return open_image_split(str(dataset), split, image_column=image_column, label_column=label_column,
                                data_dir=data_dir)
    except (ValueError, ImportError):  # bad input, a missing optional package: their own one line
        raise
    except Exception as e:  # a missing dataset, an offline Hub: one line
        raise ValueError(f"dataset {str(dataset)!r}, split {split!r} could not be opened: {type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''}") from None


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


def _run_splits(model, checkpoint, dataset, data_dir, held_out, log):
    """(calibration split, test split, their descriptions, the dataset) of a run's own images: its validation images
    and its held-out test images, drawn again and digest-checked by ``held_out``
    (:func:`timm_csm.training.run_held_out_splits`), said in the command's first line."""
    from ..data.sources import same_dataset
    from ..io import read_model_meta
    from .model import trained_model_file

    file = trained_model_file(model, *([checkpoint] if checkpoint else []))
    meta = read_model_meta(file) if file.is_file() else None
    if not meta or not meta.get("dataset"):
        raise ValueError(f"{file} is not a model file of a train.py run: give --dataset and --test-split")
    if dataset is not None and not same_dataset(dataset, meta["dataset"]):
        raise ValueError(f"--dataset {dataset} is not the run's data ({meta['dataset']}): give --test-split (and "
                         "--calibration-split or --calibration-fraction) to score it")
    if held_out is None:
        raise ValueError("without test_split the run's own held-out images are scored: pass "
                         "held_out=timm_csm.training.run_held_out_splits (the run's seeded rule), or name the images")
    val, test, rule = held_out(meta, data_dir)
    log(f"calibrating on the run's {len(val)} validation images and scoring its {len(test)} held-out test images "
        f"({rule}; both found again by their digests)")
    return (val, test, "the run's validation images", f"the run's held-out test images ({rule})", meta["dataset"])


def _config(config: Optional[CalibrateConfig], options: Dict[str, Any]) -> CalibrateConfig:
    """``config`` (default: the defaults) with ``options`` replacing its fields; an unknown one is one line."""
    names = {f.name for f in option_fields(CalibrateConfig)}
    unknown = sorted(set(options) - names)
    if unknown:
        raise ValueError(f"unknown calibrate options {unknown}; known: {', '.join(sorted(names))}")
    return dataclasses.replace(config or CalibrateConfig(), **options)


def calibrate(model, dataset=None, *, output, config: Optional[CalibrateConfig] = None,
              data_config: Optional[Dict[str, Any]] = None, transform: Optional[Callable] = None,
              held_out: Optional[Callable] = None, log: Callable[[str], None] = print, **options) -> Dict[str, Any]:
    """Fit the calibrators on the calibration split, score them on the test split and write the report and the
    calibrated model into ``output`` (see the module docstring); returns the report (``report.json``).
    ``config`` / ``options``: :class:`~timm_csm.evaluation.CalibrateConfig` and its fields as keywords (which
    replace its values); ``calibrators``: registry names (default: those registered as default), or ``["auto"]``:
    every registered one that applies; ``export``: the calibrator to export (default: the lowest ``folds``-fold
    cross-validated ``select_by`` on the calibration split); ``bootstrap``: resamples of the test (and
    calibration) samples behind the 95% interval of every number (0: none); ``shift`` / ``ood``:
    :class:`~timm_csm.evaluation.ShiftEvaluation`. ``data_config``: timm's data config keys (``input_size``,
    ``img_size``, ``in_chans``, ``mean``, ``std``, ``crop_pct``, ``crop_mode``, ``interpolation``), over the
    config's; ``transform``: for a module, any callable of one PIL image (converted to ``in_chans`` channels, RGB
    by default); ``held_out``: the rule that finds a training run's own held-out images (without ``test_split``)."""
    c = _config(config, options)
    calibrators = list_calibrators(default=True) if c.calibrators is None else list(c.calibrators)
    output, values = Path(output), c.calibrator_options()
    given = merge_data_config({**c.data_config(), **{k: v for k, v in (data_config or {}).items() if v is not None}},
                              c.in_chans, c.img_size)
    check_arguments(model, output, calibrators, dataset, c)
    from ..data import image_geometry

    if c.test_split is None:
        cal_data, test_data, cal_source, test_source, dataset = _run_splits(model, c.checkpoint, dataset, c.data_dir,
                                                                            held_out, log)
    else:
        cal_data, test_data, cal_source, test_source = _splits(dataset, c.test_split, c.calibration_split,
                                                               c.calibration_fraction, c.seed,
                                                               (c.image_column, c.label_column, c.data_dir))
    if len(test_data) == 0:
        raise ValueError(f"the test split {c.test_split!r} has no images")
    classifier = load_classifier(model, c.checkpoint, c.pretrained_path, c.num_classes, class_names=c.class_names,
                                 transform=transform, data_config=given,
                                 native_size=image_geometry(test_data, c.seed)[1], log=log)
    check_splits(classifier, dataset, c.test_split, c.calibration_split, c.allow_training_split, log)
    check_classes(classifier, list(test_data.class_names), (classifier.meta or {}).get("num_classes"), log)
    shift_eval = ShiftEvaluation.create(c.shift, c.shift_severities, c.ood, c.ood_split, seed=c.seed,
                                        in_dataset=dataset, class_names=list(test_data.class_names),
                                        data_dir=c.data_dir)
    k = len(test_data.class_names)
    calibrators, left_out = fit_candidates(calibrators, c.export, k, len(cal_data), c.folds)
    cal_labels = torch.as_tensor(cal_data.labels)
    check_calibration_samples(calibrators, len(cal_labels), len(torch.unique(cal_labels)), k)
    log(f"predicting {len(cal_data)} calibration and {len(test_data)} test images")

    def predict(split):
        return predict_split(classifier, split, c.batch_size, c.device, c.workers)

    cal = predict(cal_data)
    if cal[0].shape[1] != k:
        raise ValueError(f"the model has {cal[0].shape[1]} outputs, the data {k} classes")
    refuse_chance(cal, classifier)
    test = predict(test_data)
    chosen, selection = choose_export(calibrators, c.export, cal, c.folds, c.select_by, c.seed, c.n_bins, values,
                                      left_out, log)
    results = fit_and_score(calibrators, cal, test, c.n_bins, c.alpha, c.conformal, c.seed, log, values,
                            c.bootstrap)
    log(f"exported: {chosen['kind']} ({chosen['chosen_by']})")
    report = _report(classifier, c, dataset, test_data, (cal_source, len(cal_data)), (test_source, len(test_data)),
                     test, results, selection)
    if shift_eval is not None:
        fitted = {name: calibrator for name, (calibrator, _) in results["fitted"].items()}
        report.update(shift_eval.run(predict, test_data, test, cal, fitted, n_bins=c.n_bins, conformal=c.conformal,
                                     alpha=c.alpha, resamples=c.bootstrap, log=log, transform=classifier.transform))
    _write(output, classifier, report, chosen, results, test, test_data, test_source, dataset, c, log)
    log(f"report: {output / 'report.md'}; calibrated model: {output} (load_trained_classifier(..., "
        "calibrated=True))")
    return report


def _report(classifier: Classifier, c: CalibrateConfig, dataset, test_data, cal_part, test_part, test, results,
            selection) -> Dict[str, Any]:
    """``report.json``'s numbers before the shift sections (``cal_part`` / ``test_part``: (description, size))."""
    pre = classifier.preprocessing
    report: Dict[str, Any] = {
        "model": classifier.description, "dataset": str(dataset), "class_names": list(test_data.class_names),
        "calibration": {"source": cal_part[0], "n": cal_part[1]}, "test": {"source": test_part[0], "n": test_part[1]},
        "n_bins": c.n_bins, "alpha": c.alpha, "seed": c.seed, "odir": c.calibrator_options(),
        "preprocessing": None if pre is None else dict(vars(pre), description=pre.describe()),
        "uncalibrated": {"test": prediction_scores(test[0], test[1], c.n_bins),
                         "curves": prediction_curves(test[0], test[1], c.n_bins)},
        "calibrators": results["rows"], "conformal": results["conformal"],
    }
    if results["conformal_left_out"]:
        report["conformal_left_out"] = results["conformal_left_out"]
    if c.bootstrap:
        report["uncalibrated"]["intervals"] = {"test": prediction_intervals(*test, c.n_bins, c.bootstrap, c.seed)}
        report["bootstrap"] = {"resamples": c.bootstrap, "seed": c.seed, "level": DEFAULT_LEVEL,
                               "interval": INTERVAL_NOTE,
                               "resampled": "the samples of the test (and calibration) split"}
    if selection is not None:
        report["selection"] = selection
    return report


def _write(output: Path, classifier: Classifier, report, chosen, results, test, test_data, test_source, dataset,
           c: CalibrateConfig, log) -> None:
    """The output folder, written into a staging folder renamed to ``output`` at the end (see the module
    docstring)."""
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
        write_plots(staging, test, results["fitted"], c.n_bins, log, c.reliability)
        shift_figure(staging, report, log)
