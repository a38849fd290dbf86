"""Input handling for the calibration metrics: conversion, shape rules, validation and chunked iteration.

Every public metric goes through :func:`prepare_inputs`, which fixes the meaning of the arrays once:

* ``preds`` are ``logits``, ``probs`` or ``log_probs``, as the caller says (``input_type``); the metric functions
  never guess from the values. :func:`infer_input_type` and :func:`infer_task` are the explicit, opt-in reading
  rules (the ``evaluate`` modules apply them when given ``input_type="auto"`` / ``task="auto"``, their default).
  Multiclass predictions have shape ``(N, C)`` or, for dense tasks such as segmentation, ``(N, C, *S)``.
  With ``task="binary"`` predictions hold one value per sample (the positive class), shape ``(N,)`` or ``(N, *S)``,
  and are expanded to two classes ``[1 - p, p]`` (logits ``[0, z]``, whose softmax is ``[1 - sigmoid(z),
  sigmoid(z)]``).
* ``target`` holds class indices (shape ``(N,)`` / ``(N, *S)``) or soft targets with the shape of ``preds`` whose
  rows sum to 1 (binary: one probability of the positive class per sample, any floating dtype).
* ``ignore_index`` drops samples (pixels) whose hard target equals it.

Large inputs are never expanded as a whole: :meth:`PreparedInputs.chunks` yields ``(n, C)`` row blocks (dense inputs
are moved to channels-last one block of images at a time), so the extra memory stays bounded.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Iterator, Optional, Tuple

import numpy as np
import torch

__all__ = ["INPUT_TYPES", "TASKS", "ROW_SUM_ATOL", "PreparedInputs", "prepare_inputs", "as_tensor",
           "infer_input_type", "infer_task"]

INPUT_TYPES = ("logits", "probs", "log_probs")
TASKS = ("multiclass", "binary")
# the one tolerance of every check that rows of probabilities or soft labels sum to 1: the metrics' inputs, the losses'
# soft targets (widened to the epsilon of a half type, whose rounding needs more) and the CSM dataset format's soft
# labels (float16 softmax still passes)
ROW_SUM_ATOL = 1e-3


def as_tensor(x, name: str) -> torch.Tensor:
    """A torch tensor view of ``x`` (torch tensor, NumPy array or nested list); NumPy arrays are not copied."""
    if x is None:
        raise ValueError(f"{name} is missing")
    if isinstance(x, torch.Tensor):
        return x.detach()
    if isinstance(x, np.ndarray):
        if x.dtype.kind not in "fiub":
            raise ValueError(f"{name} has unsupported dtype {x.dtype}")
        with warnings.catch_warnings():  # read-only arrays are fine: the metrics never write into their inputs
            warnings.simplefilter("ignore", UserWarning)
            return torch.from_numpy(x)
    try:
        arr = np.asarray(x)
    except (ValueError, TypeError) as e:  # ragged lists
        raise ValueError(f"{name} could not be converted to an array: {e}") from None
    if arr.dtype == object:
        raise ValueError(f"{name} is ragged or not numeric (rows of different lengths?)")
    return torch.from_numpy(arr)


def infer_task(preds) -> str:
    """``"binary"`` for one score per sample (``preds`` of shape ``(N,)``), else ``"multiclass"``.

    Dense binary predictions ``(N, *S)`` cannot be told from multiclass ``(N, C, *S)`` by shape: pass
    ``task="binary"`` for them.
    """
    return "binary" if as_tensor(preds, "preds").ndim == 1 else "multiclass"


def infer_input_type(preds, task: str = "multiclass") -> str:
    """``"probs"`` when every row of ``preds`` is a probability vector, ``"logits"`` when some value lies outside
    ``[0, 1]``; ``ValueError`` in between.

    A row is a probability vector when all its values lie in ``[0, 1]`` and it sums to 1 within ``ROW_SUM_ATOL``
    (rows run along dim 1: ``(N, C)`` or ``(N, C, *S)``). Values all in ``[0, 1]`` whose rows do not all sum to 1
    are either probabilities that do not sum to 1 or logits that happen to lie in ``[0, 1]``: guessing would give
    one of them a wrong metric without a word, so the error names both readings and ``input_type``. With
    ``task="binary"`` the row is ``[1 - p, p]``, so every value must lie in ``[0, 1]``: binary logits that all happen
    to lie in ``[0, 1]`` read as probabilities, hence pass ``input_type="logits"`` for them. Log-probabilities read
    as logits, which gives the same softmax (only the NLL floor of given probabilities differs). Inputs that are
    empty, not floating point or of the wrong rank read as logits, and :func:`prepare_inputs` then reports the
    actual problem; NaN never reads as a probability.
    """
    _check_choice(task, TASKS, "task")
    x = as_tensor(preds, "preds")
    if not x.is_floating_point() or x.numel() == 0 or (task == "multiclass" and x.ndim < 2):
        return "logits"
    lo, hi = torch.aminmax(x)
    if not (float(lo) >= 0.0 and float(hi) <= 1.0 + ROW_SUM_ATOL):  # written so that NaN fails it
        return "logits"
    if task == "binary":
        return "probs"
    sums = x.sum(1) if x.dtype == torch.float64 else x.sum(1, dtype=torch.float32)  # no float64 copy of x
    deviation = (sums.double() - 1.0).abs()
    if float(deviation.amax()) <= ROW_SUM_ATOL:
        return "probs"
    worst = float(sums.flatten()[int(deviation.flatten().argmax())])
    raise ValueError(f"preds lie in [0, 1] but their rows do not all sum to 1 (one sums to {worst:.4g}): pass "
                     "input_type='probs' with rows that sum to 1, or input_type='logits' if they are logits")


@dataclass
class PreparedInputs:
    """Validated inputs. ``preds`` keeps the caller's layout; :meth:`chunks` yields flat ``(n, C)`` blocks."""

    preds: torch.Tensor
    target: torch.Tensor
    input_type: str
    task: str
    soft: bool
    num_classes: int
    ignore_index: Optional[int]
    dense: bool

    @property
    def device(self) -> torch.device:
        return self.preds.device

    def chunks(self, max_elements: int = 1 << 18) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        """Yield ``(preds (n, C), target (n,) or (n, C))`` blocks of at most about ``max_elements`` prediction values.

        Ignored samples are removed; blocks can be empty after that.
        """
        if self.task == "binary":
            yield from self._binary_chunks(max_elements)
            return
        C = self.num_classes
        if not self.dense:
            rows = max(1, max_elements // C)
            for start in range(0, self.preds.shape[0], rows):
                yield self._filter(self.preds[start:start + rows], self.target[start:start + rows])
            return
        # dense (N, C, *S): move one block of images to channels-last, then cut that into row blocks
        pixels = int(np.prod(self.preds.shape[2:]))
        images = max(1, max_elements // max(1, C * pixels))
        rows = max(1, max_elements // C)
        for start in range(0, self.preds.shape[0], images):
            p = self.preds[start:start + images].movedim(1, -1).reshape(-1, C)
            if self.soft:
                t = self.target[start:start + images].movedim(1, -1).reshape(-1, C)
            else:
                t = self.target[start:start + images].reshape(-1)
            for s in range(0, p.shape[0], rows):
                yield self._filter(p[s:s + rows], t[s:s + rows])

    def _binary_chunks(self, max_elements):
        p_all = self.preds.reshape(-1)
        t_all = self.target.reshape(-1)
        rows = max(1, max_elements // 2)
        for start in range(0, p_all.shape[0], rows):
            p1 = p_all[start:start + rows].double()
            t = t_all[start:start + rows]
            if self.input_type == "logits":
                p = torch.stack([torch.zeros_like(p1), p1], dim=1)
            elif self.input_type == "probs":
                p = torch.stack([1.0 - p1, p1], dim=1)
            else:  # log-probability of the positive class; log(1 - p) computed stably
                p = torch.stack([torch.log(-torch.expm1(p1)), p1], dim=1)
            if self.soft:
                t64 = t.double()
                t = torch.stack([1.0 - t64, t64], dim=1)
            yield self._filter(p, t)

    def _filter(self, p, t):
        if self.ignore_index is None or self.soft:
            return p, t
        keep = t != self.ignore_index
        if bool(keep.all()):
            return p, t
        return p[keep], t[keep]


def _check_choice(value, choices, name):
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


def prepare_inputs(preds, target, *, input_type: str = "logits", task: str = "multiclass",
                   num_classes: Optional[int] = None, ignore_index: Optional[int] = None) -> PreparedInputs:
    """Convert and validate ``(preds, target)``; raises ``ValueError`` naming the problem.

    Shape and label checks happen here; value checks on the (possibly huge) prediction matrix (NaN/+inf, rows that
    do not sum to 1) happen block by block while the statistics are accumulated, so the matrix is read once.
    """
    _check_choice(input_type, INPUT_TYPES, "input_type")
    _check_choice(task, TASKS, "task")
    preds = as_tensor(preds, "preds")
    target = as_tensor(target, "target")
    if not preds.is_floating_point():
        raise ValueError(f"preds must be floating point ({input_type}), got dtype {preds.dtype}")
    if preds.ndim == 0 or preds.shape[0] == 0 or preds.numel() == 0:
        raise ValueError(f"empty input: preds has shape {tuple(preds.shape)}")
    if target.device != preds.device:
        target = target.to(preds.device)
    if task == "binary":
        return _prepare_binary(preds, target, input_type, num_classes, ignore_index)

    if preds.ndim < 2:
        raise ValueError(f"preds must have shape (N, C) or (N, C, *S) for task='multiclass', got "
                         f"{tuple(preds.shape)}; for one sigmoid output per sample pass task='binary'")
    C = preds.shape[1]
    if num_classes is not None and int(num_classes) != C:
        raise ValueError(f"num_classes={num_classes} but preds has {C} classes (shape {tuple(preds.shape)})")
    if C < 2:
        raise ValueError(f"preds must have at least 2 classes, got shape {tuple(preds.shape)}; "
                         "for one sigmoid output per sample pass task='binary'")
    dense = preds.ndim > 2
    hard_shape = preds.shape[:1] + preds.shape[2:]
    if target.shape[:1] != preds.shape[:1]:
        raise ValueError(f"mismatched N: preds has {preds.shape[0]} samples, target has "
                         f"{target.shape[0] if target.ndim else 'a scalar'} (shapes {tuple(preds.shape)} and "
                         f"{tuple(target.shape)})")
    if target.shape == preds.shape and target.is_floating_point():
        soft = True
    elif target.shape == hard_shape:
        soft = False
    else:
        raise ValueError(f"target shape {tuple(target.shape)} does not fit preds shape {tuple(preds.shape)}: "
                         f"expected class indices of shape {tuple(hard_shape)} or soft targets of shape "
                         f"{tuple(preds.shape)}")
    if soft:
        if ignore_index is not None:
            raise ValueError("ignore_index applies to class-index targets only, not to soft targets")
    else:
        target = _hard_labels(target, C, ignore_index)
    return PreparedInputs(preds, target, input_type, task, soft, C, ignore_index, dense)


def _hard_labels(target, C, ignore_index):
    if target.is_floating_point():
        if not bool(torch.isfinite(target).all()):
            raise ValueError("target contains NaN or inf")
        if not bool((target == target.round()).all()):
            raise ValueError("target of class indices has non-integer values; soft targets need the shape of preds")
        target = target.long()
    elif target.dtype == torch.bool:
        target = target.long()
    elif target.dtype not in (torch.int64,):
        target = target.long()
    valid = target if ignore_index is None else target[target != ignore_index]
    if valid.numel():
        lo, hi = int(valid.min()), int(valid.max())
        if lo < 0 or hi >= C:
            bad = lo if lo < 0 else hi
            raise ValueError(f"label out of range: target contains {bad}, valid classes are 0..{C - 1}"
                             + (f" (ignore_index={ignore_index})" if ignore_index is not None else ""))
    return target


def _prepare_binary(preds, target, input_type, num_classes, ignore_index):
    if num_classes is not None and int(num_classes) != 2:
        raise ValueError(f"task='binary' has 2 classes, got num_classes={num_classes}")
    if preds.ndim == 2 and preds.shape[1] == 1 and target.ndim == 1:
        preds = preds[:, 0]
    if target.shape != preds.shape:
        raise ValueError(f"task='binary' needs target with the shape of preds (one value per sample), got preds "
                         f"{tuple(preds.shape)} and target {tuple(target.shape)}")
    soft = target.is_floating_point()
    if soft:
        if ignore_index is not None:
            raise ValueError("ignore_index applies to class-index targets only, not to soft targets")
        if not bool(torch.isfinite(target).all()):
            raise ValueError("target contains NaN or inf")
        if float(target.min()) < 0 or float(target.max()) > 1:
            raise ValueError("binary soft targets must lie in [0, 1]")
    else:
        target = _hard_labels(target, 2, ignore_index)
    return PreparedInputs(preds, target, input_type, "binary", soft, 2, ignore_index, preds.ndim > 1)
