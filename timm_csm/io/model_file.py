"""Model files: a plain safetensors state dict, readable by timm, with the run's metadata in the header; the metadata
read back (also from a state file), and why a state dict does not fit a model, in one line.
"""
from __future__ import annotations

import json
from typing import Any, Dict, Optional

import torch

from .atomic import save_safetensors_atomic
from .state_file import _STATE_KEY, _unflatten_state, safetensors_metadata

__all__ = ["save_model_file", "read_model_meta", "state_dict_mismatch"]

_META_KEY = "timm_csm_meta"


def save_model_file(path, model_state: Dict[str, torch.Tensor], meta: Dict[str, Any]) -> None:
    """Write model weights as a plain safetensors state dict (loadable by ``timm.models.load_checkpoint`` and
    ``pretrained_cfg_overlay=dict(file=...)``), with the run's metadata as JSON in the header (atomically)."""
    tensors = {k: v.detach().cpu().clone().contiguous() for k, v in model_state.items()}
    save_safetensors_atomic(path, tensors, {"format": "pt", _META_KEY: json.dumps(meta)})


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
