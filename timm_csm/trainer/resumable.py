"""The one resumable trainer of the package's three trainings: the classifier's epochs, the reference encoder's epochs
and the generator's steps, with the one schema of their training state.

It has the shape of timm's train loop with its ``CheckpointSaver``: restore the training objects from the run
folder's ``last.safetensors`` (:func:`~timm_csm.io.read_checkpoint`, with its one answer to a checkpoint that does
not read or does not fit: named in the log and trained again for a cache, an error naming it for a run), train the
units from where the checkpoint left off under one progress bar (:mod:`timm_csm.trainer.progress`), write the
training state every ``every`` units (:func:`~timm_csm.io.save_state`: one ``os.replace``, so a kill leaves the
previous one whole), and finish.

The training state has one schema (:data:`STATE_KEYS`), whichever model it trains: ``model``, ``optimizer`` and
``scheduler`` (the learning-rate schedule) hold those objects' ``state_dict``; ``ema`` the EMA's, where there is one;
``rng`` the global RNG states, where the run draws from them (the classifier); ``history`` the run's log so far; and
how far it got, written by the trainer: ``epoch``, the last finished epoch counted from 0 (timm's convention), or
``step``, the number of finished steps. A model adds what only it has (the classifier its loss's state, best epoch and
run metadata; the generator its training time). :meth:`ResumableTrainer.resume` (:func:`load_training_state`) is the
one function that puts a state back into the objects. A checkpoint of an earlier schema (the reference encoder's
schedule under ``sched``, the generator's under ``lr_sched`` and its history under ``losses``) does not fit: it gets
the answer above, named in the log and trained again for the reference encoder, a cache; an error naming it for a
generator run.

A model supplies only what differs: its training objects, what one unit trains (a step or an epoch) and the entries
of its training state.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

from ..io import CHECKPOINT_LAST, read_checkpoint, remove_checkpoint, save_state
from .progress import progress_bar

__all__ = ["ResumableTrainer", "load_training_state", "STATE_KEYS"]

#: the entries every trainer's training state names alike (see the module docstring)
STATE_KEYS = ("model", "optimizer", "scheduler", "ema", "rng", "history", "epoch", "step")
#: a trainer's unit -> (the entry stored after ``done`` units, the first unit to train after a stored entry)
_UNITS = {"epoch": (lambda done: done - 1, lambda last: last + 1), "step": (lambda done: done, lambda done: done)}


def load_training_state(state: Mapping[str, Any], objects: Mapping[str, Any]) -> None:
    """Put the entries of the training state ``state`` back into the training objects of ``objects``, named by the
    schema's keys (:data:`STATE_KEYS`, and a model's own): ``objects[key].load_state_dict(state[key])``, or
    ``objects[key](state[key])`` where a model loads an entry its own way (the classifier's schedule when
    ``--epochs`` extends the run, the RNG states). A key that ``state`` lacks raises ``KeyError``: a state of another
    schema does not fit."""
    for key, target in objects.items():
        entry = state[key]
        if hasattr(target, "load_state_dict"):
            target.load_state_dict(entry)
        else:
            target(entry)


class ResumableTrainer:
    """The resumable loop over the units of one training run in ``folder``.

    Args:
        folder: the run folder; its checkpoint is ``folder / last.safetensors``.
        what: the checkpoint in messages ("generator checkpoint").
        unit: ``"epoch"`` or ``"step"``: what one unit trains, and the entry of the training state that says how far
            the run got (see the module docstring).
        cache: the answer to a checkpoint that does not read or fit (:func:`~timm_csm.io.read_checkpoint`): True
            where the result is a cache, rebuilt in minutes (named in the log, removed, trained from the seed);
            False where it is hours of work (an error naming it).
        every: units between two checkpoints.
        every_seconds: also checkpoint after a unit that ends this long after the last checkpoint (or the start), so
            that a long run is never far from its last checkpoint (None: by units only).
        checkpoint_end: also checkpoint after the last unit (False where the finished run's result replaces the
            checkpoint, as the reference encoder's weights do).
        earlier: the checkpoint folder of the previous layout inside ``folder``, read in its place (converted when
            it fits; the folders earlier versions wrote hold the earlier schema, so they get the answer above).
        pickled: the ``torch.save`` files of earlier versions in ``earlier``, named and never unpickled.
        desc: the run's progress bar (None: the units show their own, as the classifier's epochs do).
        progress: show the bar.
        is_main_process: only the main process writes checkpoints and shows the bar.
        wait_for_everyone: the barrier after each unit of a distributed run.
    """

    def __init__(self, folder, what: str, *, unit: str, cache: bool, every: int = 1,
                 every_seconds: Optional[float] = None, checkpoint_end: bool = True, earlier: Optional[str] = None,
                 pickled: Sequence[str] = (),
                 desc: Optional[str] = None, progress: bool = True, is_main_process: bool = True,
                 wait_for_everyone: Callable[[], None] = lambda: None, log: Callable[[str], None] = print):
        if unit not in _UNITS:
            raise ValueError(f"unit {unit!r}: must be one of {sorted(_UNITS)}")
        if every < 1:
            raise ValueError(f"checkpoint every {every} units: must be at least 1")
        self.folder = Path(folder)
        self.path = self.folder / CHECKPOINT_LAST
        self.earlier = self.folder / earlier if earlier is not None else None
        self.what, self.unit, self.cache, self.pickled, self.log = what, unit, cache, tuple(pickled), log
        if every_seconds is not None and every_seconds <= 0:
            raise ValueError(f"checkpoint every {every_seconds} seconds: must be positive")
        self.every, self.every_seconds, self.checkpoint_end = int(every), every_seconds, checkpoint_end
        self._last_save = time.monotonic()
        self.desc, self.progress = desc, progress
        self.is_main_process, self.wait_for_everyone = is_main_process, wait_for_everyone

    def first_unit(self, state: Mapping[str, Any]) -> int:
        """The first unit to train after the training state ``state``."""
        return _UNITS[self.unit][1](int(state[self.unit]))

    def resume(self, state: Mapping[str, Any], objects: Mapping[str, Any]) -> int:
        """Put the training state ``state`` back into ``objects`` (:func:`load_training_state`); the first unit
        to train."""
        start = self.first_unit(state)
        load_training_state(state, objects)
        return start

    def restore(self, objects: Mapping[str, Any]) -> Optional[Tuple[int, Dict[str, Any]]]:
        """(the first unit to train, the checkpoint's state) after the state was put back into ``objects``
        (:meth:`resume`); None when there is none, and, for a cache, when it did not read or fit (then it is
        removed, and the objects may hold part of it: build them again)."""
        starts = []
        state = read_checkpoint(self.path, self.what, cache=self.cache, earlier=self.earlier, pickled=self.pickled,
                                restore=lambda state: starts.append(self.resume(state, objects)), log=self.log)
        return None if state is None else (starts[0], state)

    def _checkpoint_due(self, done: int, end: int) -> bool:
        if done == end:
            return self.checkpoint_end
        late = self.every_seconds is not None and time.monotonic() - self._last_save >= self.every_seconds
        return done % self.every == 0 or late

    def fit(self, train_unit: Callable[[int, Any], None], training_state: Callable[[], Dict[str, Any]],
            start: int, end: int, *, save: Optional[Callable[[int, Dict[str, Any]], None]] = None,
            bar_total: Optional[int] = None, bar_initial: Optional[int] = None) -> None:
        """Train the units ``[start, end)``: ``train_unit(unit, bar)`` (``bar`` the run's progress bar, None without
        ``desc``; a unit advances it by the steps it trains), then, when a checkpoint is due, on the main process,
        ``save(unit, state)`` with ``state`` the model's ``training_state()`` and the trainer's entry of how far
        it got (default ``save``: the state written to ``last.safetensors``); every process waits for the others
        after each unit. The bar counts ``bar_total`` steps from ``bar_initial`` (default: the units)."""
        save = save or (lambda unit, state: save_state(self.path, state))
        bar = None
        if self.desc is not None:
            bar = progress_bar(self.desc, total=end if bar_total is None else bar_total,
                               initial=start if bar_initial is None else bar_initial,
                               enabled=self.progress and self.is_main_process)
        self._last_save = time.monotonic()
        try:
            for unit in range(start, end):
                train_unit(unit, bar)
                if self.is_main_process and self._checkpoint_due(unit + 1, end):
                    save(unit, {**training_state(), self.unit: _UNITS[self.unit][0](unit + 1)})
                    self._last_save = time.monotonic()
                self.wait_for_everyone()
        finally:
            if bar is not None:
                bar.close()

    def finish(self) -> None:
        """Remove the checkpoint (and one of the previous layout) once the run's result is written: a cache
        keeps only its result."""
        remove_checkpoint(self.path, self.earlier)
