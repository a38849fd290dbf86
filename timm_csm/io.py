"""File writing shared across the package: files appear complete or not at all.

Every writer goes through a temporary file ``.<name>.<random>.tmp`` beside the target, then ``os.replace``. The
temporary file is created with the mode a plain ``open`` gives (``0o666`` less the process umask: ``0o644`` under
the usual umask ``022``), not ``tempfile.mkstemp``'s owner-only ``0o600``. A writer killed mid-write leaves its
temporary file behind; :func:`remove_temp_files` deletes such leftovers from a folder the caller owns.
"""
from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Dict, List, Tuple

import torch

__all__ = ["save_safetensors_atomic", "write_text_atomic", "remove_temp_files"]

_TMP_SUFFIX = ".tmp"


def _create_temp(path: Path) -> Tuple[int, Path]:
    """A new, exclusively created ``.<name>.<random>.tmp`` beside ``path`` (parents made); its descriptor and path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}{_TMP_SUFFIX}")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:  # 48 random bits: practically never
            continue


def _replace_or_remove(tmp: Path, path: Path, write) -> None:
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if tmp.exists():
            tmp.unlink()
        raise


def save_safetensors_atomic(path, tensors: Dict[str, torch.Tensor], metadata: Dict[str, str]) -> None:
    """``save_file`` to a temporary name in the same folder, then ``os.replace``: readers never see a partial file."""
    from safetensors.torch import save_file

    path = Path(path)
    fd, tmp = _create_temp(path)
    mode = os.fstat(fd).st_mode & 0o777  # the umask's mode; save_file itself leaves 0o600
    os.close(fd)

    def write(t):
        save_file(tensors, str(t), metadata=metadata)
        os.chmod(t, mode)

    _replace_or_remove(tmp, path, write)


def write_text_atomic(path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` through a temporary file and ``os.replace``."""
    path = Path(path)
    fd, tmp = _create_temp(path)

    def write(_):
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)

    _replace_or_remove(tmp, path, write)


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
