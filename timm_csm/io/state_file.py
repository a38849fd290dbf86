"""State files: a nested dict of tensors, numbers, strings, lists and tuples (an optimizer's, a scheduler's or an
EMA's ``state_dict``, the RNG states) in one safetensors file, tensors under dotted keys and the structure as JSON in
the header, so that resuming never unpickles (no ``torch.load``); and the header reader every safetensors file here
is checked with.
"""
from __future__ import annotations

import json
from typing import Any, Dict, Optional

import numpy as np
import torch

from .atomic import save_safetensors_atomic

__all__ = ["save_state", "load_state", "is_state_file", "safetensors_metadata"]

_STATE_KEY = "timm_csm_state"


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
