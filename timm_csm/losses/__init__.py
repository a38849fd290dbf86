"""Calibration losses with a timm-style registry.

    from timm_csm.losses import create_loss, list_losses
    loss_fn = create_loss("mbls")            # margin 10, alpha 0.1
    loss = loss_fn(logits, target)           # hard (N,) or soft (N, C) targets; dense (N, C, H, W) too

Call conventions (the registry's ``loss_spec(name).inputs`` tells a training loop which one applies; classes
declare it by their attributes, see :class:`~timm_csm.losses.LossBase`):

* plain: ``loss(logits, target)``;
* ``needs_index``: ``loss(logits, target, index=sample_indices)`` ("aslp", "aslp_bce");
* ``needs_mixed``: ``loss(logits, target, logits_mixed, target_mixed)`` ("mrl", "mndcg"; see
  :mod:`timm_csm.losses.rankmixup`);
* ``is_csm``: ``loss(logits_real, y_real, logits_gen, q_gen)`` ("csm", "csm_soft_ce", "csm_soft_focal");
* ``needs_teacher``: ``loss(logits, target, teacher_logits)`` ("kd", knowledge distillation).

RegMixup is not a loss of its own: :func:`regmixup_objective` combines a loss on the clean batch with
cross-entropy on the mixed copy.

Every loss has the hook ``on_epoch_end(val_logits, val_targets)``, to be called once per epoch with the validation
logits (a no-op except for the stateful losses "adafocal", "cals", "aslp", "aslp_bce", whose state is saved by
``state_dict()``), and ``sync(accelerator)``, which merges per-process state between epochs (ASLP's tables).
"""
from . import (binary, brier, cross_entropy, csm, distillation, focal, label_perturbation, margin, mdca, mmce, penalty,
               rankmixup, regmixup)
from .base import LossBase
from .binary import BinaryCrossEntropyLoss, BinaryFocalLoss, BinaryLabelSmoothingLoss
from .brier import BrierLoss
from .cross_entropy import CrossEntropyLoss, LabelSmoothingLoss
from .csm import CSMLoss
from .distillation import DistillationLoss
from .focal import AdaFocalLoss, FLSDLoss, FocalLoss
from .label_perturbation import AdaptiveLabelPerturbation, BinaryAdaptiveLabelPerturbation
from .margin import ACLSLoss, CALSLoss, MbLSLoss
from .mdca import MDCALoss
from .mmce import MMCELoss
from .penalty import EntropyPenalty, L1Penalty
from .rankmixup import MNDCGLoss, MRLLoss
from .regmixup import REGMIXUP_REDUCTIONS, regmixup_objective
from .registry import (LOSS_INPUTS, LOSSES, LossSpec, create_loss, get_loss_entrypoint, is_loss, list_losses,
                       loss_spec, register_loss, register_loss_inputs)

__all__ = [
    "register_loss", "create_loss", "list_losses", "is_loss", "get_loss_entrypoint", "loss_spec", "LossSpec",
    "LOSS_INPUTS", "LOSSES", "register_loss_inputs", "LossBase",
    "CrossEntropyLoss", "LabelSmoothingLoss", "FocalLoss", "FLSDLoss", "AdaFocalLoss", "BrierLoss", "MMCELoss",
    "MDCALoss", "DistillationLoss", "EntropyPenalty", "L1Penalty", "MbLSLoss", "ACLSLoss", "CALSLoss",
    "AdaptiveLabelPerturbation",
    "BinaryAdaptiveLabelPerturbation", "MRLLoss", "MNDCGLoss", "CSMLoss", "BinaryCrossEntropyLoss",
    "BinaryLabelSmoothingLoss", "BinaryFocalLoss", "regmixup_objective", "REGMIXUP_REDUCTIONS",
]
