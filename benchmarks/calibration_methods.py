"""The calibration benchmark's table (``benchmarks/calibration_bench.py``): its rows (:data:`METHODS`, each a
:class:`BenchMethod`: the :func:`timm_csm.train.run` options it adds to the shared recipe and the generated set it
reads), the recipes, amendment 2's tuned configurations named ``<method>@<axis>=<value>,...`` (:func:`get_method`),
and each cell's name and training options (:func:`cell_config`). ``benchmarks/PROTOCOL.md`` fixes all of them.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import math
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from timm_csm.recipes import derive

__all__ = ["BenchMethod", "METHODS", "get_method", "tuned_name", "grid_methods", "csm_step_methods", "stage1_methods",
           "base_recipe", "cell_name", "cell_config", "plan_cells", "every_seed"]

DEFAULT_JSON = Path("benchmarks/calibration.json")

# Named recipes (``--recipe``): a registered profile's classifier recipe (:func:`timm_csm.recipes.training_options`).
# "augmented": ``demo`` (crops + flips, weight decay 5e-4, step decay) on 2 500 images, where CE is over-confident;
# "noaug": no augmentation, no weight decay. "matched" / "borrowed" (/ "annotated"): the demo classifier on one real
# subset (data seed 0) with a 2 000-image validation set outside it; they differ in the generated set (and KD's
# teacher) only, so that their non-generated cells are the same cells, shared in one cell cache.
RECIPES: Dict[str, str] = {"matched": "demo", "borrowed": "demo", "annotated": "demo", "augmented": "demo",
                           "noaug": "noaug"}
RECIPE_OPTIONS: Dict[str, Dict[str, Any]] = {"matched": {"val_size": 2000, "data_seed": 0},
                                              "borrowed": {"val_size": 2000, "data_seed": 0},
                                              "annotated": {"val_size": 2000, "data_seed": 0}}
PROTOCOL_RECIPES = ("matched", "borrowed")
PROTOCOL_OUTPUT = "runs/calibration_protocol"
DEFAULT_OUTPUTS = {"matched": PROTOCOL_OUTPUT, "borrowed": PROTOCOL_OUTPUT,
                   "augmented": "runs/calibration_bench_augmented", "noaug": "runs/calibration_bench"}
DEFAULT_REPORTS = {"matched": Path("benchmarks/calibration.md"), "borrowed": Path("benchmarks/calibration.md"),
                   "augmented": Path("benchmarks/calibration_earlier.md"),
                   "noaug": Path("benchmarks/calibration_demo.md")}
#: where each setting's generated set and reference encoder are built (benchmarks/matched_setting.py)
SETTINGS_ROOT = Path("runs/settings")
#: finished cells of the protocol recipes, committed: a cell found here is done and never re-run
COMMITTED_CELLS = Path("benchmarks/cells")


@dataclasses.dataclass(frozen=True)
class BenchMethod:
    """One row of the table: its label, the :func:`timm_csm.train.run` options it adds to the shared recipe, and
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
#: the methods of the protocol recipes, in the order of their tables (PROTOCOL.md)
PROTOCOL_METHODS = ("ce", "ls", "mbls", "mixup", "regmixup", "brier", "real_copies", "ce_eq", "regmixup_eq", "kd",
                    "csm", "csm_hard", "csm_filtered")
#: the controls PROTOCOL.md adds (not part of the earlier benchmark's recipes)
CONTROLS = ("brier", "real_copies", "ce_eq", "regmixup_eq", "kd")
#: the methods that use no generated image: the candidates for "the best other method"
NON_GENERATED = ("ce", "ls", "mbls", "mixup", "regmixup", "brier", "real_copies", "ce_eq", "regmixup_eq", "kd")
#: the two CSM variants the validation rule chooses between
CSM_VARIANTS = ("csm", "csm_filtered")
#: the boundary study's rows (PROTOCOL.md, amendment 1): the volume axis, then the generator-steps axis
BOUNDARY_METHODS = ("csm_groups25", "csm_groups50", "csm_gen2000")

# ---------------------------------------------------------------------------------------------------------------
# amendment 2 (PROTOCOL.md): tuned methods, named "<method>@<axis>=<value>[,<axis>=<value>]"
# ---------------------------------------------------------------------------------------------------------------
#: how an axis enters a cell: a keyword of the method's loss, a training option, or a derivation of the generated set
#: it reads (s: relabelled at a fixed scale, "auto" keeps the set's own likelihood choice; filtered: flagged groups
#: dropped; label: stage 3's labels in place of the annotation's; volume: stage 4's set of 2x / 4x the groups)
TUNING_AXES = {"smoothing": "loss", "margin": "loss", "alpha": "loss", "temperature": "loss", "weight": "loss",
               "mixup": "option", "regmixup": "option", "n_aug": "option", "s": "data", "filtered": "data",
               "label": "data", "volume": "data"}
#: an axis's value where the method's options do not set it (the loss's and the recipe's defaults)
AXIS_DEFAULTS = {"weight": 1.0, "n_aug": 1, "s": "auto", "filtered": 0, "label": "projection", "volume": 1}
_AXIS_NAMES = {"smoothing": "eps", "mixup": "alpha", "regmixup": "alpha", "temperature": "tau", "n_aug": "n_aug",
               "label": "labels"}
#: stage 3's labels of a generated set (PROTOCOL.md amendment 2): the annotation's own (projection, at s), the
#: one-hot dominant generation class (hard), the generation ratio (lambda) and the annotator's softmax
LABELS = ("projection", *derive.DERIVED_LABELS)
#: stage 4's volumes: the setting's set (1) and the sets of 2x and 4x its groups (benchmarks/matched_setting.py)
VOLUMES = (1, 2, 4)
#: the axes that only a method reading the setting's own generated set takes
_SET_AXES = ("label", "volume")
#: stage 1's grids of the baselines (PROTOCOL.md amendment 2), crossed where a method has two axes
TUNING_GRIDS: Dict[str, Dict[str, Tuple[Any, ...]]] = {
    "ls": {"smoothing": (0.02, 0.05, 0.1, 0.2)},
    "mbls": {"margin": (3.0, 6.0, 10.0)},
    "mixup": {"mixup": (0.1, 0.4, 1.0)},
    "regmixup": {"regmixup": (2.0, 10.0, 20.0)},
    "kd": {"temperature": (2.0, 4.0), "alpha": (0.5, 0.9)},
}
#: CSM's coordinate-wise search, in order; each step at the values chosen before it (n_aug 4 cannot run with groups
#: of 4 ratios: PROTOCOL.md's clarification)
CSM_TUNING_STEPS: Tuple[Tuple[str, Tuple[Any, ...]], ...] = (
    ("s", (1.0, 2.3, 4.0, 8.0, "auto")), ("weight", (0.5, 1.0, 2.0)), ("n_aug", (1, 2)), ("filtered", (0, 1)))
#: the methods without a grid that stage 1 runs as they are
UNTUNED_A2 = ("ce", "brier")
A2_SETTINGS = ("matched", "annotated", "borrowed")
A2_OUTPUT = "runs/protocol_a2"
A2_SEEDS = tuple(range(15))
A2_TUNING_SEEDS = (0, 1, 2)
#: finished amendment-2 cells, committed (with their record: commit, versions, threads, generated set)
COMMITTED_A2 = Path("benchmarks/cells_a2")
#: each --verify of an amendment-2 cell: the cell, the commit it ran at, whether it reproduced
A2_VERIFY_LOG = Path("benchmarks/cells_a2_verify.json")
#: each setting's annotator (reference encoder, prototypes, s rule), under SETTINGS_ROOT: stage 3's softmax labels
A2_ANNOTATORS = {"matched": "matched", "annotated": "borrowed", "borrowed": "borrowed"}


def _axis_value(axis: str, text: str) -> Any:
    if axis == "s" and text == "auto":
        return "auto"
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
    if values.get("label", "projection") != "projection" and values.get("s", "auto") != "auto":
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


def grid_methods(method: str) -> List[str]:
    """Stage 1's configurations of a baseline, by canonical name (one name for an untuned method)."""
    grid = TUNING_GRIDS.get(method)
    if not grid:
        return [method]
    axes = sorted(grid)
    return [tuned_name(method, **dict(zip(axes, point))) for point in itertools.product(*(grid[a] for a in axes))]


def csm_step_methods(step: int, chosen: Optional[Dict[str, Any]] = None, method: str = "csm",
                     steps: Tuple[Tuple[str, Tuple[Any, ...]], ...] = CSM_TUNING_STEPS) -> List[str]:
    """The configurations of step ``step`` (0-based) of CSM's coordinate-wise search ``steps`` (amendment 2's by
    default), at the values ``chosen`` by the steps before it (their defaults where not given)."""
    axis, values = steps[step]
    fixed = {a: (chosen or {}).get(a, AXIS_DEFAULTS[a]) for a, _ in steps[:step]}
    return [tuned_name(method, **fixed, **{axis: v}) for v in values]


def stage1_methods(setting: str, amendment: int = 2) -> List[str]:
    """Stage 1's cells of ``setting`` that need no earlier choice: every baseline's grid (amendment 2: CE, LS,
    MbLS, Mixup, RegMixup, Brier; amendment 4: CE, LS, Mixup, RegMixup), KD's grid where the setting's annotator is
    its teacher, and step 1 of CSM's search (the scale s)."""
    bases = A4_BASELINES if amendment == 4 else ("ce", "ls", "mbls", "mixup", "regmixup", "brier")
    names = [m for base in bases for m in grid_methods(base)]
    if setting in METHODS["kd"].recipes:
        names += grid_methods("kd")
    return names + csm_step_methods(0, steps=A4_CSM_STEPS if amendment == 4 else CSM_TUNING_STEPS)


# ---------------------------------------------------------------------------------------------------------------
# amendment 4 (PROTOCOL.md): a timm backbone, amendment 2's settings, generated sets and grids
# ---------------------------------------------------------------------------------------------------------------
A4_SETTINGS = ("matched", "annotated")
A4_OUTPUT = "runs/protocol_a4"
#: finished amendment-4 cells, committed with their record (the instruction-set pins and the processor too)
COMMITTED_A4 = Path("benchmarks/cells_a4")
A4_VERIFY_LOG = Path("benchmarks/cells_a4_verify.json")
#: the pilot's choice (benchmarks/pilot_a4.md): the timm backbone and the recipe length, amendment 2's classifier
#: recipe otherwise (SGD 0.1, momentum 0.9, weight decay 5e-4, batch 128, crops and flips)
A4_BACKBONE: Dict[str, Any] = {"model": "resnet18", "epochs": 60, "decay_milestones": [30, 45]}
A4_SEEDS = tuple(range(10))
A4_BASELINES = ("ce", "ls", "mixup", "regmixup")
#: CSM's coordinate-wise search: as many configurations (4) as the largest baseline grid, so that no method gets a
#: larger search (amendment 2's CSM got 9 against at most 4)
A4_CSM_STEPS: Tuple[Tuple[str, Tuple[Any, ...]], ...] = (("s", (4.0, 8.0, "auto")), ("filtered", (0, 1)))


def a4_recipe() -> Dict[str, Any]:
    """Amendment 4's classifier recipe: amendment 2's (the ``matched`` recipe: data seed 0, 2 000 validation
    images) with the pilot's timm backbone and length (no ``small_cnn`` widths)."""
    recipe = base_recipe(name="matched")
    recipe.pop("model_kwargs", None)
    recipe.update(json.loads(json.dumps(A4_BACKBONE)))
    return recipe


# ---------------------------------------------------------------------------------------------------------------
# recipe and cells
# ---------------------------------------------------------------------------------------------------------------
def base_recipe(overrides: Optional[Dict[str, Any]] = None, name: str = "augmented") -> Dict[str, Any]:
    """The shared training options: the named recipe's profile (``RECIPES``), then ``overrides`` (None values
    ignored)."""
    from timm_csm.recipes import get_profile, training_options

    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; choose one of {sorted(RECIPES)}")
    recipe = training_options(get_profile(RECIPES[name]))
    recipe.update(RECIPE_OPTIONS.get(name, {}))
    recipe.update({k: v for k, v in (overrides or {}).items() if v is not None})
    if isinstance(recipe.get("model_kwargs"), (list, tuple)):
        recipe["model_kwargs"] = dict(recipe["model_kwargs"])
    return recipe


def cell_name(method: str, seed: int, setting: Optional[str] = None, data_seed: Optional[int] = None) -> str:
    """``<method>-s<seed>``; ``<method>-<setting>-s<seed>`` for a protocol cell that depends on the setting;
    ``-d<data seed>`` before the seed for a real subset other than data seed 0 (amendment 2's stage 5)."""
    data = f"-d{data_seed}" if data_seed else ""
    if setting is not None and method.partition("@")[0] in METHODS and get_method(method).per_setting:
        return f"{method}-{setting}{data}-s{seed}"
    return f"{method}{data}-s{seed}"


def cell_config(recipe: Dict[str, Any], method: BenchMethod, seed: int, cell_dir: Path,
                csm_paths: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """The :func:`timm_csm.train.run` options of one cell (``csm_paths``: the generated datasets by kind, and the
    teacher under ``"teacher"``)."""
    cfg = {k: v for k, v in recipe.items() if k != "n_aug"}
    if method.epoch_factor != 1.0:
        cfg["epochs"] = math.ceil(cfg["epochs"] * method.epoch_factor)
        if cfg.get("decay_milestones"):
            cfg["decay_milestones"] = [math.ceil(m * method.epoch_factor) for m in cfg["decay_milestones"]]
    cfg.update(method.options)
    if method.csm is not None:
        path = (csm_paths or {}).get(method.data_key)
        if not path:
            raise ValueError(f"method {method.name!r} needs the {method.data_key}-label CSM dataset")
        cfg.update(csm_dataset=str(path), n_aug=method.options.get("n_aug", recipe.get("n_aug", 1)))
    if method.teacher:
        path = (csm_paths or {}).get("teacher")
        if not path:
            raise ValueError(f"method {method.name!r} needs a teacher (the setting's reference encoder)")
        cfg.update(teacher=str(path))
    cfg.update(seed=int(seed), output=str(cell_dir), experiment=".")
    return cfg


# derived generated datasets: kind -> (derivation, folder under --output, what the page calls it)
DERIVED = {"hard": (derive.derive_hard_label_dataset, "csm-hard-labels", "hard-label copy"),
           "filtered": (derive.derive_filtered_dataset, "csm-filtered", "copy without flagged groups")}
#: the boundary study's sets: kind -> (the generated set's folder under SETTINGS_ROOT, None for the setting's own;
#: the share of each class pair's groups kept), each in the decision row's variant (flagged groups dropped or not)
BOUNDARY_SETS = {"groups25": (None, 0.25), "groups50": (None, 0.5), "gen2000": ("matched-gen2000", 1.0)}
PROTOCOL_SEEDS = (0, 1, 2, 3, 4)


def plan_cells(methods: Sequence[str], seeds: Sequence[int]) -> List[Tuple[str, int]]:
    """Seed-major order: every method's first seed before any second seed, so a partial run covers all rows."""
    return [(m, s) for s in seeds for m in methods]


def every_seed(rows: Dict[str, List[Dict[str, Any]]], methods: Sequence[str]) -> bool:
    """Whether every one of ``methods`` has a row for each of the protocol's seeds (its validation choices are made)."""
    return all(len(rows.get(m, [])) >= len(PROTOCOL_SEEDS) for m in methods)


def volume_dataset(setting: str, volume: int) -> str:
    """The CSM dataset of ``setting``'s set of ``volume`` times the groups (``matched_setting.py --setting
    <setting>-x<volume>``)."""
    return str(SETTINGS_ROOT / f"{setting}-x{volume}" / "csm" / "csm-fmnist-aug")

