"""Streaming calibration metrics with O(n_bins x C) state that merges across batches and processes.

Everything binned with fixed edges (ECE, MCE, OE/UE, classwise ECE, the reliability table) plus the NLL and Brier
sums is exact from per-bin float64 sums, so ``update`` on batches followed by ``compute`` equals the one-shot
functional call on the concatenated data. Adaptive (equal-mass) and smooth ECE need the ``(N,)`` confidences and
accuracies; they are kept unless ``keep_confidences=False`` (never the ``(N, C)`` matrix).
"""
from __future__ import annotations

from typing import Dict, Optional

import torch

from .binning import DEFAULT_N_BINS, check_n_bins
from .functional import ReliabilityTable, _table
from .inputs import INPUT_TYPES, TASKS, prepare_inputs
from .state import CalibrationState, accumulate
from .table import metrics_from_state

__all__ = ["CalibrationAccumulator"]


class CalibrationAccumulator:
    """Accumulate calibration statistics batch by batch.

    Args:
        num_classes: C; inferred from the first batch when omitted (give it when processes may see no batch
            before :meth:`sync`).
        n_bins: equal-width (and equal-mass) bin count.
        input_type: ``"logits"``, ``"probs"`` or ``"log_probs"``.
        task: ``"multiclass"`` or ``"binary"`` (one positive-class score per sample).
        ignore_index: class-index value to skip (dense targets).
        classwise: track the ``(C, n_bins)`` classwise sums.
        keep_confidences: keep the ``(N,)`` confidences/accuracies for adaptive and smooth ECE.

    Example::

        acc = CalibrationAccumulator(num_classes=100)
        for images, labels in loader:
            acc.update(model(images), labels)
        acc.sync(accelerator)          # optional: sum the states of all processes
        metrics = acc.compute()        # {"accuracy", "confidence", "ece", "aece", "cece", "mce", ...}
    """

    def __init__(self, num_classes: Optional[int] = None, n_bins: int = DEFAULT_N_BINS, *, input_type: str = "logits",
                 task: str = "multiclass", ignore_index: Optional[int] = None, classwise: bool = True,
                 keep_confidences: bool = True, nll: bool = True, brier: bool = True):
        if input_type not in INPUT_TYPES:
            raise ValueError(f"input_type must be one of {INPUT_TYPES}, got {input_type!r}")
        if task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {task!r}")
        self.n_bins = check_n_bins(n_bins)
        self.input_type = input_type
        self.task = task
        self.ignore_index = ignore_index
        if task == "binary":
            if num_classes not in (None, 2):
                raise ValueError(f"task='binary' has 2 classes, got num_classes={num_classes}")
            num_classes = 2
        self.num_classes = None if num_classes is None else int(num_classes)
        self.flags = dict(binned=True, classwise=classwise, nll=nll, brier=brier, points=keep_confidences)
        self._state: Optional[CalibrationState] = None
        self._synced = False

    # --- accumulation -----------------------------------------------------------------------------------------
    def update(self, preds, target) -> "CalibrationAccumulator":
        """Add a batch (same conventions as the functional metrics). A batch that raises leaves the state as is."""
        inputs = prepare_inputs(preds, target, input_type=self.input_type, task=self.task,
                                num_classes=self.num_classes, ignore_index=self.ignore_index)
        if self.num_classes is None:
            self.num_classes = inputs.num_classes
        if self._state is None:
            self._state = accumulate(inputs, self.n_bins, **self.flags)
        else:
            if inputs.device != self._state.device:
                inputs.preds = inputs.preds.to(self._state.device)
                inputs.target = inputs.target.to(self._state.device)
            accumulate(inputs, self.n_bins, self._state)
        self._synced = False
        return self

    def merge(self, other: "CalibrationAccumulator") -> "CalibrationAccumulator":
        """Add the statistics of ``other`` (same n_bins, classes and tracked statistics) into this one."""
        if not isinstance(other, CalibrationAccumulator):
            raise ValueError(f"can only merge a CalibrationAccumulator, got {type(other).__name__}")
        if (self.input_type, self.task) != (other.input_type, other.task):
            raise ValueError(f"cannot merge accumulators with input_type/task {(self.input_type, self.task)} and "
                             f"{(other.input_type, other.task)}")
        if other._state is None:
            return self
        if self._state is None:
            self.num_classes = other.num_classes
            self._state = self._empty_state(other._state.device)
        self._state.add_(other._state)
        return self

    def reset(self) -> None:
        self._state = None
        self._synced = False

    def _empty_state(self, device=None) -> CalibrationState:
        if self.num_classes is None:
            raise ValueError("num_classes is unknown: pass it to CalibrationAccumulator(...) or call update first")
        return CalibrationState(self.n_bins, self.num_classes, device, **self.flags)

    @property
    def num_samples(self) -> int:
        return 0 if self._state is None else self._state.num_samples

    @property
    def state(self) -> CalibrationState:
        if self._state is None:
            self._state = self._empty_state()
        return self._state

    # --- distributed ------------------------------------------------------------------------------------------
    def sync(self, accelerator) -> "CalibrationAccumulator":
        """Sum the states of all processes of an ``accelerate.Accelerator``; afterwards every process holds the
        global state (call once, before :meth:`compute`).

        The O(n_bins x C) sums travel in one ``accelerator.reduce(..., "sum")``; the kept ``(N,)`` confidences are
        padded, gathered and trimmed. Samples duplicated by a distributed sampler to even out the last batch are
        counted twice, as with any per-process accumulation: evaluate with ``even_batches=False`` or feed
        ``accelerator.gather_for_metrics`` outputs when exact counts matter.
        """
        if self._synced:
            raise ValueError("sync was already called since the last update; syncing again would double count")
        st = self.state
        device = accelerator.device
        tensors = st.sum_tensors()
        flat = torch.cat([t.reshape(-1) for t in tensors]).to(device)
        flat = accelerator.reduce(flat, reduction="sum")
        offset = 0
        for t in tensors:
            k = t.numel()
            t.copy_(flat[offset:offset + k].view_as(t).to(t.device))
            offset += k
        if st.flags["points"]:
            conf, acc = st.points()
            local = torch.stack([conf, acc], dim=1).to(device)
            sizes = accelerator.gather(torch.tensor([local.shape[0]], device=device)).view(-1).tolist()
            padded = accelerator.pad_across_processes(local, dim=0)
            gathered = accelerator.gather(padded)
            width = padded.shape[0]
            pieces = [gathered[i * width:i * width + n] for i, n in enumerate(sizes)]
            both = torch.cat(pieces).to(st.device)
            st.conf_points = [both[:, 0].contiguous()]
            st.acc_points = [both[:, 1].contiguous()]
        self._synced = True
        return self

    # --- results ------------------------------------------------------------------------------------------------
    def compute(self, smooth: bool = False) -> Dict[str, float]:
        """``accuracy, confidence, ece, aece, cece, mce, oe, ue, nll, brier`` (+ ``smece`` when ``smooth``); keys of
        statistics that are not tracked are left out."""
        if self._state is None or self._state.num_samples == 0:
            raise ValueError("no samples: call update with at least one (non-ignored) sample before compute")
        return metrics_from_state(self._state, smooth=smooth)

    def reliability_table(self) -> ReliabilityTable:
        if self._state is None or self._state.num_samples == 0:
            raise ValueError("no samples: call update before reliability_table")
        return _table(self._state)

    def state_dict(self) -> Dict[str, torch.Tensor]:
        """The float64 sums (and kept points) as a flat dict of tensors, e.g. for saving with safetensors."""
        st = self.state
        out = {name: getattr(st, name).clone() for name in CalibrationState._SUM_FIELDS}
        if st.flags["classwise"]:
            out.update({name: getattr(st, name).clone() for name in CalibrationState._CW_FIELDS})
        if st.flags["points"]:
            conf, acc = st.points()
            out["confidences"], out["accuracies"] = conf.clone(), acc.clone()
        return out

    def load_state_dict(self, state_dict: Dict[str, torch.Tensor]) -> "CalibrationAccumulator":
        st = self._empty_state(next(iter(state_dict.values())).device)
        names = CalibrationState._SUM_FIELDS + (CalibrationState._CW_FIELDS if st.flags["classwise"] else ())
        if "acc_sq_sum" not in state_dict and "acc_sum" in state_dict:  # saved before the debiased CE: exact for
            state_dict = dict(state_dict, acc_sq_sum=state_dict["acc_sum"])  # hard labels, whose acc^2 = acc
        for name in names:
            if name not in state_dict:
                raise ValueError(f"state_dict is missing {name!r}")
            value = state_dict[name].to(torch.float64)
            if value.shape != getattr(st, name).shape:
                raise ValueError(f"state_dict[{name!r}] has shape {tuple(value.shape)}, expected "
                                 f"{tuple(getattr(st, name).shape)}")
            getattr(st, name).copy_(value)
        if st.flags["points"]:
            if "confidences" not in state_dict or "accuracies" not in state_dict:
                raise ValueError("state_dict is missing 'confidences'/'accuracies' (keep_confidences=True)")
            st.conf_points = [state_dict["confidences"].to(torch.float64)]
            st.acc_points = [state_dict["accuracies"].to(torch.float64)]
        self._state = st
        return self

    def __repr__(self) -> str:
        return (f"CalibrationAccumulator(num_classes={self.num_classes}, n_bins={self.n_bins}, "
                f"input_type={self.input_type!r}, task={self.task!r}, samples={self.num_samples})")
