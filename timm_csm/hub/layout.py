"""Write a CSM dataset in the Hub repository layout, offline.

The layout is what ``DatasetDict.push_to_hub`` produces, with the shards in a versioned subfolder:
``data/<version>/<split>-0000K-of-0000N.parquet`` (images embedded as bytes, row groups sized as ``datasets`` sizes
them for images) and a ``README.md`` whose YAML block holds ``dataset_info`` (features, splits, sizes) and
``configs`` (``data_files`` per split, ``data/<version>/<split>-*``). ``load_dataset(folder)`` and the Hub's viewer
read it as is, and :func:`~timm_csm.hub.push.push_csm_dataset` uploads it (``push_to_hub`` writes the Hub copy's
shards as ``data/<split>-*``).

Replacing a saved dataset never leaves the folder without a complete copy: the new shards go into a new version
subfolder, which no reader sees until ``README.md`` is replaced (one atomic ``os.replace``) by the card that points
to them. The previous version is kept for readers still reading it; every other entry of ``data/`` is removed.
"""
from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Union

from ..io import write_text_atomic
from .build import build_csm_dataset
from .card import card_metadata, render_card_body

__all__ = ["save_csm_dataset", "data_files", "folder_fingerprint", "README", "DATA_DIR"]

README = "README.md"
DATA_DIR = "data"


def data_files(folder) -> Dict[str, List[Path]]:
    """The shard files of each split that ``folder``'s ``README.md`` points to (its ``configs`` ``data_files``);
    empty when the folder has no card or the card names no existing file."""
    from huggingface_hub.repocard import metadata_load

    folder = Path(folder)
    if not (folder / README).is_file():
        return {}
    configs = (metadata_load(folder / README) or {}).get("configs") or []
    files: Dict[str, List[Path]] = {}
    for entry in (configs[0].get("data_files") or []) if configs else []:
        patterns = entry["path"] if isinstance(entry["path"], list) else [entry["path"]]
        found = sorted({p for pattern in patterns for p in folder.glob(pattern) if p.is_file()})
        if found:
            files[entry["split"]] = found
    return files


def folder_fingerprint(folder) -> str:
    """sha256 (20 hex) over ``README.md`` and the content of every shard it points to: changes whenever a byte of
    the dataset does, and is the same for two copies of one dataset."""
    folder = Path(folder)
    h = hashlib.sha256((folder / README).read_bytes())
    for split, paths in sorted(data_files(folder).items()):
        for path in paths:
            h.update(f"{split}:{path.relative_to(folder).as_posix()}:{path.stat().st_size}".encode())
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
    return h.hexdigest()[:20]


def _nbytes(ds) -> int:
    estimate = getattr(ds, "_estimate_nbytes", None)  # counts external image files too, as push_to_hub does
    return int(estimate()) if callable(estimate) else int(ds.data.nbytes)


def _write_split(ds, split: str, data_dir: Path, max_shard_size) -> tuple:
    from datasets.arrow_writer import get_writer_batch_size_from_data_size, get_writer_batch_size_from_features
    from datasets.table import embed_table_storage
    from datasets.utils.py_utils import convert_file_size_to_int

    nbytes = _nbytes(ds)
    batch = get_writer_batch_size_from_features(ds.features) or get_writer_batch_size_from_data_size(len(ds), nbytes)
    num_shards = int(nbytes / convert_file_size_to_int(max_shard_size)) + 1
    written = 0
    for index in range(num_shards):
        shard = ds.shard(num_shards=num_shards, index=index, contiguous=True)
        fmt = shard.format
        shard = shard.with_format("arrow").map(embed_table_storage, batched=True, batch_size=batch,
                                               keep_in_memory=True)  # image paths -> bytes, as push_to_hub does
        shard = shard.with_format(**fmt)
        path = data_dir / f"{split}-{index:05d}-of-{num_shards:05d}.parquet"
        shard.to_parquet(str(path), batch_size=batch)
        written += path.stat().st_size
    return nbytes, written


def _new_version() -> str:
    """``<UTC time to the microsecond>-<random>``: in writing order, and unique across processes."""
    now = time.time()
    return f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime(now))}.{int(now % 1 * 1e6):06d}-{secrets.token_hex(3)}"


def _in_use(folder: Path) -> set:
    """The entries of ``folder/data`` that the current card points to (a version subfolder, or legacy flat shards)."""
    data = folder / DATA_DIR
    return {p.relative_to(data).parts[0] for paths in data_files(folder).values() for p in paths
            if p.is_relative_to(data)}


def _prune(folder: Path, keep: set) -> None:
    for entry in (folder / DATA_DIR).iterdir():
        if entry.name not in keep:
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()


def _card_text(dd, split_infos, prov: Dict, version: str) -> str:
    from datasets.info import DatasetInfosDict
    from datasets.utils.metadata import MetadataConfigs
    from huggingface_hub import DatasetCardData

    card_data = DatasetCardData(**card_metadata(prov, sum(len(ds) for ds in dd.values())))
    DatasetInfosDict({"default": split_infos}).to_dataset_card_data(card_data)
    paths = [{"split": s, "path": f"{DATA_DIR}/{version}/{s}-*"} for s in dd]
    MetadataConfigs({"default": {"data_files": paths}}).to_dataset_card_data(card_data)
    return f"---\n{card_data.to_yaml()}\n---\n\n{render_card_body(dd, prov)}"


def _write_version(dd, data_dir: Path, max_shard_size):
    """Write every split's shards into ``data_dir``; returns the ``DatasetInfo`` with their sizes."""
    import datasets
    from datasets.info import DatasetInfo
    from datasets.splits import SplitDict, SplitInfo

    data_dir.mkdir(parents=True)
    was_enabled = not datasets.utils.are_progress_bars_disabled()
    datasets.utils.disable_progress_bars()
    try:
        info = DatasetInfo(config_name="default", features=dd[next(iter(dd))].features, splits=SplitDict(),
                           download_size=0, dataset_size=0)
        for split, ds in dd.items():
            nbytes, written = _write_split(ds, split, data_dir, max_shard_size)
            info.splits.add(SplitInfo(name=split, num_bytes=nbytes, num_examples=len(ds)))
            info.download_size += written
            info.dataset_size += nbytes
        info.size_in_bytes = info.download_size + info.dataset_size
    finally:
        if was_enabled:
            datasets.utils.enable_progress_bars()
    return info


def save_csm_dataset(dataset, folder, provenance: Optional[Dict] = None,
                     class_names: Optional[Sequence[str]] = None, lambdas: Optional[Sequence[float]] = None,
                     max_shard_size: Union[int, str] = "500MB") -> Path:
    """Validate ``dataset`` (a ``Dataset``, saved as split ``train``, or a ``DatasetDict``) and write it to
    ``folder`` in the Hub layout with a dataset card built from ``provenance``.

    ``folder`` should be named ``csm-<dataset>-aug`` (see :func:`~timm_csm.hub.build.csm_dataset_name`): its base
    name is the name under which :func:`~timm_csm.hub.install.install_dataset` registers it. A new folder appears
    whole (written beside it, then renamed into place); an existing one holds a complete copy at every instant, the
    previous one until the card is switched to the new version (see the module docstring).
    """
    import datasets

    folder = Path(folder).absolute()
    if class_names is None:
        first = dataset[next(iter(dataset))] if isinstance(dataset, datasets.DatasetDict) else dataset
        class_names = first.features["label"].names if "label" in first.features else None
        if class_names is None:
            raise ValueError("pass class_names: the dataset has no 'label' ClassLabel column")
    dd = build_csm_dataset(dataset, class_names, lambdas)
    prov = dict(provenance or {})
    prov.setdefault("name", folder.name)

    version = _new_version()
    fresh = not folder.exists()
    root = folder.parent / f".{folder.name}.tmp-{os.getpid()}-{version}" if fresh else folder
    written = root if fresh else root / DATA_DIR / version
    previous = set() if fresh else _in_use(folder)
    try:
        info = _write_version(dd, root / DATA_DIR / version, max_shard_size)
        write_text_atomic(root / README, _card_text(dd, info, prov, version))  # the switch: readers see the new version
        if fresh:
            os.rename(root, folder)
    except BaseException:
        shutil.rmtree(written, ignore_errors=True)
        raise
    _prune(folder, previous | {version})
    return folder
