"""File writing shared across the package: files appear complete or not at all."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Dict

import torch

__all__ = ["save_safetensors_atomic"]


def save_safetensors_atomic(path, tensors: Dict[str, torch.Tensor], metadata: Dict[str, str]) -> None:
    """``save_file`` to a temporary name in the same folder, then ``os.replace``: readers never see a partial file."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=metadata)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
