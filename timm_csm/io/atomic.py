"""Atomic writers: files and folders appear complete or not at all.

Every writer goes through a temporary file ``.<name>.<random>.tmp`` beside the target, then ``os.replace``. The
temporary file is created with the mode a plain ``open`` gives (``0o666`` less the process umask: ``0o644`` under the
usual umask ``022``), not ``tempfile.mkstemp``'s owner-only ``0o600``. A writer killed mid-write leaves its temporary
file behind; :func:`remove_temp_files` deletes such leftovers from a folder the caller owns.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import shutil
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch

__all__ = ["atomic_path", "save_safetensors_atomic", "write_text_atomic", "write_bytes_atomic", "write_json_atomic",
           "link_or_copy_atomic", "staging_folder", "remove_temp_files"]

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
