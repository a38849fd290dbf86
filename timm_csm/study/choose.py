"""Stage 1 of a study: every method's configuration chosen on the validation split alone.

A method's rows are its per-seed rows (``{"seed": s, "val_ece_pre_ts": ..., "val_nll_pre_ts": ..., ...}``, ECE in
percentage points; :func:`timm_csm.recipes.cells.per_seed_row` writes them from a cell's results). The chooser reads
a row's ``seed`` and its validation keys (:func:`choice_keys`, each ``val_...``) and nothing else: a row may carry
the test split's numbers for the page beside it, and they never reach a choice.

* :func:`choose`: among configurations, the lowest mean validation ECE over the tuning seeds; means within
  :data:`TIE` points of the lowest are a tie, broken by the lower mean validation NLL (then by the order given). No
  choice (None) while a candidate lacks one of the seeds.
* :func:`coordinate_search`: a method searched one axis at a time, each step's configurations at the values the
  steps before it chose (CSM's search in ``benchmarks/PROTOCOL.md``, amendments 2 and 4).
* :func:`stage1_choices`: each method's choice on its grid, the searched method's steps and row, and the best other
  method before and after temperature scaling.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from .methods import AXIS_DEFAULTS, TUNING_AXES, get_method, step_configurations

__all__ = ["TIE", "PHASES", "choice_keys", "validation_rows", "seed_mean", "choose", "axis_value", "SearchStep",
           "coordinate_search", "stage1_choices"]

#: means of validation ECE (in points) closer than this are a tie, broken by validation NLL (PROTOCOL.md)
TIE = 0.01
#: before and after temperature scaling: the two phases a choice is made in
PHASES = ("pre_ts", "post_ts")

Rows = Mapping[str, Sequence[Mapping[str, Any]]]


def choice_keys(phase: str = "pre_ts") -> Tuple[str, str]:
    """The two row keys a choice in ``phase`` reads: the validation ECE (points) and the validation NLL."""
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {', '.join(PHASES)}, got {phase!r}")
    return f"val_ece_{phase}", f"val_nll_{phase}"


def validation_rows(rows: Rows) -> Dict[str, List[Dict[str, Any]]]:
    """``rows`` cut to what a choice may read: each row's ``seed`` and its validation keys (``val_...``). What a
    study hands its chooser, so that no number of the test split is within its reach."""
    return {m: [{k: v for k, v in r.items() if k == "seed" or k.startswith("val_")} for r in found]
            for m, found in rows.items()}


def seed_mean(rows: Sequence[Mapping[str, Any]], key: str, seeds: Sequence[int]) -> Optional[float]:
    """The mean of ``key`` over the rows of ``seeds``; None unless every one of ``seeds`` has it."""
    values = [r.get(key) for r in rows if r["seed"] in seeds]
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if len(values) == len(seeds) else None


def choose(rows: Rows, candidates: Sequence[str], phase: str = "pre_ts", seeds: Sequence[int] = (0, 1, 2),
           tie: float = TIE) -> Optional[str]:
    """The candidate with the lowest mean validation ECE over ``seeds``; means within ``tie`` points of the lowest
    are broken by the lower mean validation NLL, then by the order of ``candidates``. None while any candidate lacks
    one of the seeds (or there is no candidate)."""
    ece_key, nll_key = choice_keys(phase)
    ece = {m: seed_mean(rows.get(m, ()), ece_key, seeds) for m in candidates}
    if not candidates or any(v is None for v in ece.values()):
        return None
    lowest = min(ece.values())
    tied = [m for m in candidates if ece[m] - lowest < tie]
    if len(tied) == 1:
        return tied[0]
    nll = {m: seed_mean(rows[m], nll_key, seeds) for m in tied}
    if any(v is None for v in nll.values()):
        return None
    return min(tied, key=lambda m: (nll[m], candidates.index(m)))


def axis_value(name: str, axis: str) -> Any:
    """The value of ``axis`` in the configuration ``name`` (the inverse of :func:`~.methods.tuned_name`)."""
    method = get_method(name)
    kind = TUNING_AXES[axis]
    if kind == "data":
        return dict(method.derive).get(axis, AXIS_DEFAULTS[axis])
    options = method.options.get("loss_kwargs", {}) if kind == "loss" else method.options
    return options.get(axis, AXIS_DEFAULTS.get(axis))


class SearchStep(NamedTuple):
    """One step of a coordinate-wise search: the ``axis`` it varies, its ``configurations`` and its ``choice``
    (None while pending)."""

    axis: str
    configurations: List[str]
    choice: Optional[str]


def coordinate_search(rows: Rows, steps: Sequence[Tuple[str, Sequence[Any]]], method: str = "csm",
                      seeds: Sequence[int] = (0, 1, 2)) -> Tuple[Dict[str, Any], List[SearchStep]]:
    """The coordinate-wise search of ``method`` over ``steps`` (``(axis, values)`` in order): the values chosen so
    far and the steps reached, the last one's choice None while it is pending."""
    chosen: Dict[str, Any] = {}
    reached: List[SearchStep] = []
    for i, (axis, _) in enumerate(steps):
        names = step_configurations(steps, i, chosen, method)
        pick = choose(rows, names, seeds=seeds)
        reached.append(SearchStep(axis, names, pick))
        if pick is None:
            break
        chosen[axis] = axis_value(pick, axis)
    return chosen, reached


def stage1_choices(rows: Rows, grids: Mapping[str, Sequence[str]], steps: Sequence[Tuple[str, Sequence[Any]]],
                   method: str = "csm", seeds: Sequence[int] = (0, 1, 2)) -> Dict[str, Any]:
    """Stage 1's choices, each None while pending:

    * ``"grids"``: ``grids`` as given (each other method's configurations) and ``"chosen"``: each one's choice;
    * ``"csm_steps"``: the :class:`SearchStep` s of ``method``'s search over ``steps`` and ``"csm"``: its row, the
      last step's choice;
    * ``"best_other"``: ``{"pre_ts", "post_ts"}``, the chosen configuration with the lowest mean validation ECE
      before and after temperature scaling (once every method's choice is made).
    """
    grids = {name: list(configurations) for name, configurations in grids.items()}
    chosen = {name: choose(rows, configurations, seeds=seeds) for name, configurations in grids.items()}
    search = coordinate_search(rows, steps, method, seeds)[1]
    row = search[-1].choice if len(search) == len(steps) else None
    ready = list(chosen.values())
    best = {phase: (choose(rows, ready, phase, seeds) if all(ready) else None) for phase in PHASES}
    return {"grids": grids, "chosen": chosen, "csm_steps": search, "csm": row, "best_other": best}
