"""One entry point from a raw generated set to its annotated CSM dataset: encoder, prototypes, the scale s, soft labels
and the annotation checks. :func:`timm_csm.recipes.steps.annotate_generated_folder`, which both ``hub_scripts/annotate.py``
and the recipe's annotate stage call, runs :func:`annotate_generated` on a generated folder and saves the result.

    generated, plan = load_generated("runs/gen-fmnist")
    result = annotate_generated(generated, plan, real_train, lambda fit: train_reference_encoder(fit, "runs/ref"),
                                "auto")
    save_csm_dataset(result.dataset, "out/csm-fmnist-aug", result.provenance())
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple, Union

import numpy as np

from ..data import ImageArrays
from ..data.csm_format import check_class_names
from .label_groups import annotate
from .checks import annotation_report, drop_groups
from .config import AUTO, DEFAULTS, parse_s
from .encoders import ImageEncoder
from .prototypes import ClassPrototypes, HeldOutFeatures, prototypes_and_held_out
from .soft_labels import pairwise_true_lambda, scale_nll, select_scale

__all__ = ["AnnotatedSet", "annotate_generated", "holdout_rows", "holdout_split", "choose_scale"]

EncoderArg = Union[ImageEncoder, Callable[[ImageArrays], ImageEncoder]]


def holdout_rows(n: int, fraction: float = DEFAULTS.holdout_fraction, seed: int = DEFAULTS.seed) -> np.ndarray:
    """The sorted row indices of a seeded random ``fraction`` of ``n`` real images (at least one, never all) that
    :func:`holdout_split` holds out. The same ``(fraction, seed)`` always gives the same rows."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"the held-out fraction must lie in (0, 1), got {fraction}")
    if n < 2:
        raise ValueError(f"holding out real images needs at least 2, got {n}")
    order = np.random.default_rng(seed).permutation(n)
    return np.sort(order[:min(n - 1, max(1, int(round(fraction * n))))])


def holdout_split(real: ImageArrays, fraction: float = DEFAULTS.holdout_fraction,
                  seed: int = DEFAULTS.seed) -> Tuple[ImageArrays, ImageArrays]:
    """``(fit, held_out)``: the rows of :func:`holdout_rows` held out, both in the original order."""
    held = holdout_rows(len(real), fraction, seed)
    return real.subset(np.setdiff1d(np.arange(len(real)), held)), real.subset(held)


def choose_scale(held_out: HeldOutFeatures) -> Tuple[float, Dict]:
    """s by :func:`~timm_csm.annotation.soft_labels.select_scale` on the features of held-out real images, with the
    class means of the other real images (those the encoder may have seen); returns s and a record of the choice
    for the dataset card."""
    s = select_scale(held_out.features, held_out.labels, held_out.fit_means)
    nll = scale_nll(s, pairwise_true_lambda(held_out.features, held_out.labels, held_out.fit_means))
    return s, {"criterion": "maximum likelihood of the true class on held-out real images (select_scale)",
               "held_out_images": len(held_out.labels), "nll": round(nll, 6)}


@dataclass
class AnnotatedSet:
    """What :func:`annotate_generated` returns: the annotated ``datasets.Dataset`` and how it was made."""

    dataset: object
    encoder: ImageEncoder
    prototypes: ClassPrototypes
    s: float
    s_selection: Optional[Dict]
    label_mode: str
    report: Dict  # annotation_report, without the flagged group ids
    dropped_flagged: bool

    def provenance(self) -> Dict:
        """The annotation's part of the dataset card's provenance (the real data's fingerprint and class counts of
        the prototypes, encoder, s and its choice, checks)."""
        return {
            "dataset_revision": self.prototypes.dataset,
            "real_counts": dict(zip(self.prototypes.class_names, map(int, self.prototypes.counts.tolist()))),
            "encoder": self.encoder.describe(),
            "s": round(float(self.s), 6),
            "s_selection": self.s_selection,
            "label_mode": self.label_mode,
            "dropped_groups": self.dataset.info.description or None,
            "annotation_checks": {**self.report, "flagged_dropped": self.dropped_flagged},
        }


def _resolve(s: Union[str, float], holdout: Optional[bool]) -> Tuple[Union[str, float], bool, bool]:
    """``(s, whether it is chosen here, whether the encoder learns without the held-out share)``."""
    s = parse_s(s)
    if s is None:
        raise ValueError(f"s must be a positive number or {AUTO!r}, got None (a dataset's default: "
                         "AnnotationConfig.resolved)")
    auto = s == AUTO
    holdout = auto if holdout is None else bool(holdout)
    if auto and not holdout:
        raise ValueError("s='auto' is fitted on held-out real images; it cannot run with holdout=False")
    return s, auto, holdout


def annotate_generated(generated, plan: Dict, real: ImageArrays, encoder: EncoderArg, s: Union[str, float], *,
                       holdout: Optional[bool] = None, holdout_fraction: float = DEFAULTS.holdout_fraction,
                       seed: int = DEFAULTS.seed, label_mode: str = DEFAULTS.label_mode,
                       batch_size: int = DEFAULTS.batch_size, drop_incomplete: bool = DEFAULTS.drop_incomplete,
                       drop_flagged: bool = DEFAULTS.drop_flagged, min_spearman: float = DEFAULTS.min_spearman,
                       cache_dir=None, progress: bool = True, log: Callable[[str], None] = print) -> AnnotatedSet:
    """Annotate a raw generated set (``generated, plan = load_generated(folder)``) against the real training set.

    Which real data serves what:

    * the prototypes of the soft labels: class means over *all* of ``real`` (the paper's choice), cached in
      ``cache_dir``;
    * ``s="auto"``: s is chosen on held-out real images, a seeded ``holdout_fraction`` of ``real``
      (:func:`holdout_split` with ``seed``): maximum likelihood of their true class
      (:func:`~timm_csm.annotation.soft_labels.select_scale`) under the prototypes of the remaining images. One
      encoding pass over ``real`` gives the prototypes and the held-out features
      (:func:`~timm_csm.annotation.prototypes.prototypes_and_held_out`): each real image is encoded once. A
      number is used as given (4.0 for CIFAR-10 / Tiny-ImageNet and 2.3 for CIFAR-100 in the paper).
    * ``encoder``: a ready :class:`ImageEncoder` (pretrained elsewhere), or a callable that builds one from the real
      images it may be fitted on: the images outside the held-out share when ``holdout`` (default: when
      ``s="auto"``; ``holdout=True`` with a number keeps the encoder of the ``"auto"`` run), else all of ``real``.
      A ready encoder trained on all of ``real`` has seen the held-out images.

    Then :func:`~timm_csm.annotation.label_groups.annotate` (``label_mode``, ``drop_incomplete``),
    :func:`~timm_csm.annotation.checks.annotation_report` with the pure members' recognition
    (:func:`~timm_csm.annotation.label_groups.pure_member_recognition`); ``drop_flagged`` removes the groups the
    report flags (not monotone below ``min_spearman``, or a misread endpoint).
    """
    s, auto, holdout = _resolve(s, holdout)
    check_class_names(plan["class_names"], real.class_names, "generation plan", "the real dataset")
    held = holdout_rows(len(real), holdout_fraction, seed) if auto else None
    if not isinstance(encoder, ImageEncoder):
        encoder = encoder(holdout_split(real, holdout_fraction, seed)[0] if holdout else real)
    log(f"encoder: {encoder.identity}")
    protos, held_out = prototypes_and_held_out(encoder, real, held, cache_dir=cache_dir, batch_size=batch_size,
                                               progress=progress, log=log)
    selection = None
    if auto:
        s, selection = choose_scale(held_out)
        selection["seed"] = seed
        log(f"s = {s:.4f} (fitted on {len(held)} held-out real images, NLL {selection['nll']:.4f})")
    annotated, recognition = annotate(generated, plan["class_names"], encoder, protos, float(s),
                                      lambdas=plan["lambdas"], label_mode=label_mode, batch_size=batch_size,
                                      drop_incomplete=drop_incomplete, return_recognition=True, progress=progress,
                                      log=log)
    report = annotation_report(annotated, min_spearman)
    report["pure_class_recognition"] = recognition
    flagged = report.pop("flagged_group_ids")
    log("annotation report: " + json.dumps(report))
    if drop_flagged and report["flagged"]:
        annotated = drop_groups(annotated, flagged)
        log(f"dropped {report['flagged']} flagged group(s) of {report['num_groups']}")
    return AnnotatedSet(annotated, encoder, protos, float(s), selection, label_mode, report, bool(drop_flagged))
