"""The optional ``[report]`` table of a study spec: what the study's page shows (:mod:`.report`), never what a cell
runs or a choice reads, so a spec without it gets the generic page.

::

    [report]
    page = "my_study.md"                  # where the page goes (default: <spec file's stem>.md beside it)
    title = "My study"                    # the page's heading (default: the study's name)
    figure_label = "My study"             # names the study in figure titles (default: the study's name)
    intro = ["Protocol: ...", "Rows: [{json}]({json})"]   # paragraphs under the heading; {json}: the JSON's name
    sections = ["verify", "decision", "stage2", "stage1", "cost", "pending"]   # in this order
    verify_log = "cells_verify.json"      # ``timm-csm-study verify``'s log (paths relative to the spec's folder)
    builds = "settings.json"              # the generated sets' build record: the cost section's generation times
    label_cache = "cells_labels.json"     # the generated sets' label confidence, by fingerprint (``labels``)
    later_seeds = [0, 1, 2, 3, 4]         # the training seeds of the label variants and of the data seeds
    images_per_volume = 27000             # generated images at volume 1 (``volume``),
    volume_groups = 6750                  #   in this many groups
    data_seeds = [0, 1, 2]                # ``data_seeds``: other real subsets, in one setting,
    data_seed_setting = "borrowed"        #   with the methods chosen in another
    data_seed_choices = "annotated"
    data_seed_methods = { CE = "ce", RegMixup = "regmixup", KD = "kd" }   # shown name: method (its choice)
    [report.encoder]                      # an annotator trained on images that include the validation images
    name = "the borrowed encoder"
    train_images = 54000
    settings = ["annotated", "borrowed"]
    saw_validation = [1787, 1769, 1820]   # validation images it learned from, per data seed

Sections: ``verify`` (the verify log), ``decision`` (stage 2's primary comparisons under Holm), ``stage2`` (the
stage-2 rows, secondary intervals and the decision figure), ``stage1`` (each setting's grids and search), ``labels``,
``volume`` and ``data_seeds`` (later stages: the searched row's label variants, its generated volume, other real
subsets), ``cost`` (cell seconds per method, the generated sets' build times) and ``pending`` (cells that can run).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional, Tuple

from .amendments import SpecError

__all__ = ["SECTIONS", "DEFAULT_SECTIONS", "ReportSpec", "read_report"]

SECTIONS = ("verify", "decision", "stage2", "stage1", "labels", "volume", "data_seeds", "cost", "pending")
DEFAULT_SECTIONS = ("verify", "decision", "stage2", "stage1", "cost", "pending")


@dataclasses.dataclass(frozen=True)
class ReportSpec:
    """The ``[report]`` table (module docstring); paths as written, relative to the spec's folder."""

    page: Optional[str] = None
    title: Optional[str] = None
    figure_label: Optional[str] = None
    intro: Tuple[str, ...] = ()
    sections: Tuple[str, ...] = DEFAULT_SECTIONS
    verify_log: Optional[str] = None
    builds: Optional[str] = None
    label_cache: Optional[str] = None
    later_seeds: Tuple[int, ...] = ()
    images_per_volume: Optional[int] = None
    volume_groups: Optional[int] = None
    data_seeds: Tuple[int, ...] = ()
    data_seed_setting: Optional[str] = None
    data_seed_choices: Optional[str] = None
    data_seed_methods: Tuple[Tuple[str, str], ...] = ()
    encoder_name: str = "the annotator's encoder"
    encoder_train_images: Optional[int] = None
    encoder_settings: Tuple[str, ...] = ()
    encoder_saw_validation: Tuple[int, ...] = ()

    def saw_validation(self, data_seed: int) -> Optional[int]:
        """The validation images of ``data_seed`` the encoder learned from (None where not stated)."""
        seeds = self.data_seeds or (0,)
        counts = dict(zip(seeds, self.encoder_saw_validation))
        return counts.get(data_seed)


_KINDS: Dict[str, Any] = {"page": str, "title": str, "figure_label": str, "intro": list, "sections": list,
                          "verify_log": str, "builds": str, "label_cache": str, "later_seeds": list,
                          "images_per_volume": int, "volume_groups": int, "data_seeds": list,
                          "data_seed_setting": str, "data_seed_choices": str, "data_seed_methods": dict,
                          "encoder": dict}


def _ints(value: Any, where: str) -> Tuple[int, ...]:
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in value):
        raise SpecError(f"{where}: expected integers >= 0, got {value!r}")
    return tuple(value)


def read_report(raw: Dict[str, Any], settings: Tuple[str, ...], methods: Tuple[str, ...]) -> ReportSpec:
    """The :class:`ReportSpec` of the spec's raw ``[report]`` table (``{}``: the generic page), checked against the
    study's ``settings`` and method names; a :class:`SpecError` naming the field."""
    for key, value in raw.items():
        kind = _KINDS.get(key)
        if kind is None:
            raise SpecError(f"report.{key}: unknown key (known: {', '.join(sorted(_KINDS))})")
        if isinstance(value, bool) or not isinstance(value, kind):
            raise SpecError(f"report.{key}: expected a {kind.__name__}, got {value!r}")
    sections = tuple(raw.get("sections", DEFAULT_SECTIONS))
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        raise SpecError(f"report.sections: unknown section {unknown[0]!r}; choose from {', '.join(SECTIONS)}")
    if not all(isinstance(p, str) for p in raw.get("intro", [])):
        raise SpecError("report.intro: expected a list of paragraphs (strings)")
    for key in ("data_seed_setting", "data_seed_choices"):
        if raw.get(key, settings[0]) not in settings:
            raise SpecError(f"report.{key}: {raw[key]!r} is not one of the study's settings {list(settings)}")
    picks = raw.get("data_seed_methods", {})
    for shown, method in picks.items():
        if method not in methods:
            raise SpecError(f"report.data_seed_methods.{shown}: {method!r} is not a method of the study")
    encoder = dict(raw.get("encoder", {}))
    encoder_keys = {"name": str, "train_images": int, "settings": list, "saw_validation": list}
    for key, value in encoder.items():
        if key not in encoder_keys or isinstance(value, bool) or not isinstance(value, encoder_keys[key]):
            raise SpecError(f"report.encoder.{key}: expected one of {', '.join(encoder_keys)} with a value of its "
                            f"type, got {value!r}")
    data_seeds = _ints(raw.get("data_seeds", []), "report.data_seeds")
    saw = _ints(encoder.get("saw_validation", []), "report.encoder.saw_validation")
    if saw and len(saw) < max(len(data_seeds), 1):
        raise SpecError("report.encoder.saw_validation: one count per data seed")
    needs = {"labels": ("later_seeds",), "volume": ("images_per_volume", "volume_groups"),
             "data_seeds": ("later_seeds", "data_seeds", "data_seed_setting", "data_seed_choices",
                            "data_seed_methods")}
    for section, keys in needs.items():
        missing = [k for k in keys if section in sections and not raw.get(k)]
        if missing:
            raise SpecError(f"report.{missing[0]}: the {section!r} section needs it")
    plain = {k: raw[k] for k in ("page", "title", "figure_label", "verify_log", "builds", "label_cache",
                                 "images_per_volume", "volume_groups", "data_seed_setting", "data_seed_choices")
             if k in raw}
    return ReportSpec(**plain, intro=tuple(raw.get("intro", [])), sections=sections,
                      later_seeds=_ints(raw.get("later_seeds", []), "report.later_seeds"), data_seeds=data_seeds,
                      data_seed_methods=tuple(picks.items()),
                      encoder_name=encoder.get("name", ReportSpec.encoder_name),
                      encoder_train_images=encoder.get("train_images"),
                      encoder_settings=tuple(encoder.get("settings", [])), encoder_saw_validation=saw)
