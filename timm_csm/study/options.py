"""A cell's training options: the :func:`timm_csm.training.run` options of one (configuration, seed), from the recipe a
study's spec states (:func:`study_recipe`) and the configuration's method (:func:`cell_options`).

The calibration benchmark's cells (``benchmarks/calibration_methods.py``) take theirs from :func:`cell_options` too,
so that a spec that states an amendment's design (``benchmarks/study_fmnist_a4.toml``) runs the very cells the
amendment ran: the same options, hence the same cell folders and numbers.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Dict, Mapping, Optional

from ..recipes import get_profile, training_options
from .methods import BenchMethod
from .spec import StudySpec

__all__ = ["study_recipe", "cell_options"]


def study_recipe(spec: StudySpec) -> Dict[str, Any]:
    """The training options every cell of ``spec`` shares: its recipe profile's classifier recipe
    (:func:`timm_csm.recipes.training_options`) on the spec's data (dataset, real-image budget, validation size,
    data seed) and model, then the spec's ``model.options``. The profile's ``model_kwargs`` belong to the profile's
    own model: another model drops them unless the options state its own."""
    profile = get_profile(spec.model.recipe)
    recipe = training_options(profile)
    if spec.model.name != profile.model:
        recipe.pop("model_kwargs", None)
    recipe.update(dataset=spec.data.dataset, max_train_samples=spec.data.train_size, val_size=spec.data.val_size,
                  data_seed=spec.data.data_seed, model=spec.model.name)
    # as JSON has them (a frozen spec keeps lists as tuples): the options a cell is keyed by
    recipe.update(json.loads(json.dumps(dict(spec.model.options))))
    return recipe


def cell_options(recipe: Mapping[str, Any], method: BenchMethod, seed: int, cell_dir: Path,
                 data_paths: Optional[Mapping[str, str]] = None) -> Dict[str, Any]:
    """The :func:`timm_csm.training.run` options of the cell of ``method`` at ``seed`` written into ``cell_dir``:
    ``recipe``, its epochs and milestones scaled by the method's ``epoch_factor``, the method's options, and the
    generated set it reads and its teacher from ``data_paths`` (the sets by data key,
    :attr:`~.methods.BenchMethod.data_key`, the teacher under ``"teacher"``); a ``ValueError`` naming what is
    missing."""
    cfg = {k: v for k, v in recipe.items() if k != "n_aug"}
    if method.epoch_factor != 1.0:
        cfg["epochs"] = math.ceil(cfg["epochs"] * method.epoch_factor)
        if cfg.get("decay_milestones"):
            cfg["decay_milestones"] = [math.ceil(m * method.epoch_factor) for m in cfg["decay_milestones"]]
    cfg.update(method.options)
    if method.csm is not None:
        path = (data_paths or {}).get(method.data_key)
        if not path:
            raise ValueError(f"method {method.name!r} needs the {method.data_key}-label CSM dataset")
        cfg.update(csm_dataset=str(path), n_aug=method.options.get("n_aug", recipe.get("n_aug", 1)))
    if method.teacher:
        path = (data_paths or {}).get("teacher")
        if not path:
            raise ValueError(f"method {method.name!r} needs a teacher (the setting's reference encoder)")
        cfg.update(teacher=str(path))
    cfg.update(seed=int(seed), output=str(cell_dir), experiment=".")
    return cfg
