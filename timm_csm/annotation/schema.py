"""The columns of a generated CSM dataset, raw (from generation) and annotated (for training and publishing)."""
from __future__ import annotations

from typing import Sequence

__all__ = ["CSM_COLUMNS", "RAW_COLUMNS", "csm_features"]

# raw generated shards (timm_csm.generation.writer) carry at least these
RAW_COLUMNS = ("image", "group_id", "seed", "class_a", "class_b", "lambda_gen")

# the annotated dataset, in this order
CSM_COLUMNS = ("image", "label", "soft_label", "class_a", "class_b", "lambda_gen", "lambda_hat", "group_id", "seed")


def csm_features(class_names: Sequence[str]):
    """``datasets.Features`` of an annotated CSM dataset.

    ``image`` Image; ``label`` ClassLabel (the dominant class of the soft label); ``soft_label`` Sequence of float32,
    length K, rows sum to 1; ``class_a``, ``class_b`` ClassLabel (the mixed pair); ``lambda_gen`` float32 (the
    weight of class_a in the generation condition); ``lambda_hat`` float32 (the projection coefficient);
    ``group_id``, ``seed`` int64.
    """
    import datasets

    names = [str(n) for n in class_names]
    if len(set(names)) != len(names):
        raise ValueError(f"class names must be unique, got {names}")
    return datasets.Features({
        "image": datasets.Image(),
        "label": datasets.ClassLabel(names=names),
        "soft_label": datasets.Sequence(datasets.Value("float32")),
        "class_a": datasets.ClassLabel(names=names),
        "class_b": datasets.ClassLabel(names=names),
        "lambda_gen": datasets.Value("float32"),
        "lambda_hat": datasets.Value("float32"),
        "group_id": datasets.Value("int64"),
        "seed": datasets.Value("int64"),
    })
