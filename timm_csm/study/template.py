"""The spec ``timm-csm-study init`` writes: amendment 2's design of ``benchmarks/PROTOCOL.md`` (its baselines and
grids, CSM's coordinate-wise search, 3 tuning seeds within 15 decision seeds, CSM minus CE and minus the best other
method under Holm at 0.05) for a dataset, a real-image budget and a timm model, as TOML text
(:func:`template_text`).
"""
from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

from .decide import FAMILY_ALPHA
from .methods import METHODS

__all__ = ["BASELINES", "TUNING_GRIDS", "CSM_TUNING_STEPS", "TUNING_SEEDS", "DECISION_SEEDS", "PLANNING_SD",
           "template_text"]

#: amendment 2's baselines, in the order of its tables (KD besides, where a setting's annotator is its teacher)
BASELINES = ("ce", "brier", "ls", "mbls", "mixup", "regmixup")
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
TUNING_SEEDS = (0, 1, 2)
DECISION_SEEDS = tuple(range(15))
#: amendment 2's planning sd (ECE points): the paired sd of CSM minus RegMixup in ``matched`` at 5 seeds
PLANNING_SD = 0.56


def _value(value: Any) -> str:
    """``value`` as TOML: strings quoted, numbers as Python writes them, lists and dicts inline."""
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(map(_value, value)) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_value(v)}" for k, v in value.items()) + " }"
    return repr(value)


def template_text(name: str, dataset: str, model: str, recipe: str = "demo", train_size: int = 2500,
                  val_size: int = 2000, data_seed: int = 0, settings: Sequence[str] = ("matched",),
                  tuning_seeds: Sequence[int] = TUNING_SEEDS, decision_seeds: Sequence[int] = DECISION_SEEDS,
                  planning_sd: float = PLANNING_SD, options: Dict[str, Any] = None) -> str:
    """The TOML text of amendment 2's design for ``dataset`` (``train_size`` real training images, ``val_size``
    validation images of ``data_seed``) and the timm ``model`` on the recipe profile ``recipe`` (``options`` over
    it), in ``settings``. KD is among the methods where a setting's annotator is its teacher."""
    kd = [s for s in settings if s in (METHODS["kd"].recipes or ())]
    lines: List[str] = [
        f"# Study spec (timm_csm.study): amendment 2's design of benchmarks/PROTOCOL.md for {dataset} and {model}.",
        "# Pre-registered: once a cell has run, change it only by appending a dated [[amendment]] at the end.", "",
        "[study]", f"name = {_value(name)}", f"settings = {_value(list(settings))}", "",
        "[data]", f"dataset = {_value(dataset)}", f"train_size = {train_size}", f"val_size = {val_size}",
        f"data_seed = {data_seed}", "",
        "[model]", f"name = {_value(model)}", f"recipe = {_value(recipe)}"]
    lines += [f"options = {_value(options)}"] if options else []
    lines += ["", "[seeds]", f"tuning = {_value(list(tuning_seeds))}", f"decision = {_value(list(decision_seeds))}"]
    for method in [*BASELINES, *(["kd"] if kd else [])]:
        lines += ["", f"[methods.{method}]"]
        if method in TUNING_GRIDS:
            lines.append(f"grid = {_value(TUNING_GRIDS[method])}")
        if method == "kd":
            lines.append(f"settings = {_value(kd)}")
    steps = [f"    {_value({'axis': axis, 'values': list(values)})}," for axis, values in CSM_TUNING_STEPS]
    lines += ["", "[search]  # coordinate-wise: each step at the values the steps before it chose", 'method = "csm"',
              "steps = [", *steps, "]", "",
              "[decision]", 'metric = "ece_pre_ts"', 'others = ["ce", "best_other"]', 'secondary = ["regmixup"]',
              f"family_alpha = {FAMILY_ALPHA!r}", f"planning_sd = {planning_sd!r}", "",
              "[calibrators]", 'fit = ["temperature_scaling"]', ""]
    return "\n".join(lines)
