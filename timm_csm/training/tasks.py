"""Training tasks: a task owns the classifier and the criterion, builds the collator of its batches and computes one
step's loss, so that the training loop never branches on the method (the shape of timm's ``timm.task``).

``task(batch)`` returns ``{"loss", "output", "terms"}``: the scalar to back-propagate, the logits of the real (clean)
batch, and the loss's detached components (``criterion.terms``) for the log. The batch keys each task reads are
``batch_keys`` (the collators of :mod:`timm_csm.data.collators` write them):

=================  =================================================================================================
task               step
=================  =================================================================================================
ClassificationTask ``loss(f(x), y)`` (``index=`` for per-sample-state losses)
MixupTask          the same on mixed images and soft targets (Zhang et al., ICLR 2018)
RegMixupTask       ``regmixup_objective(loss(f(x), y), CE(f(x~), y~))``, clean and mixed in one pass (Pinto et al.,
                   NeurIPS 2022; the released code's concatenated batch)
RankMixupTask      ``loss(f(x), y, f(x~), y~)``, clean and mixed copies in two passes (Noh et al., ICCV 2023)
CSMTask            ``loss(f(x), y, f(x_gen), q_gen)``, real and generated batches in two passes (Luo et al., ICML 2025)
                   or, with ``--csm-forward concat``, in one forward over their concatenation
DistillationTask   ``loss(f(x), y, t(x))`` with a frozen teacher ``t`` on the same batch (Hinton et al., 2015)
=================  =================================================================================================

Two passes keep separate batch-norm statistics per batch, as CSM and RankMixup specify; both run inside one
forward of :class:`TrainingModule`, so a distributed wrapper sees one forward and one backward per step. CSM's
``concat`` forward computes them over the real and generated images together (one larger batch, one call of the
classifier); without batch norm in training mode it gives the two passes' logits and loss
(``benchmarks/csm_step.md`` measures its cost and its validation ECE).
:func:`select_task` picks the task from the loss's registry spec (:func:`timm_csm.losses.loss_spec`, returned by
:func:`create_criterion` with the loss and handed to the task) and the ``--mixup`` / ``--regmixup`` flags.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple, Type

import torch
import torch.nn as nn

from ..data import CSMCollator, ImageCollator, MixupCollator, RankMixupCollator, RegMixupCollator, TimmMixupCollator
from ..losses import LOSS_INPUTS, CrossEntropyLoss, LossBase, LossSpec, create_loss, loss_spec, regmixup_objective
from ..registry import Registry
from .config import CSM_FORWARDS, TrainConfig

__all__ = ["TrainingModule", "TrainingTask", "ClassificationTask", "MixupTask", "TimmMixupTask", "RegMixupTask",
           "RankMixupTask", "TRAINING_TASKS", "register_training_task",
           "CSMTask", "DistillationTask", "load_teacher", "select_task", "create_criterion"]


class TrainingModule(nn.Module):
    """Calls the classifier once per input batch inside a single forward: ``module(x)`` gives the logits of ``x``,
    ``module(x, x2)`` a tuple of the logits of each."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, *batches: torch.Tensor):
        if len(batches) == 1:
            return self.model(batches[0])
        return tuple(self.model(x) for x in batches)


class TrainingTask(nn.Module):
    """Base of the tasks: ``model`` (the classifier), ``criterion`` (a :class:`~timm_csm.losses.LossBase`) and
    ``forward_module`` (the :class:`TrainingModule` a distributed wrapper replaces, see :meth:`prepare`).

    ``spec``: what the criterion needs from the batch (its :class:`~timm_csm.losses.LossSpec`), read once here:
    the registry's, as :func:`create_criterion` returns it with the criterion; by default
    :meth:`LossSpec.of(criterion) <timm_csm.losses.LossSpec.of>`, the attributes of its class (a criterion from
    outside the registry).

    Subclasses set ``batch_keys``, implement :meth:`create_collator` and :meth:`forward`, and build themselves from
    the run's configuration in :meth:`from_config` (``data_info``: the run's input settings, ``mean`` and ``std``
    among them, from :func:`~timm_csm.training.build_transforms`).
    """

    batch_keys: Tuple[str, ...] = ("pixel_values", "labels", "index")
    #: whether the task trains on the generated CSM companions (``--csm-dataset``)
    needs_companions = False

    def __init__(self, model: nn.Module, criterion: LossBase, spec: Optional[LossSpec] = None):
        super().__init__()
        if not isinstance(criterion, LossBase):
            raise ValueError(f"{type(self).__name__} needs a timm_csm.losses.LossBase criterion (it calls its hooks "
                             f"on_epoch_end and sync), got {type(criterion).__name__}; derive the loss from LossBase")
        self.model = model
        self.criterion = criterion
        self.forward_module = TrainingModule(model)
        self.spec = LossSpec.of(criterion) if spec is None else spec

    @classmethod
    def from_config(cls, config: TrainConfig, model, criterion, num_classes: int, companions=None,
                  spec: Optional[LossSpec] = None, data_info: Optional[Dict] = None) -> "TrainingTask":
        return cls(model, criterion, spec)

    def create_collator(self, images, labels, transform, seed: int):
        """The collator that builds this task's training batches."""
        return ImageCollator(images, labels, transform, seed=seed)

    def prepare(self, accelerator, optimizer):
        """Move the criterion to the accelerator's device and let ``accelerator.prepare`` wrap the forward module
        with the optimizer; returns the prepared optimizer."""
        self.criterion.to(accelerator.device)
        self.forward_module, optimizer = accelerator.prepare(self.forward_module, optimizer)
        return optimizer

    def end_epoch(self, accelerator, val_logits=None, val_targets=None) -> None:
        """The criterion's epoch-end hooks: ``sync`` of the state the processes wrote, then ``on_epoch_end`` on the
        validation logits when there is a validation split."""
        self.criterion.sync(accelerator)
        if val_logits is not None:
            self.criterion.on_epoch_end(val_logits.to(accelerator.device), val_targets.to(accelerator.device))

    def _clean_loss(self, logits: torch.Tensor, batch: Dict[str, torch.Tensor]) -> torch.Tensor:
        if self.spec.needs_index:
            return self.criterion(logits, batch["labels"], index=batch["index"])
        return self.criterion(logits, batch["labels"])

    def _forward_concatenated(self, x: torch.Tensor, x2: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """The logits of ``x`` and of ``x2`` from one forward over ``cat([x, x2])`` (one set of batch-norm
        statistics for both)."""
        both = self.forward_module(torch.cat([x, x2]))
        return both[:len(x)], both[len(x):]

    def _result(self, loss: torch.Tensor, output: torch.Tensor) -> Dict[str, object]:
        return {"loss": loss, "output": output, "terms": self.criterion.terms}


class ClassificationTask(TrainingTask):
    """One forward pass, ``loss(f(x), y)`` (``index=`` for per-sample-state losses)."""

    def forward(self, batch: Dict[str, torch.Tensor]) -> Dict[str, object]:
        logits = self.forward_module(batch["pixel_values"])
        return self._result(self._clean_loss(logits, batch), logits)


class MixupTask(ClassificationTask):
    """Mixup: :class:`ClassificationTask` on the mixed images and soft targets of
    :class:`~timm_csm.data.MixupCollator` (``lam ~ Beta(alpha, alpha)`` per batch or per image, optional label
    smoothing of the mixed targets)."""

    batch_keys = ("pixel_values", "labels", "lam", "index")

    def __init__(self, model, criterion, num_classes: int, alpha: float, mode: str = "batch", smoothing: float = 0.0,
                 spec: Optional[LossSpec] = None):
        super().__init__(model, criterion, spec)
        self.num_classes, self.alpha, self.mode, self.smoothing = int(num_classes), float(alpha), mode, smoothing

    @classmethod
    def from_config(cls, config: TrainConfig, model, criterion, num_classes: int, companions=None,
                  spec: Optional[LossSpec] = None, data_info: Optional[Dict] = None) -> "MixupTask":
        return cls(model, criterion, num_classes, config.mixup, config.mixup_mode, config.smoothing, spec)

    def create_collator(self, images, labels, transform, seed: int):
        return MixupCollator(images, labels, transform, self.num_classes, alpha=self.alpha, mode=self.mode,
                             smoothing=self.smoothing, seed=seed)


class TimmMixupTask(ClassificationTask):
    """timm's Mixup / CutMix (``--cutmix``, with ``--mixup`` as timm's mixup alpha): :class:`ClassificationTask` on the
    batches of :class:`~timm_csm.data.TimmMixupCollator` (soft targets, ``--smoothing`` applied by ``Mixup``)."""

    def __init__(self, model, criterion, mixup_fn, spec: Optional[LossSpec] = None):
        super().__init__(model, criterion, spec)
        self.mixup_fn = mixup_fn

    @classmethod
    def from_config(cls, config: TrainConfig, model, criterion, num_classes: int, companions=None,
                  spec: Optional[LossSpec] = None, data_info: Optional[Dict] = None) -> "TimmMixupTask":
        from timm.data import Mixup

        return cls(model, criterion, Mixup(
            mixup_alpha=config.mixup, cutmix_alpha=config.cutmix, cutmix_minmax=config.cutmix_minmax,
            prob=config.mixup_prob, switch_prob=config.mixup_switch_prob, mode=config.mixup_mode,
            label_smoothing=config.smoothing, num_classes=num_classes), spec)

    def create_collator(self, images, labels, transform, seed: int):
        return TimmMixupCollator(images, labels, transform, self.mixup_fn, seed=seed)


class RegMixupTask(TrainingTask):
    """RegMixup: the clean and the mixed batch in one pass, ``regmixup_objective(loss(f(x), y), CE(f(x~), y~),
    weight, reduction)`` (the mixed term is soft-target cross-entropy, as in the released code)."""

    batch_keys = ("pixel_values", "labels", "index", "mix_pixel_values", "mix_targets", "lam")

    def __init__(self, model, criterion, num_classes: int, alpha: float, weight: float = 1.0,
                 reduction: str = "mean", spec: Optional[LossSpec] = None):
        super().__init__(model, criterion, spec)
        self.num_classes, self.alpha, self.weight, self.reduction = int(num_classes), float(alpha), weight, reduction
        self.mixed_loss = CrossEntropyLoss()

    @classmethod
    def from_config(cls, config: TrainConfig, model, criterion, num_classes: int, companions=None,
                  spec: Optional[LossSpec] = None, data_info: Optional[Dict] = None) -> "RegMixupTask":
        return cls(model, criterion, num_classes, config.regmixup, config.regmixup_weight, config.regmixup_reduction,
                   spec)

    def create_collator(self, images, labels, transform, seed: int):
        return RegMixupCollator(images, labels, transform, self.num_classes, alpha=self.alpha, seed=seed)

    def forward(self, batch: Dict[str, torch.Tensor]) -> Dict[str, object]:
        logits, logits_mix = self._forward_concatenated(batch["pixel_values"], batch["mix_pixel_values"])
        loss = regmixup_objective(self._clean_loss(logits, batch), self.mixed_loss(logits_mix, batch["mix_targets"]),
                                  self.weight, self.reduction)
        return self._result(loss, logits)


class _TwoPassTask(TrainingTask):
    """``loss(f(x), y, f(x2), y2)`` with the second batch ``mix_pixel_values`` / ``mix_targets`` in its own pass,
    or, where ``concatenated``, both batches in one forward."""

    batch_keys = ("pixel_values", "labels", "index", "mix_pixel_values", "mix_targets")
    concatenated = False

    def forward(self, batch: Dict[str, torch.Tensor]) -> Dict[str, object]:
        x, x2 = batch["pixel_values"], batch["mix_pixel_values"]
        logits, logits_mix = self._forward_concatenated(x, x2) if self.concatenated else self.forward_module(x, x2)
        return self._result(self.criterion(logits, batch["labels"], logits_mix, batch["mix_targets"]), logits)


class RankMixupTask(_TwoPassTask):
    """RankMixup (MRL, M-NDCG): the clean batch and ``num_mixup`` mixed copies (copy-major, one lam per copy) of
    :class:`~timm_csm.data.RankMixupCollator`, in two passes; ``num_mixup=None``: the spec's ``num_mixed``."""

    batch_keys = _TwoPassTask.batch_keys + ("lam",)

    def __init__(self, model, criterion, num_classes: int, alpha: float = 2.0, num_mixup: Optional[int] = None,
                 spec: Optional[LossSpec] = None):
        super().__init__(model, criterion, spec)
        self.num_classes, self.alpha = int(num_classes), float(alpha)
        self.num_mixup = int(num_mixup or self.spec.num_mixed)

    @classmethod
    def from_config(cls, config: TrainConfig, model, criterion, num_classes: int, companions=None,
                  spec: Optional[LossSpec] = None, data_info: Optional[Dict] = None) -> "RankMixupTask":
        return cls(model, criterion, num_classes, config.rankmixup_alpha, config.num_mixup, spec)

    def create_collator(self, images, labels, transform, seed: int):
        return RankMixupCollator(images, labels, transform, self.num_classes, alpha=self.alpha,
                                 num_mixup=self.num_mixup, seed=seed)


class CSMTask(_TwoPassTask):
    """CSM: the real batch and its generated companions (:class:`~timm_csm.data.CSMCollator`: per real image the
    best-matching group member and ``n_aug`` interior members, with their annotated soft labels), in two passes
    (``forward="two-pass"``, the paper's) or in one forward over their concatenation (``"concat"``: batch-norm
    statistics over both; the loss is the same function of the two sets of logits)."""

    needs_companions = True

    def __init__(self, model, criterion, companions, spec: Optional[LossSpec] = None, forward: str = CSM_FORWARDS[0]):
        super().__init__(model, criterion, spec)
        if forward not in CSM_FORWARDS:
            raise ValueError(f"CSM forward {forward!r}: choose one of {', '.join(CSM_FORWARDS)}")
        self.companions = companions
        self.concatenated = forward == "concat"

    @classmethod
    def from_config(cls, config: TrainConfig, model, criterion, num_classes: int, companions=None,
                  spec: Optional[LossSpec] = None, data_info: Optional[Dict] = None) -> "CSMTask":
        return cls(model, criterion, companions, spec, config.csm_forward)

    def create_collator(self, images, labels, transform, seed: int):
        return CSMCollator(images, labels, transform, self.companions, seed=seed)


def load_teacher(path) -> Tuple[nn.Module, Tuple[float, ...], Tuple[float, ...]]:
    """(model in eval mode, mean, std) of a teacher: a reference-encoder folder
    (:func:`~timm_csm.annotation.train_reference_encoder`) or a run folder / model file written by ``train.py``; the
    mean and std are those its inputs were normalised with."""
    from pathlib import Path

    folder = Path(path)
    if (folder / "config.json").is_file() and (folder / "model.safetensors").is_file():
        from ..annotation import load_reference_encoder

        encoder = load_reference_encoder(folder)
        model, mean, std = encoder.model, encoder.config["mean"], encoder.config["std"]
    else:
        from ..evaluation.model import load_trained_classifier

        model, _, meta = load_trained_classifier(folder)
        mean, std = meta["mean"], meta["std"]
    return model.eval(), tuple(float(v) for v in mean), tuple(float(v) for v in std)


class DistillationTask(ClassificationTask):
    """Knowledge distillation: ``loss(f(x), y, t(x))``, the frozen teacher ``t`` (timm's
    :class:`timm.task.distillation.DistillationTeacher`, which re-normalises the student's input to the teacher's
    mean and std) evaluated on the same augmented batch without gradient."""

    def __init__(self, model, criterion, teacher: nn.Module, student_mean, student_std,
                 spec: Optional[LossSpec] = None):
        super().__init__(model, criterion, spec)
        from timm.task.distillation import DistillationTeacher

        self.teacher = teacher if isinstance(teacher, DistillationTeacher) else DistillationTeacher(teacher)
        self.teacher.requires_grad_(False)
        self.register_buffer("student_mean", torch.tensor(student_mean, dtype=torch.float32).view(1, -1, 1, 1),
                             persistent=False)
        self.register_buffer("student_std", torch.tensor(student_std, dtype=torch.float32).view(1, -1, 1, 1),
                             persistent=False)

    @classmethod
    def from_config(cls, config: TrainConfig, model, criterion, num_classes: int, companions=None,
                  spec: Optional[LossSpec] = None, data_info: Optional[Dict] = None) -> "DistillationTask":
        if not config.teacher:
            raise ValueError(f"--loss {config.loss} needs --teacher (a reference-encoder folder or a trained run)")
        teacher, mean, std = load_teacher(config.teacher)
        if data_info is None:
            raise ValueError("DistillationTask.from_config needs data_info (the student's mean and std)")
        teacher.pretrained_cfg = dict(getattr(teacher, "pretrained_cfg", {}) or {}, mean=mean, std=std)
        task = cls(model, criterion, teacher, data_info["mean"], data_info["std"], spec)
        n_out = task.teacher.model.num_classes  # a timm model: its head's size
        if n_out != num_classes:
            raise ValueError(f"--teacher {config.teacher} predicts {n_out} classes, the data has {num_classes}")
        return task

    def prepare(self, accelerator, optimizer):
        self.teacher.to(accelerator.device)
        self.student_mean = self.student_mean.to(accelerator.device)
        self.student_std = self.student_std.to(accelerator.device)
        return super().prepare(accelerator, optimizer)

    def forward(self, batch: Dict[str, torch.Tensor]) -> Dict[str, object]:
        x = batch["pixel_values"]
        logits = self.forward_module(x)
        with torch.no_grad():
            teacher_logits = self.teacher(self.teacher.normalize_input(x, self.student_mean, self.student_std))
        return self._result(self.criterion(logits, batch["labels"], teacher_logits), logits)


#: the task of each loss call convention that builds its own batches (:data:`~timm_csm.losses.LOSS_INPUTS`);
#: a convention without one trains in the plain tasks (with ``--mixup`` / ``--cutmix`` / ``--regmixup``)
TRAINING_TASKS = Registry("training task", check=lambda name, task, spec: _check_task(name, task))


def _check_task(inputs: str, task) -> None:
    if inputs not in LOSS_INPUTS:
        raise ValueError(f"register_training_task({inputs!r}): not a loss call convention; register it first with "
                         "register_loss_inputs")
    if not (isinstance(task, type) and issubclass(task, TrainingTask)):
        raise ValueError(f"register_training_task({inputs!r}): expected a TrainingTask subclass, got {task!r}")


def register_training_task(inputs: str, task: Optional[Type[TrainingTask]] = None, *, overwrite: bool = False):
    """Register ``task`` (a :class:`TrainingTask` subclass; without it, a decorator) as the task that trains the
    losses of call convention ``inputs``."""
    return TRAINING_TASKS.register(inputs, overwrite=overwrite) if task is None else \
        TRAINING_TASKS.register(inputs, task, overwrite=overwrite)


register_training_task("generated", CSMTask)
register_training_task("mixed", RankMixupTask)
register_training_task("teacher", DistillationTask)


def select_task(config: TrainConfig, spec: LossSpec) -> Type[TrainingTask]:
    """The task class of the training loss of registry spec ``spec`` (:func:`create_criterion`'s) with
    ``--mixup`` / ``--cutmix`` (timm's ``Mixup``) / ``--regmixup``; conflicting options raise ``ValueError``."""
    cutmix = config.cutmix > 0 or config.cutmix_minmax is not None
    conflicts = [flag for flag, on in (("--mixup", config.mixup > 0), ("--cutmix", cutmix),
                                       ("--regmixup", config.regmixup > 0)) if on]
    task = TRAINING_TASKS.get(spec.inputs) if spec.inputs in TRAINING_TASKS else None
    if task is not None and conflicts:
        raise ValueError(f"--loss {config.loss} builds its own batches; drop {' and '.join(conflicts)}")
    if "--regmixup" in conflicts and len(conflicts) > 1:
        raise ValueError("--regmixup mixes its own copy; drop --mixup / --cutmix")
    if task is None:
        task = (TimmMixupTask if cutmix else MixupTask if config.mixup > 0 else RegMixupTask if config.regmixup > 0
                else ClassificationTask)
    if task.needs_companions and not config.csm_dataset:
        raise ValueError(f"--loss {config.loss} needs --csm-dataset (the generated CSM dataset)")
    if not task.needs_companions and config.csm_dataset:
        raise ValueError(f"--csm-dataset is used by the csm losses only; --loss {config.loss} is not one")
    if not task.needs_companions and config.csm_forward != CSM_FORWARDS[0]:
        raise ValueError(f"--csm-forward is used by the csm losses only; --loss {config.loss} is not one")
    if config.teacher and task is not DistillationTask:
        raise ValueError(f"--teacher is used by distillation losses (kd) only; --loss {config.loss} is not one")
    return task


def create_criterion(config: TrainConfig, num_train: int) -> Tuple[LossBase, LossSpec]:
    """The training loss from ``--loss`` / ``--loss-kwargs`` and its registry :class:`~timm_csm.losses.LossSpec`
    (which :func:`select_task` and the task read: one spec for the run). ``--smoothing`` (without ``--mixup`` /
    ``--cutmix``, which smooth their mixed targets) selects the loss's label-smoothing form (``ce`` -> ``ls``) with
    ``smoothing=``; a generated-batch loss takes ``weight=--csm-weight``, a per-sample-state loss ``num_samples=``
    the training-set size."""
    name = config.loss
    kwargs = dict(config.loss_kwargs or [])
    spec = loss_spec(name)  # unknown names: ValueError listing the registered losses
    if config.smoothing > 0 and config.mixup <= 0 and config.cutmix <= 0 and config.cutmix_minmax is None:
        if spec.smoothed is None:
            raise ValueError(f"--smoothing applies to --loss ce / ls (or to --mixup targets), not to {name!r}")
        name = spec.smoothed
        kwargs.setdefault("smoothing", config.smoothing)
        spec = loss_spec(name)
    if spec.needs_generated:
        kwargs.setdefault("weight", config.csm_weight)
    if spec.needs_index:
        kwargs.setdefault("num_samples", num_train)
    return create_loss(name, **kwargs), spec
