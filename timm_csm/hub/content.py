"""What a CSM dataset holds, wherever it is stored: its training split, the fingerprint of its content, and why a
name or folder does not load as one."""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Dict, Optional

import numpy as np

from .install import load_csm_dataset

__all__ = ["FINGERPRINT_COLUMNS", "train_split", "content_fingerprint", "csm_dataset_problem"]

#: the columns that define what a generated set teaches: its pixels, labels, ratios and groups
FINGERPRINT_COLUMNS = ("image", "soft_label", "lambda_gen", "lambda_hat", "group_id", "class_a", "class_b")
_FINGERPRINTS: Dict[str, str] = {}


def train_split(dd):
    """The ``train`` split of a ``DatasetDict``, or the dataset itself."""
    return dd["train"] if hasattr(dd, "keys") and "train" in dd else dd


def content_fingerprint(name_or_path) -> str:
    """sha256 of a CSM dataset's content (image bytes, soft labels, ratios, groups, in row order): the same for
    the same set wherever and however it is stored. Computed once per folder and process."""
    key = str(Path(name_or_path).resolve()) if Path(name_or_path).exists() else str(name_or_path)
    if key not in _FINGERPRINTS:
        table = train_split(load_csm_dataset(str(name_or_path))).data.table
        h = hashlib.sha256()
        for name in FINGERPRINT_COLUMNS:
            column = table.column(name).combine_chunks()
            h.update(name.encode())
            if name == "image":
                for item in column.field("bytes").to_pylist():
                    h.update(len(item).to_bytes(8, "little") + item)
            elif name == "soft_label":
                h.update(np.ascontiguousarray(column.flatten().to_numpy(), dtype=np.float32).tobytes())
            else:
                h.update(np.ascontiguousarray(column.to_numpy(), dtype=np.float64).tobytes())
        _FINGERPRINTS[key] = h.hexdigest()
    return _FINGERPRINTS[key]


def csm_dataset_problem(name_or_path) -> Optional[str]:
    """None when ``name_or_path`` loads as a CSM dataset, else why not (one line)."""
    try:
        load_csm_dataset(str(name_or_path))
    except Exception as e:  # missing folder, not installed, offline Hub
        return f"{type(e).__name__}: {e}"
    return None
