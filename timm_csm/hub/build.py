"""Build and validate the ``DatasetDict`` of a CSM-augmented dataset."""
from __future__ import annotations

import re
from typing import Optional, Sequence

import numpy as np

from ..data.csm_format import CSM_COLUMNS, check_class_names, check_groups, check_soft_labels, csm_features
from ..data.lazy import column_arrays

__all__ = ["dataset_short_name", "csm_dataset_name", "build_csm_dataset", "validate_csm_dataset"]

_SHORT_NAMES = {
    "fashion_mnist": "fmnist", "zalando-datasets/fashion_mnist": "fmnist", "fashion-mnist": "fmnist",
    "uoft-cs/cifar10": "cifar10", "uoft-cs/cifar100": "cifar100", "zh-plus/tiny-imagenet": "tiny-imagenet",
    "tiny_imagenet": "tiny-imagenet",
}


def dataset_short_name(dataset: str) -> str:
    """The short name of a real dataset in the names of its CSM dataset and shipped generator: ``fashion_mnist``
    and ``zalando-datasets/fashion_mnist`` -> ``fmnist``, ``uoft-cs/cifar10`` -> ``cifar10``, any other name
    lower-cased, its last path part, runs of other characters than letters and digits as ``-``."""
    short = _SHORT_NAMES.get(dataset.lower(), dataset.lower().rstrip("/").split("/")[-1])
    short = re.sub(r"[^a-z0-9]+", "-", short).strip("-")
    if not short:
        raise ValueError(f"cannot derive a dataset name from {dataset!r}")
    return short


def csm_dataset_name(dataset: str) -> str:
    """The one name of the CSM dataset of ``dataset``, its folder and installed bare name: ``csm-<short name>-aug``
    (:func:`dataset_short_name`): ``fashion_mnist`` -> ``csm-fmnist-aug``, ``cifar100`` -> ``csm-cifar100-aug``."""
    return f"csm-{dataset_short_name(dataset)}-aug"


def validate_csm_dataset(dataset, class_names: Optional[Sequence[str]] = None,
                         lambdas: Optional[Sequence[float]] = None) -> None:
    """ValueError naming the first problem of an annotated split: columns and features, class names (against
    ``class_names``, the real dataset's), soft labels (:func:`~timm_csm.data.csm_format.check_soft_labels`), the
    dominant label, class ids, and complete groups (one row per value of ``lambdas``; default: the values found)."""
    missing = [c for c in CSM_COLUMNS if c not in dataset.column_names]
    extra = [c for c in dataset.column_names if c not in CSM_COLUMNS]
    if missing or extra:
        raise ValueError(f"columns must be exactly {list(CSM_COLUMNS)}; missing {missing}, unexpected {extra}")
    label_feature = dataset.features["label"]
    names = getattr(label_feature, "names", None)
    if not names:
        raise ValueError("the 'label' column must be a ClassLabel with the class names of the real dataset")
    if class_names is not None:
        check_class_names(names, class_names, "CSM dataset", "the real dataset")
    expected = csm_features(names)
    if dataset.features != expected:
        bad = [c for c in CSM_COLUMNS if dataset.features[c] != expected[c]]
        raise ValueError(f"features of column(s) {bad} differ from the CSM schema: "
                         + "; ".join(f"{c}: {dataset.features[c]} != {expected[c]}" for c in bad[:3]))
    k = len(names)
    n = len(dataset)
    if n == 0:
        raise ValueError("the CSM dataset is empty")
    cols = column_arrays(dataset, [c for c in CSM_COLUMNS if c != "image"])
    soft = cols["soft_label"]
    check_soft_labels(soft, k)
    for c in ("label", "class_a", "class_b"):
        v = cols[c]
        bad = np.flatnonzero((v < 0) | (v >= k))
        if len(bad):
            raise ValueError(f"{c} out of range [0, {k}) in {len(bad)} row(s) (first: row {bad[0]}, value {v[bad[0]]})")
    label = cols["label"].astype(np.int64)
    not_max = np.flatnonzero(soft[np.arange(n), label] < soft.max(1))
    if len(not_max):
        raise ValueError(f"label is not the dominant class of soft_label in {len(not_max)} row(s) "
                         f"(first: row {not_max[0]})")
    lam = cols["lambda_gen"]
    if lambdas is None:
        lambdas = np.unique(np.round(lam.astype(np.float64), 6))
    check = check_groups(cols["group_id"], lam, lambdas, cols["seed"], cols["class_a"], cols["class_b"])
    if not check.ok:
        raise ValueError(check.message)


def build_csm_dataset(annotated, class_names: Sequence[str], lambdas: Optional[Sequence[float]] = None,
                      split: str = "train"):
    """``DatasetDict({split: annotated})`` after :func:`validate_csm_dataset` against the real class names."""
    import datasets

    if isinstance(annotated, datasets.DatasetDict):
        splits = dict(annotated)
    else:
        splits = {split: annotated}
    for name, ds in splits.items():
        try:
            validate_csm_dataset(ds, class_names, lambdas)
        except ValueError as e:
            raise ValueError(f"split {name!r}: {e}") from None
    return datasets.DatasetDict(splits)
