"""Base class of the post-hoc calibrators: fit on validation logits, transform test logits, save as safetensors."""
from __future__ import annotations

import json
import os
from typing import Dict, Optional, Tuple

import torch

from ._checks import all_finite, as_logits, compute_dtype, non_finite_output_error
from .registry import calibrator_class, list_calibrators

__all__ = ["PostHocCalibrator", "load_calibrator", "check_finite_state"]

_COMPUTE_DTYPES = (torch.float32, torch.float64)


class PostHocCalibrator:
    """Fit on validation logits with ``fit(logits, targets) -> self``; ``transform(logits)`` returns calibrated
    logits (apply softmax for probabilities). ``state_dict()`` holds tensors; ``config()`` the constructor
    arguments; ``save(path)`` writes both to a safetensors file, ``load(path)`` restores a fitted calibrator.
    ``fit_info`` holds what an iterative fit reports (its iterations, its final objective), None otherwise."""

    #: the registered name written into saved files (set by :func:`~timm_csm.calibration.register_calibrator`)
    kind: str = ""
    fit_info: Optional[dict] = None
    # Where NaN or infinite logits show in ``_apply``'s output, so that an apply checks what it computed instead of
    # reading its input once more: "values" (an elementwise map with finite parameters: every non-finite logit gives
    # a non-finite output value), "rows" (an affine map of each row: a non-finite value in a row makes every output
    # value of that row non-finite, so the first column tells), or None (a map that can send NaN to a finite value,
    # as a table look-up: the input is checked before the apply).
    non_finite_shows_in: Optional[str] = None

    @property
    def is_fitted(self) -> bool:
        return bool(self.state_dict())

    def _require_fitted(self):
        if not self.is_fitted:
            raise ValueError(f"{type(self).__name__} is not fitted: call fit(val_logits, val_targets) first")

    def check_fit_dependencies(self) -> None:
        """Raise :class:`~timm_csm.extras.MissingExtra` when fitting needs an optional package that is absent
        (none by default); :func:`~timm_csm.calibration.create_calibrator` calls it, so the gap shows before any
        work. A saved calibrator loads and transforms without it."""

    def fit(self, logits, targets) -> "PostHocCalibrator":
        raise NotImplementedError

    def _apply(self, logits: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _derived(self, tag: str, source: torch.Tensor, like: torch.Tensor, make=None):
        """``make(source)`` (default: ``source``) of ``source`` in ``like``'s dtype and on its device, computed once
        per fitted state (a new ``source`` tensor, from ``fit`` or ``load_state_dict``, replaces it): the applies
        convert their parameters, or build their tables, once, not on every call."""
        cache = self.__dict__.setdefault("_derived_cache", {})
        key = (tag, like.dtype, like.device)
        entry = cache.get(key)
        if entry is None or entry[0] is not source:
            # a fresh copy: aligned storage, so BLAS takes the same path whatever memory the state came from
            value = source.to(dtype=like.dtype, device=like.device, copy=True)
            entry = cache[key] = (source, make(value) if make is not None else value)
        return entry[1]

    def _calibrated(self, logits) -> Tuple[torch.Tensor, torch.dtype]:
        """Validated logits through ``_apply`` in their compute precision (float64 stays float64, other types run
        in float32: the applies' results agree with float64 arithmetic to about 1e-6 relative; isotonic regression
        interpolates in float64), and the input's dtype. One reduction per call refuses non-finite logits: over
        the output where it shows them (``non_finite_shows_in``), else over the input before the apply."""
        self._require_fitted()
        shows_in = self.non_finite_shows_in
        logits = as_logits(logits, check_finite=shows_in is None)
        dtype = logits.dtype
        out = self._apply(logits if dtype in _COMPUTE_DTYPES else logits.to(compute_dtype(dtype)))
        if shows_in is not None and not all_finite(out if shows_in == "values" else out[:, 0]):
            raise non_finite_output_error(type(self).__name__, logits, out)
        return out, dtype

    def transform(self, logits) -> torch.Tensor:
        """Calibrated logits (N, C), in the input's dtype and device."""
        out, dtype = self._calibrated(logits)
        return out if out.dtype == dtype else out.to(dtype)

    __call__ = transform

    def predict_proba(self, logits) -> torch.Tensor:
        out, dtype = self._calibrated(logits)
        return torch.softmax(out, dim=1).to(dtype)

    def config(self) -> dict:
        raise NotImplementedError

    def unfitted(self) -> "PostHocCalibrator":
        """A new calibrator of the same kind and options (:meth:`config`), not fitted: what a procedure that must
        fit its own copy on other images (:class:`~timm_csm.calibration.ConformalClassifier`) takes."""
        return type(self)(**self.config())

    def state_dict(self) -> Dict[str, torch.Tensor]:
        raise NotImplementedError

    def load_state_dict(self, state: Dict[str, torch.Tensor]) -> "PostHocCalibrator":
        raise NotImplementedError

    def save(self, path) -> None:
        """Write the fitted state and config to ``path`` (safetensors; atomic replace)."""
        from ..io import save_safetensors_atomic

        self._require_fitted()
        tensors = {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}
        metadata = {"calibrator": self.kind, "config": json.dumps(self.config(), sort_keys=True)}
        save_safetensors_atomic(path, tensors, metadata)

    @classmethod
    def load(cls, path) -> "PostHocCalibrator":
        """Load a calibrator saved with :meth:`save` (on a subclass, the file must hold that kind)."""
        calibrator = load_calibrator(path)
        if cls is not PostHocCalibrator and not isinstance(calibrator, cls):
            raise ValueError(f"{os.fspath(path)} holds a {type(calibrator).__name__}, not a {cls.__name__}")
        return calibrator


def load_calibrator(path) -> PostHocCalibrator:
    """Restore any calibrator written by ``save``; a ``ValueError`` naming the file refuses an unknown kind and
    non-finite parameters."""
    from safetensors import safe_open

    path = os.fspath(path)
    with safe_open(path, framework="pt") as f:
        metadata = f.metadata() or {}
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    kind = metadata.get("calibrator")
    cls = calibrator_class(kind)
    if cls is None:
        raise ValueError(f"{path} is not a saved calibrator (metadata 'calibrator'={kind!r}; known: "
                         f"{[n for n in list_calibrators() if calibrator_class(n) is not None]})")
    check_finite_state(tensors, path)
    config = json.loads(metadata.get("config", "{}"))
    return cls(**config).load_state_dict(tensors)


def check_finite_state(tensors: Dict[str, torch.Tensor], source: str) -> None:
    """Refuse a state with NaN or infinite parameters (a corrupt file), whatever the calibrator; ``source`` (the
    file) is named in the error."""
    for name, tensor in sorted(tensors.items()):
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"{source}: parameter {name!r} contains NaN or infinite values (a corrupt file or "
                             f"state); fit the calibrator again and save it")
