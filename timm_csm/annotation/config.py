"""The configuration of a re-annotation: :class:`AnnotationConfig`, one typed field per option of
``timm-csm-annotate`` (its flags are built from the fields, :func:`timm_csm.options.add_options`), which the
command, the steps (:func:`timm_csm.recipes.steps.annotate_generated_folder`) and the recipe's annotate stage all take.

Its defaults are the annotation's: the scale s (None: the paper's value where it published one, else chosen on
held-out real images, :meth:`AnnotationConfig.resolved`), the held-out share of the real training split and its seed,
whether the reference encoder learns without that share (:meth:`AnnotationConfig.holds_out`), the label mode and the
annotation checks.

s has one name everywhere (this field, ``timm-csm-annotate --s``, a study's ``s`` axis and its ``@s=`` spelling in
configuration names), is read once (:func:`parse_s`: a positive number or :data:`AUTO`) and defaulted once
(:meth:`AnnotationConfig.resolved`).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Dict, Union

from ..options import option
from .soft_labels import LABEL_MODES, paper_s

__all__ = ["AnnotationConfig", "LABEL_MODES", "AUTO", "parse_s"]

#: s chosen on held-out real images (maximum likelihood of their true class,
#: :func:`~timm_csm.annotation.select_scale`); written as this word in configurations, keys and names
AUTO = "auto"


def parse_s(value: Union[None, str, float]) -> Union[None, str, float]:
    """s as given on a command line, in a configuration or in a name: None (not given), :data:`AUTO`, or a positive
    finite number (a number's text too), as a float; anything else is a ``ValueError`` naming it."""
    if value is None or value == AUTO:
        return value
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if isinstance(value, bool) or not math.isfinite(number) or number <= 0:
        raise ValueError(f"s must be a positive number or {AUTO!r}, got {value!r}")
    return number


_annotation = dict(group=None)
_checks = dict(group="annotation checks")


@dataclass(frozen=True)
class AnnotationConfig:
    """How generated groups are re-annotated (:func:`~timm_csm.annotation.annotate_generated`): the fields are the
    flags of ``timm-csm-annotate`` (same name with ``-``; ``holdout_fraction`` is ``--val-fraction``)."""

    s: Union[None, str, float] = option(
        None, **_annotation, help="sigmoid scale: a number, or 'auto' (fit on a held-out split of the real training "
                                  "set); default: the paper's value for CIFAR-10/100 and Tiny-ImageNet, else auto")
    holdout_fraction: float = option(0.1, **_annotation, flag="--val-fraction",
                                     help="held-out share of the training split for --s auto")
    seed: int = option(0, **_annotation, help="seed of the held-out split")
    holdout_encoder: bool = option(
        False, **_annotation, help="train the reference encoder without the held-out share even with a numeric --s, "
                                   "so that a run with a fixed s differs from the --s auto run only in s")
    label_mode: str = option(LABEL_MODES[0], **_annotation, choices=LABEL_MODES,
                             help="soft labels from the projection on the prototypes (the paper), zero-shot, or the "
                                  "generation lambda")
    batch_size: int = option(256, **_annotation, help="images per encoder batch")
    drop_incomplete: bool = option(
        False, **_checks, help="drop groups that lack members of the lambda grid (reported) instead of failing")
    drop_flagged: bool = option(
        False, **_checks, help="drop groups whose lambda-hat is not monotone in lambda (Spearman < --min-spearman) or "
                               "whose pure endpoints project nearer the other class; the annotation report counts "
                               "them either way")
    min_spearman: float = option(0.8, **_checks, help="monotonicity threshold of --drop-flagged")
    accept_poor_generator: bool = option(
        False, **_checks, help="build the dataset even when the checks find the generator poor (its pure-class images "
                               "recognised near chance, or most groups flagged), with a warning; without it such a "
                               "run stops before anything is saved")

    def __post_init__(self):
        object.__setattr__(self, "s", parse_s(self.s))

    def resolved(self, dataset: str) -> "AnnotationConfig":
        """This configuration with s set for ``dataset``: as given, or by default (None) the paper's value where it
        published one (CIFAR-10, CIFAR-100, Tiny-ImageNet: :func:`~timm_csm.annotation.paper_s`), :data:`AUTO`
        for any other dataset."""
        if self.s is not None:
            return self
        try:
            s: Union[str, float] = paper_s(dataset)
        except ValueError:  # no published value for this dataset
            s = AUTO
        return dataclasses.replace(self, s=s)

    def holds_out(self, dataset: str) -> bool:
        """Whether the reference encoder learns without the held-out share: when s is chosen there (:data:`AUTO`,
        given or by default for ``dataset``), or with :attr:`holdout_encoder`."""
        return self.resolved(dataset).s == AUTO or self.holdout_encoder

    def annotate_kwargs(self) -> Dict[str, Any]:
        """The keyword arguments of :func:`~timm_csm.annotation.annotate_generated` (all but s and the checks'
        ``accept_poor_generator``, which the caller applies)."""
        return dict(holdout_fraction=self.holdout_fraction, seed=self.seed, label_mode=self.label_mode,
                    batch_size=self.batch_size, drop_incomplete=self.drop_incomplete, drop_flagged=self.drop_flagged,
                    min_spearman=self.min_spearman)


#: the defaults, read by the functions whose parameters these fields are
DEFAULTS = AnnotationConfig()
