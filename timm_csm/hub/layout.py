"""Write a CSM dataset in the Hub repository layout, offline.

The layout is what ``DatasetDict.push_to_hub`` produces: ``data/<split>-0000K-of-0000N.parquet`` (images embedded as
bytes, row groups sized as ``datasets`` sizes them for images) and a ``README.md`` whose YAML block holds
``dataset_info`` (features, splits, sizes) and ``configs`` (``data_files`` per split). ``load_dataset(folder)`` and
the Hub's viewer read it as is, and :func:`~timm_csm.hub.push.push_csm_dataset` uploads it unchanged in content.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Dict, Optional, Sequence, Union

from .build import build_csm_dataset
from .card import card_metadata, render_card_body

__all__ = ["save_csm_dataset", "README", "DATA_DIR"]

README = "README.md"
DATA_DIR = "data"


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


def save_csm_dataset(dataset, folder, provenance: Optional[Dict] = None,
                     class_names: Optional[Sequence[str]] = None, lambdas: Optional[Sequence[float]] = None,
                     max_shard_size: Union[int, str] = "500MB") -> Path:
    """Validate ``dataset`` (a ``Dataset``, saved as split ``train``, or a ``DatasetDict``) and write it to
    ``folder`` in the Hub layout with a dataset card built from ``provenance``.

    ``folder`` should be named ``csm-<dataset>-aug`` (see :func:`~timm_csm.hub.build.csm_dataset_name`): its base
    name is the name under which :func:`~timm_csm.hub.install.install_dataset` registers it. The folder is replaced
    atomically: it holds either the previous complete copy or the new one.
    """
    import datasets
    from datasets.info import DatasetInfo, DatasetInfosDict
    from datasets.splits import SplitDict, SplitInfo
    from datasets.utils.metadata import MetadataConfigs
    from huggingface_hub import DatasetCardData

    folder = Path(folder).absolute()
    if class_names is None:
        first = dataset[next(iter(dataset))] if isinstance(dataset, datasets.DatasetDict) else dataset
        class_names = first.features["label"].names if "label" in first.features else None
        if class_names is None:
            raise ValueError("pass class_names: the dataset has no 'label' ClassLabel column")
    dd = build_csm_dataset(dataset, class_names, lambdas)
    prov = dict(provenance or {})
    prov.setdefault("name", folder.name)

    tmp = folder.parent / f".{folder.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / DATA_DIR).mkdir(parents=True)
    try:
        was_enabled = not datasets.utils.are_progress_bars_disabled()
        datasets.utils.disable_progress_bars()
        try:
            info = DatasetInfo(config_name="default", features=dd[next(iter(dd))].features, splits=SplitDict(),
                               download_size=0, dataset_size=0)
            for split, ds in dd.items():
                nbytes, written = _write_split(ds, split, tmp / DATA_DIR, max_shard_size)
                info.splits.add(SplitInfo(name=split, num_bytes=nbytes, num_examples=len(ds)))
                info.download_size += written
                info.dataset_size += nbytes
            info.size_in_bytes = info.download_size + info.dataset_size
        finally:
            if was_enabled:
                datasets.utils.enable_progress_bars()
        card_data = DatasetCardData(**card_metadata(prov, sum(len(ds) for ds in dd.values())))
        DatasetInfosDict({"default": info}).to_dataset_card_data(card_data)
        MetadataConfigs({"default": {"data_files": [{"split": s, "path": f"{DATA_DIR}/{s}-*"} for s in dd]}}
                        ).to_dataset_card_data(card_data)
        text = f"---\n{card_data.to_yaml()}\n---\n\n{render_card_body(dd, prov)}"
        (tmp / README).write_text(text, encoding="utf-8")
        old = folder.parent / f".{folder.name}.old-{os.getpid()}"
        if folder.exists():
            os.replace(folder, old)
        os.replace(tmp, folder)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder
