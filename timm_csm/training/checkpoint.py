"""A run folder's checkpoints (the role of timm's ``CheckpointSaver``): the last training state, the best model and
an optional history of per-epoch states.

* ``last.safetensors``: the training state after every epoch (model, optimizer, scheduler, loss state, RNG, epoch,
  best, history, run metadata, and the EMA weights with ``--model-ema``; :func:`timm_csm.io.save_state`), what
  ``--resume`` continues (read by :func:`timm_csm.io.read_checkpoint`, as the reference encoder's and the
  generator's checkpoints are);
* ``model_best.safetensors``: the model weights of the best epoch by the validation metric ``select_by``
  (:func:`timm_csm.io.save_model_file`), replaced only when an epoch is strictly better (every epoch counts as
  better when there is no validation split); with ``--model-ema`` the EMA weights, which are the ones validated
  (as timm's ``train.py`` selects on the EMA's metrics);
* ``checkpoint-<epoch>.safetensors``: with ``max_history > 0``, the training states of the ``max_history`` most
  recent epochs (older ones are deleted), each a hard link of that epoch's ``last.safetensors`` (a copy where the
  filesystem has no hard links, :func:`timm_csm.io.link_or_copy_atomic`): the state is written once per epoch. As
  ``last.safetensors`` is replaced (a new file) every epoch, an epoch's link keeps that epoch's state.

Every file is written through a temporary file and ``os.replace`` (:mod:`timm_csm.io`): a writer killed mid-write
leaves the previous files as they were.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import torch

from ..evaluation.model import load_model_weights
from ..io import CHECKPOINT_LAST, link_or_copy_atomic, read_model_meta, save_model_file, save_state
from ..metrics.table import metric_spec, metrics_for

__all__ = ["CHECKPOINT_LAST", "CHECKPOINT_BEST", "SELECT_METRICS", "CheckpointSaver", "rng_state", "set_rng_state",
           "load_best", "saved_temperature"]

CHECKPOINT_BEST = "model_best.safetensors"
#: ``--select-by`` -> (logged validation key, better of two values): the metric table's ``"checkpoint"`` view, by
#: abbreviation (``acc``), each in its direction
SELECT_METRICS = {metric_spec(name).abbrev: (f"val_{name}", max if metric_spec(name).higher_is_better else min)
                  for name in metrics_for("checkpoint")}


def rng_state() -> Dict[str, Any]:
    """The global torch RNG states (CPU, and every CUDA device when present)."""
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = list(torch.cuda.get_rng_state_all())
    return state


def set_rng_state(state: Dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(list(state["cuda"]))


class CheckpointSaver:
    """The checkpoints of the run folder ``folder`` (see the module docstring).

    Args:
        folder: the run folder.
        select_by: ``"acc"`` (higher is better), ``"nll"`` or ``"ece"`` (lower is better).
        max_history: per-epoch training states to keep (0: none).
        best: the ``best`` record of a resumed run (``{"value", "epoch", "metric"}``); None for a new run.
    """

    def __init__(self, folder, select_by: str = "acc", max_history: int = 0, best: Optional[Dict[str, Any]] = None):
        if select_by not in SELECT_METRICS:
            raise ValueError(f"select_by must be one of {sorted(SELECT_METRICS)}, got {select_by!r}")
        if max_history < 0:
            raise ValueError(f"max_history must be >= 0, got {max_history}")
        self.folder = Path(folder)
        self.select_by = select_by
        self.metric_key = SELECT_METRICS[select_by][0]
        self.max_history = int(max_history)
        self.best = dict(best) if best else {"value": None, "epoch": None, "metric": select_by}

    def is_better(self, value) -> bool:
        """Whether ``value`` of the selection metric beats the best so far (strictly; the first value always)."""
        if self.best["value"] is None:
            return True
        return value > self.best["value"] if SELECT_METRICS[self.select_by][1] is max else value < self.best["value"]

    def update(self, epoch: int, row: Dict[str, Any], validated: bool = True) -> bool:
        """Record epoch ``epoch`` with its log ``row``; True (and ``best`` updated) when it is the new best. Without
        validation (``validated=False``) every epoch is the new best."""
        improved = self.is_better(row.get(self.metric_key, 0.0)) if validated else True
        if improved:
            self.best = {"value": row.get(self.metric_key), "epoch": epoch, "metric": self.select_by}
        return improved

    def save(self, epoch: int, state: Dict[str, Any], improved: bool) -> None:
        """Write epoch ``epoch``'s files: the best model (when ``improved``), ``last.safetensors``, and the history
        entry, a link of it (deleting the one that falls out). ``state`` is the training state, with ``model`` (the
        model's state dict), optionally ``ema`` (the EMA's, then the best model's weights) and ``meta`` (the run
        metadata, stored with the best model along with ``epoch`` and ``best``)."""
        if improved:
            save_model_file(self.folder / CHECKPOINT_BEST, state.get("ema", state["model"]),
                            dict(state["meta"], epoch=epoch, best=self.best))
        save_state(self.folder / CHECKPOINT_LAST, state)
        if self.max_history > 0:
            link_or_copy_atomic(self.folder / CHECKPOINT_LAST, self.folder / f"checkpoint-{epoch}.safetensors")
            stale = self.folder / f"checkpoint-{epoch - self.max_history}.safetensors"
            if stale.exists():
                stale.unlink()


def load_best(model, folder, best: Dict[str, Any], run_id: str) -> Optional[Path]:
    """Load this run's best checkpoint into ``model``; its path, or None when no epoch was selected (the model is
    evaluated as it is, e.g. ``--epochs 0``). A model file of another run or epoch is an error, never evaluated."""
    if best.get("epoch") is None:
        return None
    path = Path(folder) / CHECKPOINT_BEST
    meta = (read_model_meta(path) if path.exists() else None) or {}
    found = (meta.get("run_id"), meta.get("epoch"))
    if found != (run_id, best["epoch"]):
        raise ValueError(f"{path} is not this run's best checkpoint: it holds run {found[0]}, epoch {found[1]}; "
                         f"expected run {run_id}, epoch {best['epoch']}")
    load_model_weights(model, path)
    return path


def saved_temperature(checkpoint) -> Optional[Tuple[Any, str]]:
    """The temperature a finished training run fitted for its model file ``checkpoint``: ``(scaler, where it comes
    from)`` when the run folder's ``results.json`` names that file of the same run and the run saved
    ``temperature.safetensors``; None otherwise (another file, a run without validation images)."""
    import json

    from ..calibration import TemperatureScaling

    folder = Path(checkpoint).parent
    results_file, temperature_file = folder / "results.json", folder / "temperature.safetensors"
    if not (results_file.is_file() and temperature_file.is_file()):
        return None
    results = json.loads(results_file.read_text())
    run_id = (read_model_meta(checkpoint) or {}).get("run_id")
    scored = results.get("checkpoint")
    if run_id is None or results.get("run_id") != run_id or not scored or Path(scored).name != Path(checkpoint).name:
        return None
    source = (f"fitted by run {run_id} on its {results.get('n_val')} validation images ({results.get('ts_method')}), "
              f"{temperature_file}")
    return TemperatureScaling.load(temperature_file), source
