"""The methods a study compares: the table of training methods (:data:`METHODS`, each a :class:`BenchMethod`: the
:func:`timm_csm.training.run` options it adds to the shared recipe and the generated set it reads), the axes a method is
tuned on, the names of its configurations ``<method>@<axis>=<value>,...`` (:func:`tuned_name`, :func:`get_method`),
a grid's and a coordinate-wise search step's configurations, and a cell's name (:func:`cell_name`): what a study
spec names and what the calibration benchmark's cells are called.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import math
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..annotation.config import AUTO, parse_s
from ..recipes.derive import DERIVED_LABELS

__all__ = ["BenchMethod", "METHODS", "TUNING_AXES", "AXIS_DEFAULTS", "LABELS", "VOLUMES", "tuned_name",
           "get_method", "grid_configurations", "step_configurations", "cell_name"]

@dataclasses.dataclass(frozen=True)
class BenchMethod:
    """One row of the table: its label, the :func:`timm_csm.training.run` options it adds to the shared recipe, and
    which generated dataset it reads (``None``, ``"soft"``: ``--csm-dataset``, ``"hard"``: the hard-label copy,
    ``"filtered"``: the copy without the groups flagged by :func:`timm_csm.annotation.checks.flag_groups`)."""

    name: str
    label: str
    options: Dict[str, Any]
    csm: Optional[str] = None
    #: trains with the setting's reference encoder as teacher (``--teacher``)
    teacher: bool = False
    #: the protocol recipes it belongs to (None: every recipe)
    recipes: Optional[Tuple[str, ...]] = None
    #: the recipe's epochs and lr milestones times this (rounded up): as many images processed as CSM's three per
    #: real image and step (CE x3; RegMixup, which takes two, x1.5)
    epoch_factor: float = 1.0
    #: amendment 2's derivations of the generated set it reads: ``(("filtered", 1), ("s", 2.3))``
    derive: Tuple[Tuple[str, Any], ...] = ()

    @property
    def data_key(self) -> Optional[str]:
        """The generated set it reads: its kind, then the derivations of amendment 2 in the order they apply
        (``"filtered@s=2.3"``, ``"soft@volume=2@label=lambda"``): the volume set, its labels, their scale."""
        if self.csm is None:
            return None
        derive = dict(self.derive)
        changed = [a for a in ("volume", "label", "s") if derive.get(a, AXIS_DEFAULTS[a]) != AXIS_DEFAULTS[a]]
        steps = [f"{a}={derive[a] if isinstance(derive[a], str) else format(derive[a], 'g')}" for a in changed]
        return "@".join(["filtered" if derive.get("filtered") else self.csm, *steps])

    @property
    def per_setting(self) -> bool:
        """Whether its cells depend on the setting's generated data or encoder (else one cell serves both)."""
        return self.teacher or self.csm not in (None, "real_copies")


# Hyper-parameters: the settings of each method's paper / released configs; one value each, no
# per-method search, so that every method gets the same tuning effort.
METHODS: Dict[str, BenchMethod] = {m.name: m for m in (
    BenchMethod("ce", "CE", {"loss": "ce"}),
    BenchMethod("ls", "Label smoothing (eps 0.05)", {"loss": "ls", "loss_kwargs": {"smoothing": 0.05}}),
    BenchMethod("focal", "Focal (gamma 3)", {"loss": "focal", "loss_kwargs": {"gamma": 3.0}}),
    BenchMethod("flsd53", "FLSD-53", {"loss": "flsd53"}),
    BenchMethod("mbls", "MbLS (m 10, alpha 0.1)", {"loss": "mbls", "loss_kwargs": {"margin": 10.0, "alpha": 0.1}}),
    BenchMethod("acls", "ACLS", {"loss": "acls"}),
    BenchMethod("mdca", "NLL + MDCA (beta 1)", {"loss": "mdca", "loss_kwargs": {"beta": 1.0}}),
    BenchMethod("mixup", "Mixup (alpha 0.4)", {"loss": "ce", "mixup": 0.4}),
    BenchMethod("regmixup", "RegMixup (alpha 20)", {"loss": "ce", "regmixup": 20.0}),
    BenchMethod("csm", "CSM", {"loss": "csm"}, csm="soft"),
    BenchMethod("csm_soft_ce", "CSM, soft-CE loss", {"loss": "csm_soft_ce"}, csm="soft"),
    BenchMethod("csm_soft_focal", "CSM, soft-focal loss", {"loss": "csm_soft_focal"}, csm="soft"),
    BenchMethod("csm_hard", "CSM data, hard labels (variant 2)", {"loss": "csm"}, csm="hard"),
    BenchMethod("csm_filtered", "CSM, flagged groups dropped", {"loss": "csm"}, csm="filtered"),
    # the controls of benchmarks/PROTOCOL.md
    BenchMethod("brier", "Brier (control)", {"loss": "brier"}),
    BenchMethod("real_copies", "Real copies (control)", {"loss": "csm"}, csm="real_copies"),
    BenchMethod("ce_eq", "CE, equal images (control)", {"loss": "ce"}, epoch_factor=3.0),
    BenchMethod("regmixup_eq", "RegMixup, equal images (control)", {"loss": "ce", "regmixup": 20.0},
                epoch_factor=1.5),
    # the boundary study (PROTOCOL.md, amendment 1): the decision row's set with fewer groups per class pair
    BenchMethod("csm_groups25", "CSM, a quarter of the groups", {"loss": "csm"}, csm="groups25"),
    BenchMethod("csm_groups50", "CSM, half of the groups", {"loss": "csm"}, csm="groups50"),
    BenchMethod("csm_gen2000", "CSM, generator at 2 000 steps", {"loss": "csm"}, csm="gen2000"),
    BenchMethod("kd", "KD from the borrowed encoder (control)",
                {"loss": "kd", "loss_kwargs": {"temperature": 4.0, "alpha": 0.9}}, teacher=True,
                recipes=("borrowed", "annotated")),
)}

#: how an axis enters a cell: a keyword of the method's loss, a training option, or a derivation of the generated set
#: it reads (s: relabelled at a fixed scale, "auto" keeps the set's own likelihood choice; filtered: flagged groups
#: dropped; label: stage 3's labels in place of the annotation's; volume: stage 4's set of 2x / 4x the groups)
TUNING_AXES = {"smoothing": "loss", "margin": "loss", "alpha": "loss", "temperature": "loss", "weight": "loss",
               "mixup": "option", "regmixup": "option", "n_aug": "option", "s": "data", "filtered": "data",
               "label": "data", "volume": "data"}
#: an axis's value where the method's options do not set it (the loss's and the recipe's defaults)
AXIS_DEFAULTS = {"weight": 1.0, "n_aug": 1, "s": AUTO, "filtered": 0, "label": "projection", "volume": 1}
_AXIS_NAMES = {"smoothing": "eps", "mixup": "alpha", "regmixup": "alpha", "temperature": "tau", "n_aug": "n_aug",
               "label": "labels"}
#: stage 3's labels of a generated set (PROTOCOL.md amendment 2): the annotation's own (projection, at s), the
#: one-hot dominant generation class (hard), the generation ratio (lambda) and the annotator's softmax
LABELS = ("projection", *DERIVED_LABELS)
#: stage 4's volumes: the setting's set (1) and the sets of 2x and 4x its groups (benchmarks/matched_setting.py)
VOLUMES = (1, 2, 4)
#: the axes that only a method reading the setting's own generated set takes
_SET_AXES = ("label", "volume")


def _axis_value(axis: str, text: str) -> Any:
    if axis == "s":  # the annotation's s, read as the annotation reads it
        return parse_s(text)
    if axis == "label":
        if text not in LABELS:
            raise ValueError(f"label must be one of {', '.join(LABELS)}, got {text}")
        return text
    if axis == "volume":
        if text not in [str(v) for v in VOLUMES]:
            raise ValueError(f"volume must be one of {', '.join(map(str, VOLUMES))}, got {text}")
        return int(text)
    value = float(text)
    if axis in ("n_aug", "filtered"):
        if value != int(value) or value < (1 if axis == "n_aug" else 0) or (axis == "filtered" and value > 1):
            raise ValueError(f"{axis} must be {'a positive integer' if axis == 'n_aug' else '0 or 1'}, got {text}")
        return int(value)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{axis} must be a positive number, got {text}")
    return value


def _base_value(base: BenchMethod, axis: str) -> Any:
    kind = TUNING_AXES[axis]
    if kind == "loss":
        return base.options.get("loss_kwargs", {}).get(axis, AXIS_DEFAULTS.get(axis))
    if kind == "option":
        return base.options.get(axis, AXIS_DEFAULTS.get(axis))
    return AXIS_DEFAULTS[axis]


def tuned_name(method: str, **values: Any) -> str:
    """The canonical name of ``method`` at ``values``: axes at the method's own value are left out, so that one
    configuration has one name (``tuned_name("csm", s=2.3, weight=1.0) == "csm@s=2.3"``)."""
    base = METHODS[method]
    parts = [f"{axis}={value if isinstance(value, str) else format(value, 'g')}"
             for axis, value in sorted(values.items()) if value != _base_value(base, axis)]
    return method + ("@" + ",".join(parts) if parts else "")


def get_method(name: str) -> BenchMethod:
    """The :class:`BenchMethod` of a method name or a tuned name (``"ls@smoothing=0.1"``, ``"csm@s=2.3,n_aug=2"``)."""
    base_name, _, spec = name.partition("@")
    if base_name not in METHODS:
        raise ValueError(f"unknown method {base_name!r}; choose from {list(METHODS)}")
    base = METHODS[base_name]
    if not spec:
        return base
    values: Dict[str, Any] = {}
    for part in spec.split(","):
        axis, eq, text = part.partition("=")
        if axis not in TUNING_AXES or not eq:
            raise ValueError(f"{name!r}: expected <axis>=<value> with an axis of {sorted(TUNING_AXES)}, got {part!r}")
        kind = TUNING_AXES[axis]
        if kind == "data" and base.csm is None:
            raise ValueError(f"{name!r}: {axis} applies to methods that read a generated set")
        if axis in _SET_AXES and base.csm != "soft":
            raise ValueError(f"{name!r}: {axis} applies to methods that read the setting's generated set")
        if kind == "loss" and axis not in base.options.get("loss_kwargs", {}) and axis not in AXIS_DEFAULTS:
            raise ValueError(f"{name!r}: the {base.options.get('loss')} loss of {base_name} has no option {axis!r}")
        if kind == "option" and axis not in base.options and axis not in AXIS_DEFAULTS:
            raise ValueError(f"{name!r}: {base_name} has no option {axis!r}")
        values[axis] = _axis_value(axis, text)
    if values.get("label", "projection") != "projection" and values.get("s", AUTO) != AUTO:
        raise ValueError(f"{name!r}: s scales the annotation's labels, which label={values['label']} replaces")
    options = json.loads(json.dumps(base.options))
    for axis, value in values.items():
        if TUNING_AXES[axis] == "loss":
            options.setdefault("loss_kwargs", {})[axis] = value
        elif TUNING_AXES[axis] == "option":
            options[axis] = value
    shown = ", ".join(f"{_AXIS_NAMES.get(a, a)} {v if isinstance(v, str) else format(v, 'g')}"
                      for a, v in sorted(values.items()))
    derive = tuple(sorted((a, v) for a, v in values.items() if TUNING_AXES[a] == "data"))
    return dataclasses.replace(base, name=tuned_name(base_name, **values), label=f"{base.label.split(' (')[0]} "
                               f"({shown})", options=options, derive=derive)



def grid_configurations(method: str, grid: Optional[Mapping[str, Sequence[Any]]] = None) -> List[str]:
    """The configurations of ``method`` on ``grid`` (``{axis: values}``, crossed where it has several axes, in the
    axes' name order), by canonical name; the method's own name for no grid."""
    if not grid:
        return [method]
    axes = sorted(grid)
    return [tuned_name(method, **dict(zip(axes, point))) for point in itertools.product(*(grid[a] for a in axes))]


def step_configurations(steps: Sequence[Tuple[str, Sequence[Any]]], step: int,
                        chosen: Optional[Mapping[str, Any]] = None, method: str = "csm") -> List[str]:
    """The configurations of step ``step`` (0-based) of the coordinate-wise search ``steps`` (``(axis, values)`` in
    order), at the values ``chosen`` by the steps before it (their defaults where not given)."""
    axis, values = steps[step]
    fixed = {a: (chosen or {}).get(a, AXIS_DEFAULTS[a]) for a, _ in steps[:step]}
    return [tuned_name(method, **fixed, **{axis: v}) for v in values]


def cell_name(method: str, seed: int, setting: Optional[str] = None, data_seed: Optional[int] = None) -> str:
    """``<method>-s<seed>``; ``<method>-<setting>-s<seed>`` for a protocol cell that depends on the setting;
    ``-d<data seed>`` before the seed for a real subset other than data seed 0 (amendment 2's stage 5)."""
    data = f"-d{data_seed}" if data_seed else ""
    if setting is not None and method.partition("@")[0] in METHODS and get_method(method).per_setting:
        return f"{method}-{setting}{data}-s{seed}"
    return f"{method}{data}-s{seed}"

