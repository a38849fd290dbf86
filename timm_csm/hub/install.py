"""Make a saved CSM dataset loadable by its bare name, and load CSM datasets by name or path.

``datasets`` resolves a bare name such as ``"csm-fmnist-aug"`` (no namespace) in only two ways offline: a folder of
that name in the working directory, or a dataset prepared in ``$HF_DATASETS_CACHE/csm-fmnist-aug/``. A bare name
can never be a Hub repository (Hub ids are ``org/name``). :func:`install_dataset` therefore loads the folder once
through a path whose base name is the dataset name, which prepares exactly that cache entry; afterwards
``load_dataset("csm-fmnist-aug")`` works from any working directory (instantly with ``HF_HUB_OFFLINE=1`` or
``HF_DATASETS_OFFLINE=1``; without them ``datasets`` first retries the Hub).
"""
from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Optional

from .layout import DATA_DIR, README

__all__ = ["install_dataset", "load_csm_dataset", "is_installed"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def _check_layout(folder: Path) -> None:
    if not folder.is_dir():
        raise FileNotFoundError(f"dataset folder not found: {folder}")
    if not (folder / README).is_file() or not any((folder / DATA_DIR).glob("*.parquet")):
        raise ValueError(f"{folder} is not in the Hub layout (needs {README} and {DATA_DIR}/<split>-*.parquet); "
                         "write it with timm_csm.hub.save_csm_dataset")


def _cache_root(cache_dir=None) -> Path:
    import datasets

    return Path(os.path.expanduser(str(cache_dir or datasets.config.HF_DATASETS_CACHE)))


def is_installed(name: str, cache_dir=None) -> bool:
    """Whether a prepared copy of ``name`` exists in the datasets cache."""
    from datasets.naming import camelcase_to_snakecase

    root = _cache_root(cache_dir) / camelcase_to_snakecase(name)
    return any(p.is_dir() for p in root.glob("*/*/*"))


def install_dataset(folder, name: Optional[str] = None, cache_dir=None):
    """Prepare the Hub-layout ``folder`` in the datasets cache under ``name`` (default: the folder's base name) so
    that ``datasets.load_dataset(name)`` works offline from any directory. Returns the loaded ``DatasetDict``.

    Installing again after the data changed prepares a new cache entry, which becomes the one a bare name loads
    (``datasets`` takes the most recently modified entry).
    """
    import datasets

    folder = Path(folder).absolute()
    _check_layout(folder)
    name = name or folder.name
    if not _NAME.match(name) or "/" in name:
        raise ValueError(f"invalid dataset name {name!r}: use letters, digits, '.', '_' and '-' (no namespace)")
    with tempfile.TemporaryDirectory(prefix="timm-csm-install-") as tmp:
        path = folder
        if folder.name != name:  # datasets names the cache entry after the folder's base name
            path = Path(tmp) / name
            path.symlink_to(folder, target_is_directory=True)
        dd = datasets.load_dataset(str(path), cache_dir=cache_dir)
    # the newest entry wins when a bare name is resolved: make this one the newest even when it existed already
    for ds in dd.values():
        for f in ds.cache_files:
            entry = Path(f["filename"]).parent
            os.utime(entry)
    return dd


def _load_cached(name: str, cache_dir=None, split: Optional[str] = None):
    """Load a prepared dataset from the cache without contacting the Hub."""
    from datasets.packaged_modules.cache.cache import Cache

    builder = Cache(cache_dir=str(_cache_root(cache_dir)), dataset_name=name, repo_id=name, version="auto",
                    hash="auto")
    return builder.as_dataset(split=split)


def load_csm_dataset(name_or_path, split: Optional[str] = None, cache_dir=None, **load_kwargs):
    """Load a CSM dataset from a folder, an installed bare name, or a Hub repository id.

    * an existing folder (any working directory): ``load_dataset(<absolute path>)``;
    * a bare name (``"csm-fmnist-aug"``): a folder of that name in the working directory, else the installed copy
      in the datasets cache (see :func:`install_dataset`), never the Hub;
    * ``"org/name"``: ``load_dataset`` (the Hub, or its cache when offline).

    Returns a ``DatasetDict`` (or the ``Dataset`` of ``split``).
    """
    import datasets

    key = os.fspath(name_or_path)
    path = Path(key).expanduser()
    if path.is_dir():
        _check_layout(path)
        return datasets.load_dataset(str(path.absolute()), split=split, cache_dir=cache_dir, **load_kwargs)
    if "/" not in key and "\\" not in key:
        if not is_installed(key, cache_dir):
            raise FileNotFoundError(
                f"dataset {key!r} is neither a folder nor installed in {_cache_root(cache_dir)}; install it with "
                f"timm_csm.install_dataset('<folder>/{key}'), pass its folder, or use a Hub id 'org/{key}'")
        return _load_cached(key, cache_dir, split)
    return datasets.load_dataset(key, split=split, cache_dir=cache_dir, **load_kwargs)
