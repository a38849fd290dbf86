"""Model files: a plain safetensors state dict, readable by timm, with the run's metadata in the header; the metadata
read back (also from a state file), and why a state dict does not fit a model, in one line.
"""
from __future__ import annotations

import hashlib
import json
import struct
from typing import Any, Dict, Optional

import torch

from .atomic import save_safetensors_atomic
from .state_file import _STATE_KEY, _unflatten_state, safetensors_metadata

__all__ = ["save_model_file", "read_model_meta", "tensors_sha256", "state_dict_mismatch"]

_META_KEY = "timm_csm_meta"


def save_model_file(path, model_state: Dict[str, torch.Tensor], meta: Dict[str, Any]) -> None:
    """Write model weights as a plain safetensors state dict (loadable by ``timm.models.load_checkpoint`` and
    ``pretrained_cfg_overlay=dict(file=...)``), with the run's metadata as JSON in the header (atomically)."""
    tensors = {k: v.detach().cpu().clone().contiguous() for k, v in model_state.items()}
    save_safetensors_atomic(path, tensors, {"format": "pt", _META_KEY: json.dumps(meta)})


def tensors_sha256(path) -> str:
    """The SHA-256 (hex) of a safetensors file's tensors: each name, dtype, shape and bytes, in name order. Two
    files of the same weights give the same digest whatever their header metadata holds (a run's id) and in
    whatever order safetensors wrote it (which changes from one process to the next), where the file's own sha256
    differs. A file that does not parse as safetensors is a ``ValueError`` naming it."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        (size,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + size])
        body = memoryview(data)[8 + size:]
        entries = {k: v for k, v in header.items() if k != "__metadata__"}
        digest = hashlib.sha256()
        for name in sorted(entries):
            start, end = entries[name]["data_offsets"]
            if not 0 <= start <= end <= len(body):
                raise ValueError(f"tensor {name!r} lies beyond the file's end")
            digest.update(json.dumps([name, entries[name]["dtype"], entries[name]["shape"], end - start]).encode())
            digest.update(body[start:end])
    except (struct.error, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path} is not a readable safetensors file (truncated or corrupt: {e}); write it again or "
                         "choose another file") from e
    return digest.hexdigest()


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
