"""Calibrate a classifier a timm user already has, on the labelled images they already have, without training.

    timm-csm-calibrate --model runs/my-run --dataset ./holdout --calibration-split val --test-split test \\
        --calibrators temperature_scaling,dirichlet,isotonic --output calibrated/

    timm-csm-calibrate --model resnet18 --checkpoint resnet18.safetensors --num-classes 10 \\
        --input-size 1 28 28 --mean 0.1307 --std 0.3081 --dataset ./digits --test-split train \\
        --calibration-fraction 0.5 --output calibrated/

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

Checks, all before anything is written (the arguments before anything is loaded): the class names of the data
equal the checkpoint's (count only, said in the log, when the model carries none); the test split is not the split
the run trained on (unless ``allow_training_split``); the calibration split holds enough samples for each
calibrator; the weights fit the architecture (one line: the counts of missing, unexpected and misshapen keys). A
model at chance accuracy on the calibration split (not clearly above the share of its most frequent class:
wrong preprocessing, class order or weights) is refused with one line, exit status 2 and nothing written, rather
than reported as calibrated. Nothing of the training run's data options (its sample limits, splits) is reused.

Output (written into a temporary folder renamed to ``output`` at the end, so a failure leaves nothing behind;
folders with the umask's mode, 0755 usually): ``report.json`` (every number: the metrics of
:func:`timm_csm.metrics.calibration_metrics`, classwise and adaptive ECE included, AURC / E-AURC / AUGRC, the
reliability tables and risk-coverage curves, conformal coverage with its expected range and set sizes, also with
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

import argparse
import math
import numbers
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from .calibrate_report import RELIABILITY_KINDS, report_markdown, write_plots
from .calibration import (CONFORMAL_METHODS, SELECTION_METRICS, ConformalClassifier, auto_candidates,
                          calibrator_spec, check_calibration_samples, create_calibrator, fold_table_markdown,
                          list_calibrators, select_calibrator)
from .io import save_model_file, staging_folder, write_json_atomic, write_text_atomic
from .cli import console_command
from .metrics import DEFAULT_N_BINS, reliability_table
from .metrics.intervals import DEFAULT_LEVEL, DEFAULT_RESAMPLES
from .metrics.selective import risk_coverage_from_points
from .training.args import HelpFormatter
from .training.classifier import (CROP_MODES, INTERPOLATIONS, Classifier, load_classifier, merge_data_config,
                                  require_safetensors)
from .training.model import CALIBRATED_MODEL_FILE
from .training.shift import ShiftEvaluation, prediction_intervals, prediction_scores
from .training.shift_report import shift_figure, shift_markdown

__all__ = ["calibrate", "load_classifier", "Classifier", "main", "require_safetensors"]


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
                             f"{diff}; output i is the model's i-th class name and the data's classes are read in "
                             "timm's order (folder names, natural sort: 1, 2, 10): rename the class folders (or the "
                             "label column's names) to the model's, or give the dataset the model was trained on")
    else:
        log(f"class names not checked (the model carries none): the data's {len(data_names)} classes are taken "
            "in order as the model's outputs")
    if num_outputs is not None and num_outputs != len(data_names):
        raise ValueError(f"the model has {num_outputs} outputs, the data {len(data_names)} classes")


def _predict(classifier: Classifier, split, batch_size: int, device: str, workers: int):
    """(logits float32 (N, C), labels (N,)) of ``split`` through the classifier's eval transform."""
    from torch.utils.data import DataLoader

    from .data import BatchTransform, ImageCollator, IndexDataset, LazyImages, pil_mode

    images, tf = split.images, classifier.transform
    if isinstance(tf, BatchTransform) and isinstance(images, LazyImages):  # one size, to be stacked into a batch
        images = images.with_output(pil_mode(tf.in_chans), tf.img_size)
    loader = DataLoader(IndexDataset(len(split)), batch_size=batch_size, shuffle=False, num_workers=workers,
                        collate_fn=ImageCollator(images, split.labels, tf, 0))
    model = classifier.model.to(device).eval()
    logits, labels = [], []
    with torch.no_grad():
        for batch in loader:
            logits.append(model(batch["pixel_values"].to(device)).float().cpu())
            labels.append(batch["labels"].cpu())
    return torch.cat(logits), torch.cat(labels)


def _curves(logits, labels, n_bins: int) -> Dict[str, Any]:
    conf, pred = torch.softmax(logits.double(), dim=1).max(dim=1)
    return {"reliability": reliability_table(logits, labels, n_bins).to_dict(),
            "risk_coverage": risk_coverage_from_points(conf, (pred == labels).double()).to_dict()}


def _create(name: str, penalties: Dict[str, float]):
    """The calibrator ``name`` with the strengths of ``penalties`` it takes (its registered ``penalties``)."""
    return create_calibrator(name, **calibrator_spec(name).penalty_options(penalties))


#: the conformal sets with their own temperature, fitted for set size (a key of the report's "conformal")
OWN_TEMPERATURE = "set_size_temperature"


def _fit_all(names: Sequence[str], cal, test, n_bins: int, alpha: float, conformal: Sequence[str], seed: int,
             log, odir: Dict[str, float], bootstrap: int) -> Dict[str, Any]:
    """Fit each calibrator on ``cal`` (``odir``: the ODIR penalty strengths, for those that take them), score it on
    ``test`` and ``cal`` (with ``bootstrap`` resamples: the interval of every number); conformal sets on top of
    each (and of none), and with their own temperature fitted for set size (:data:`OWN_TEMPERATURE`)."""
    fitted, rows = {}, {}
    for name in names:
        calibrator = _create(name, odir).fit(*cal)
        out = calibrator.transform(test[0])
        fitted[name] = (calibrator, out)
        scored = {"test": (out, test[1]), "calibration_split": (calibrator.transform(cal[0]), cal[1])}
        rows[name] = {"test": prediction_scores(out, test[1], n_bins), "curves": _curves(out, test[1], n_bins),
                      "calibration_split": prediction_scores(*scored["calibration_split"], n_bins)}
        if bootstrap:
            rows[name]["intervals"] = {split: prediction_intervals(*pair, n_bins, bootstrap, seed)
                                       for split, pair in scored.items()}
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


#: how many standard errors above the share of the most frequent class an accuracy must lie not to be at chance
CHANCE_MARGIN = 3.0


def _refuse_chance(cal, classifier: Classifier) -> None:
    """A one-line error when the calibration split's accuracy is not clearly above the most frequent class's share
    (one-sided binomial test at :data:`CHANCE_MARGIN` standard errors): such a model does not recognise the
    images, and its calibration would only flatten its predictions towards the class frequencies."""
    logits, labels = cal
    n = len(labels)
    accuracy = float((logits.argmax(dim=1) == labels).double().mean())
    share = float(torch.bincount(labels).max()) / n
    bar = share + CHANCE_MARGIN * math.sqrt(share * (1.0 - share) / n)
    if accuracy > bar:
        return
    pre = classifier.preprocessing
    how = (pre.describe() + (", guessed" if pre.guessed else "") if pre is not None else
           "the run's stored one" if classifier.meta else "the transform given")
    raise ValueError(f"accuracy {accuracy:.1%} on the {n} calibration images is at chance (the most frequent class "
                     f"alone is {share:.1%}; a model that recognises them scores above {bar:.1%}): nothing to "
                     f"calibrate, nothing written. Check the preprocessing ({how}), the class order and the weights")


def _candidates(calibrators: List[str], export: Optional[str], k: int, n_cal: int, folds: int):
    """(the calibrators to fit, ``{name: why not}``): the listed ones, or for ``auto`` the registered ones that
    apply to ``k`` classes and ``n_cal`` calibration samples in ``folds`` folds (``export`` must be one)."""
    if calibrators != ["auto"]:
        return calibrators, {}
    names, left_out = auto_candidates(k, n_cal, folds)
    if export is not None and export not in names:
        raise ValueError(f"--export {export!r} does not apply here: {left_out[export]}")
    return names, left_out


def _choose_export(names: List[str], export: Optional[str], cal, folds: int, by: str, seed: int, n_bins: int,
                   odir: Dict[str, float], left_out: Dict[str, str], log) -> Tuple[Dict[str, Any], Optional[dict]]:
    """(the calibrator to export and why, the fold table of the choice or None): ``export`` when given, the only
    one listed, else the lowest ``folds``-fold cross-validated ``by`` on the calibration split
    (:func:`~timm_csm.calibration.select_calibrator`; ``left_out``: the registered ones ``auto`` did not try);
    never a test-split number."""
    if export is not None:
        return {"kind": export, "chosen_by": "named by --export"}, None
    if len(names) == 1:
        return {"kind": names[0], "chosen_by": "the only calibrator listed"}, None
    folds = min(folds, len(cal[1]))
    chosen, table = select_calibrator(*cal, names, folds=folds, by=by, seed=seed, n_bins=n_bins,
                                      options={name: calibrator_spec(name).penalty_options(odir) for name in names})
    log(f"calibrators by {folds}-fold cross-validated {by.upper()} on the calibration split (chosen: {chosen}; "
        f"left out: {left_out or 'none'}):\n{fold_table_markdown(table)}")
    return ({"kind": chosen, "chosen_by": f"the lowest {folds}-fold cross-validated {by.upper()} on the calibration "
             "split"}, dict(table, left_out=left_out))


def _check_arguments(model, output: Path, calibrators: List[str], export, select_by, conformal, alpha, reliability,
                     odir, calibration_split, calibration_fraction, test_split, checkpoint, pretrained_path,
                     least: Dict[str, Tuple[int, int]]) -> None:
    """Every check that needs nothing loaded, in one place, before anything is: one line for the first problem
    (``least``: {flag: (value, its least value)})."""
    if output.exists():
        raise ValueError(f"--output {output} exists; choose a new folder (nothing is overwritten)")
    if not calibrators:
        raise ValueError("give at least one calibrator (--calibrators NAME[,NAME...])")
    auto = calibrators == ["auto"]
    if "auto" in calibrators and not auto:
        raise ValueError("--calibrators auto chooses among every registered calibrator: give it alone")
    for name in [] if auto else calibrators:
        _create(name, odir)  # unknown names list the registered ones; bad ODIR strengths: one line
    if export is not None:
        _create(export, odir)
        if not auto and export not in calibrators:
            raise ValueError(f"--export {export!r} is not one of --calibrators {','.join(calibrators)}")
    if select_by not in SELECTION_METRICS:
        raise ValueError(f"--select-by must be one of {', '.join(SELECTION_METRICS)}, got {select_by!r}")
    for kind in reliability:
        if kind not in RELIABILITY_KINDS:
            raise ValueError(f"unknown reliability diagram {kind!r}; known: {', '.join(RELIABILITY_KINDS)}")
    for method in conformal:
        if method not in CONFORMAL_METHODS:
            raise ValueError(f"unknown conformal method {method!r}; known: {', '.join(CONFORMAL_METHODS)}")
    if not 0.0 < float(alpha) < 1.0:
        raise ValueError(f"--alpha must lie in (0, 1), got {alpha}")
    if (calibration_split is None) == (calibration_fraction is None):
        raise ValueError("give exactly one of --calibration-split NAME or --calibration-fraction F (held out of the "
                         "test split)")
    if calibration_split is not None and calibration_split == test_split:
        raise ValueError(f"--calibration-split and --test-split are both {test_split!r}; calibrators are never "
                         "fitted on the test split: use --calibration-fraction to hold part of it out")
    if calibration_fraction is not None and not 0.0 < float(calibration_fraction) < 1.0:
        raise ValueError(f"--calibration-fraction must lie in (0, 1), got {calibration_fraction}")
    for flag, (value, smallest) in least.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < smallest:
            raise ValueError(f"{flag} must be at least {smallest}, a whole number; got {value!r}")
    if isinstance(model, (str, Path)) and not Path(model).exists():  # a timm name: its weights are files here
        for path, flag in ((checkpoint, "--checkpoint"), (pretrained_path, "--pretrained-path")):
            if path:
                require_safetensors(path, flag)


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


def calibrate(model, dataset, *, output, test_split: str, calibration_split: Optional[str] = None,
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
    _check_arguments(model, output, calibrators, export, select_by, conformal, alpha, reliability, odir,
                     calibration_split, calibration_fraction, test_split, checkpoint, pretrained_path,
                     {"--n-bins": (n_bins, 1), "--batch-size": (batch_size, 1), "--folds": (folds, 2),
                      "--bootstrap": (bootstrap, 0), "--workers": (workers, 0)})
    from .data import image_geometry

    cal_data, test_data, cal_source, test_source = _splits(dataset, test_split, calibration_split,
                                                           calibration_fraction, seed,
                                                           (image_column, label_column, data_dir))
    if len(test_data) == 0:
        raise ValueError(f"the test split {test_split!r} has no images")
    classifier = load_classifier(model, checkpoint, pretrained_path, num_classes, class_names=class_names,
                                 transform=transform, data_config=given,
                                 native_size=image_geometry(test_data, seed)[1], log=log)
    _check_splits(classifier, dataset, test_split, calibration_split, allow_training_split, log)
    _check_classes(classifier, list(test_data.class_names), (classifier.meta or {}).get("num_classes"), log)
    shift_eval = ShiftEvaluation.create(shift, shift_severities, ood, ood_split, seed=seed, in_dataset=dataset,
                                        class_names=list(test_data.class_names), data_dir=data_dir)
    k = len(test_data.class_names)
    calibrators, left_out = _candidates(calibrators, export, k, len(cal_data), folds)
    cal_labels = torch.as_tensor(cal_data.labels)
    check_calibration_samples(calibrators, len(cal_labels), len(torch.unique(cal_labels)), k)
    log(f"predicting {len(cal_data)} calibration and {len(test_data)} test images")
    cal = _predict(classifier, cal_data, batch_size, device, workers)
    if cal[0].shape[1] != k:
        raise ValueError(f"the model has {cal[0].shape[1]} outputs, the data {k} classes")
    _refuse_chance(cal, classifier)
    test = _predict(classifier, test_data, batch_size, device, workers)
    chosen, selection = _choose_export(calibrators, export, cal, folds, select_by, seed, n_bins, odir, left_out, log)
    results = _fit_all(calibrators, cal, test, n_bins, alpha, conformal, seed, log, odir, bootstrap)
    log(f"exported: {chosen['kind']} ({chosen['chosen_by']})")
    pre = classifier.preprocessing
    report: Dict[str, Any] = {
        "model": classifier.description, "dataset": str(dataset), "class_names": list(test_data.class_names),
        "calibration": {"source": cal_source, "n": len(cal_data)}, "test": {"source": test_source, "n": len(test_data)},
        "n_bins": n_bins, "alpha": alpha, "seed": seed, "odir": odir,
        "preprocessing": None if pre is None else dict(vars(pre), description=pre.describe()),
        "uncalibrated": {"test": prediction_scores(test[0], test[1], n_bins), "curves": _curves(test[0], test[1], n_bins)},
        "calibrators": results["rows"], "conformal": results["conformal"],
    }
    if bootstrap:
        report["uncalibrated"]["intervals"] = {"test": prediction_intervals(*test, n_bins, bootstrap, seed)}
        report["bootstrap"] = {"resamples": bootstrap, "seed": seed, "level": DEFAULT_LEVEL, "interval": "percentile",
                               "resampled": "the samples of the test (and calibration) split"}
    if selection is not None:
        report["selection"] = selection
    if shift_eval is not None:
        report.update(shift_eval.run(lambda split: _predict(classifier, split, batch_size, device, workers),
                                     test_data, test, cal, {n: c for n, (c, _) in results["fitted"].items()},
                                     n_bins=n_bins, conformal=conformal, alpha=alpha, resamples=bootstrap,
                                     log=log))
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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="timm-csm-calibrate", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("--model", required=True, help="a train.py run folder or model file, or a timm model name")
    p.add_argument("--checkpoint", default=None, help="weights (safetensors) of a timm model name, trained anywhere; "
                                                      "or the file to use in a run folder")
    p.add_argument("--pretrained-path", default=None, help="timm's own pretrained weights (safetensors) of a timm "
                                                           "model name: its pretrained_cfg describes them")
    p.add_argument("--dataset", required=True, help="image folder, datasets name or folder, hfds/..., torch/...")
    p.add_argument("--calibration-split", default=None, help="the split the calibrators are fitted on")
    p.add_argument("--calibration-fraction", type=float, default=None,
                   help="hold out this seeded fraction of the test split for fitting instead")
    p.add_argument("--test-split", required=True, help="the split the report scores (a flat <class>/* folder is "
                                                       "split 'train')")
    p.add_argument("--calibrators", default=",".join(list_calibrators(default=True)),
                   help="comma-separated registry names (timm_csm.calibration.list_calibrators()), or 'auto': every "
                        "registered one that applies")
    p.add_argument("--export", default=None, help="the calibrator exported with the model (default: the lowest "
                                                  "cross-validated --select-by on the calibration split)")
    p.add_argument("--select-by", default="nll", choices=SELECTION_METRICS,
                   help="the held-out metric that chooses the exported calibrator among several")
    p.add_argument("--folds", type=int, default=5, help="folds of the calibration split in that cross-validation")
    p.add_argument("--bootstrap", type=int, default=DEFAULT_RESAMPLES,
                   help="bootstrap resamples behind the 95%% interval of every number of the report (0: none)")
    p.add_argument("--conformal", default=",".join(CONFORMAL_METHODS), help="conformal methods ('' for none)")
    p.add_argument("--alpha", type=float, default=0.1, help="conformal miscoverage level")
    p.add_argument("--output", required=True, help="a new folder for the report and the calibrated model")
    p.add_argument("--reg-lambda", type=float, default=0.0,
                   help=f"{' / '.join(list_calibrators(penalty='reg_lambda'))}: the off-diagonal weight penalty (ODIR, "
                        "Kull et al. 2019)")
    p.add_argument("--reg-mu", type=float, default=0.0,
                   help=f"{' / '.join(list_calibrators(penalty='reg_mu'))}: the intercept penalty")
    p.add_argument("--shift", nargs="?", const="all", default=None, metavar="NAMES",
                   help="also score the test split under corruptions, before and after each calibrator: 'all' (the "
                        "flag alone) or comma-separated names of timm_csm.data.corruptions.list_corruptions()")
    p.add_argument("--shift-severities", type=int, nargs="+", default=[1, 2, 3, 4, 5],
                   help="the corruption severities of --shift (1-5)")
    p.add_argument("--ood", default=None, help="an image source of none of the model's classes (any --dataset "
                                               "form): OOD detection scores against the test images")
    p.add_argument("--ood-split", default=None, help="the split of --ood (default: its test split, else 'train')")
    p.add_argument("--reliability", default="", help="extra reliability diagrams, comma-separated: adaptive "
                   "(equal-mass bins), classwise (one-vs-rest pairs of every class)")
    p.add_argument("--num-classes", type=int, default=None, help="classes of a timm model name (default: the run's)")
    g = p.add_argument_group("preprocessing of a timm model name (timm's validate.py flags; default: the model's "
                             "pretrained_cfg, and for weights trained elsewhere the images' own size, said as a guess)")
    g.add_argument("--input-size", type=int, nargs=3, default=None, metavar=("C", "H", "W"),
                   help="input channels and size (H = W)")
    g.add_argument("--in-chans", type=int, default=None, help="input channels (default: the model's, 3 for most)")
    g.add_argument("--img-size", type=int, default=None, help="input size")
    g.add_argument("--mean", type=float, nargs="+", default=None, help="normalisation mean, one value per channel")
    g.add_argument("--std", type=float, nargs="+", default=None, help="normalisation std, one value per channel")
    g.add_argument("--crop-pct", type=float, default=None, help="resize to size / crop-pct, then crop")
    g.add_argument("--crop-mode", default=None, choices=CROP_MODES, help="timm's crop mode")
    g.add_argument("--interpolation", default=None, choices=INTERPOLATIONS, help="resize interpolation")
    p.add_argument("--allow-training-split", action="store_true",
                   help="score the split the model was trained on (refused otherwise)")
    p.add_argument("--n-bins", type=int, default=DEFAULT_N_BINS, help="confidence bins of ECE-type metrics")
    p.add_argument("--batch-size", type=int, default=128, help="images per prediction batch")
    p.add_argument("--seed", type=int, default=0, help="seed of the calibration split and of the calibrators")
    p.add_argument("--device", default="cpu", help="torch device of the model")
    p.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    p.add_argument("--image-column", default=None, help="image column (detected when omitted)")
    p.add_argument("--label-column", default=None, help="label column (detected when omitted)")
    p.add_argument("--data-dir", default=None, help="root folder of a timm torch/<name> dataset")
    p.add_argument("--class-names", default=None, help="comma-separated names of the model's outputs, in output "
                   "order (a plain timm model carries none); the data's classes must carry the same names in "
                   "timm's order (natural sort: 1, 2, 10), so map by renaming class folders")
    return p


@console_command("timm-csm-calibrate", build_parser)
def main(argv: Optional[Sequence[str]] = None) -> int:
    """``timm-csm-calibrate``: bad input (a model at chance accuracy included) is one line on stderr and exit
    status 2, with nothing written."""
    args = build_parser().parse_args(argv)
    data_config = {"input_size": args.input_size, "mean": args.mean, "std": args.std, "crop_pct": args.crop_pct,
                   "crop_mode": args.crop_mode, "interpolation": args.interpolation}
    try:
        calibrate(args.model, args.dataset, output=args.output, test_split=args.test_split,
                  calibration_split=args.calibration_split, calibration_fraction=args.calibration_fraction,
                  calibrators=[c for c in args.calibrators.split(",") if c], export=args.export,
                  conformal=[c for c in args.conformal.split(",") if c], alpha=args.alpha,
                  checkpoint=args.checkpoint, pretrained_path=args.pretrained_path, num_classes=args.num_classes,
                  in_chans=args.in_chans, img_size=args.img_size, data_config=data_config,
                  allow_training_split=args.allow_training_split,
                  n_bins=args.n_bins, batch_size=args.batch_size, seed=args.seed, device=args.device,
                  workers=args.workers, image_column=args.image_column, label_column=args.label_column,
                  data_dir=args.data_dir, reg_lambda=args.reg_lambda, reg_mu=args.reg_mu,
                  reliability=[r for r in args.reliability.split(",") if r], select_by=args.select_by,
                  folds=args.folds, bootstrap=args.bootstrap, shift=args.shift,
                  shift_severities=args.shift_severities, ood=args.ood, ood_split=args.ood_split,
                  class_names=args.class_names.split(",") if args.class_names else None,
                  log=lambda m: print(m, file=sys.stderr))
    except (ValueError, FileNotFoundError) as e:
        print(f"timm-csm-calibrate: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
