"""Calibration benchmark: CSM against the calibration baselines and controls on Fashion-MNIST, before and after
temperature scaling.

Every method trains the same backbone with the same recipe on the same real images, for several training seeds.
Recipes (``--recipe``):

* ``matched`` and ``borrowed`` (the default ``matched``): the two settings of ``benchmarks/PROTOCOL.md``, written
  before their cells ran. One real subset (data seed 0, 2 500 images) and a 2 000-image validation set drawn outside
  it; 5 training seeds; the generated set of ``matched`` comes from a generator and an encoder trained on the
  classifier's 2 500 images, that of ``borrowed`` from the shipped generator (60 000 images) and an encoder trained
  on 54 000 (``benchmarks/matched_setting.py`` builds both under ``runs/settings/<setting>/``). Methods: CE, label
  smoothing, MbLS, Mixup, RegMixup, the controls (Brier, real copies, CE and RegMixup at equal images processed, KD
  from the borrowed encoder), CSM and its hard-label and filtered variants. Cells that use no generated data are the
  same cells in both settings. Finished cells are committed under ``benchmarks/cells/`` and never re-run; the page
  ``benchmarks/calibration.md`` shows both settings with per-seed rows, paired 95% intervals and the decision rule's
  verdicts, and ``benchmarks/calibration.json`` their rows with ``per_seed``.
* ``augmented`` and ``noaug``: the earlier benchmark's (``benchmarks/calibration_earlier.md``,
  ``calibration_demo.md``), kept to reproduce those pages.

Each (method, seed) cell is one :func:`timm_csm.train.run` into ``<output>/cells/<cell>/``: a cell with a
``results.json`` is skipped, a killed cell resumes from its ``last.safetensors``, so the benchmark can run in pieces
(``--max-cells``) and the tables fill in as cells finish. The cache is keyed by the cell's training options (the
generated dataset by its path, not its content: use a fresh ``--output`` after regenerating it); a folder trained
with other options is refused.

    python benchmarks/matched_setting.py --setting matched       # the generated sets (hours, resumable)
    python benchmarks/matched_setting.py --setting borrowed
    python benchmarks/calibration_bench.py --recipe matched      # all cells of a setting (hours; resumable)
    python benchmarks/calibration_bench.py --recipe borrowed
    python benchmarks/calibration_bench.py --recipe matched --methods ce csm --max-cells 3
    python benchmarks/calibration_bench.py --report-only         # re-assemble the page only

The hard-label ablation reads ``--csm-dataset-hard`` or, when that is not given, a copy of the setting's CSM dataset
whose soft labels are replaced by the one-hot dominant generation class (``a`` when lambda_gen >= 1/2, else ``b``:
the annotation's ``label_mode="generation"``), written once under ``<output>/``; the filtered row reads a copy
without its flagged groups (``annotate.py --drop-flagged``), written there too; the real-copies control a CSM dataset
of real training images with the generated sets' group structure (:func:`derive_real_copies_dataset`).

Amendment 2 (``--amendment 2 --recipe matched / annotated / borrowed``) names its configurations
``<method>@<axis>=<value>,...`` (:data:`TUNING_AXES`). CSM's data axes derive the set it reads, each written once
under ``--output`` and keyed by its source: ``s`` (relabelled at a fixed scale), ``filtered``, stage 3's ``label``
(``hard``, ``lambda``: q_a = lambda_gen, ``softmax``: the setting's annotator's, :data:`A2_ANNOTATORS`) and stage
4's ``volume`` (2, 4: ``runs/settings/<setting>-x<volume>`` from ``matched_setting.py``, then the other
derivations). Stage 5's ``--data-seed N`` trains on another real subset; its cells are named
``<method>[-<setting>]-d<N>-s<seed>`` (data seed 0 keeps the names without it).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from timm_csm.io import write_json_atomic

__all__ = ["BenchMethod", "METHODS", "base_recipe", "cell_config", "run_cells", "collect_cells", "matches_recipe",
           "summarize", "json_rows", "write_json_rows",
           "write_report", "derive_hard_label_dataset", "derive_filtered_dataset", "build_parser", "main"]

RESULTS = "results.json"
CELL_META = "cell.json"
PREDICTIONS = "test_predictions.safetensors"
DEFAULT_JSON = Path("benchmarks/calibration.json")

# Named recipes (``--recipe``): the classifier recipe of a registered recipe profile
# (:func:`timm_csm.recipes.training_options`), with its cell cache and page. "augmented": the ``demo`` profile, the
# paper's training ingredients (random crops + flips, weight decay 5e-4, step decay, best validation accuracy) on a
# 2 500-image subset trained to convergence, where CE is over-confident (test ECE 4.2% before TS at seed 0, 2.7%
# with 5 000 images: the sweep in benchmarks/calibration.md); "noaug": the ``noaug`` profile (no augmentation, no
# weight decay: over-confident by over-fitting).
# "matched" and "borrowed": the two settings of benchmarks/PROTOCOL.md, the demo profile's classifier on one real
# subset (data seed 0) with a 2 000-image validation set drawn outside it; they differ in the generated set (and
# KD's teacher) only, so that their non-generated cells are the same cells, shared in one cell cache.
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
        changed = [a for a in ("volume", "label", "s") if derive.get(a, _AXIS_DEFAULTS[a]) != _AXIS_DEFAULTS[a]]
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
_AXIS_DEFAULTS = {"weight": 1.0, "n_aug": 1, "s": "auto", "filtered": 0, "label": "projection", "volume": 1}
_AXIS_NAMES = {"smoothing": "eps", "mixup": "alpha", "regmixup": "alpha", "temperature": "tau", "n_aug": "n_aug",
               "label": "labels"}
#: stage 3's labels of a generated set (PROTOCOL.md amendment 2): the annotation's own (projection, at s), the
#: one-hot dominant generation class (hard), the generation ratio (lambda) and the annotator's softmax
LABELS = ("projection", "hard", "lambda", "softmax")
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
#: CSM's coordinate-wise search, in order; each step at the values chosen before it
CSM_TUNING_STEPS: Tuple[Tuple[str, Tuple[Any, ...]], ...] = (
    ("s", (1.0, 2.3, 4.0, 8.0, "auto")), ("weight", (0.5, 1.0, 2.0)), ("n_aug", (1, 2, 4)), ("filtered", (0, 1)))
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
        return base.options.get("loss_kwargs", {}).get(axis, _AXIS_DEFAULTS.get(axis))
    if kind == "option":
        return base.options.get(axis, _AXIS_DEFAULTS.get(axis))
    return _AXIS_DEFAULTS[axis]


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
        if kind == "loss" and axis not in base.options.get("loss_kwargs", {}) and axis not in _AXIS_DEFAULTS:
            raise ValueError(f"{name!r}: the {base.options.get('loss')} loss of {base_name} has no option {axis!r}")
        if kind == "option" and axis not in base.options and axis not in _AXIS_DEFAULTS:
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
    import itertools

    grid = TUNING_GRIDS.get(method)
    if not grid:
        return [method]
    axes = sorted(grid)
    return [tuned_name(method, **dict(zip(axes, point))) for point in itertools.product(*(grid[a] for a in axes))]


def csm_step_methods(step: int, chosen: Optional[Dict[str, Any]] = None, method: str = "csm") -> List[str]:
    """The configurations of step ``step`` (0-based) of CSM's coordinate-wise search, at the values ``chosen`` by
    the steps before it (their defaults where not given)."""
    axis, values = CSM_TUNING_STEPS[step]
    fixed = {a: (chosen or {}).get(a, _AXIS_DEFAULTS[a]) for a, _ in CSM_TUNING_STEPS[:step]}
    return [tuned_name(method, **fixed, **{axis: v}) for v in values]


def stage1_methods(setting: str) -> List[str]:
    """Stage 1's cells of ``setting`` that need no earlier choice: every baseline's grid, CE, Brier, KD's grid where
    the setting's annotator is its teacher, and step 1 of CSM's search (the scale s)."""
    names = [m for base in ("ce", "ls", "mbls", "mixup", "regmixup", "brier") for m in grid_methods(base)]
    if setting in METHODS["kd"].recipes:
        names += grid_methods("kd")
    return names + csm_step_methods(0)


# options that do not change what a cell computes (where it writes, how it shows progress)
_NOT_KEYED = ("output", "experiment", "progress", "resume")


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


def _keyed(cfg: Dict[str, Any]) -> Dict[str, Any]:
    return json.loads(json.dumps({k: v for k, v in cfg.items() if k not in _NOT_KEYED}, sort_keys=True, default=str))


def _read_json(path: Path):
    with open(path) as f:
        return json.load(f)


def _check_config(meta_path: Path, cfg: Dict[str, Any]) -> None:
    saved = _read_json(meta_path).get("config", {})
    want = _keyed(cfg)
    if saved != want:
        diff = sorted(k for k in set(saved) | set(want) if saved.get(k) != want.get(k))
        raise ValueError(f"{meta_path.parent} holds a cell trained with other options (they differ in {diff}); "
                         "choose another --output for this recipe")


def cell_state(cell_dir: Path, cfg: Dict[str, Any], committed: Optional[Path] = None) -> str:
    """"done", "partial" (a ``last.safetensors`` to resume from) or "new"; ValueError when the folder holds a cell
    trained with other options (the cache is keyed by the configuration). ``committed``: the cell's folder among the
    committed cells (``results.json`` and ``cell.json`` only), which makes it done."""
    if committed is not None and (committed / CELL_META).exists() and (committed / RESULTS).exists():
        _check_config(committed / CELL_META, cfg)
        return "done"
    meta_path = cell_dir / CELL_META
    if meta_path.exists():
        _check_config(meta_path, cfg)
    elif (cell_dir / RESULTS).exists():
        raise ValueError(f"{cell_dir} has a {RESULTS} but no {CELL_META}: it was not written by this benchmark")
    if (cell_dir / RESULTS).exists():
        return "done"
    if (cell_dir / "last.safetensors").exists():
        return "partial"
    return "new"


def run_cell(cfg: Dict[str, Any], cell_dir: Path, method: str, seed: int, log=print, setting: Optional[str] = None,
             committed: Optional[Path] = None, amendment: Optional[int] = None) -> Dict[str, Any]:
    """Train and evaluate one cell (resuming a killed one); returns its results. With ``committed``, its
    ``results.json`` and ``cell.json`` are copied there once it has finished. With ``amendment``, ``cell.json``
    holds the cell's record (:func:`cell_record`)."""
    from timm_csm.io import load_state
    from timm_csm.train import run

    state = cell_state(cell_dir, cfg, committed)
    if state == "done":
        return _read_json((committed if committed is not None and (committed / RESULTS).exists() else cell_dir)
                          / RESULTS)
    cell_dir.mkdir(parents=True, exist_ok=True)
    earlier = 0.0
    cfg = dict(cfg)
    if state == "partial":
        last = cell_dir / "last.safetensors"
        earlier = sum(float(h.get("epoch_time", 0.0)) for h in load_state(last)["history"])
        cfg["resume"] = str(last)
        log(f"[{cell_dir.name}] resuming from {last}")
    meta = {"method": method, "seed": seed, "setting": setting, "config": _keyed(cfg)}
    if amendment is not None:
        meta["record"] = dict(cell_record(cfg, amendment), **({"resumed": True} if state == "partial" else {}))
    write_json_atomic(cell_dir / CELL_META, dict(meta, finished=False))
    t0 = time.time()
    results = run(dict(cfg, auto_resume=True))  # also takes over a cell killed before its first epoch ended
    meta.update(finished=True, seconds=round(earlier + time.time() - t0, 1))
    write_json_atomic(cell_dir / CELL_META, meta)
    if committed is not None:
        write_json_atomic(committed / RESULTS, results, indent=1)
        write_json_atomic(committed / CELL_META, meta, indent=1)
    return results


_FINGERPRINTS: Dict[str, str] = {}
#: the columns that define what a generated set teaches: its pixels, labels, ratios and groups
_FINGERPRINT_COLUMNS = ("image", "soft_label", "lambda_gen", "lambda_hat", "group_id", "class_a", "class_b")


def dataset_fingerprint(path) -> str:
    """sha256 of a CSM dataset's content (image bytes, soft labels, ratios, groups, in row order): the same for
    the same set wherever and however it is stored."""
    import hashlib

    import numpy as np

    from timm_csm.hub import load_csm_dataset

    key = str(Path(path).resolve()) if Path(path).exists() else str(path)
    if key not in _FINGERPRINTS:
        dd = load_csm_dataset(str(path))
        table = (dd["train"] if hasattr(dd, "keys") and "train" in dd else dd).data.table
        h = hashlib.sha256()
        for name in _FINGERPRINT_COLUMNS:
            column = table.column(name).combine_chunks()
            h.update(name.encode())
            if name == "image":
                for item in column.field("bytes").to_pylist():
                    h.update(len(item).to_bytes(8, "little") + item)
            elif name == "soft_label":
                h.update(np.ascontiguousarray(column.flatten().to_numpy(), dtype=np.float32).tobytes())
            else:
                h.update(np.ascontiguousarray(column.to_numpy(), dtype=np.float64).tobytes())
        _FINGERPRINTS[key] = h.hexdigest()
    return _FINGERPRINTS[key]


def _file_digest(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _git(*args: str) -> Optional[str]:
    import subprocess

    try:
        out = subprocess.run(["git", *args], cwd=Path(__file__).resolve().parent, capture_output=True, text=True,
                             check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip()


def cell_record(cfg: Dict[str, Any], amendment: int) -> Dict[str, Any]:
    """What a cell's numbers depend on besides its options (PROTOCOL.md amendment 2): the amendment, the commit and
    whether tracked files differ from it, the Python / torch / timm versions, the torch thread count, the fingerprint
    of the generated set it reads and the digest of KD's teacher weights."""
    import timm
    import torch

    status = _git("status", "--porcelain", "--untracked-files=no")
    record = {"amendment": int(amendment), "commit": _git("rev-parse", "HEAD"),
              "clean": None if status is None else status == "", "python": platform.python_version(),
              "torch": torch.__version__, "timm": timm.__version__, "torch_threads": torch.get_num_threads()}
    if cfg.get("csm_dataset"):
        record["generated_set"] = dataset_fingerprint(cfg["csm_dataset"])
    if cfg.get("teacher"):
        record["teacher"] = _file_digest(Path(cfg["teacher"]) / "model.safetensors")
    return record


#: results.json keys that say where and how fast a cell ran, not what it computed
_WHERE = ("checkpoint", "output_dir", "run_id", "epoch_time", "seconds")


def _differences(a: Any, b: Any, where: str = "") -> List[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) if k not in _WHERE
                for d in _differences(a.get(k), b.get(k), f"{where}.{k}" if where else k)]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _differences(x, y, f"{where}[{i}]")]
    return [] if a == b else [f"{where}: committed {a!r}, now {b!r}"]


def verify_cell(name: str, roots: Sequence[Path] = (COMMITTED_A2, COMMITTED_CELLS), log=print
                ) -> Dict[str, List[str]]:
    """Re-run the committed cell ``name`` from its recorded options on the current code (into a temporary folder).
    Returns ``{"results": every difference of what it computed, "added": keys the current code reports that the
    committed results.json lacks (not compared), "record": how its record differs (commit, versions, threads,
    generated set), where it has one}``; the cell reproduces when ``results`` is empty."""
    import tempfile

    from timm_csm.train import run

    home = next((Path(r) / name for r in roots if (Path(r) / name / CELL_META).exists()), None)
    if home is None:
        raise SystemExit(f"no committed cell {name!r} under {', '.join(str(r) for r in roots)}")
    meta = _read_json(home / CELL_META)
    cfg = dict(meta["config"])
    with tempfile.TemporaryDirectory(prefix=f"verify-{name}-") as tmp:
        log(f"[verify] re-running {name} in {tmp}")
        results = json.loads(json.dumps(run(dict(cfg, output=tmp, experiment=".", progress=False))))
    committed = _read_json(home / RESULTS)
    added = sorted(k for k in results if k not in committed)
    out = {"results": _differences(committed, {k: v for k, v in results.items() if k not in added}),
           "added": added, "record": []}
    if "record" in meta:
        now = cell_record(cfg, meta["record"]["amendment"])
        out["record"] = _differences({k: v for k, v in meta["record"].items() if k != "resumed"}, now)
    return out


def _derived_copy(source, folder, derivation: str, derive) -> Path:
    """``derive(dataset) -> (dataset, provenance)`` applied to the CSM dataset ``source``, saved to ``folder`` once;
    rewritten when the source dataset changes (keyed by its fingerprint)."""
    from timm_csm.hub import load_csm_dataset, save_csm_dataset

    folder = Path(folder)
    dd = load_csm_dataset(str(source))
    ds = dd["train"] if hasattr(dd, "keys") and "train" in dd else dd
    marker = folder / "derived_from.json"
    stamp = {"source": str(source), "fingerprint": getattr(ds, "_fingerprint", None), "derivation": derivation}
    if marker.exists() and _read_json(marker) == stamp:
        return folder
    derived, provenance = derive(ds)
    save_csm_dataset(derived, folder, provenance=dict(provenance, derived_from=str(source)))
    write_json_atomic(marker, stamp)
    return folder


def derive_hard_label_dataset(source, folder) -> Path:
    """A copy of the CSM dataset ``source`` whose soft labels are the one-hot dominant generation class (the
    annotation's ``label_mode="generation"``, variant 2 of the ablation): same images, groups and companions, no
    semantic soft labels. Written once to ``folder``; rewritten when the source dataset changes."""
    import numpy as np

    from timm_csm.annotation.soft_labels import generation_class_labels

    def derive(ds):
        k = len(ds.features["label"].names)

        def relabel(lambda_gen, class_a, class_b):
            q = generation_class_labels(np.asarray(lambda_gen, np.float64), np.asarray(class_a),
                                        np.asarray(class_b), k)
            return {"soft_label": q.numpy().astype(np.float32).tolist(), "label": q.argmax(1).tolist()}

        hard = ds.map(relabel, batched=True, input_columns=["lambda_gen", "class_a", "class_b"],
                      features=ds.features, desc="hard labels")
        return hard, {"label_mode": "generation"}

    return _derived_copy(source, folder, "label_mode=generation", derive)


def derive_filtered_dataset(source, folder, min_spearman: float = 0.8) -> Path:
    """A copy of the CSM dataset ``source`` without its flagged groups (lambda-hat not monotone in lambda, Spearman
    below ``min_spearman``, or a misread endpoint: :func:`timm_csm.annotation.checks.annotation_report`), the
    ``annotate.py --drop-flagged`` set. Written once to ``folder``; rewritten when the source dataset changes."""
    from timm_csm.annotation.checks import annotation_report, drop_groups

    def derive(ds):
        report = annotation_report(ds, min_spearman)
        kept = drop_groups(ds, report["flagged_group_ids"])
        return kept, {"dropped_groups": report["flagged"], "min_spearman": float(min_spearman)}

    return _derived_copy(source, folder, f"drop_flagged(min_spearman={min_spearman:g})", derive)


def derive_real_copies_dataset(recipe: Dict[str, Any], folder, num_groups: int = 6750, num_lambdas: int = 4,
                               seed: int = 0) -> Path:
    """The real-copies control (PROTOCOL.md): a CSM dataset with the generated sets' group structure (the plan's
    groups and lambda grid) whose every member is a real training image of the recipe's classifier, drawn (seeded per
    group) from the member's dominant class (``a`` when lambda >= 1/2, else ``b``), with its one-hot label. CSM's
    loss and batch on it train on real images only. Written once to ``folder``; rewritten when the recipe's training
    images or the structure change (keyed by their digest)."""
    import datasets
    import numpy as np

    from timm_csm.data import derive_seed
    from timm_csm.generation.plan import lambda_grid, plan_groups
    from timm_csm.generation.writer import encode_png
    from timm_csm.hub import save_csm_dataset
    from timm_csm.training import TrainConfig, load_data

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from matched_setting import images_digest

    folder = Path(folder)
    options = {"dataset": str(recipe["dataset"]), "seed": 0}
    for key, kind in (("max_train_samples", int), ("val_size", int), ("data_seed", int), ("val_fraction", float)):
        if recipe.get(key) is not None:
            options[key] = kind(recipe[key])
    real = load_data(TrainConfig(**options)).train
    stamp = {"real": images_digest(real), "num_groups": num_groups, "num_lambdas": num_lambdas, "seed": seed}
    marker = folder / "derived_from.json"
    if marker.exists() and _read_json(marker) == stamp:
        return folder
    names = list(real.class_names)
    k = len(names)
    labels = np.asarray(real.labels)
    by_class = [np.flatnonzero(labels == c) for c in range(k)]
    empty = [names[c] for c in range(k) if len(by_class[c]) == 0]
    if empty:
        raise ValueError(f"the real training set has no image of class(es) {empty}")
    images = np.asarray(real.images)
    rows = {key: [] for key in ("image", "label", "soft_label", "class_a", "class_b", "lambda_gen", "lambda_hat",
                                "group_id", "seed")}
    lambdas = lambda_grid(num_lambdas)
    for group in plan_groups(k, num_groups):
        rng = np.random.default_rng(derive_seed(seed, group.group_id))
        for lam in lambdas:
            c = group.class_a if lam >= 0.5 else group.class_b
            q = np.zeros(k, np.float32)
            q[c] = 1.0
            rows["image"].append({"bytes": encode_png(images[rng.choice(by_class[c])]), "path": None})
            rows["label"].append(c)
            rows["soft_label"].append(q.tolist())
            rows["class_a"].append(group.class_a)
            rows["class_b"].append(group.class_b)
            rows["lambda_gen"].append(lam)
            rows["lambda_hat"].append(1.0 if c == group.class_a else 0.0)
            rows["group_id"].append(group.group_id)
            rows["seed"].append(group.seed)
    from timm_csm.data.csm_format import csm_features

    ds = datasets.Dataset.from_dict(rows, features=csm_features(names))
    save_csm_dataset(ds, folder, provenance={"dataset": recipe["dataset"], "label_mode": "real_copies",
                                             "real_images_digest": stamp["real"], "num_groups": num_groups,
                                             "lambdas": lambdas}, class_names=names, lambdas=lambdas)
    write_json_atomic(marker, stamp)
    return folder


def derive_group_subset(source, folder, fraction: float) -> Path:
    """A copy of the CSM dataset ``source`` with, for every class pair, its first ``ceil(fraction * n)`` of the
    pair's ``n`` groups (by group id): less generated volume, the same pairs and the same share of each. Written once
    to ``folder``; rewritten when the source dataset changes."""
    import numpy as np

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

    return _derived_copy(source, folder, f"group_fraction={fraction:g}", derive)


def derive_rescaled_dataset(source, folder, s: float) -> Path:
    """A copy of the CSM dataset ``source`` whose soft labels are recomputed from its stored lambda-hat at the fixed
    scale ``s`` (:func:`timm_csm.annotation.rescale_soft_labels`): the same images, groups and companions (amendment
    2's s grid). Written once to ``folder``; rewritten when the source dataset changes."""
    from timm_csm.annotation.label_groups import rescale_soft_labels

    def derive(ds):
        return rescale_soft_labels(ds, float(s)), {"s": float(s), "label_mode": "projection"}

    return _derived_copy(source, folder, f"rescale(s={float(s):g})", derive)


def derive_lambda_label_dataset(source, folder) -> Path:
    """A copy of the CSM dataset ``source`` whose soft label is the generation ratio itself: q_a = lambda_gen,
    q_b = 1 - lambda_gen (amendment 2's stage 3: no re-annotation). Written once to ``folder``; rewritten when the
    source dataset changes."""
    import numpy as np
    import torch

    from timm_csm.annotation.soft_labels import dominant_class

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

    return _derived_copy(source, folder, "label_mode=lambda_gen", derive)


def derive_softmax_label_dataset(source, folder, annotator) -> Path:
    """A copy of the CSM dataset ``source`` whose soft label is the annotator's softmax over all classes on each
    image (the paper's variant 1, direct annotation): the reference encoder at ``annotator``
    (:func:`timm_csm.annotation.load_reference_encoder`) classifies the decoded images. Written once to
    ``folder``; rewritten when the source dataset or the annotator's weights change."""
    import datasets

    from timm_csm.annotation import decode_images, load_reference_encoder

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

    digest = _file_digest(Path(annotator) / "model.safetensors")
    return _derived_copy(source, folder, f"label_mode=softmax(annotator sha256 {digest})", derive)


def derive_label_dataset(source, folder, label: str, annotator=None) -> Path:
    """Stage 3's ``label`` (:data:`LABELS`) in place of the annotation's soft labels of ``source``."""
    if label == "hard":
        return derive_hard_label_dataset(source, folder)
    if label == "lambda":
        return derive_lambda_label_dataset(source, folder)
    if label == "softmax":
        return derive_softmax_label_dataset(source, folder, annotator)
    raise ValueError(f"label must be one of {', '.join(LABELS[1:])} to derive, got {label!r}")


# derived generated datasets: kind -> (derivation, folder under --output, what the skip message calls it)
_DERIVED = {"hard": (derive_hard_label_dataset, "csm-hard-labels", "hard-label copy"),
            "filtered": (derive_filtered_dataset, "csm-filtered", "copy without flagged groups")}
#: the boundary study's sets: kind -> (the generated set's folder under SETTINGS_ROOT, None for the setting's own;
#: the share of each class pair's groups kept), each in the decision row's variant (flagged groups dropped or not)
_BOUNDARY_SETS = {"groups25": (None, 0.25), "groups50": (None, 0.5), "gen2000": ("matched-gen2000", 1.0)}


def _resolve_boundary_sets(kinds, output: Path, setting: Optional[str], committed: Optional[Path],
                     csm_paths: Dict[str, str], blocked: Dict[str, str]) -> None:
    """The boundary study's sets, in the variant of the setting's decision row, which the validation rule chooses
    once both CSM variants have every seed (their cells run first)."""
    summary = protocol_summary(protocol_cells(output, setting, committed), setting) if setting else None
    if summary is None or not _every_seed(summary["rows"], CSM_VARIANTS):
        for kind in kinds:
            blocked[kind] = "the decision row (csm or csm_filtered) is chosen once both have every seed"
        return
    variant = METHODS[summary["csm"]].csm
    for kind in sorted(kinds):
        generated, fraction = _BOUNDARY_SETS[kind]
        if generated is None:
            source = csm_paths.get(variant)
            if source is None:
                blocked[kind] = blocked.get(variant, f"the {variant} CSM dataset is not available")
                continue
        else:
            source = str(SETTINGS_ROOT / generated / "csm" / "csm-fmnist-aug")
            problem = _check_csm_dataset(source)
            if problem is not None:
                blocked[kind] = f"CSM dataset {source!r} not available ({problem})"
                continue
            if variant == "filtered":
                source = str(derive_filtered_dataset(source, output / f"csm-filtered-{generated}"))
        csm_paths[kind] = (source if fraction == 1.0 else
                           str(derive_group_subset(source, output / f"csm-{kind}-{setting}", fraction)))


def _check_csm_dataset(path) -> Optional[str]:
    """None when ``path`` loads as a CSM dataset, else why not."""
    from timm_csm.hub import load_csm_dataset

    try:
        load_csm_dataset(str(path))
    except Exception as e:  # missing folder, not installed, offline Hub
        return f"{type(e).__name__}: {e}"
    return None


def plan_cells(methods: Sequence[str], seeds: Sequence[int]) -> List[Tuple[str, int]]:
    """Seed-major order: every method's first seed before any second seed, so a partial run covers all rows."""
    return [(m, s) for s in seeds for m in methods]


def run_cells(recipe: Dict[str, Any], methods: Sequence[str], seeds: Sequence[int], output: Path,
              csm_dataset: Optional[str] = None, csm_dataset_hard: Optional[str] = None,
              max_cells: Optional[int] = None, log=print, setting: Optional[str] = None,
              teacher: Optional[str] = None, committed: Optional[Path] = None,
              amendment: Optional[int] = None, volume_datasets: Optional[Dict[int, str]] = None,
              annotator: Optional[str] = None) -> Dict[str, Any]:
    """Run the unfinished cells (at most ``max_cells`` of them) of :func:`prepare_cells`; returns counts and the
    skipped cells' reasons. ``amendment``: recorded in each new cell's record."""
    from tqdm.auto import tqdm

    todo, skipped = prepare_cells(recipe, methods, seeds, output, csm_dataset, csm_dataset_hard, setting, teacher,
                                  committed, volume_datasets, annotator)
    if max_cells is not None:
        todo = todo[:max(0, max_cells)]
    for reason in sorted(set(skipped.values())):
        log(f"skipping {sum(v == reason for v in skipped.values())} cell(s): {reason}")
    bar = tqdm(todo, desc="cells", unit="cell", dynamic_ncols=True, disable=not todo)
    for m, s, cell_dir, cfg, home in bar:
        bar.set_postfix(cell=cell_dir.name)
        run_cell(cfg, cell_dir, m, s, log=log, setting=setting if get_method(m).per_setting else None,
                 committed=home, amendment=amendment)
    return {"ran": len(todo), "skipped": skipped}


def prepare_cells(recipe: Dict[str, Any], methods: Sequence[str], seeds: Sequence[int], output: Path,
                  csm_dataset: Optional[str] = None, csm_dataset_hard: Optional[str] = None,
                  setting: Optional[str] = None, teacher: Optional[str] = None, committed: Optional[Path] = None,
                  volume_datasets: Optional[Dict[int, str]] = None, annotator: Optional[str] = None
                  ) -> Tuple[List[Tuple[str, int, Path, Dict[str, Any], Optional[Path]]], Dict[str, str]]:
    """The unfinished cells ``(method, seed, folder, options, committed folder)``, their generated sets derived,
    and the reasons of the cells that cannot run. ``methods``: method names or tuned names (:func:`get_method`);
    ``setting``: the protocol recipe (cells that depend on it are named after it); ``teacher``: the reference
    encoder of KD; ``committed``: the folder of committed cells; ``volume_datasets``: the setting's sets of 2x / 4x
    the groups by volume; ``annotator``: the reference encoder of the setting's annotation (``label=softmax``)."""
    output = Path(output)
    specs = {m: get_method(m) for m in methods}
    csm_paths, blocked = _generated_sets(recipe, specs.values(), output, csm_dataset, csm_dataset_hard, setting,
                                         committed, volume_datasets, annotator)
    if any(m.teacher for m in specs.values()):
        if teacher and (Path(teacher) / "model.safetensors").exists():
            csm_paths["teacher"] = str(teacher)
        else:
            blocked["teacher"] = f"teacher {teacher!r} not available (no model.safetensors)"
    data_seed = recipe.get("data_seed")
    todo, skipped = [], {}
    for m, s in plan_cells(list(dict.fromkeys(spec.name for spec in specs.values())), seeds):
        method = get_method(m)
        if setting is not None and method.recipes is not None and setting not in method.recipes:
            continue
        name = cell_name(m, s, setting, data_seed)
        reason = blocked.get(method.data_key) or (blocked.get("teacher") if method.teacher else None)
        if reason:
            skipped[name] = reason
            continue
        cell_dir = output / "cells" / name
        cfg = cell_config(recipe, method, s, cell_dir, csm_paths)
        home = committed / name if committed is not None else None
        if cell_state(cell_dir, cfg, home) != "done":
            todo.append((m, s, cell_dir, cfg, home))
    return todo, skipped


def _generated_sets(recipe: Dict[str, Any], specs, output: Path, csm_dataset: Optional[str],
                    csm_dataset_hard: Optional[str], setting: Optional[str], committed: Optional[Path],
                    volume_datasets: Optional[Dict[int, str]], annotator: Optional[str]
                    ) -> Tuple[Dict[str, str], Dict[str, str]]:
    """``(paths, blocked)``: the folder of every generated set ``specs`` read, by data key, derived where needed,
    and why each set that cannot be had is missing."""
    csm_paths: Dict[str, str] = {}
    blocked: Dict[str, str] = {}
    kinds = {m.csm for m in specs} - {None}
    filtered_needed = any(dict(m.derive).get("filtered") for m in specs)
    if kinds & {"soft", *_DERIVED, *_BOUNDARY_SETS}:
        problem = _check_csm_dataset(csm_dataset) if csm_dataset else "no --csm-dataset given"
        if problem is None:
            csm_paths["soft"] = str(csm_dataset)
        else:
            blocked["soft"] = f"CSM dataset {csm_dataset!r} not available ({problem})"
        if "hard" in kinds and csm_dataset_hard:
            problem = _check_csm_dataset(csm_dataset_hard)
            if problem is None:
                csm_paths["hard"] = str(csm_dataset_hard)
            else:
                blocked["hard"] = f"hard-label CSM dataset {csm_dataset_hard!r} not available ({problem})"
        # the boundary study's subsets come from the decision row's set, which may be the filtered one
        derived = kinds & set(_DERIVED) | ({"filtered"} if kinds & set(_BOUNDARY_SETS) or filtered_needed else set())
        for kind in sorted(derived - set(csm_paths) - set(blocked)):
            derive, name, what = _DERIVED[kind]
            if "soft" in csm_paths:
                folder = output / (f"{name}-{setting}" if setting else name)
                csm_paths[kind] = str(derive(csm_paths["soft"], folder))
            else:
                blocked[kind] = blocked["soft"] + f"; the {what} is derived from it"
    if kinds & set(_BOUNDARY_SETS):
        _resolve_boundary_sets(kinds & set(_BOUNDARY_SETS), output, setting, committed, csm_paths, blocked)
    sources = {"volume": volume_datasets or {}, "annotator": annotator}
    for key in sorted({m.data_key for m in specs if m.data_key and "@" in m.data_key}):
        _resolve_derived_set(key, output, setting, csm_paths, blocked, sources)
    if "real_copies" in kinds:
        data_seed = recipe.get("data_seed")
        csm_paths["real_copies"] = str(derive_real_copies_dataset(
            recipe, output / ("csm-real-copies" + (f"-d{data_seed}" if data_seed else ""))))
    return csm_paths, blocked


def _split_data_key(key: str) -> Tuple[str, List[Tuple[str, str]]]:
    kind, *steps = key.split("@")
    return kind, [tuple(step.split("=", 1)) for step in steps]


def _join_data_key(kind: str, steps: Sequence[Tuple[str, str]]) -> str:
    return "@".join([kind, *(f"{axis}={value}" for axis, value in steps)])


def _derived_set_folder(key: str, setting: Optional[str]) -> str:
    """The folder name of a derived set under ``--output``: ``csm-filtered-matched-s2.3``,
    ``csm-soft-matched-x2-lambda-labels``."""
    kind, steps = _split_data_key(key)
    suffix = {"volume": "-x{}", "label": "-{}-labels", "s": "-s{}"}
    return f"csm-{kind}-{setting or 'set'}" + "".join(suffix[axis].format(value) for axis, value in steps)


def _resolve_derived_set(key: str, output: Path, setting: Optional[str], csm_paths: Dict[str, str],
                         blocked: Dict[str, str], sources: Dict[str, Any]) -> None:
    """The set of the data key ``key`` (:attr:`BenchMethod.data_key`): its parent set (``key`` less its last step;
    the volume set before its filter) resolved first, then the step applied: ``s``, a fixed scale (amendment 2's s
    grid); ``label``, stage 3's labels; ``filtered``, the flagged groups dropped; ``volume``, the set of 2x / 4x
    the groups itself (``sources["volume"]``)."""
    if key in csm_paths or key in blocked:
        return
    kind, steps = _split_data_key(key)
    if not steps:  # a set of its own kind, resolved by the caller when it can be had
        blocked[key] = f"the {kind} CSM dataset is not available"
        return
    if steps[-1][0] in ("s", "label"):
        parent, (axis, value) = _join_data_key(kind, steps[:-1]), steps[-1]
    elif kind == "filtered":
        parent, axis, value = _join_data_key("soft", steps), "filtered", "1"
    else:
        path = sources["volume"].get(int(steps[0][1]))
        problem = _check_csm_dataset(path) if path else "none given"
        if problem is None:
            csm_paths[key] = str(path)
        else:
            blocked[key] = f"the {steps[0][1]}x generated set {path!r} is not available ({problem})"
        return
    _resolve_derived_set(parent, output, setting, csm_paths, blocked, sources)
    if parent in blocked:
        blocked[key] = blocked[parent]
        return
    source, folder = csm_paths[parent], output / _derived_set_folder(key, setting)
    if axis == "s":
        csm_paths[key] = str(derive_rescaled_dataset(source, folder, float(value)))
    elif axis == "filtered":
        csm_paths[key] = str(derive_filtered_dataset(source, folder))
    elif value == "softmax" and not (sources["annotator"] and (Path(sources["annotator"]) / "config.json").exists()):
        blocked[key] = f"the softmax labels need the setting's annotator (a reference encoder folder), got " \
                       f"{sources['annotator']!r}"
    else:
        csm_paths[key] = str(derive_label_dataset(source, folder, value, sources["annotator"]))


# ---------------------------------------------------------------------------------------------------------------
# table and report
# ---------------------------------------------------------------------------------------------------------------
def collect_cells(output: Path) -> Dict[str, Dict[int, Dict[str, Any]]]:
    """``{method: {seed: {"results": ..., "seconds": ..., "dir": ...}}}`` of every finished cell under ``output``."""
    found: Dict[str, Dict[int, Dict[str, Any]]] = {}
    cells = Path(output) / "cells"
    if not cells.is_dir():
        return found
    for d in sorted(cells.iterdir()):
        meta_path, res_path = d / CELL_META, d / RESULTS
        if not (meta_path.exists() and res_path.exists()):
            continue
        meta = _read_json(meta_path)
        found.setdefault(meta["method"], {})[int(meta["seed"])] = {
            "results": _read_json(res_path), "seconds": meta.get("seconds"), "dir": d, "config": meta["config"]}
    return found


# (key in the metrics dict, column header, scale): accuracy and calibration errors in %
_COLUMNS = (("accuracy", "Acc (%)", 100.0), ("ece", "ECE (%)", 100.0), ("aece", "AECE (%)", 100.0),
            ("cece", "CECE (%)", 100.0), ("nll", "NLL", 1.0))
_HIGHER_IS_BETTER = {"accuracy"}


def _mean_std(values: Sequence[float]) -> Tuple[float, Optional[float]]:
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, None
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))


def matches_recipe(cell: Dict[str, Any], method: str, seed: int, recipe: Dict[str, Any]) -> bool:
    """Whether a finished cell was trained with ``recipe`` (the generated dataset's path aside)."""
    if method not in METHODS:
        return False
    placeholders = dict.fromkeys(("soft", *_DERIVED, *_BOUNDARY_SETS), "-")
    expected = _keyed(cell_config(recipe, METHODS[method], seed, cell["dir"], placeholders))
    actual = dict(cell["config"])
    expected.pop("csm_dataset", None)
    actual.pop("csm_dataset", None)
    return expected == actual


def summarize(cells: Dict[str, Dict[int, Dict[str, Any]]]) -> Dict[str, Dict[str, Any]]:
    """Per method: seeds and ``{phase: {metric: (mean, sample std or None)}}`` for phase pre_ts / post_ts, plus the
    temperature and the mean seconds per cell."""
    out: Dict[str, Dict[str, Any]] = {}
    for method in [m for m in METHODS if m in cells] + sorted(m for m in cells if m not in METHODS):
        runs = cells[method]
        seeds = sorted(runs)
        row: Dict[str, Any] = {"seeds": seeds}
        for phase in ("pre_ts", "post_ts"):
            metrics = [runs[s]["results"]["test"].get(phase) for s in seeds]
            metrics = [m for m in metrics if m]
            row[phase] = {k: _mean_std([m[k] for m in metrics]) for k, _, _ in _COLUMNS} if metrics else {}
        temps = [runs[s]["results"].get("temperature") for s in seeds]
        temps = [t for t in temps if t is not None]
        row["temperature"] = _mean_std(temps) if temps else None
        secs = [runs[s]["seconds"] for s in seeds if runs[s].get("seconds") is not None]
        row["seconds"] = sum(secs) / len(secs) if secs else None
        out[method] = row
    return out


def _fmt(ms: Optional[Tuple[float, Optional[float]]], scale: float, digits: int) -> str:
    if ms is None:
        return "-"
    mean, std = ms
    text = f"{mean * scale:.{digits}f}"
    return text + (f" ± {std * scale:.{digits}f}" if std is not None else "")


def _table(summary: Dict[str, Dict[str, Any]], phase: str, with_temperature: bool) -> List[str]:
    heads = [h for _, h, _ in _COLUMNS] + (["T"] if with_temperature else []) + ["s / cell"]
    lines = ["| method | seeds | " + " | ".join(heads) + " |", "|---|---|" + "---|" * len(heads)]
    best = {}
    for key, _, _ in _COLUMNS:
        vals = [row[phase][key][0] for row in summary.values() if row.get(phase)]
        if vals:
            best[key] = max(vals) if key in _HIGHER_IS_BETTER else min(vals)
    for method, row in summary.items():
        label = METHODS[method].label if method in METHODS else method
        cells = []
        for key, _, scale in _COLUMNS:
            ms = row[phase].get(key) if row.get(phase) else None
            text = _fmt(ms, scale, 4 if scale == 1.0 else 2)
            if ms is not None and len(summary) > 1 and ms[0] == best.get(key):
                text = f"**{text}**"
            cells.append(text)
        if with_temperature:
            cells.append(_fmt(row["temperature"], 1.0, 2))
        cells.append("-" if row["seconds"] is None else f"{row['seconds']:.0f}")
        lines.append(f"| {label} | {len(row['seeds'])} | " + " | ".join(cells) + " |")
    return lines


def machine_description() -> str:
    """CPU model and core count, or the GPU when torch sees one; the load average at report time."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        if names:
            cpu = names[0]
    except OSError:
        pass
    text = f"{os.cpu_count()}-core CPU ({cpu})"
    try:
        import torch

        if torch.cuda.is_available():
            text += f", GPU {torch.cuda.get_device_name(0)}"
    except ImportError:
        pass
    if hasattr(os, "getloadavg"):
        text += f"; load average {os.getloadavg()[0]:.1f} when the report was written"
    return text


def reliability_figure(cells: Dict[str, Dict[int, Dict[str, Any]]], path: Path, n_bins: int = 15,
                       methods: Sequence[str] = ("ce", "csm")) -> Optional[int]:
    """CE against CSM reliability diagrams (test split, before temperature scaling) of the first seed both
    finished with saved test predictions; returns that seed, or None when there is none (or no matplotlib)."""
    from safetensors.torch import load_file

    common = sorted(set.intersection(*[set(cells.get(m, {})) for m in methods]))
    for seed in common:
        files = [cells[m][seed]["dir"] / PREDICTIONS for m in methods]
        if not all(f.exists() for f in files):
            continue
        try:
            from timm_csm.metrics.plots import reliability_diagrams
        except ImportError:
            return None
        runs = {}
        for m, f in zip(methods, files):
            t = load_file(str(f))
            runs[f"{METHODS[m].label if m in METHODS else m} (seed {seed})"] = (t["logits"], t["targets"])
        try:
            reliability_diagrams(runs, path, n_bins=n_bins, title="Test reliability before temperature scaling")
        except ImportError:  # matplotlib is an optional extra
            return None
        return seed
    return None


_JSON_KEYS = {"accuracy": "acc", "ece": "ece", "aece": "aece", "cece": "cece", "nll": "nll"}


def json_rows(summary: Dict[str, Dict[str, Any]], recipe_name: str, recipe: Dict[str, Any]) -> List[Dict[str, Any]]:
    """One row per method: ``method``, ``recipe``, ``seeds``, ``{metric}_{pre|post}_ts`` as ``{"mean", "std"}`` for
    acc / ece / aece / cece / nll (acc and the calibration errors in %), and ``T``."""
    rows = []
    for method, row in summary.items():
        out: Dict[str, Any] = {"method": method, "label": METHODS[method].label if method in METHODS else method,
                               "recipe": recipe_name, "recipe_options": recipe, "seeds": row["seeds"]}
        for phase in ("pre_ts", "post_ts"):
            for key, (mean, std) in row[phase].items():
                scale = 1.0 if key == "nll" else 100.0
                out[f"{_JSON_KEYS[key]}_{phase}"] = {"mean": mean * scale, "std": None if std is None else std * scale}
        temp = row.get("temperature")
        out["T"] = None if temp is None else {"mean": temp[0], "std": temp[1]}
        rows.append(out)
    return rows


def write_json_rows(path: Path, recipe_name: str, rows: List[Dict[str, Any]]) -> None:
    """Replace the rows of ``recipe_name`` in the JSON list at ``path``, keeping the other recipes' rows."""
    old = _read_json(path) if path.exists() else []
    write_json_atomic(path, [r for r in old if r.get("recipe") != recipe_name] + rows)


def write_report(output: Path, report: Path, recipe: Dict[str, Any], seeds: Sequence[int], command: str,
                 wall_seconds: float, skipped: Optional[Dict[str, str]] = None,
                 methods: Sequence[str] = tuple(METHODS), recipe_name: str = "augmented",
                 json_path: Optional[Path] = None) -> str:
    """(Re)write this script's section of the markdown ``report`` (other sections of the file are kept) from every
    finished cell under ``output`` trained with ``recipe``; returns the section. With ``json_path`` the summary's
    rows (:func:`json_rows`) replace that recipe's rows there."""
    cells, excluded = {}, []
    for m, runs in collect_cells(output).items():
        for s, cell in runs.items():
            if matches_recipe(cell, m, s, recipe):
                cells.setdefault(m, {})[s] = cell
            else:
                excluded.append(cell_name(m, s))
    summary = summarize(cells)
    report = Path(report)
    report.parent.mkdir(parents=True, exist_ok=True)
    if json_path is not None and summary:
        write_json_rows(Path(json_path), recipe_name, json_rows(summary, recipe_name, recipe))
    figure = report.with_name(report.stem + "_reliability.png")
    seed = reliability_figure(cells, figure, n_bins=int(recipe.get("n_bins", 15)))
    total = sum(c["seconds"] or 0.0 for runs in cells.values() for c in runs.values())
    n_done = sum(len(r) for r in cells.values())
    pending = [cell_name(m, s) for m, s in plan_cells(methods, seeds) if s not in cells.get(m, {})]
    shown = {k: v for k, v in recipe.items() if k != "progress"}
    lines = ["## Calibration benchmark: CSM against the baselines on Fashion-MNIST", "",
             "Same backbone, recipe, data and seeds for every method; test split; calibration errors with 15 "
             "equal-width bins (AECE: equal-mass bins, CECE: classwise); temperature T fitted on the validation "
             "split (grid search by ECE). Mean ± sample standard deviation over the finished seeds; best mean of "
             "each column in bold. `s / cell`: training and evaluation time of one cell.", "",
             "Command:", "", f"    {command}", "",
             f"Machine: {machine_description()}.", "",
             f"Cells finished: {n_done} ({total / 3600:.2f} h of cell time in all); this invocation: "
             f"{wall_seconds / 60:.1f} min wall time.", "",
             "Recipe (every cell): `" + json.dumps(shown, sort_keys=True) + "`.", "",
             "### Before temperature scaling", ""]
    if summary:
        lines += _table(summary, "pre_ts", with_temperature=False)
        lines += ["", "### After temperature scaling", ""]
        lines += _table(summary, "post_ts", with_temperature=True)
    else:
        lines += ["No cell has finished yet."]
    lines += ["", "Methods (options added to the recipe):", ""]
    for m in methods:
        bm = METHODS[m]
        data = ("; generated data: `--csm-dataset`" if bm.csm == "soft" else
                f"; generated data: the {_DERIVED[bm.csm][2]} of `--csm-dataset`" if bm.csm in _DERIVED else
                f"; generated data: {_BOUNDARY_SETS[bm.csm][1]:.0%} of each class pair's groups of "
                f"{_BOUNDARY_SETS[bm.csm][0] or 'the setting'}'s set, the decision row's variant" if bm.csm in _BOUNDARY_SETS
                else "; generated data: the real-copies set" if bm.csm else "")
        lines.append(f"* {bm.label}: `{json.dumps(bm.options, sort_keys=True)}`{data}")
    if seed is not None:
        lines += ["", f"![Reliability diagrams, CE against CSM, seed {seed}]({figure.name})"]
    if pending:
        lines += ["", f"Pending cells ({len(pending)}): " + ", ".join(pending) + "."]
    if excluded:
        lines += ["", f"Left out ({len(excluded)}, trained with another recipe): " + ", ".join(excluded) + "."]
    for reason in sorted(set((skipped or {}).values())):
        lines += ["", f"Not run: {reason}."]
    text = "\n".join(lines) + "\n"
    _replace_section(report, text)
    return text


_MARKERS = ("<!-- calibration_bench: begin -->", "<!-- calibration_bench: end -->")
_PROTOCOL_MARKERS = ("<!-- calibration_protocol: begin -->", "<!-- calibration_protocol: end -->")


def _replace_section(path: Path, section: str, markers: Tuple[str, str] = _MARKERS) -> None:
    """Write ``section`` between ``markers`` in ``path``, keeping whatever else the file holds."""
    begin, end = markers
    block = f"{begin}\n{section}{end}\n"
    old = path.read_text() if path.exists() else ""
    if begin in old and end in old:
        head, rest = old.split(begin, 1)
        tail = rest.split(end, 1)[1].lstrip("\n")
        new = head + block + ("\n" + tail if tail else "")
    else:
        new = old + ("\n" if old and not old.endswith("\n\n") else "") + block
    from timm_csm.io import write_text_atomic

    write_text_atomic(path, new)


# ---------------------------------------------------------------------------------------------------------------
# the protocol's report (benchmarks/PROTOCOL.md): two settings, per-seed rows, paired intervals, the rule's verdicts
# ---------------------------------------------------------------------------------------------------------------
PROTOCOL_SEEDS = (0, 1, 2, 3, 4)
_PROTOCOL_METRICS = ("accuracy", "ece", "aece", "cece", "nll", "brier")
_PCT = {"accuracy", "ece", "aece", "cece"}


def protocol_cells(output: Path, setting: str, committed: Optional[Path] = COMMITTED_CELLS
                   ) -> Dict[str, Dict[int, Dict[str, Any]]]:
    """``{method: {seed: {"results", "seconds", "dir"}}}`` of the finished protocol cells of ``setting``: the cells
    shared by both settings and the setting's own, committed ones first, then those of the cell cache ``output``."""
    found: Dict[str, Dict[int, Dict[str, Any]]] = {}
    for root in [r for r in (committed, Path(output) / "cells") if r is not None and Path(r).is_dir()]:
        for d in sorted(Path(root).iterdir()):
            if not ((d / CELL_META).exists() and (d / RESULTS).exists()):
                continue
            meta = _read_json(d / CELL_META)
            method, seed = meta["method"], int(meta["seed"])
            if method not in METHODS or meta.get("setting") not in (None, setting):
                continue
            if METHODS[method].per_setting != (meta.get("setting") is not None):
                continue
            if METHODS[method].recipes is not None and setting not in METHODS[method].recipes:
                continue
            if seed in found.get(method, {}):
                continue
            local = Path(output) / "cells" / d.name
            found.setdefault(method, {})[seed] = {"results": _read_json(d / RESULTS), "seconds": meta.get("seconds"),
                                                  "dir": local if local.is_dir() else d}
    return found


def per_seed_row(seed: int, cell: Dict[str, Any]) -> Dict[str, Any]:
    """One seed of a method: test metrics before / after TS (accuracy and calibration errors in %), T, the chosen
    checkpoint's epoch, the validation ECE before / after TS (%), the cell's seconds."""
    r = cell["results"]
    row: Dict[str, Any] = {"seed": int(seed)}
    for phase in ("pre_ts", "post_ts"):
        scores = r["test"].get(phase) or {}
        for key in _PROTOCOL_METRICS:
            if key in scores:
                scale = 100.0 if key in _PCT else 1.0
                row[f"{_JSON_KEYS.get(key, key)}_{phase}"] = scores[key] * scale
        val = (r.get("val") or {}).get(phase) or {}
        if "ece" in val:
            row[f"val_ece_{phase}"] = val["ece"] * 100.0
        if "nll" in val:
            row[f"val_nll_{phase}"] = val["nll"]
    row["T"] = r.get("temperature")
    row["epoch"] = r.get("checkpoint_epoch")
    row["seconds"] = cell.get("seconds")
    return row


def paired_interval(a: Dict[int, float], b: Dict[int, float], level: float = 0.95
                    ) -> Optional[Tuple[int, float, float, float]]:
    """``(n, mean, low, high)`` of the per-seed differences ``a[s] - b[s]`` over their common seeds: the mean and its
    two-sided t-interval, :func:`timm_csm.metrics.paired_t_interval` (what ``timm-csm-compare`` reports); None
    below 2 common seeds."""
    from timm_csm.metrics import paired_t_interval

    interval = paired_t_interval(a, b, level)
    return None if interval is None else tuple(interval[:4])


def _by_seed(rows: Sequence[Dict[str, Any]], key: str) -> Dict[int, float]:
    return {r["seed"]: r[key] for r in rows if r.get(key) is not None}


def _lowest_mean(rows: Dict[str, List[Dict[str, Any]]], candidates: Sequence[str], key: str) -> Optional[str]:
    means = {m: sum(v.values()) / len(v) for m in candidates if m in rows for v in [_by_seed(rows[m], key)] if v}
    return min(means, key=means.get) if means else None


def protocol_summary(cells: Dict[str, Dict[int, Dict[str, Any]]], setting: str) -> Dict[str, Any]:
    """Per-seed rows of every method, the validation choices (the CSM variant; the best other method before and
    after TS), and the paired intervals of the chosen CSM row against every other method."""
    rows = {m: [per_seed_row(s, c) for s, c in sorted(runs.items())] for m, runs in cells.items()}
    csm = _lowest_mean(rows, CSM_VARIANTS, "val_ece_pre_ts")
    best = {"pre_ts": _lowest_mean(rows, NON_GENERATED, "val_ece_pre_ts"),
            "post_ts": _lowest_mean(rows, NON_GENERATED, "val_ece_post_ts")}
    pairs: Dict[str, Dict[str, Any]] = {}
    if csm is not None:
        for other in rows:
            if other == csm:
                continue
            pairs[other] = {f"{key}_{phase}": paired_interval(_by_seed(rows[csm], f"{key}_{phase}"),
                                                              _by_seed(rows[other], f"{key}_{phase}"))
                            for phase in ("pre_ts", "post_ts") for key in ("ece", "acc", "nll")}
    # the methods whose seeds the choices wait for: the CSM variants and the candidates of the best other method
    candidates = [m for m in (*CSM_VARIANTS, *NON_GENERATED)
                  if METHODS[m].recipes is None or setting in METHODS[m].recipes]
    return {"rows": rows, "csm": csm, "best_other": best, "pairs": pairs, "candidates": candidates}


def _every_seed(rows: Dict[str, List[Dict[str, Any]]], methods: Sequence[str]) -> bool:
    """Whether every one of ``methods`` has a row for each of the protocol's seeds (its validation choices are made)."""
    return all(len(rows.get(m, [])) >= len(PROTOCOL_SEEDS) for m in methods)


def _outcome(interval: Optional[Tuple[int, float, float, float]], n_required: int = len(PROTOCOL_SEEDS),
             choices_final: bool = True) -> Optional[str]:
    """``"lower"`` / ``"higher"`` where the interval of CSM minus the other method excludes 0, ``"none"`` where it
    contains 0, ``None`` while pending (below ``n_required`` seeds, or while the validation choices behind the
    comparison, the CSM row and the best other method, still wait for some method's seeds)."""
    if interval is None or interval[0] < n_required or not choices_final:
        return None
    _, _, lo, hi = interval
    return "lower" if hi < 0 else "higher" if lo > 0 else "none"


def _verdict(interval: Optional[Tuple[int, float, float, float]], n_required: int = len(PROTOCOL_SEEDS),
             choices_final: bool = True) -> str:
    """The rule's reading of a paired interval (:func:`_outcome`) in words."""
    if interval is None:
        return "pending (fewer than 2 paired seeds)"
    n, mean, lo, hi = interval
    text = f"{mean:+.2f} [{lo:+.2f}, {hi:+.2f}] over {n} seeds"
    if n < n_required:
        return text + f": pending ({n} of {n_required} seeds)"
    if not choices_final:
        return text + ": pending (the validation choices wait for every method's seeds)"
    return text + {"lower": ": CSM lower (interval excludes 0)", "higher": ": CSM higher (interval excludes 0)",
                   "none": ": no difference shown (interval contains 0)"}[_outcome(interval)]


def _statement(outcomes: Sequence[Optional[str]]) -> str:
    """PROTOCOL.md's "CSM calibrates better": CSM lower against CE and against the best other method."""
    if any(o is None for o in outcomes):
        return "pending"
    return "holds" if all(o == "lower" for o in outcomes) else "does not hold"


def _interval_text(interval: Optional[Tuple[int, float, float, float]], digits: int = 2) -> str:
    """``mean [low, high] (n=...)`` of a paired interval, ``-`` when there is none (``timm-csm-compare``'s text)."""
    from timm_csm.commands.compare import interval_text

    return interval_text(interval, digits)


def _mean_cell(rows: List[Dict[str, Any]], key: str, digits: int) -> str:
    values = [r[key] for r in rows if r.get(key) is not None]
    if not values:
        return "-"
    mean, sd = _mean_std(values)
    return f"{mean:.{digits}f}" + (f" ± {sd:.{digits}f}" if sd is not None else "")


def protocol_section(setting: str, summary: Dict[str, Any], recipe: Dict[str, Any]) -> List[str]:
    """The markdown of one setting: the before / after TS tables, the validation choices and the paired tests."""
    rows, csm = summary["rows"], summary["csm"]
    title = {"matched": "`matched`: the generator and the encoder learned from the classifier's 2 500 images only",
             "borrowed": "`borrowed`: the shipped generator (60 000 images) and an encoder trained on 54 000"}[setting]
    lines = [f"## {title}", ""]
    order = [m for m in PROTOCOL_METHODS if m in rows]
    if not order:
        return lines + ["No cell of this setting has finished yet.", ""]
    head = "| method | seeds | Acc (%) | ECE (%) | AECE (%) | CECE (%) | NLL | Brier |"
    for phase, extra in (("pre_ts", ""), ("post_ts", " T | epoch | val ECE before / after TS (%) | s / cell |")):
        lines += [f"### {'Before' if phase == 'pre_ts' else 'After'} temperature scaling (test split)", "",
                  head + extra, "|---" * (8 + extra.count("|")) + "|"]
        for m in order:
            r = rows[m]
            cells = [_mean_cell(r, f"{k}_{phase}", 4 if k in ("nll", "brier") else 2)
                     for k in ("acc", "ece", "aece", "cece", "nll", "brier")]
            if phase == "post_ts":
                cells += [_mean_cell(r, "T", 2), _mean_cell(r, "epoch", 0),
                          f"{_mean_cell(r, 'val_ece_pre_ts', 2)} / {_mean_cell(r, 'val_ece_post_ts', 2)}",
                          _mean_cell(r, "seconds", 0)]
            mark = " (decision row)" if m == csm else ""
            lines.append(f"| {METHODS[m].label}{mark} | {len(r)} | " + " | ".join(cells) + " |")
        lines.append("")
    best = summary["best_other"]
    label = lambda m: METHODS[m].label if m else "-"  # noqa: E731
    lines += ["### The protocol's choices (validation split only)", "",
              f"* CSM row of the decision (lower mean validation ECE of {', '.join(CSM_VARIANTS)}): {label(csm)}.",
              f"* Best other method, before TS (lowest mean validation ECE): {label(best['pre_ts'])}; after TS: "
              f"{label(best['post_ts'])}.", "",
              "### Paired differences, CSM minus each method (mean [95% t-interval])", "",
              "| method | ECE before TS (points) | ECE after TS (points) | Acc before TS (points) | NLL before TS |",
              "|---|---|---|---|---|"]
    for m in order:
        if m not in summary["pairs"]:
            continue
        p = summary["pairs"][m]
        lines.append(f"| {METHODS[m].label} | {_interval_text(p['ece_pre_ts'])} | {_interval_text(p['ece_post_ts'])} | "
                     f"{_interval_text(p['acc_pre_ts'])} | {_interval_text(p['nll_pre_ts'], 4)} |")
    lines += ["", "### The decision rule's verdicts", ""]
    if csm is None:
        return lines + ["Pending: no CSM cell has finished.", ""]
    final = _every_seed(rows, summary["candidates"])
    outcomes = {}
    for what, other, phase in (("against CE, before TS", "ce", "pre_ts"),
                               ("against the best other method, before TS", best["pre_ts"], "pre_ts"),
                               ("against CE, after TS", "ce", "post_ts"),
                               ("against the best other method, after TS", best["post_ts"], "post_ts")):
        iv = summary["pairs"].get(other, {}).get(f"ece_{phase}") if other else None
        outcomes.setdefault(phase, []).append(_outcome(iv, choices_final=final))
        lines.append(f"* ECE {what} ({label(other)}): {_verdict(iv, choices_final=final)}.")
    acc = summary["pairs"].get("ce", {}).get("acc_pre_ts")
    lines += [f"* Accuracy against CE: {_verdict(acc, choices_final=final).replace('CSM lower', 'CSM costs accuracy')}.",
              "",
              f"**\"CSM calibrates better\" in `{setting}` (before TS, against CE and the best other method): "
              f"{_statement(outcomes['pre_ts'])}.** The same test after TS: {_statement(outcomes['post_ts'])}.", ""]
    return lines + boundary_section(summary)


def boundary_section(summary: Dict[str, Any]) -> List[str]:
    """The boundary study (PROTOCOL.md, amendment 1): the decision row at a quarter, half and all of its groups, and
    with the generator at half its steps, each against CE and the best other method (paired intervals, before TS)."""
    rows, csm = summary["rows"], summary["csm"]
    shown = [m for m in BOUNDARY_METHODS if m in rows]
    if not shown or csm is None:
        return []
    best = summary["best_other"]["pre_ts"]
    lines = ["### Boundary study: generated volume and generator steps (amendment 1)", "",
             f"The decision row ({METHODS[csm].label}) with the first quarter and half of each class pair's groups, "
             "and with its generator stopped at 2 000 of its 4 000 steps; test metrics in %, differences in ECE "
             "points before TS (mean [95% t-interval]). Commands (`make boundary`): `python "
             "benchmarks/matched_setting.py --setting matched-gen2000`, then `python benchmarks/calibration_bench.py "
             "--recipe matched --methods csm_groups25 csm_groups50 csm_gen2000`.", "",
             f"| generated set | seeds | ECE before TS | ECE after TS | Acc | minus CE | minus "
             f"{METHODS[best].label if best else '-'} |", "|---|---|---|---|---|---|---|"]
    names = {"csm_groups25": "25% of the groups", "csm_groups50": "50% of the groups",
             "csm_gen2000": "all groups, generator at 2 000 steps", csm: "all groups, 4 000 steps (decision row)"}
    below = []
    for m in [m for m in ("csm_groups25", "csm_groups50", csm, "csm_gen2000") if m in rows]:
        r = rows[m]
        intervals = [paired_interval(_by_seed(r, "ece_pre_ts"), _by_seed(rows[o], "ece_pre_ts")) if o in rows else None
                     for o in ("ce", best)]
        if _outcome(intervals[1]) == "lower":
            below.append(names[m])
        lines.append(f"| {names[m]} | {len(r)} | {_mean_cell(r, 'ece_pre_ts', 2)} | {_mean_cell(r, 'ece_post_ts', 2)} "
                     f"| {_mean_cell(r, 'acc_pre_ts', 2)} | " + " | ".join(map(_interval_text, intervals)) + " |")
    return lines + ["", f"Points whose interval against {METHODS[best].label if best else '-'} lies below 0 (5 seeds): "
                    f"{', '.join(below) if below else 'none'}.", ""]


def write_protocol_report(output: Path, report: Path, json_path: Optional[Path], recipe: Dict[str, Any],
                          command: str, committed: Optional[Path] = COMMITTED_CELLS) -> str:
    """(Re)write the protocol's section of ``report`` (both settings) and their rows of ``json_path``."""
    summaries = {s: protocol_summary(protocol_cells(output, s, committed), s) for s in PROTOCOL_RECIPES}
    shown = {k: v for k, v in recipe.items() if k != "progress"}
    n_cells = len({(m, s, METHODS[m].per_setting and st) for st, sm in summaries.items()
                   for m, rs in sm["rows"].items() for s in [r["seed"] for r in rs]})
    lines = ["# Calibration benchmark: CSM against the baselines and controls, under a protocol fixed in advance", "",
             "The protocol ([PROTOCOL.md](PROTOCOL.md)) was committed before any of these cells ran: the settings, "
             "the methods and their fixed hyper-parameters, the seeds, every selection rule (all on the 2 000-image "
             "validation set) and the decision rule. Every method learns from the same 2 500 real images (data seed "
             "0); the 5 training seeds vary initialisation, order and augmentation only, so the intervals below "
             "cover the training's randomness, not the choice of the real subset. The classifier recipe was chosen "
             "in the earlier benchmark by CE's test ECE ([calibration_earlier.md](calibration_earlier.md)) and is "
             "not re-tuned here. Accuracy and calibration errors in %, 15 equal-width bins; the test split (10 000 "
             "images) is read only by each cell's final evaluation.", "",
             "Command (both settings; finished cells are committed under `benchmarks/cells/` and never re-run):", "",
             f"    {command}", "",
             f"Machine: {machine_description()}. Finished cells: {n_cells}.", "",
             "Recipe (every cell, before each method's options): `" + json.dumps(shown, sort_keys=True) + "`.", ""]
    for setting in PROTOCOL_RECIPES:
        lines += protocol_section(setting, summaries[setting], recipe)
    pending = [cell_name(m, s, st) for st in PROTOCOL_RECIPES for s in PROTOCOL_SEEDS for m in PROTOCOL_METHODS
               if (METHODS[m].recipes is None or st in METHODS[m].recipes)
               and s not in {r["seed"] for r in summaries[st]["rows"].get(m, [])}]
    pending = list(dict.fromkeys(pending))
    if pending:
        lines += [f"Pending cells ({len(pending)}): " + ", ".join(pending) + ".", ""]
    text = "\n".join(lines)
    _replace_section(Path(report), text, _PROTOCOL_MARKERS)
    if json_path is not None:
        json_rows_out = []
        for setting, sm in summaries.items():
            for m in [m for m in (*PROTOCOL_METHODS, *BOUNDARY_METHODS) if m in sm["rows"]]:
                rows = sm["rows"][m]
                out: Dict[str, Any] = {"method": m, "label": METHODS[m].label, "recipe": setting,
                                       "recipe_options": recipe, "method_options": METHODS[m].options,
                                       "seeds": [r["seed"] for r in rows], "per_seed": rows}
                for key in rows[0]:
                    values = [r[key] for r in rows if isinstance(r.get(key), (int, float)) and key != "seed"]
                    if values and key != "seed":
                        mean, sd = _mean_std(values)
                        out[key] = {"mean": mean, "std": sd}
                json_rows_out.append(out)
        old = _read_json(json_path) if Path(json_path).exists() else []
        write_json_atomic(Path(json_path), [r for r in old if r.get("recipe") not in PROTOCOL_RECIPES]
                          + json_rows_out)
    return text


# ---------------------------------------------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------------------------------------------
def _key_value(text: str) -> Tuple[str, Any]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    import yaml

    key, value = text.split("=", 1)
    return key.strip().replace("-", "_"), yaml.safe_load(value)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", default="matched", choices=sorted(RECIPES),
                   help="the shared training recipe (see RECIPES): matched / borrowed, the two settings of "
                        "benchmarks/PROTOCOL.md (one shared cell cache, one page); augmented / noaug, the earlier "
                        "benchmark's; the flags below override single options")
    p.add_argument("--output", default=None,
                   help="cell cache: <output>/cells/<cell>/ (default: runs/calibration_protocol for matched / "
                        "borrowed, runs/calibration_bench_augmented, runs/calibration_bench for noaug)")
    p.add_argument("--report", default=None,
                   help="markdown report; default: the recipe's page (benchmarks/calibration.md for matched / "
                        "borrowed, calibration_earlier.md, calibration_demo.md) for its default --output, else "
                        "<output>/calibration.md, so that side experiments never overwrite the committed report")
    p.add_argument("--methods", nargs="+", default=None, metavar="METHOD",
                   help=f"methods to run (default: the protocol's {', '.join(PROTOCOL_METHODS)} for matched / "
                        f"borrowed, else {', '.join(m for m in METHODS if m not in CONTROLS)})")
    p.add_argument("--seeds", nargs="+", type=int, default=None,
                   help="training seeds (default: 0-4 for matched / borrowed, 0-2 otherwise)")
    p.add_argument("--max-cells", type=int, default=None, help="run at most N unfinished cells this time")
    p.add_argument("--amendment", type=int, default=None, choices=(2,),
                   help="run the cells of PROTOCOL.md's amendment 2 (--recipe matched / annotated / borrowed): cell "
                        "cache runs/protocol_a2, committed under benchmarks/cells_a2 with each cell's record; "
                        "--methods takes tuned names (ls@smoothing=0.1, csm@s=2.3,n_aug=2, stage 3's "
                        "csm@label=lambda, stage 4's csm@volume=2: the set runs/settings/<setting>-x2); default: "
                        "stage 1's cells of the setting at seeds 0-2")
    p.add_argument("--data-seed", type=int, default=None,
                   help="with --amendment: the real subset (2 500 training and 2 000 validation images) of this "
                        "data seed, stage 5's (default 0); cells of another data seed than 0 are named "
                        "<method>-d<N>-s<seed>")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads per cell (default 1 with --amendment: a cell's numbers depend on it)")
    p.add_argument("--verify", default=None, metavar="CELL",
                   help="re-run one committed cell (e.g. ce-s0, csm@s=2.3-matched-s1) from its recorded options on "
                        "the current code and print every difference from its results.json and record; exits 1 "
                        "when any")
    p.add_argument("--report-only", action="store_true", help="only re-assemble the report from finished cells")
    p.add_argument("--json", default=None,
                   help="JSON rows of the summary (one per method and recipe; other recipes' rows are kept); "
                        "default: benchmarks/calibration.json when the report is the recipe's page, else none")
    p.add_argument("--csm-dataset", default=None,
                   help="generated CSM dataset (folder, installed name or Hub id) of the CSM rows (default: the "
                        "setting's, runs/settings/<recipe>/csm/csm-fmnist-aug, for matched / borrowed; else "
                        "csm-fmnist-aug)")
    p.add_argument("--teacher", default=None,
                   help="KD's teacher (default: runs/settings/borrowed/reference, the borrowed setting's encoder)")
    p.add_argument("--csm-dataset-hard", default=None,
                   help="the same generated images annotated with label_mode='generation' (hard labels); default: "
                        "derived from --csm-dataset")
    g = p.add_argument_group("recipe overrides (default: the --recipe's options)")
    g.add_argument("--dataset", default=None)
    g.add_argument("--model", default=None)
    g.add_argument("--model-kwargs", nargs="*", type=_key_value, default=None, metavar="KEY=VALUE")
    g.add_argument("--epochs", type=int, default=None)
    g.add_argument("--batch-size", type=int, default=None)
    g.add_argument("--lr", type=float, default=None)
    g.add_argument("--weight-decay", type=float, default=None)
    g.add_argument("--sched", default=None)
    g.add_argument("--max-train-samples", type=int, default=None)
    g.add_argument("--max-test-samples", type=int, default=None)
    g.add_argument("--n-aug", type=int, default=None)
    g.add_argument("--train-opt", nargs="*", type=_key_value, default=[], metavar="KEY=VALUE",
                   help="any other train.py option for every cell, e.g. --train-opt val_fraction=0.2 amp=true")
    g.add_argument("--no-progress", action="store_true", help="no per-epoch progress bars")
    return p


def main(argv: Optional[Sequence[str]] = None) -> str:
    args = build_parser().parse_args(argv)
    for m in args.methods or ():
        try:
            get_method(m)
        except ValueError as e:
            build_parser().error(str(e))
    if args.amendment is not None and args.recipe not in A2_SETTINGS:
        build_parser().error(f"--amendment {args.amendment} runs the settings {', '.join(A2_SETTINGS)}")
    if args.data_seed is not None and args.amendment is None:
        build_parser().error("--data-seed names amendment 2's cells; give --amendment 2")
    threads = args.threads if args.threads is not None else (1 if args.amendment or args.verify else None)
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    if args.verify:
        found = verify_cell(args.verify)
        diffs = found["results"]
        text = "\n".join([f"{args.verify}: reproduced exactly" if not diffs else
                          f"{args.verify}: {len(diffs)} difference(s)", *diffs]
                         + [f"reported now, not in the committed results (not compared): {', '.join(found['added'])}"]
                         * bool(found["added"]) + [f"record: {d}" for d in found["record"]])
        print(text)
        if (COMMITTED_A2 / args.verify).is_dir():  # the page lists every verify run of an amendment-2 cell
            runs = _read_json(A2_VERIFY_LOG) if A2_VERIFY_LOG.exists() else []
            write_json_atomic(A2_VERIFY_LOG, runs + [{"cell": args.verify, "commit": _git("rev-parse", "HEAD"),
                                                      "clean": _git("status", "--porcelain",
                                                                    "--untracked-files=no") == "",
                                                      "reproduced": not diffs, "differences": diffs,
                                                      "not_compared": found["added"]}], indent=1)
        if diffs:
            raise SystemExit(1)
        return text
    t0 = time.time()
    overrides = {k: getattr(args, k) for k in ("dataset", "model", "epochs", "batch_size", "lr", "weight_decay",
                                               "sched", "max_train_samples", "max_test_samples", "n_aug",
                                               "data_seed")}
    if args.model_kwargs is not None:
        overrides["model_kwargs"] = dict(args.model_kwargs)
    overrides.update(dict(args.train_opt))
    if args.no_progress:
        overrides["progress"] = False
    recipe = base_recipe(overrides, args.recipe)
    if args.amendment is not None:
        return run_amendment(args, recipe)
    output = args.output or DEFAULT_OUTPUTS[args.recipe]
    protocol = args.recipe in PROTOCOL_RECIPES
    methods = list(dict.fromkeys(args.methods or (PROTOCOL_METHODS if protocol else
                                                  [m for m in METHODS if m not in CONTROLS])))
    seeds = list(dict.fromkeys(args.seeds or (PROTOCOL_SEEDS if protocol else (0, 1, 2))))
    csm_dataset = args.csm_dataset or (str(SETTINGS_ROOT / args.recipe / "csm" / "csm-fmnist-aug") if protocol
                                       else "csm-fmnist-aug")
    teacher = args.teacher or str(SETTINGS_ROOT / "borrowed" / "reference")
    committed = COMMITTED_CELLS if protocol and output == DEFAULT_OUTPUTS[args.recipe] else None
    skipped: Dict[str, str] = {}
    if not args.report_only:
        done = run_cells(recipe, methods, seeds, Path(output), csm_dataset=csm_dataset,
                         csm_dataset_hard=args.csm_dataset_hard, max_cells=args.max_cells,
                         setting=args.recipe if protocol else None, teacher=teacher, committed=committed)
        skipped = done["skipped"]
    command = "python benchmarks/calibration_bench.py" + "".join(
        " " + shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    if protocol:
        report = Path(args.report or DEFAULT_REPORTS[args.recipe])
        json_path = args.json or (DEFAULT_JSON if report == DEFAULT_REPORTS[args.recipe] else None)
        command = "python benchmarks/calibration_bench.py --recipe matched; python benchmarks/calibration_bench.py " \
                  "--recipe borrowed"
        text = write_protocol_report(Path(output), report, json_path, recipe, command, committed=committed)
        for reason in sorted(set(skipped.values())):
            text += f"\nNot run: {reason}."
        print(text)
        return text
    report = args.report or (DEFAULT_REPORTS[args.recipe] if output == DEFAULT_OUTPUTS[args.recipe]
                             else Path(output) / "calibration.md")
    json_path = args.json or (DEFAULT_JSON if Path(report) == DEFAULT_REPORTS[args.recipe] else None)
    text = write_report(Path(output), Path(report), recipe, seeds, command, time.time() - t0,
                        skipped=skipped, methods=methods, recipe_name=args.recipe, json_path=json_path)
    print(text)
    return text


def volume_dataset(setting: str, volume: int) -> str:
    """The CSM dataset of ``setting``'s set of ``volume`` times the groups (``matched_setting.py --setting
    <setting>-x<volume>``)."""
    return str(SETTINGS_ROOT / f"{setting}-x{volume}" / "csm" / "csm-fmnist-aug")


def run_amendment(args: argparse.Namespace, recipe: Dict[str, Any]) -> str:
    """Run amendment 2's cells of one setting (stage 1's by default) into ``--output`` (runs/protocol_a2), each
    committed under benchmarks/cells_a2 with its record as it finishes (not with another ``--output``)."""
    output = Path(args.output or A2_OUTPUT)
    committed = COMMITTED_A2 if args.output is None else None
    methods = list(args.methods or stage1_methods(args.recipe))
    seeds = list(args.seeds or A2_TUNING_SEEDS)
    csm_dataset = args.csm_dataset or str(SETTINGS_ROOT / args.recipe / "csm" / "csm-fmnist-aug")
    teacher = args.teacher or str(SETTINGS_ROOT / "borrowed" / "reference")
    volume_datasets = {v: volume_dataset(args.recipe, v) for v in VOLUMES[1:]}
    done = run_cells(recipe, methods, seeds, output, csm_dataset=csm_dataset, max_cells=args.max_cells,
                     setting=args.recipe, teacher=teacher, committed=committed, amendment=args.amendment,
                     volume_datasets=volume_datasets,
                     annotator=str(SETTINGS_ROOT / A2_ANNOTATORS[args.recipe] / "reference"))
    text = (f"amendment {args.amendment}, {args.recipe}"
            + (f", data seed {recipe['data_seed']}" if recipe.get("data_seed") else "")
            + f": ran {done['ran']} cell(s) into {output / 'cells'}"
            + (f", committed under {committed}" if committed else "")
            + "".join(f"\nnot run: {name}: {why}" for name, why in sorted(done["skipped"].items())))
    print(text)
    return text


if __name__ == "__main__":
    main()
