"""Read an NVlabs EDM network pickle (``network-snapshot-*.pkl``, ``edm-cifar10-32x32-cond-vp.pkl``) without running
any code from it.

The format (NVlabs/edm ``torch_utils/persistence.py`` and ``training/training_loop.py``): a plain ``pickle`` of
``dict(ema=net, loss_fn=..., augment_pipe=..., dataset_kwargs=...)`` in which every network object is a
*persistent-object record*: a call of ``torch_utils.persistence._reconstruct_persistent_obj`` on
``dict(type='class', version=6, module_src=<the Python source of the module defining the class>,
class_name=<name>, state=<the module's __dict__>)``. The state holds ``_parameters`` / ``_buffers`` / ``_modules``
(submodules are records, or ``torch.nn.ModuleDict`` objects), attributes, and ``_init_args`` / ``_init_kwargs``:
the constructor arguments. Tensors are ``torch._utils._rebuild_parameter`` / ``_rebuild_tensor_v2`` calls on
storages pickled as ``torch.storage._load_from_bytes(<legacy torch.save bytes>)``; NumPy scalars (EDM's
``np.sqrt(0.5)`` skip scales) appear as ``numpy.core.multiarray.scalar``.

NVlabs' own loader executes ``module_src`` to rebuild the classes. Here :class:`EDMUnpickler` resolves only the
names listed above, each to a local data constructor (a :class:`PersistentRecord`, a tensor from the storage bytes
read by ``torch.load(weights_only=True)``, a plain number); the module source is kept as an inert string and never
executed, and any other global (``os.system``, ``builtins.eval``, another class) stops the load with an
:class:`UnsafePickleError` that names it. :func:`load_edm_network` then builds our re-implementation of the class
the record names (:mod:`~timm_csm.generation.edm.precond`) from its recorded constructor arguments and loads the
recorded tensors into it strictly.
"""
from __future__ import annotations

import collections
import io
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Tuple

import numpy as np
import torch

from ...io import HashingReader
from .precond import PRECONDITIONERS

__all__ = ["EDMUnpickler", "PersistentRecord", "UnsafePickleError", "read_edm_pickle", "load_edm_network",
           "record_state_dict"]


class UnsafePickleError(pickle.UnpicklingError):
    """The pickle needs something this loader does not construct (a global outside the EDM format)."""


@dataclass
class PersistentRecord:
    """One persistent object of NVlabs' format: its class name, its module's source (never executed) and state."""

    class_name: str
    module_src: str
    state: Dict[str, Any]
    version: int = 0


class ContainerRecord:
    """A plain ``torch.nn`` container (``ModuleDict``, ...) inside a network: no constructor runs, pickle's BUILD
    hands it the container's state (its ``__dict__``), kept as ``state``."""

    class_name = "container"

    def __setstate__(self, state):
        if not isinstance(state, dict):
            raise UnsafePickleError(f"the state of a {self.class_name} must be a dict, got {type(state).__name__}")
        self.state = state


class _EasyDict(dict):
    """Stand-in for ``dnnlib.util.EasyDict`` (a dict with attribute access) in recorded arguments."""


def _record(meta) -> PersistentRecord:
    if not isinstance(meta, dict) or meta.get("type") != "class" or not isinstance(meta.get("class_name"), str):
        raise UnsafePickleError(f"a persistent-object record must be dict(type='class', class_name=..., ...), got "
                                f"{type(meta).__name__} with keys {sorted(meta) if isinstance(meta, dict) else '-'}")
    state = meta.get("state") or {}
    if not isinstance(state, dict):
        raise UnsafePickleError(f"the record of {meta['class_name']} holds a state of type {type(state).__name__}")
    return PersistentRecord(meta["class_name"], str(meta.get("module_src", "")), dict(state),
                            int(meta.get("version", 0)))


def _storage_from_bytes(data: bytes):
    """A storage from the legacy ``torch.save`` bytes of ``TypedStorage.__reduce__``, read with ``weights_only``."""
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise UnsafePickleError(f"a tensor storage in the pickle does not read as plain tensor data: {e}") from e


def _rebuild_tensor(storage, offset, size, stride, requires_grad=False, hooks=None, metadata=None):
    if not isinstance(storage, torch.TypedStorage):
        raise UnsafePickleError(f"a tensor must be built on a storage, got {type(storage).__name__}")
    return torch.empty(0, dtype=storage.dtype).set_(storage._untyped_storage, offset, tuple(size), tuple(stride))


def _rebuild_parameter(data, requires_grad=False, hooks=None, state=None):
    if not torch.is_tensor(data):
        raise UnsafePickleError(f"a parameter must hold a tensor, got {type(data).__name__}")
    return data


def _numpy_scalar(dtype, data=None):
    if not isinstance(dtype, np.dtype) or dtype.kind not in "biuf" or not isinstance(data, bytes):
        raise UnsafePickleError(f"only numeric NumPy scalars are read, got dtype {dtype!r}")
    return np.frombuffer(data, dtype=dtype)[0].item()


_NAMES = {
    ("torch_utils.persistence", "_reconstruct_persistent_obj"): _record,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    ("torch.storage", "_load_from_bytes"): _storage_from_bytes,
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("numpy", "dtype"): np.dtype,
    ("numpy.core.multiarray", "scalar"): _numpy_scalar,
    ("numpy._core.multiarray", "scalar"): _numpy_scalar,
    ("dnnlib.util", "EasyDict"): _EasyDict,
    **{("torch.nn.modules.container", name): type(name, (ContainerRecord,), {"class_name": name})
       for name in ("ModuleDict", "ModuleList", "Sequential")},
}


class EDMUnpickler(pickle.Unpickler):
    """An unpickler that constructs only the data of NVlabs' network pickles (see the module docstring)."""

    def find_class(self, module: str, name: str):
        try:
            return _NAMES[(module, name)]
        except KeyError:
            raise UnsafePickleError(
                f"the pickle refers to {module}.{name}, which is not part of an EDM network pickle; refusing to "
                "load it (this loader constructs only EDM's records, tensors and plain values, and runs no code "
                "from the file)") from None

    def persistent_load(self, pid):
        raise UnsafePickleError(f"the pickle holds a persistent id {str(pid)[:80]!r}; EDM network pickles hold none "
                                "(a torch.save checkpoint reads with torch.load(..., weights_only=True))")


def read_edm_pickle(path) -> Tuple[Any, str]:
    """``(content, sha256)``: the unpickled content of an EDM pickle, a dict (``ema``, ``loss_fn``, ...) of
    :class:`PersistentRecord`\\s, tensors and plain values, and the SHA-256 (hex) of the file, hashed as it is read
    (:class:`~timm_csm.io.HashingReader`): the file is read once."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"EDM network pickle not found: {path}")
    with open(path, "rb") as f:
        if f.peek(4)[:4] == b"PK\x03\x04":
            raise ValueError(f"{path} is a zip archive (a torch.save checkpoint), not an EDM network pickle")
        reader = HashingReader(f)
        try:
            content = EDMUnpickler(reader).load()
        except UnsafePickleError as e:
            raise UnsafePickleError(f"{path}: {e}") from None
        return content, reader.hexdigest()


def _module_state(obj, where: str) -> Dict[str, Any]:
    if isinstance(obj, (PersistentRecord, ContainerRecord)):
        return getattr(obj, "state", {})
    raise ValueError(f"{where or 'the network'} is a {type(obj).__name__}, not a module record")


def record_state_dict(record, prefix: str = "") -> Dict[str, torch.Tensor]:
    """The ``state_dict`` a module record describes: its parameters and persistent buffers, then its submodules'."""
    state = _module_state(record, prefix.rstrip("."))
    out: Dict[str, torch.Tensor] = {}
    skip = set(state.get("_non_persistent_buffers_set") or ())
    for kind in ("_parameters", "_buffers"):
        for name, t in (state.get(kind) or {}).items():
            if t is None or (kind == "_buffers" and name in skip):
                continue
            if not torch.is_tensor(t):
                raise ValueError(f"{prefix}{name} is a {type(t).__name__}, not a tensor")
            out[prefix + name] = t
    for name, sub in (state.get("_modules") or {}).items():
        if sub is not None:
            out.update(record_state_dict(sub, f"{prefix}{name}."))
    return out


def _network_record(content, key: str) -> PersistentRecord:
    record = content.get(key) if isinstance(content, dict) else content
    if not isinstance(record, PersistentRecord):
        keys = sorted(content) if isinstance(content, dict) else type(content).__name__
        raise ValueError(f"no network record under {key!r} (the pickle holds {keys})")
    if record.class_name not in PRECONDITIONERS:
        raise ValueError(f"the network is a {record.class_name}; supported: {sorted(PRECONDITIONERS)} "
                         "(EDM's preconditioned denoisers)")
    return record


def _constructor_arguments(record: PersistentRecord) -> Tuple[tuple, Dict[str, Any]]:
    args, kwargs = record.state.get("_init_args"), record.state.get("_init_kwargs")
    if kwargs is None or args is None:
        raise ValueError(f"the {record.class_name} record holds no constructor arguments (_init_args / "
                         "_init_kwargs); it cannot be rebuilt")
    return tuple(args), dict(kwargs)


def load_edm_network(path, key: str = "ema", device="cpu") -> torch.nn.Module:
    """Our :class:`EDMPrecond` / :class:`VPPrecond` / :class:`VEPrecond` with the weights of an EDM pickle.

    ``key``: the entry of the pickle's dict (EDM's snapshots: ``ema``). The network is rebuilt from the record's
    constructor arguments, its state dict must match ours exactly (no missing, extra or reshaped tensor), and it is
    returned in eval mode without gradients. ``net.init_kwargs`` keeps the recorded arguments, ``net.file_sha256``
    the SHA-256 (hex) of the pickle, taken in the same read.
    """
    content, sha256 = read_edm_pickle(path)
    record = _network_record(content, key)
    args, kwargs = _constructor_arguments(record)
    try:
        net = PRECONDITIONERS[record.class_name](*args, **kwargs)
    except TypeError as e:
        raise ValueError(f"{path}: the recorded arguments of {record.class_name} ({sorted(kwargs)}) do not fit "
                         f"this re-implementation: {e}") from e
    state = record_state_dict(record)
    try:
        net.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise ValueError(f"{path}: the weights do not fit {record.class_name}({kwargs}): {e}") from e
    net.init_kwargs, net.file_sha256 = kwargs, sha256
    return net.to(device).eval().requires_grad_(False)
