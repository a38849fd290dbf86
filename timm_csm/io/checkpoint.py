"""Resumable checkpoints: a state file (``last.safetensors``, written by
:func:`~timm_csm.io.state_file.save_state`) read back by :func:`read_checkpoint`, the one answer to a checkpoint that
does not read; the folder layouts of earlier versions read and converted, never written.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from .state_file import load_state, save_state

__all__ = ["CHECKPOINT_LAST", "read_checkpoint", "remove_checkpoint"]

#: the training state a run resumes from (:func:`save_state`: weights, optimizer, schedule and how far it got), as
#: timm's ``last.pth.tar``; written by one ``os.replace``, so a kill leaves the previous one whole
CHECKPOINT_LAST = "last.safetensors"
# the layout before it (read and converted, never written): a folder holding the state and, beside it, the progress
# as JSON, swapped in whole by renames (a kill between them leaves <folder>.old); the generator's layout before that
# split the state in two, the UNet alone and the rest
_FOLDER_STATE, _FOLDER_PROGRESS = "state.safetensors", "state.json"
_FOLDER_MODEL, _FOLDER_REST = "model.safetensors", "training_state.safetensors"
#: what a state that reads but does not fit the objects raises from their ``load_state_dict``
_DOES_NOT_FIT = (KeyError, ValueError, RuntimeError, TypeError)


class _Unreadable(Exception):
    """A checkpoint that does not read; its message names the file and what is wrong with it."""


def _cause(e: BaseException) -> str:
    """``e`` on one line (``load_state_dict`` lists its missing keys on several)."""
    return f"{type(e).__name__}: {' '.join(str(e).split())}"


def _folder_siblings(folder: Path) -> Tuple[Path, ...]:
    return folder, folder.with_name(folder.name + ".tmp"), folder.with_name(folder.name + ".old")


def _remove_folder(earlier) -> None:
    for folder in _folder_siblings(Path(earlier)) if earlier is not None else ():
        shutil.rmtree(folder, ignore_errors=True)


def remove_checkpoint(path, earlier=None) -> None:
    """Remove the checkpoint ``path`` and, where given, the ``earlier`` checkpoint folder of the previous layout
    with what a kill between its renames may have left beside it."""
    Path(path).unlink(missing_ok=True)
    _remove_folder(earlier)


def _read_state(path: Path, what: str) -> Dict[str, Any]:
    from safetensors import SafetensorError

    try:
        return load_state(path)
    except (SafetensorError, OSError, ValueError, KeyError) as e:  # truncated, unreadable, foreign
        raise _Unreadable(f"{path} is a damaged {what} ({_cause(e)})") from e


def _read_folder(folder: Path, what: str, pickled: Sequence[str]) -> Dict[str, Any]:
    """The state of a checkpoint folder of the previous layouts, its progress merged in."""
    from safetensors.torch import load_file

    for name in pickled:
        if (folder / name).exists() and not (folder / _FOLDER_STATE).exists():
            raise _Unreadable(f"{folder / name} is a {what} in the pickled format of earlier versions, which is never "
                              "unpickled here")
    if (folder / _FOLDER_MODEL).is_file() and (folder / _FOLDER_REST).is_file():
        parts = [(folder / _FOLDER_MODEL, lambda p: {"model": load_file(p)}), (folder / _FOLDER_REST, load_state)]
    else:
        parts = [(folder / _FOLDER_STATE, load_state)]
    missing = [p.name for p, _ in parts + [(folder / _FOLDER_PROGRESS, None)] if not p.is_file()]
    if missing:
        raise _Unreadable(f"{folder} is a {what} in the layout of an earlier version (no {', '.join(missing)})")
    state: Dict[str, Any] = {}
    try:
        for path, read in parts:
            state.update(read(path))
        state.update(json.loads((folder / _FOLDER_PROGRESS).read_text()))
    except Exception as e:  # truncated, unreadable, bad JSON: all of it is the damaged checkpoint
        raise _Unreadable(f"{folder} is a damaged {what} ({_cause(e)})") from e
    return state


def read_checkpoint(path, what: str, *, cache: bool, restore: Optional[Callable[[Dict[str, Any]], None]] = None,
                    earlier=None, pickled: Sequence[str] = (),
                    log: Callable[[str], None] = print) -> Optional[Dict[str, Any]]:
    """The training state of the checkpoint ``path`` (:func:`save_state`), loaded into the training objects by
    ``restore(state)``; None when there is none. Every resumable run reads its checkpoint here.

    ``earlier`` names the checkpoint folder of the previous layout (a state file and ``state.json``; or the
    generator's ``model.safetensors`` and ``training_state.safetensors``): when ``path`` is absent it is read,
    restored, written as ``path`` and removed, so that a run interrupted then finishes now. ``pickled`` names the
    ``torch.save`` files of earlier versions, which are never unpickled.

    A checkpoint that does not read, or reads but does not fit the objects (``restore`` raises), has one answer.
    Where it is a cache, rebuilt in minutes (``cache=True``), it is named in the log and removed, and training starts
    over (the objects may hold part of it: build them again); otherwise it is a ``ValueError`` naming it and what to
    do, never a restart that would overwrite it.
    """
    path = Path(path)
    folder = next((f for f in _folder_siblings(Path(earlier)) if f.is_dir()), None) if earlier is not None else None
    where = path if path.exists() or folder is None else folder
    try:
        if path.exists():
            state = _read_state(path, what)
        elif folder is not None:
            state = _read_folder(folder, what, pickled)
        else:
            return None
        if restore is not None:
            try:
                restore(state)
            except _DOES_NOT_FIT as e:
                raise _Unreadable(f"{where} is a damaged {what}: it does not fit ({_cause(e)})") from e
    except _Unreadable as e:
        if cache:
            log(f"{e}; it is removed and training starts over from the seed")
            remove_checkpoint(path, earlier)
            return None
        raise ValueError(f"{e}; a run from scratch would overwrite it: resume from another checkpoint, train into a "
                         f"fresh output folder, or delete {where} to start again from scratch") from None
    if where is not path:  # converted on read: written in today's layout, then the folder goes
        save_state(path, state)
    _remove_folder(earlier)  # also one a kill left after the conversion
    return state
