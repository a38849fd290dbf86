"""Derived CSM datasets: copies of a CSM dataset with other labels or fewer groups, and the real-copies control.

Each derivation maps the training split of a source set to a new one plus the provenance it adds, and is written
once to its folder (:func:`derived_copy`), keyed by the source's path and fingerprint and the derivation (the
marker ``derived_from.json``, a :class:`~timm_csm.recipes.cache.KeyedFolder`): rewritten when the source changes.

* labels: :func:`derive_hard_label_dataset` (the one-hot dominant generation class, ``label_mode="generation"``),
  :func:`derive_lambda_label_dataset` (q_a = lambda_gen), :func:`derive_softmax_label_dataset` (a reference
  encoder's softmax on each image), :func:`derive_rescaled_dataset` (the projection labels at another scale s);
* groups: :func:`derive_filtered_dataset` (flagged groups dropped), :func:`derive_group_subset` (the first share of
  each class pair's groups);
* :func:`derive_real_copies_dataset`: the group structure of a generated set filled with real training images.

A data key names a set by its base and the derivations applied to it (``"soft@volume=2@label=lambda"``,
``"filtered@s=2.3"``): :func:`resolve_data_key` derives every set on the way, each in a folder named after its key.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..io import file_sha256
from ..registry import Registry
from .cache import KeyedFolder

__all__ = ["DERIVED_LABELS", "DerivedLabel", "register_derived_label", "DERIVED_MARKER", "derived_copy", "derive_hard_label_dataset",
           "derive_filtered_dataset", "derive_group_subset", "derive_rescaled_dataset",
           "derive_lambda_label_dataset", "derive_softmax_label_dataset", "derive_label_dataset", "label_confidence",
           "real_copies_columns", "derive_real_copies_dataset", "split_data_key", "join_data_key",
           "derived_set_folder", "resolve_data_key"]

DERIVED_MARKER = "derived_from.json"
#: the labels a set can be given in place of its annotation's (:func:`derive_label_dataset`), in registration
#: order: name -> ``derive(source, folder, annotator) -> Path``, with :class:`DerivedLabel`
DERIVED_LABELS = Registry("derived label", sort=False)


@dataclass(frozen=True)
class DerivedLabel:
    """A registered derived label: its ``derive(source, folder, annotator)``, and whether it ``needs_annotator``
    (a reference encoder folder whose classifier gives the labels)."""

    derive: Callable[[Any, Any, Any], Path]
    needs_annotator: bool = False


def register_derived_label(name: str, derive: Optional[Callable] = None, *, overwrite: bool = False,
                           needs_annotator: bool = False):
    """Register ``derive(source, folder, annotator) -> Path`` as the derived label ``name``."""
    return DERIVED_LABELS.register(name, derive, overwrite=overwrite,
                                   spec=DerivedLabel(derive, bool(needs_annotator)))


def derived_copy(source, folder, derivation: str, derive: Callable[[Any], Tuple[Any, Dict[str, Any]]]) -> Path:
    """``derive(dataset) -> (dataset, provenance)`` applied to the training split of the CSM dataset ``source``,
    saved to ``folder`` once; rewritten when the source dataset changes (keyed by its fingerprint)."""
    from ..hub import load_csm_dataset, save_csm_dataset, train_split

    ds = train_split(load_csm_dataset(str(source)))
    stamp = {"source": str(source), "fingerprint": getattr(ds, "_fingerprint", None), "derivation": derivation}
    keyed = KeyedFolder(Path(folder), stamp, DERIVED_MARKER, config_field=None)
    if keyed.state() == "done":
        return keyed.folder
    derived, provenance = derive(ds)
    save_csm_dataset(derived, keyed.folder, provenance=dict(provenance, derived_from=str(source)))
    keyed.write()
    return keyed.folder


def derive_hard_label_dataset(source, folder) -> Path:
    """A copy of ``source`` whose soft labels are the one-hot dominant generation class (the annotation's
    ``label_mode="generation"``, variant 2 of the ablation): same images, groups and companions."""
    from ..annotation.soft_labels import generation_class_labels

    def derive(ds):
        k = len(ds.features["label"].names)

        def relabel(lambda_gen, class_a, class_b):
            q = generation_class_labels(np.asarray(lambda_gen, np.float64), np.asarray(class_a),
                                        np.asarray(class_b), k)
            return {"soft_label": q.numpy().astype(np.float32).tolist(), "label": q.argmax(1).tolist()}

        hard = ds.map(relabel, batched=True, input_columns=["lambda_gen", "class_a", "class_b"],
                      features=ds.features, desc="hard labels")
        return hard, {"label_mode": "generation"}

    return derived_copy(source, folder, "label_mode=generation", derive)


def derive_filtered_dataset(source, folder, min_spearman: float = 0.8) -> Path:
    """A copy of ``source`` without its flagged groups (lambda-hat not monotone in lambda, Spearman below
    ``min_spearman``, or a misread endpoint: :func:`timm_csm.annotation.checks.annotation_report`), the
    ``timm-csm-annotate --drop-flagged`` set."""
    from ..annotation.checks import annotation_report, drop_groups

    def derive(ds):
        report = annotation_report(ds, min_spearman)
        kept = drop_groups(ds, report["flagged_group_ids"])
        return kept, {"dropped_groups": report["flagged"], "min_spearman": float(min_spearman)}

    return derived_copy(source, folder, f"drop_flagged(min_spearman={min_spearman:g})", derive)


def derive_group_subset(source, folder, fraction: float) -> Path:
    """A copy of ``source`` with, for every class pair, its first ``ceil(fraction * n)`` of the pair's ``n`` groups
    (by group id): less generated volume, the same pairs and the same share of each."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")

    def derive(ds):
        gid, a, b = (np.asarray(ds[c]) for c in ("group_id", "class_a", "class_b"))
        groups = {}
        for g, pair in zip(gid.tolist(), zip(np.minimum(a, b).tolist(), np.maximum(a, b).tolist())):
            groups.setdefault(pair, set()).add(g)
        keep = {g for ids in groups.values() for g in sorted(ids)[:math.ceil(fraction * len(ids))]}
        rows = np.flatnonzero(np.isin(gid, np.fromiter(keep, dtype=gid.dtype)))
        return ds.select(rows), {"group_fraction": float(fraction), "groups": len(keep)}

    return derived_copy(source, folder, f"group_fraction={fraction:g}", derive)


def derive_rescaled_dataset(source, folder, s: float) -> Path:
    """A copy of ``source`` whose soft labels are recomputed from its stored lambda-hat at the fixed scale ``s``
    (:func:`timm_csm.annotation.label_groups.rescale_soft_labels`): the same images, groups and companions."""
    from ..annotation.label_groups import rescale_soft_labels

    def derive(ds):
        return rescale_soft_labels(ds, float(s)), {"s": float(s), "label_mode": "projection"}

    return derived_copy(source, folder, f"rescale(s={float(s):g})", derive)


def derive_lambda_label_dataset(source, folder) -> Path:
    """A copy of ``source`` whose soft label is the generation ratio itself: q_a = lambda_gen, q_b = 1 - lambda_gen
    (no re-annotation)."""
    import torch

    from ..annotation.soft_labels import dominant_class

    def derive(ds):
        k = len(ds.features["label"].names)

        def relabel(lambda_gen, class_a, class_b):
            lam = np.asarray(lambda_gen, np.float64)
            rows = np.arange(len(lam))
            q = np.zeros((len(lam), k))
            q[rows, np.asarray(class_a)] = lam
            q[rows, np.asarray(class_b)] = 1.0 - lam
            q = torch.from_numpy(q)
            return {"soft_label": q.float().numpy(), "label": dominant_class(q, np.asarray(class_a)).numpy()}

        out = ds.map(relabel, batched=True, batch_size=4096, input_columns=["lambda_gen", "class_a", "class_b"],
                     features=ds.features, desc="lambda labels")
        return out, {"label_mode": "lambda_gen"}

    return derived_copy(source, folder, "label_mode=lambda_gen", derive)


def derive_softmax_label_dataset(source, folder, annotator) -> Path:
    """A copy of ``source`` whose soft label is the annotator's softmax over all classes on each image (the paper's
    variant 1, direct annotation): the reference encoder at ``annotator``
    (:func:`timm_csm.annotation.load_reference_encoder`) classifies the decoded images. Rewritten when the source
    or the annotator's weights change."""
    import datasets

    from ..annotation import decode_images, load_reference_encoder

    encoder = load_reference_encoder(annotator)

    def derive(ds):
        if encoder.class_names != list(ds.features["label"].names):
            raise ValueError(f"the annotator {annotator} was trained on the classes {encoder.class_names}, the set "
                             f"holds {ds.features['label'].names}")
        stored = ds.features["image"]
        raw = ds.cast_column("image", datasets.Image(decode=False))

        def relabel(images):
            q = encoder.classify(decode_images(images)).double().softmax(1)
            return {"soft_label": q.float().numpy(), "label": q.argmax(1).numpy()}

        out = raw.map(relabel, batched=True, batch_size=512, input_columns=["image"], features=raw.features,
                      desc="softmax labels")
        return out.cast_column("image", stored), {"label_mode": "softmax", "annotator": str(annotator)}

    digest = file_sha256(Path(annotator) / "model.safetensors")
    return derived_copy(source, folder, f"label_mode=softmax(annotator sha256 {digest})", derive)


def derive_label_dataset(source, folder, label: str, annotator=None) -> Path:
    """``label`` (:data:`DERIVED_LABELS`) in place of the annotation's soft labels of ``source``."""
    if label not in DERIVED_LABELS:
        raise ValueError(f"label must be one of {', '.join(DERIVED_LABELS)} to derive, got {label!r}")
    return DERIVED_LABELS.create(label, source, folder, annotator)


register_derived_label("hard", lambda source, folder, annotator: derive_hard_label_dataset(source, folder))
register_derived_label("lambda", lambda source, folder, annotator: derive_lambda_label_dataset(source, folder))
register_derived_label("softmax", derive_softmax_label_dataset, needs_annotator=True)


def real_copies_columns(real, num_groups: int, num_lambdas: int, seed: int = 0) -> Dict[str, list]:
    """The CSM columns of the real-copies control: the plan's groups and lambda grid, every member a real image of
    ``real`` (:class:`~timm_csm.data.ImageArrays`) drawn (seeded per group) from the member's dominant class (``a``
    when lambda >= 1/2, else ``b``), with its one-hot label."""
    from ..data import derive_seed
    from ..generation.plan import lambda_grid, plan_groups
    from ..generation.writer import encode_png

    names = list(real.class_names)
    k = len(names)
    labels = np.asarray(real.labels)
    by_class = [np.flatnonzero(labels == c) for c in range(k)]
    empty = [names[c] for c in range(k) if len(by_class[c]) == 0]
    if empty:
        raise ValueError(f"the real training set has no image of class(es) {empty}")
    rows = {key: [] for key in ("image", "label", "soft_label", "class_a", "class_b", "lambda_gen", "lambda_hat",
                                "group_id", "seed")}
    for group in plan_groups(k, num_groups):
        rng = np.random.default_rng(derive_seed(seed, group.group_id))
        for lam in lambda_grid(num_lambdas):
            c = group.class_a if lam >= 0.5 else group.class_b
            q = np.zeros(k, np.float32)
            q[c] = 1.0
            # indexed by a list: an in-memory array and a folder's lazy images both give (1, C, H, W)
            image = np.asarray(real.images[[int(rng.choice(by_class[c]))]])[0]
            rows["image"].append({"bytes": encode_png(image), "path": None})
            rows["label"].append(c)
            rows["soft_label"].append(q.tolist())
            rows["class_a"].append(group.class_a)
            rows["class_b"].append(group.class_b)
            rows["lambda_gen"].append(lam)
            rows["lambda_hat"].append(1.0 if c == group.class_a else 0.0)
            rows["group_id"].append(group.group_id)
            rows["seed"].append(group.seed)
    return rows


def derive_real_copies_dataset(recipe: Dict[str, Any], folder, num_groups: int = 6750, num_lambdas: int = 4,
                               seed: int = 0) -> Path:
    """The real-copies control: a CSM dataset of :func:`real_copies_columns` from the training images of the
    classifier recipe ``recipe`` (``dataset`` and its data options), on which CSM's loss and batch train on real
    images only. Written once to ``folder``; rewritten when the training images or the structure change (keyed by
    their digest)."""
    from ..data import csm_dataset_from_columns
    from ..data.arrays import images_labels_hash
    from ..generation.plan import lambda_grid
    from ..hub import save_csm_dataset
    from ..training import TrainConfig, load_data

    options = {"dataset": str(recipe["dataset"]), "seed": 0}
    for key, kind in (("max_train_samples", int), ("val_size", int), ("data_seed", int), ("val_fraction", float)):
        if recipe.get(key) is not None:
            options[key] = kind(recipe[key])
    real = load_data(TrainConfig(**options)).train
    digest = images_labels_hash(real.images, real.labels, with_shape=False).hexdigest()
    stamp = {"real": digest, "num_groups": num_groups, "num_lambdas": num_lambdas, "seed": seed}
    keyed = KeyedFolder(Path(folder), stamp, DERIVED_MARKER, config_field=None)
    if keyed.state() == "done":
        return keyed.folder
    lambdas = lambda_grid(num_lambdas)
    ds = csm_dataset_from_columns(real_copies_columns(real, num_groups, num_lambdas, seed), real.class_names)
    save_csm_dataset(ds, keyed.folder, provenance={"dataset": recipe["dataset"], "label_mode": "real_copies",
                                                   "real_images_digest": digest, "num_groups": num_groups,
                                                   "lambdas": lambdas}, class_names=list(real.class_names),
                     lambdas=lambdas)
    keyed.write()
    return keyed.folder


# ---------------------------------------------------------------------------------------------------------------
# data keys: a set named by its base and the derivations applied to it, in order
# ---------------------------------------------------------------------------------------------------------------
#: each derivation step of a data key: its place in the folder name of the derived set
_KEY_SUFFIX = {"volume": "-x{}", "label": "-{}-labels", "s": "-s{}"}


def split_data_key(key: str) -> Tuple[str, List[Tuple[str, str]]]:
    """``"filtered@volume=2@s=2.3"`` -> ``("filtered", [("volume", "2"), ("s", "2.3")])``."""
    kind, *steps = key.split("@")
    return kind, [tuple(step.split("=", 1)) for step in steps]


def join_data_key(kind: str, steps: Sequence[Tuple[str, str]]) -> str:
    return "@".join([kind, *(f"{axis}={value}" for axis, value in steps)])


def derived_set_folder(key: str, setting: Optional[str]) -> str:
    """The folder name of the set of a data key: ``csm-filtered-matched-s2.3``, ``csm-soft-matched-x2-lambda-labels``
    (``set`` in place of a missing setting)."""
    kind, steps = split_data_key(key)
    return f"csm-{kind}-{setting or 'set'}" + "".join(_KEY_SUFFIX[axis].format(value) for axis, value in steps)


def resolve_data_key(key: str, output: Path, setting: Optional[str], paths: Dict[str, str], blocked: Dict[str, str],
                     volume_sets: Dict[int, str], annotator=None) -> None:
    """Fill ``paths[key]`` with the folder of the set named ``key`` (``kind@axis=value@...``), or ``blocked[key]``
    with why it cannot be had. Its parent (``key`` less its last step; for a ``filtered`` key, the ``soft`` set of
    the same steps) is resolved first, then the step applied and written under ``output``
    (:func:`derived_set_folder`): ``s``, the labels at a fixed scale; ``label``, :func:`derive_label_dataset`
    (``annotator``: the reference encoder of the softmax labels); ``filtered``, the flagged groups dropped;
    ``volume``, the set of that many times the groups itself (``volume_sets``). A key without steps is a set of its
    own kind, which ``paths`` must already hold."""
    from ..hub import csm_dataset_problem

    if key in paths or key in blocked:
        return
    kind, steps = split_data_key(key)
    if not steps:
        blocked[key] = f"the {kind} CSM dataset is not available"
        return
    if steps[-1][0] in ("s", "label"):
        parent, (axis, value) = join_data_key(kind, steps[:-1]), steps[-1]
    elif kind == "filtered":
        parent, axis, value = join_data_key("soft", steps), "filtered", "1"
    else:
        path = volume_sets.get(int(steps[0][1]))
        problem = csm_dataset_problem(path) if path else "none given"
        if problem is None:
            paths[key] = str(path)
        else:
            blocked[key] = f"the {steps[0][1]}x generated set {path!r} is not available ({problem})"
        return
    resolve_data_key(parent, output, setting, paths, blocked, volume_sets, annotator)
    if parent in blocked:
        blocked[key] = blocked[parent]
        return
    source, folder = paths[parent], Path(output) / derived_set_folder(key, setting)
    if axis == "s":
        paths[key] = str(derive_rescaled_dataset(source, folder, float(value)))
    elif axis == "filtered":
        paths[key] = str(derive_filtered_dataset(source, folder))
    elif (value in DERIVED_LABELS and DERIVED_LABELS.get_spec(value).needs_annotator
          and not (annotator and (Path(annotator) / "config.json").exists())):
        blocked[key] = f"the {value} labels need the setting's annotator (a reference encoder folder), got " \
                       f"{annotator!r}"
    else:
        paths[key] = str(derive_label_dataset(source, folder, value, annotator))


def label_confidence(path, fingerprint: str) -> Optional[float]:
    """The mean over a CSM dataset's training images of its label's largest class probability
    (:func:`timm_csm.annotation.soft_label_confidence`; 1: one-hot), None unless a set at ``path`` has the content
    ``fingerprint`` (:func:`timm_csm.hub.content_fingerprint`): what a study's page shows of a derived set's labels."""
    from ..annotation import soft_label_confidence
    from ..hub import content_fingerprint, csm_dataset_problem, load_csm_dataset

    if not path or csm_dataset_problem(path) is not None or content_fingerprint(path) != fingerprint:
        return None
    dd = load_csm_dataset(str(path))
    ds = dd["train"] if hasattr(dd, "keys") and "train" in dd else dd
    return soft_label_confidence(np.asarray(ds["soft_label"]))["mean"]

