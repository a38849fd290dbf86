"""Adaptive stochastic label perturbation (ASLP) with self-calibrating targets.

Reference: Liu et al., "Model Calibration in Dense Classification with Adaptive Label Perturbation", ICCV 2023
(code: Carlisle-Liu/ASLP). The paper's setting is dense *binary* prediction (salient-object masks): with probability
alpha_i the whole target of image i is replaced by (1 - 2 beta) y + beta, and BCE is taken against it (SC-BCE).
BCE is affine in its target, so the loss in expectation is BCE against y + alpha_i beta (1 - 2 y) = (1 - eps_i) y +
eps_i / 2 with eps_i = 2 alpha_i beta; both losses here use that expected target, which has the same gradient in
expectation, no sampling noise, and never leaves [0, 1] (per-draw targets with beta = 2 do).

The per-image level is learnt by gradient *ascent* on the loss (raising entropy while the model fits the clean label
better than the uniform target), with an "accuracy enforcer" that pulls it down once the expected loss of target
confidence exceeds the validation error rate 1 - Acc_val (the ASLP_MC variant).

Interface: ``needs_index = True``; ``forward(logits, target, index=...)`` takes the dataset index of each sample
(N,) and updates the levels of those samples after computing the loss (no update in ``eval()`` mode or before
``warmup_epochs`` epoch ends). Hook: ``on_epoch_end(val_logits, val_targets)`` sets Acc_val and counts epochs. Until
the first hook call the enforcer is inactive. The per-sample table is a buffer (grown on demand when ``num_samples``
is not given), saved by ``state_dict``. Under data parallelism each process updates the entries of the samples it
sees; ``sync(accelerator)`` (train.py calls it after every epoch) merges the tables so that all processes hold the
same levels again.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from .base import LossBase
from .batch import (check_finite_number, check_reduction, flatten_batch, flatten_binary, reduce_binary,
                         reduce_rows, row_nll)
from .registry import register_loss

__all__ = ["AdaptiveLabelPerturbation", "BinaryAdaptiveLabelPerturbation"]


class _PerSampleState(LossBase):
    needs_index = True

    def __init__(self, num_samples: Optional[int], warmup_epochs: int, ignore_index: int, validate: bool):
        super().__init__(ignore_index, validate)
        self.num_samples = None if num_samples is None else int(num_samples)
        if self.num_samples is not None and self.num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples}")
        self.warmup_epochs = int(warmup_epochs)
        self.register_buffer("level", torch.zeros(self.num_samples or 0, dtype=torch.float32))
        self.register_buffer("val_accuracy", torch.tensor(0.0, dtype=torch.float32))
        self.register_buffer("epoch", torch.tensor(0, dtype=torch.int64))
        # entries written since the last sync (not saved: tables are synced at epoch ends, where state is saved)
        self.register_buffer("touched", torch.zeros(self.num_samples or 0, dtype=torch.bool), persistent=False)

    def _set_levels(self, index: torch.Tensor, new: torch.Tensor) -> None:
        self.level[index] = new.to(self.level.dtype)
        if self.touched.numel() != self.level.numel():
            self.touched = self._resized(self.touched, self.level.numel())
        self.touched[index] = True

    @staticmethod
    def _resized(table: torch.Tensor, size: int) -> torch.Tensor:
        grown = torch.zeros(size, dtype=table.dtype, device=table.device)
        grown[: min(size, table.numel())] = table[:size]
        return grown

    @torch.no_grad()
    def sync(self, accelerator) -> None:
        """Merge the per-sample tables of all processes of an ``accelerate.Accelerator`` (call on every process,
        between epochs). An entry written by one or more processes since the last sync takes the mean of their
        values (two only when a distributed sampler repeated a sample to even out the last batch); the others keep
        their common value."""
        if accelerator.num_processes > 1:
            device = accelerator.device
            size = int(accelerator.gather(torch.tensor([self.level.numel()], device=device)).max())
            level = self._resized(self.level, size).to(device, torch.float64)
            touched = self._resized(self.touched, size).to(device, torch.float64)
            sums = accelerator.reduce(torch.stack([level * touched, touched]), reduction="sum")
            written = sums[1] > 0
            level[written] = sums[0][written] / sums[1][written]
            self.level = level.to(self.level.device, self.level.dtype)
        self.touched = torch.zeros(self.level.numel(), dtype=torch.bool, device=self.level.device)

    def _check_index(self, index: Optional[torch.Tensor], num_groups: int) -> Optional[torch.Tensor]:
        name = type(self).__name__
        if index is None:
            if self.training:
                raise ValueError(f"{name} needs the dataset index of each sample: call forward(logits, target, "
                                 f"index=...) (or put the loss in eval() mode to use the clean targets)")
            return None
        if not isinstance(index, torch.Tensor) or index.is_floating_point() or index.shape != (num_groups,):
            raise ValueError(f"{name}: index must be an integer tensor of shape ({num_groups},), got "
                             f"{getattr(index, 'shape', type(index).__name__)}")
        index = index.to(self.level.device).long()
        if self.validate and index.numel() and bool((index < 0).any()):
            raise ValueError(f"{name}: sample indices must be non-negative")
        if self.num_samples is not None:
            if self.validate and index.numel() and bool((index >= self.num_samples).any()):
                raise ValueError(f"{name}: sample index {int(index.max())} >= num_samples={self.num_samples}")
        elif index.numel():
            needed = int(index.max()) + 1
            if needed > self.level.numel():
                self.level = self._resized(self.level, max(needed, 2 * self.level.numel()))
        return index

    def _updating(self, index) -> bool:
        return index is not None and self.training and int(self.epoch) >= self.warmup_epochs


@register_loss("aslp")
class AdaptiveLabelPerturbation(_PerSampleState):
    """ASLP generalised to K-class classification (a generalisation of the binary method; not in the paper).

    Per sample i a smoothing level eps_i (initially 0) defines the expected perturbed target
    y'_i = (1 - eps_i) y_i + eps_i u with u = 1/K (the expectation of "keep y with probability 1 - alpha_i, else
    (1 - beta') y + beta' u", eps_i = alpha_i beta'); the loss is the cross-entropy against y'_i:

        L_i = (1 - eps_i) CE(p_i, y_i) + eps_i CE(p_i, u).

    After each training step (once ``warmup_epochs`` epochs have ended) the levels of the batch take one ascent
    step on dL_i/d eps_i plus the enforcer:

        eps_i <- clip(eps_i + lr * [CE(p_i, u) - CE(p_i, y_i) + lam * min((1 - Acc_val) - eps_i (K-1)/K, 0)],
                      0, eps_max),

    so the expected target confidence 1 - eps_i (K-1)/K does not fall below the validation accuracy. eps_max
    defaults to (K-1)/K (the label stays the target's argmax). For dense inputs, eps_i is per image and the ascent
    term is the mean over its non-ignored pixels. Defaults lr = 0.002 and warmup 5 epochs follow the official binary
    code; lam = 250 replaces its 2000 so that lr * lam = 0.5 and one enforcer step moves eps halfway back to the
    boundary instead of overshooting it (the binary units differ). Soft targets y_i are perturbed the same way.
    """

    def __init__(self, lr: float = 0.002, lam: float = 250.0, warmup_epochs: int = 5, eps_max: Optional[float] = None,
                 num_samples: Optional[int] = None, reduction: str = "mean", ignore_index: int = -100,
                 validate: bool = True):
        super().__init__(num_samples, warmup_epochs, ignore_index, validate)
        self.lr = check_finite_number("lr", lr, 0.0)
        self.lam = check_finite_number("lam", lam, 0.0)
        self.eps_max = None if eps_max is None else check_finite_number("eps_max", eps_max, 0.0, 1.0)
        self.reduction = check_reduction(reduction)

    def forward(self, logits: torch.Tensor, target: torch.Tensor, index: Optional[torch.Tensor] = None):
        batch = self._flat(logits, target)
        num_images = logits.shape[0]
        index = self._check_index(index, num_images)
        log_probs = F.log_softmax(batch.logits, dim=1)
        ce_label = row_nll(log_probs, batch)
        ce_uniform = -log_probs.mean(dim=1)
        if index is None:
            eps = torch.zeros_like(ce_label)
        else:
            per_image = batch.num_rows // max(num_images, 1)
            eps = self.level[index].to(ce_label).repeat_interleave(per_image)
        rows = (1.0 - eps) * ce_label + eps * ce_uniform
        loss = reduce_rows(rows, batch, self.reduction)
        if self._updating(index):
            self._step(index, (ce_uniform - ce_label).detach(), batch.row_weight(), num_images, batch.num_classes)
        return loss

    @torch.no_grad()
    def _step(self, index, ascent_rows, weight, num_images, num_classes):
        per_image = ascent_rows.shape[0] // max(num_images, 1)
        ascent = (ascent_rows * weight).reshape(num_images, per_image).sum(1)
        ascent = ascent / weight.reshape(num_images, per_image).sum(1).clamp_min(1.0)
        eps = self.level[index].double()
        loss_of_conf = eps * (num_classes - 1) / num_classes
        enforcer = torch.clamp((1.0 - self.val_accuracy.double()) - loss_of_conf, max=0.0)
        eps_max = (num_classes - 1) / num_classes if self.eps_max is None else self.eps_max
        new = (eps + self.lr * (ascent.double().to(eps.device) + self.lam * enforcer)).clamp(0.0, eps_max)
        self._set_levels(index, new)

    @torch.no_grad()
    def on_epoch_end(self, val_logits: torch.Tensor, val_targets: torch.Tensor) -> None:
        """Set Acc_val (top-1 accuracy on the validation logits) and count a finished epoch."""
        batch = flatten_batch(val_logits, val_targets, self.ignore_index, True, "AdaptiveLabelPerturbation")
        weight = batch.row_weight()
        correct = (batch.logits.argmax(dim=1) == batch.target_dominant()).to(weight.dtype) * weight
        self.val_accuracy.fill_(float(correct.sum() / weight.sum().clamp_min(1.0)))
        self.epoch += 1


@register_loss("aslp_bce")
class BinaryAdaptiveLabelPerturbation(_PerSampleState):
    """ASLP with SC-BCE for dense binary prediction (the paper's setting), using the expected perturbed target.

    Per image i a perturbation probability alpha_i (initially 0) gives the target t_i = (1 - 2 alpha_i beta) y +
    alpha_i beta, and the loss is BCE-with-logits against it (pixel mean over non-ignored pixels). After each
    training step past ``warmup_epochs``:

        a = alpha_i + lr * [(H_i - 2 BCE_i) / beta + lam * min((1 - Acc_val) - beta alpha_i, 0)],
        alpha_i <- 0 if a < 0, 1 / (2 beta) - 0.01 if a >= 1 / (2 beta), else a,

    with BCE_i the pixel-mean BCE against the clean mask and H_i = mean(-log(p (1 - p))) = 2 BCE(p, 1/2). The cap
    is the released one (``main_ASLP.py`` of Carlisle-Liu/ASLP): a level that reaches 1 / (2 beta) drops to 0.01
    below it, while levels in between are kept (so with beta = 2 they lie in [0, 0.25)). Acc_val is the validation
    pixel accuracy at threshold 0.5, set by ``on_epoch_end``. Defaults are the official code's: beta = 2,
    lr = 0.002, lam = 2000, 5 warm-up epochs. ``level`` stores alpha_i.

    Deviations: the loss uses the expected perturbed target (module docstring) instead of one random draw per
    image; H_i and BCE_i use exact log-sigmoids, where the released code clamps p to [1e-7, 1 - 1e-7] (the two
    differ only for |logit| > 16).
    """

    def __init__(self, beta: float = 2.0, lr: float = 0.002, lam: float = 2000.0, warmup_epochs: int = 5,
                 num_samples: Optional[int] = None, reduction: str = "mean", ignore_index: int = -100,
                 validate: bool = True):
        super().__init__(num_samples, warmup_epochs, ignore_index, validate)
        self.beta = check_finite_number("beta", beta, 0.0, low_open=True)
        if 1.0 / (2.0 * self.beta) - 0.01 <= 0:
            raise ValueError(f"beta={beta} leaves no room for alpha: need 1 / (2 beta) > 0.01")
        self.lr = check_finite_number("lr", lr, 0.0)
        self.lam = check_finite_number("lam", lam, 0.0)
        self.reduction = check_reduction(reduction)

    def forward(self, logits: torch.Tensor, target: torch.Tensor, index: Optional[torch.Tensor] = None):
        batch = flatten_binary(logits, target, self.ignore_index, self.validate, type(self).__name__)
        index = self._check_index(index, batch.num_groups)
        if index is None:
            shift = torch.zeros_like(batch.target)
        else:
            per_image = batch.logits.shape[0] // max(batch.num_groups, 1)
            shift = (self.level[index].to(batch.logits) * self.beta).repeat_interleave(per_image)
        perturbed = batch.target + shift * (1.0 - 2.0 * batch.target)
        rows = F.binary_cross_entropy_with_logits(batch.logits, perturbed, reduction="none")
        loss = reduce_binary(rows, batch, self.reduction)
        if self._updating(index):
            with torch.no_grad():
                z = batch.logits.detach()
                bce_clean = F.binary_cross_entropy_with_logits(z, batch.target, reduction="none")
                entropy_proxy = F.softplus(-z) + F.softplus(z)  # -log p - log(1 - p)
                weight = batch.entry_weight().reshape(batch.num_groups, -1)
                ascent_rows = (entropy_proxy - 2.0 * bce_clean).reshape(batch.num_groups, -1) * weight
                ascent = ascent_rows.sum(dim=1) / weight.sum(dim=1).clamp_min(1.0)
                alpha = self.level[index].double()
                enforcer = torch.clamp((1.0 - self.val_accuracy.double()) - self.beta * alpha, max=0.0)
                step = ascent.double().to(alpha.device) / self.beta + self.lam * enforcer
                self._set_levels(index, self._capped(alpha + self.lr * step))
        return loss

    def _capped(self, alpha: torch.Tensor) -> torch.Tensor:
        """The released bounds: negative levels become 0, levels >= 1 / (2 beta) become 1 / (2 beta) - 0.01."""
        top = 1.0 / (2.0 * self.beta)
        return torch.where(alpha >= top, alpha.new_tensor(top - 0.01), alpha.clamp_min(0.0))

    @torch.no_grad()
    def on_epoch_end(self, val_logits: torch.Tensor, val_targets: torch.Tensor) -> None:
        """Set Acc_val (pixel accuracy at threshold 0.5, targets rounded) and count a finished epoch."""
        batch = flatten_binary(val_logits, val_targets, self.ignore_index, True, type(self).__name__)
        correct = (batch.logits > 0) == (batch.target >= 0.5)
        accuracy = (correct.to(batch.logits.dtype) * batch.entry_weight()).sum() / batch.count()
        self.val_accuracy.fill_(float(accuracy))
        self.epoch += 1
