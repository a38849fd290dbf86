"""Make a saved CSM dataset loadable by its bare name, and load CSM datasets by name or path.

``datasets`` resolves a bare name such as ``"csm-fmnist-aug"`` (no namespace) in only two ways offline: a folder of
that name in the working directory, or a dataset prepared in ``$HF_DATASETS_CACHE/csm-fmnist-aug/``. A bare name
can never be a Hub repository (Hub ids are ``org/name``). :func:`install_dataset` therefore loads the folder once
through a path whose base name is the dataset name, which prepares exactly that cache entry; afterwards
``load_dataset("csm-fmnist-aug")`` works from any working directory (instantly with ``HF_HUB_OFFLINE=1`` or
``HF_DATASETS_OFFLINE=1``; without them ``datasets`` first retries the Hub).

``datasets`` keys a folder's prepared copy by its ``README.md`` alone, so a shard changed in place (truncated,
edited, overwritten) would keep loading the stale copy. Folders are therefore loaded through
:func:`load_folder`, which stamps the prepared copy with :func:`~timm_csm.hub.layout.folder_fingerprint` (the
content of the card and of every shard) and prepares it again from the files when the stamp differs.
"""
from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Optional

from .layout import DATA_DIR, README, data_files, folder_fingerprint

__all__ = ["install_dataset", "load_csm_dataset", "load_folder", "is_installed"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# the commands that build and install the CSM datasets the recipes make, named when such a dataset is missing
_BUILT_BY = {"csm-fmnist-aug": "timm-csm-pipeline --profile demo (at toy size: --profile smoke)",
             "csm-digits-aug": "timm-csm-pipeline --profile demo --dataset digits",
             "csm-cifar100-aug": "timm-csm-pipeline --profile full (the paper's GPU recipe)"}
_STAMP = "timm_csm_fingerprint.txt"  # beside the prepared arrow files: the folder content they were prepared from


def _check_layout(folder: Path) -> None:
    if not folder.is_dir():
        raise FileNotFoundError(f"dataset folder not found: {folder}")
    if not data_files(folder):
        raise ValueError(f"{folder} is not in the Hub layout (needs {README} whose configs point to "
                         f"{DATA_DIR}/.../<split>-*.parquet files); write it with timm_csm.hub.save_csm_dataset")


def load_folder(folder, cache_dir=None, **builder_kwargs):
    """``DatasetDict`` of the Hub-layout ``folder``, prepared again whenever its files changed since the cached copy
    was prepared (see the module docstring). ``builder_kwargs`` go to ``datasets.load_dataset_builder``.

    Raises ValueError naming the folder when its files no longer load (a truncated shard, rows that disagree with
    the card's split sizes).
    """
    import datasets
    from filelock import FileLock

    folder = Path(folder)
    _check_layout(folder)
    fingerprint = folder_fingerprint(folder)
    builder = datasets.load_dataset_builder(str(folder), cache_dir=cache_dir, **builder_kwargs)
    entry = Path(builder.cache_dir)
    entry.parent.mkdir(parents=True, exist_ok=True)
    # one process at a time from the check to the open: another one (a training job's ranks) must not prepare the
    # entry again while this one opens it
    with FileLock(str(entry.parent / f".{entry.name}.timm_csm.lock")):
        stamp = entry / _STAMP
        fresh = stamp.is_file() and stamp.read_text() == fingerprint
        try:
            builder.download_and_prepare(download_mode=None if fresh else "force_redownload")
        except Exception as e:
            raise ValueError(f"the dataset at {folder} does not load ({type(e).__name__}: {e}); its files changed "
                             "or were damaged after it was written: write it again with "
                             "timm_csm.hub.save_csm_dataset") from e
        if not fresh:
            stamp.write_text(fingerprint)
        return builder.as_dataset()


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

    Installing again after the data changed prepares it again (a new card: a new cache entry; shards changed in
    place: the same entry, prepared afresh, see :func:`load_folder`), and that entry becomes the one a bare name
    loads (``datasets`` takes the most recently modified entry).
    """
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
        dd = load_folder(path, cache_dir=cache_dir)
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

    * an existing folder (any working directory): :func:`load_folder` (``load_dataset(<absolute path>)``, prepared
      again when the folder's files changed);
    * a bare name (``"csm-fmnist-aug"``): a folder of that name in the working directory, else the installed copy
      in the datasets cache (see :func:`install_dataset`), never the Hub;
    * ``"org/name"``: ``load_dataset`` (the Hub, or its cache when offline).

    Returns a ``DatasetDict`` (or the ``Dataset`` of ``split``).
    """
    import datasets

    key = os.fspath(name_or_path)
    path = Path(key).expanduser()
    if path.is_dir():
        dd = load_folder(path.absolute(), cache_dir=cache_dir, **load_kwargs)
        return dd[split] if split is not None else dd
    if "/" not in key and "\\" not in key:
        if not is_installed(key, cache_dir):
            how = _BUILT_BY.get(key, "timm-csm-generate, then timm-csm-annotate --install")
            raise FileNotFoundError(
                f"dataset {key!r} is neither a folder nor installed in {_cache_root(cache_dir)}: build and install "
                f"it with {how}; or pass its folder, or a Hub id 'org/{key}'")
        return _load_cached(key, cache_dir, split)
    return datasets.load_dataset(key, split=split, cache_dir=cache_dir, **load_kwargs)
