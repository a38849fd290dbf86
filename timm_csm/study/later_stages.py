"""A study's later stages, after stage 2 (``benchmarks/PROTOCOL.md``, amendment 2): configurations made of stage 1's
choices, each stage's cells known once the setting its choices come from has finished stage 2.

* stage 3, ``labels``: the searched row of the decision setting whose row has the lower mean validation ECE, at its
  chosen scale, at the paper's s = 2.3 and 4, and with each other label kind (:func:`label_variants`);
* stage 4, ``volume``: the searched row on 2x and 4x its generated set (:func:`volume_points`);
* stage 5, ``data_seeds``: chosen methods on other real subsets (:func:`data_seed_methods`).

What they run with (training seeds, data seeds, the methods of stage 5) is the spec's ``[report]`` table
(:mod:`.report_spec`).
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from .choose import axis_value, seed_mean
from ..annotation.config import AUTO
from .methods import LABELS, VOLUMES, tuned_name
from .plan import setting_plan
from .spec import StudySpec

__all__ = ["label_setting", "label_variants", "volume_points", "volume_settings", "data_seed_methods",
           "stage2_finished", "later_stage_cells"]

Rows = Mapping[str, Sequence[Mapping[str, Any]]]


def _row_values(spec: StudySpec, row: str) -> Dict[str, Any]:
    return {axis: axis_value(row, axis) for axis, _ in spec.search.steps}


def label_setting(spec: StudySpec, all_rows: Mapping[str, Rows]) -> Optional[str]:
    """The decision setting whose searched row has the lower mean validation ECE before TS over the tuning seeds
    (stage 3's, and stage 4's second); None until every decision setting's row is chosen."""
    settings = spec.decision.settings
    rows = {s: all_rows.get(s, {}) for s in settings}
    chosen = {s: setting_plan(spec, s, r).choices["csm"] for s, r in rows.items()}
    if None in chosen.values():
        return None
    return min(settings, key=lambda s: seed_mean(rows[s][chosen[s]], "val_ece_pre_ts", spec.seeds.tuning))


def label_variants(spec: StudySpec, row: str) -> List[Tuple[str, str]]:
    """``(what, configuration)`` of stage 3: ``row`` (its weight, n_aug and filter) at its chosen s, at the paper's
    s = 2.3 and 4, and with each other label kind; each configuration once."""
    values = _row_values(spec, row)
    method = spec.search.method
    s = values.get("s", AUTO)
    variants = [(f"CSM row (s {s if isinstance(s, str) else format(s, 'g')})", row)]
    variants += [(f"s = {v:g}", tuned_name(method, **dict(values, s=v))) for v in (2.3, 4.0)]
    variants += [(f"{label} labels", tuned_name(method, **dict(values, s=AUTO, label=label)))
                 for label in LABELS[1:]]
    first: Dict[str, str] = {}
    for what, name in variants:
        first.setdefault(name, what)
    return [(what, name) for name, what in first.items()]


def volume_points(spec: StudySpec, row: str) -> List[Tuple[int, str]]:
    """``(volume, configuration)`` of stage 4: ``row`` on the setting's set and on its 2x and 4x sets."""
    return [(v, tuned_name(spec.search.method, **dict(_row_values(spec, row), volume=v))) for v in VOLUMES]


def volume_settings(spec: StudySpec, third: Optional[str]) -> List[str]:
    """Stage 4's settings: the first decision setting, and stage 3's setting ``third`` where it is another."""
    first = spec.decision.settings[0]
    return [first] + ([third] if third is not None and third != first else [])


def data_seed_methods(spec: StudySpec, choices: Mapping[str, Any]) -> Optional[List[Tuple[str, str]]]:
    """``(shown name, configuration)`` of stage 5 from one setting's stage-1 ``choices``: each method of
    ``report.data_seed_methods`` at its choice, then the searched row; None until they are made."""
    # a method without a grid is its own choice
    picks = [(shown, choices["chosen"].get(method) if len(spec.method(method).configurations()) > 1 else method)
             for shown, method in spec.report.data_seed_methods] + [("CSM", choices["csm"])]
    return None if any(name is None for _, name in picks) else picks


def stage2_finished(spec: StudySpec, setting: str, rows: Rows) -> bool:
    """Whether ``setting`` has no stage-1 or stage-2 cell left and its row and best other methods are chosen."""
    plan = setting_plan(spec, setting, rows)
    choices = plan.choices
    return not plan.ready() and choices["csm"] is not None and None not in choices["best_other"].values()


def later_stage_cells(spec: StudySpec, all_rows: Mapping[str, Rows]
                      ) -> Dict[Tuple[str, int], List[Tuple[str, Tuple[int, ...]]]]:
    """The later stages' cells by (setting, data seed), as (configuration, seeds), for the sections the spec's
    report names: stage 3's in :func:`label_setting`'s setting, stage 4's volumes in :func:`volume_settings`,
    stage 5's in ``data_seed_setting`` at each data seed with ``data_seed_choices``' choices; each once the choices
    it needs are made and the setting they come from has finished stage 2 (stage 1, then 2, then the later ones)."""
    report, sections = spec.report, spec.report.sections
    settings = spec.decision.settings
    finished = {s: stage2_finished(spec, s, all_rows.get(s, {})) for s in settings}
    chosen = {s: setting_plan(spec, s, all_rows.get(s, {})).choices["csm"] for s in settings}
    out: Dict[Tuple[str, int], List[Tuple[str, Tuple[int, ...]]]] = {}
    third = label_setting(spec, all_rows)
    if "labels" in sections and third is not None and finished[third]:
        out.setdefault((third, 0), []).extend((name, report.later_seeds) for _, name in label_variants(spec,
                                                                                                      chosen[third]))
    if "volume" in sections:
        for setting in volume_settings(spec, third):
            if finished[setting]:
                out.setdefault((setting, 0), []).extend((name, spec.seeds.decision)
                                                        for v, name in volume_points(spec, chosen[setting]) if v != 1)
    source = report.data_seed_choices
    if "data_seeds" in sections and source is not None:
        methods = data_seed_methods(spec, setting_plan(spec, source, all_rows.get(source, {})).choices)
        if methods is not None and finished.get(source, False):
            for data_seed in report.data_seeds:
                out.setdefault((report.data_seed_setting, data_seed), []).extend(
                    (name, report.later_seeds) for _, name in methods)
    return out
