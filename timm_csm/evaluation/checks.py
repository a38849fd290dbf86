"""The checks of ``timm-csm-calibrate`` (:func:`timm_csm.evaluation.calibrate`), each a one-line ``ValueError``: the
arguments before anything is loaded, then the data against the model (class names, the training split) and the
model against chance accuracy before anything is written."""
from __future__ import annotations

import math
import numbers
from pathlib import Path
from typing import List, Optional

import torch

from ..calibration import CONFORMAL_METHODS, SELECTION_METRICS
from .calibrators import check_calibrators
from .classifier import Classifier, require_safetensors
from .config import CalibrateConfig
from .report import RELIABILITY_KINDS

__all__ = ["check_arguments", "check_splits", "check_classes", "refuse_chance", "CHANCE_MARGIN"]


def check_arguments(model, output: Path, calibrators: List[str], dataset, c: CalibrateConfig) -> None:
    """Every check of the options ``c`` that needs nothing loaded, in one place, before anything is: one line for
    the first problem."""
    if output.exists():
        raise ValueError(f"--output {output} exists; choose a new folder (nothing is overwritten)")
    check_calibrators(calibrators, c.export, c.calibrator_options())
    select_by, reliability, conformal, alpha = c.select_by, c.reliability, c.conformal, c.alpha
    test_split, calibration_split, calibration_fraction = c.test_split, c.calibration_split, c.calibration_fraction
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
    if test_split is None:  # the run's own images, which only a run of train.py knows
        if calibration_split is not None or calibration_fraction is not None:
            raise ValueError("--calibration-split / --calibration-fraction choose images of --test-split's dataset: "
                             "give --test-split too (without the three, a run's own held-out images are used)")
        if not isinstance(model, (str, Path)) or not Path(model).exists():
            raise ValueError("give --dataset and --test-split (with --calibration-split or --calibration-fraction): "
                             "only a train.py run folder or model file knows its own held-out images")
    elif dataset is None:
        raise ValueError(f"--test-split {test_split!r} of which dataset? give --dataset")
    elif (calibration_split is None) == (calibration_fraction is None):
        raise ValueError("give exactly one of --calibration-split NAME or --calibration-fraction F (held out of the "
                         "test split)")
    if calibration_split is not None and calibration_split == test_split:
        raise ValueError(f"--calibration-split and --test-split are both {test_split!r}; calibrators are never "
                         "fitted on the test split: use --calibration-fraction to hold part of it out")
    if calibration_fraction is not None and not 0.0 < float(calibration_fraction) < 1.0:
        raise ValueError(f"--calibration-fraction must lie in (0, 1), got {calibration_fraction}")
    least = {"--n-bins": (c.n_bins, 1), "--batch-size": (c.batch_size, 1), "--folds": (c.folds, 2),
             "--bootstrap": (c.bootstrap, 0), "--workers": (c.workers, 0)}
    for flag, (value, smallest) in least.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < smallest:
            raise ValueError(f"{flag} must be at least {smallest}, a whole number; got {value!r}")
    if isinstance(model, (str, Path)) and not Path(model).exists():  # a timm name: its weights are files here
        for path, flag in ((c.checkpoint, "--checkpoint"), (c.pretrained_path, "--pretrained-path")):
            if path:
                require_safetensors(path, flag)


def check_splits(classifier: Classifier, dataset, test_split: Optional[str], calibration_split: Optional[str],
                 allow_training_split: bool, log) -> None:
    if test_split is None:  # the run's own held-out images (training.data.run_held_out_splits)
        return
    from ..data.sources import dataset_split_names, same_dataset

    meta = classifier.meta or {}
    if not meta.get("dataset"):
        # a flat <class>/<image> folder's one split is named 'train' whatever the images are: name the folder
        flat = Path(str(dataset)).is_dir() and dataset_split_names(str(dataset)) == ["train"]
        scored = f"the images of {dataset}" if flat else f"split {test_split!r} of {dataset}"
        log(f"the training data of {classifier.description} is unknown: make sure it was not trained on {scored}")
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



def check_classes(classifier: Classifier, data_names: List[str], num_outputs: Optional[int], log) -> None:
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


#: how many standard errors above the share of the most frequent class an accuracy must lie not to be at chance
CHANCE_MARGIN = 3.0


def refuse_chance(cal, classifier: Classifier) -> None:
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
