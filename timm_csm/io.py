"""File I/O shared across the package: atomic writers, a reader that hashes what it reads, and the safetensors formats
of training states and models.

Files appear complete or not at all. Every writer goes through a temporary file ``.<name>.<random>.tmp`` beside
the target, then ``os.replace``. The temporary file is created with the mode a plain ``open`` gives (``0o666`` less
the process umask: ``0o644`` under the usual umask ``022``), not ``tempfile.mkstemp``'s owner-only ``0o600``. A
writer killed mid-write leaves its temporary file behind; :func:`remove_temp_files` deletes such leftovers from a folder the caller owns.

State files (:func:`save_state` / :func:`load_state`): a nested dict of tensors, numbers, strings, lists and tuples
(an optimizer's, a scheduler's or an EMA's ``state_dict``, the RNG states) in one safetensors file, tensors under
dotted keys and the structure as JSON in the header, so that resuming never unpickles (no ``torch.load``). Model
files (:func:`save_model_file`): a plain safetensors state dict, readable by timm, with the run's metadata in the
header (:func:`read_model_meta`). Resumable checkpoints: a state file (``last.safetensors``, written by
:func:`save_state`) read back by :func:`read_checkpoint`, the one answer to a checkpoint that does not read.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import secrets
import shutil
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch

__all__ = ["atomic_path", "save_safetensors_atomic", "write_text_atomic", "write_bytes_atomic", "write_json_atomic",
           "link_or_copy_atomic", "remove_temp_files", "HashingReader", "file_sha256", "save_state", "load_state",
           "is_state_file", "safetensors_metadata", "save_model_file", "read_model_meta", "CHECKPOINT_LAST",
           "read_checkpoint", "remove_checkpoint", "staging_folder", "state_dict_mismatch"]

_TMP_SUFFIX = ".tmp"


def _create_temp(path: Path, create: Optional[Callable[[Path], Any]] = None) -> Tuple[Any, Path]:
    """A new, exclusively created ``.<name>.<random>.tmp`` beside ``path`` (parents made): ``create(tmp)``'s result
    (default: the descriptor of a new file) and the temporary path. ``create`` must fail on an existing name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    create = create or (lambda tmp: os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}{_TMP_SUFFIX}")
        try:
            return create(tmp), tmp
        except FileExistsError:  # 48 random bits: practically never
            continue


@contextlib.contextmanager
def atomic_path(path) -> Iterator[Path]:
    """A temporary path beside ``path`` for a writer that takes a file name (``save_file``, ``to_parquet``,
    ``savefig``); on a clean exit it replaces ``path`` with the umask's mode (``0o644`` usually, whatever mode the
    writer left), on an error it is removed."""
    path = Path(path)
    fd, tmp = _create_temp(path)
    mode = os.fstat(fd).st_mode & 0o777
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if tmp.exists():
            tmp.unlink()
        raise


def save_safetensors_atomic(path, tensors: Dict[str, torch.Tensor], metadata: Dict[str, str]) -> None:
    """``save_file`` to a temporary name in the same folder, then ``os.replace``: readers never see a partial file."""
    from safetensors.torch import save_file

    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=metadata)


def write_text_atomic(path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` through a temporary file and ``os.replace``."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_bytes_atomic(path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and ``os.replace``."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_json_atomic(path, obj, indent: Optional[int] = 2, sort_keys: bool = False) -> None:
    """``obj`` as JSON (``default=str`` for paths and other plain values), written atomically."""
    write_text_atomic(path, json.dumps(obj, indent=indent, sort_keys=sort_keys, default=str))


#: os.link errors that mean "this filesystem gives no hard link here": another device, or links not supported
_NO_HARD_LINK = (errno.EXDEV, errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP)


def link_or_copy_atomic(src, dst) -> bool:
    """Make ``dst`` the file ``src`` is, without writing its bytes again: a hard link made under a temporary name
    beside ``dst``, then ``os.replace``. Where the filesystem gives no hard link (``EXDEV``: another device;
    ``EPERM`` / ``ENOTSUP`` / ``EOPNOTSUPP``: not supported), ``dst`` is a copy, written atomically; any other
    error is raised. True when linked.

    A link stays the content ``src`` had: the writers here replace a file (a new inode), never write into it.
    """
    src, dst = Path(src), Path(dst)
    try:
        _, tmp = _create_temp(dst, lambda tmp: os.link(src, tmp))
    except OSError as e:
        if e.errno not in _NO_HARD_LINK:
            raise
        with atomic_path(dst) as tmp:
            shutil.copyfile(src, tmp)
        return False
    try:
        os.replace(tmp, dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return True


@contextlib.contextmanager
def staging_folder(path) -> Iterator[Path]:
    """A new folder ``.<name>.<random>.tmp`` beside ``path`` to write an output folder into: renamed to ``path`` on a
    clean exit (a ``ValueError`` if ``path`` appeared meanwhile), removed with its contents on an error, so the
    output exists complete or not at all. Created with the mode ``mkdir`` gives (``0o777`` less the umask:
    ``0o755`` usually), not ``tempfile.mkdtemp``'s owner-only ``0o700``."""
    path = Path(path)
    _, tmp = _create_temp(path, lambda tmp: tmp.mkdir(0o777))
    try:
        yield tmp
        if path.exists():
            raise ValueError(f"{path} appeared while it was written; nothing of this run was kept")
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def remove_temp_files(folder) -> List[Path]:
    """Delete the temporary files these writers leave in ``folder`` when killed (``.<name>.<random>.tmp``); returns
    what was removed. Only for a folder no other process writes to (e.g. a run folder whose lock is held)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    stale = [p for p in folder.iterdir() if p.name.startswith(".") and p.name.endswith(_TMP_SUFFIX) and p.is_file()]
    for p in stale:
        p.unlink(missing_ok=True)
    return stale


class HashingReader:
    """A binary file's reader that feeds every byte it hands out to a SHA-256, so that a parser (``pickle``) reads a
    file and its digest is taken in the same single read. ``read``, ``readinto`` and ``readline`` as the file's."""

    def __init__(self, f):
        self._f, self._hash = f, hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self._f.read(size)
        self._hash.update(data)
        return data

    def readinto(self, buffer) -> int:
        n = self._f.readinto(buffer)
        self._hash.update(memoryview(buffer)[:n])
        return n

    def readline(self, size: int = -1) -> bytes:
        data = self._f.readline(size)
        self._hash.update(data)
        return data

    def hexdigest(self) -> str:
        """The SHA-256 (hex) of the whole file: what was not read yet is read (and hashed) first."""
        while self.read(1 << 20):
            pass
        return self._hash.hexdigest()


def file_sha256(path) -> str:
    """The SHA-256 (hex) of a file, read in 1 MiB chunks."""
    with open(path, "rb") as f:
        return HashingReader(f).hexdigest()


# ---------------------------------------------------------------------------------------------------------------
# safetensors state and model files
# ---------------------------------------------------------------------------------------------------------------
_STATE_KEY, _META_KEY = "timm_csm_state", "timm_csm_meta"


def _flatten_state(obj, prefix: str, tensors: Dict[str, torch.Tensor]):
    """JSON skeleton of a nested state whose tensors are moved to ``tensors`` under dotted keys."""
    if isinstance(obj, torch.Tensor):
        tensors[prefix] = obj.detach().cpu().clone().contiguous()
        return {"__tensor__": prefix}
    if isinstance(obj, dict):
        return {"__dict__": [[k, _flatten_state(v, f"{prefix}.{k}", tensors)] for k, v in obj.items()]}
    if isinstance(obj, (list, tuple)):
        items = [_flatten_state(v, f"{prefix}.{i}", tensors) for i, v in enumerate(obj)]
        return {"__tuple__": items} if isinstance(obj, tuple) else items
    if isinstance(obj, (np.integer, np.floating)):
        return obj.item()
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"cannot store {type(obj).__name__} at {prefix!r} in a safetensors state file")


def _unflatten_state(skeleton, tensors: Dict[str, torch.Tensor]):
    if isinstance(skeleton, dict):
        if "__tensor__" in skeleton:
            return tensors[skeleton["__tensor__"]]
        if "__dict__" in skeleton:
            return {k: _unflatten_state(v, tensors) for k, v in skeleton["__dict__"]}
        if "__tuple__" in skeleton:
            return tuple(_unflatten_state(v, tensors) for v in skeleton["__tuple__"])
    if isinstance(skeleton, list):
        return [_unflatten_state(v, tensors) for v in skeleton]
    return skeleton


def save_state(path, state: Dict[str, Any]) -> None:
    """Write a nested dict of tensors and JSON values to one safetensors file (atomically)."""
    tensors: Dict[str, torch.Tensor] = {}
    skeleton = _flatten_state(state, "s", tensors)
    save_safetensors_atomic(path, tensors, {"format": "pt", _STATE_KEY: json.dumps(skeleton)})


def safetensors_metadata(path) -> Optional[Dict[str, str]]:
    """The header metadata of a safetensors file (``{}`` when it has none); None for a file in another format (a
    torch checkpoint). A file that is named ``*.safetensors`` or starts like one (8-byte header length, then
    ``{``) but cannot be read, e.g. truncated by a kill or a full disk, is a ``ValueError`` naming it."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return f.metadata() or {}
    except SafetensorError as e:
        with open(path, "rb") as f:
            head = f.read(9)
        if str(path).endswith(".safetensors") or head[8:9] == b"{":
            raise ValueError(f"{path} is not a readable safetensors file (truncated or corrupt: {e}); write it "
                             "again or choose another file") from e
        return None


def is_state_file(path) -> bool:
    """Whether ``path`` was written by :func:`save_state`."""
    return _STATE_KEY in (safetensors_metadata(path) or {})


def load_state(path) -> Dict[str, Any]:
    """Read a file written by :func:`save_state` (``ValueError`` naming a truncated / corrupt or foreign file)."""
    from safetensors import safe_open

    meta = safetensors_metadata(path)
    if meta is None or _STATE_KEY not in meta:
        raise ValueError(f"{path} is not a timm-csm state file (no {_STATE_KEY!r} metadata)")
    with safe_open(str(path), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    return _unflatten_state(json.loads(meta[_STATE_KEY]), tensors)


def save_model_file(path, model_state: Dict[str, torch.Tensor], meta: Dict[str, Any]) -> None:
    """Write model weights as a plain safetensors state dict (loadable by ``timm.models.load_checkpoint`` and
    ``pretrained_cfg_overlay=dict(file=...)``), with the run's metadata as JSON in the header (atomically)."""
    tensors = {k: v.detach().cpu().clone().contiguous() for k, v in model_state.items()}
    save_safetensors_atomic(path, tensors, {"format": "pt", _META_KEY: json.dumps(meta)})


def state_dict_mismatch(model: torch.nn.Module, state: Dict[str, torch.Tensor], shown: int = 3) -> Optional[str]:
    """Why ``state`` does not load into ``model`` strictly, in one short line (the counts of missing, unexpected and
    differently shaped keys, ``shown`` of each), or None when it fits. ``load_state_dict``'s own error lists every
    key on many lines: thousands of characters for another architecture."""
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shapes = [f"{k}: file {tuple(state[k].shape)}, model {tuple(own[k].shape)}" for k in own
              if k in state and hasattr(state[k], "shape") and tuple(state[k].shape) != tuple(own[k].shape)]
    parts = [f"{len(keys)} {what} (" + ", ".join(keys[:shown]) + (", ..." if len(keys) > shown else "") + ")"
             for what, keys in (("keys missing", missing), ("unexpected", unexpected),
                                ("of another shape", shapes)) if keys]
    return "; ".join(parts) if parts else None


class _NoTensors(dict):
    def __missing__(self, key):
        return None


def read_model_meta(path) -> Optional[Dict[str, Any]]:
    """The run metadata of a model file or a training-state file (its ``meta`` entry; None for other weight
    files); a truncated or corrupt safetensors file is a ``ValueError`` naming it."""
    meta = safetensors_metadata(path) or {}
    if _META_KEY in meta:
        return json.loads(meta[_META_KEY])
    if _STATE_KEY not in meta:
        return None
    state = _unflatten_state(json.loads(meta[_STATE_KEY]), _NoTensors())
    return state.get("meta") if isinstance(state, dict) else None


# ---------------------------------------------------------------------------------------------------------------
# resumable checkpoints
# ---------------------------------------------------------------------------------------------------------------
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
