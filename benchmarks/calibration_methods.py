"""The calibration benchmark's table (``benchmarks/calibration_bench.py``): the recipes, the protocol's method lists,
amendment 2's and 4's grids and searches, and each cell's training options (:func:`cell_config`, the library's
:func:`timm_csm.study.options.cell_options`), over the library's method table (:mod:`timm_csm.study.methods`: the
rows, :data:`METHODS`, the configurations named ``<method>@<axis>=<value>,...``, :func:`get_method`, and the cells'
names, :func:`cell_name`).
``benchmarks/PROTOCOL.md`` fixes all of them.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from timm_csm.recipes import derive
from timm_csm.study.methods import (AXIS_DEFAULTS, LABELS, METHODS, TUNING_AXES, VOLUMES, BenchMethod, cell_name,
                                    get_method, grid_configurations, step_configurations, tuned_name)
from timm_csm.study.options import cell_options as cell_config
from timm_csm.study.template import CSM_TUNING_STEPS, DECISION_SEEDS, TUNING_GRIDS, TUNING_SEEDS

# the library's method table, re-exported: the benchmark's scripts read it here
__all__ = ["BenchMethod", "METHODS", "TUNING_AXES", "AXIS_DEFAULTS", "LABELS", "VOLUMES", "TUNING_GRIDS",
           "CSM_TUNING_STEPS", "get_method", "tuned_name", "grid_methods", "csm_step_methods", "stage1_methods",
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
#: stage 1's grids (TUNING_GRIDS) and CSM's search (CSM_TUNING_STEPS) are the library's amendment-2 template
#: (timm_csm.study.template), imported above
#: the methods without a grid that stage 1 runs as they are
UNTUNED_A2 = ("ce", "brier")
A2_SETTINGS = ("matched", "annotated", "borrowed")
A2_OUTPUT = "runs/protocol_a2"
A2_SEEDS = DECISION_SEEDS
A2_TUNING_SEEDS = TUNING_SEEDS
#: finished amendment-2 cells, committed (with their record: commit, versions, threads, generated set)
COMMITTED_A2 = Path("benchmarks/cells_a2")
#: each --verify of an amendment-2 cell: the cell, the commit it ran at, whether it reproduced
A2_VERIFY_LOG = Path("benchmarks/cells_a2_verify.json")
#: each setting's annotator (reference encoder, prototypes, s rule), under SETTINGS_ROOT: stage 3's softmax labels
A2_ANNOTATORS = {"matched": "matched", "annotated": "borrowed", "borrowed": "borrowed"}


def grid_methods(method: str) -> List[str]:
    """Stage 1's configurations of a baseline on amendment 2's grid, by canonical name (one name for an untuned
    method)."""
    return grid_configurations(method, TUNING_GRIDS.get(method))


def csm_step_methods(step: int, chosen: Optional[Dict[str, Any]] = None, method: str = "csm",
                     steps: Tuple[Tuple[str, Tuple[Any, ...]], ...] = CSM_TUNING_STEPS) -> List[str]:
    """The configurations of step ``step`` (0-based) of CSM's coordinate-wise search ``steps`` (amendment 2's by
    default), at the values ``chosen`` by the steps before it (their defaults where not given)."""
    return step_configurations(steps, step, chosen, method)


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

