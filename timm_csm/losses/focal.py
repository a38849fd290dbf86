"""Focal-loss family: focal (gamma 3), FLSD-53 (sample-dependent gamma) and AdaFocal (per-bin gamma learnt from
validation calibration).

The binary (sigmoid) focal loss lives in :mod:`timm_csm.losses.binary`.
"""
from __future__ import annotations

from typing import Sequence, Tuple

import torch
import torch.nn.functional as F

from ..metrics.binning import bin_index, bin_sums, equal_mass_edges
from .base import LossBase
from .batch import (FlatBatch, check_finite_number, check_reduction, flatten_batch, modulating_factor,
                         reduce_rows)
from .registry import register_loss

__all__ = ["FocalLoss", "FLSDLoss", "AdaFocalLoss", "focal_rows"]


def focal_rows(log_probs: torch.Tensor, batch: FlatBatch, gamma) -> torch.Tensor:
    """Per-row focal loss ``-sum_k y_k f(p_k) log p_k`` with ``f`` the (inverse-)focal factor of
    :func:`modulating_factor`. ``gamma`` is a float or a per-row tensor (M,). For a hard label this is
    ``-f(p_t) log p_t``."""
    if isinstance(gamma, torch.Tensor) and gamma.ndim == 1:
        gamma_rows = gamma
        gamma_cols = gamma.unsqueeze(1)
    else:
        gamma_rows = gamma_cols = gamma
    if batch.hard is not None:
        log_pt = log_probs.gather(1, batch.hard.unsqueeze(1)).squeeze(1)
        return -modulating_factor(log_pt.exp(), gamma_rows) * log_pt
    probs = log_probs.exp()
    return -(batch.soft * modulating_factor(probs, gamma_cols) * log_probs).sum(dim=1)


def _true_class_prob(log_probs: torch.Tensor, batch: FlatBatch, soft_rule: str = "expected") -> torch.Tensor:
    """Detached p_t: the label's probability; for soft targets sum_k y_k p_k ("expected") or p at argmax y."""
    with torch.no_grad():
        if batch.hard is not None:
            return log_probs.gather(1, batch.hard.unsqueeze(1)).squeeze(1).exp()
        if soft_rule == "expected":
            return (batch.soft * log_probs.exp()).sum(dim=1)
        return log_probs.gather(1, batch.soft.argmax(dim=1, keepdim=True)).squeeze(1).exp()


@register_loss("focal")
class FocalLoss(LossBase):
    """Focal loss ``L = -(1/N) sum_i (1 - p_t)^gamma log p_t`` (Lin et al. 2017; calibration: Mukhoti et al.,
    NeurIPS 2020, "FL-3"). Soft targets use ``-sum_k y_k (1 - p_k)^gamma log p_k``. gamma defaults to 3
    ("FL-3" of the MbLS/CALS/RankMixup configs); focal_calibration sums over the batch, the MbLS lineage averages."""

    def __init__(self, gamma: float = 3.0, reduction: str = "mean", ignore_index: int = -100, validate: bool = True):
        super().__init__(ignore_index, validate)
        self.gamma = check_finite_number("gamma", gamma, 0.0)
        self.reduction = check_reduction(reduction)

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        batch = self._flat(logits, target)
        return reduce_rows(focal_rows(F.log_softmax(batch.logits, dim=1), batch, self.gamma), batch, self.reduction)


def _check_schedule(schedule) -> Tuple[Tuple[float, float], ...]:
    out = []
    for item in schedule:
        if len(item) != 2:
            raise ValueError(f"schedule entries must be (threshold, gamma) pairs, got {item!r}")
        out.append((check_finite_number("schedule threshold", item[0], 0.0, 1.0),
                     check_finite_number("schedule gamma", item[1], 0.0)))
    return tuple(sorted(out))


@register_loss("flsd53")
class FLSDLoss(LossBase):
    """FLSD-53: focal loss with a sample-dependent gamma (Mukhoti et al., NeurIPS 2020, ``FocalLossAdaptive``).

    gamma is picked from the detached p_t with the table ``schedule`` (threshold, gamma), smallest threshold first:
    the default ``((0.2, 5.0), (0.5, 3.0))`` with base ``gamma=3`` gives gamma = 5 for p_t < 0.2, 3 otherwise
    ("FLSD-53"); ``gamma=2`` gives FLSD-52 (5 / 3 / 2). For soft targets p_t = sum_k y_k p_k.
    """

    def __init__(self, gamma: float = 3.0, schedule: Sequence[Tuple[float, float]] = ((0.2, 5.0), (0.5, 3.0)),
                 reduction: str = "mean", ignore_index: int = -100, validate: bool = True):
        super().__init__(ignore_index, validate)
        self.gamma = check_finite_number("gamma", gamma, 0.0)
        self.schedule = _check_schedule(schedule)
        self.reduction = check_reduction(reduction)

    def sample_gamma(self, p_t: torch.Tensor) -> torch.Tensor:
        """gamma for each detached true-class probability."""
        gamma = torch.full_like(p_t, self.gamma)
        for threshold, value in reversed(self.schedule):  # the smallest threshold is applied last and wins
            gamma = torch.where(p_t < threshold, torch.full_like(p_t, value), gamma)
        return gamma

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        batch = self._flat(logits, target)
        log_probs = F.log_softmax(batch.logits, dim=1)
        gamma = self.sample_gamma(_true_class_prob(log_probs, batch, "expected"))
        return reduce_rows(focal_rows(log_probs, batch, gamma), batch, self.reduction)


@register_loss("adafocal")
class AdaFocalLoss(LossBase):
    """AdaFocal (Ghosh et al., NeurIPS 2022): focal loss whose gamma is kept per confidence bin and updated after
    every epoch from the calibration of the validation set.

    Hook: ``on_epoch_end(val_logits, val_targets)``. It bins the validation top-label confidences into
    ``n_bins`` equal-mass bins (:func:`timm_csm.metrics.binning.equal_mass_edges`, the interpolation of the official
    code, whose last-bit rounding may differ: ``v[lo] (1 - f) + v[hi] f`` here, ``v[lo] + f (v[hi] - v[lo])`` in
    its ``np.interp``, so an edge can move by one unit in the last place and a validation sample changes bin only
    where an edge rounds onto its value), takes each bin's gap g_b = mean confidence - accuracy over (lo, hi] (the
    lowest sample is included in the first bin; empty bins have g_b = 0), and updates

        gamma_b <- gamma_b * exp(lam * g_b)   if gamma_b > 0,   gamma_b * exp(-lam * g_b) otherwise;
        |gamma_b| < switch  ->  flip to -switch (was positive) or +switch;   clip to [gamma_min, gamma_max].

    The new validation edges replace the old ones. During training a sample takes the gamma of the bin its p_t
    falls in ([lo, hi), the outer bins open-ended); gamma < 0 means inverse focal, -(1 + p_t)^|gamma| log p_t.
    For soft targets p_t is p at argmax y. Defaults are the official ``main.py`` values: lam 1, gamma_init 1,
    switch 0.2, gamma in [-2, 20], 15 bins; the official recipe sums over the batch (``reduction="sum"``),
    the default here is the mean. State (edges, gammas) is in buffers.
    """

    def __init__(self, n_bins: int = 15, lam: float = 1.0, gamma_init: float = 1.0, switch: float = 0.2,
                 gamma_max: float = 20.0, gamma_min: float = -2.0, reduction: str = "mean", ignore_index: int = -100,
                 validate: bool = True):
        super().__init__(ignore_index, validate)
        if int(n_bins) < 1:
            raise ValueError(f"n_bins must be >= 1, got {n_bins}")
        self.n_bins = int(n_bins)
        self.lam = check_finite_number("lam", lam)
        self.switch = check_finite_number("switch", switch, 0.0)
        self.gamma_max = check_finite_number("gamma_max", gamma_max)
        self.gamma_min = check_finite_number("gamma_min", gamma_min, high=self.gamma_max)
        gamma_init = check_finite_number("gamma_init", gamma_init, self.gamma_min, self.gamma_max)
        self.reduction = check_reduction(reduction)
        self.register_buffer("bin_edges", torch.linspace(0.0, 1.0, self.n_bins + 1, dtype=torch.float64))
        self.register_buffer("bin_gamma", torch.full((self.n_bins,), gamma_init, dtype=torch.float64))

    def sample_gamma(self, p_t: torch.Tensor) -> torch.Tensor:
        inner = self.bin_edges[1:-1].to(p_t)  # state buffers follow the logits (dtype and device)
        index = torch.bucketize(p_t, inner, right=True)  # [lo, hi) bins, outer bins open-ended
        return self.bin_gamma.to(p_t)[index]

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        batch = self._flat(logits, target)
        log_probs = F.log_softmax(batch.logits, dim=1)
        gamma = self.sample_gamma(_true_class_prob(log_probs, batch, "argmax"))
        return reduce_rows(focal_rows(log_probs, batch, gamma), batch, self.reduction)

    @torch.no_grad()
    def on_epoch_end(self, val_logits: torch.Tensor, val_targets: torch.Tensor) -> None:
        """Update the per-bin gammas and bin edges from validation logits (see the class docstring)."""
        batch = flatten_batch(val_logits, val_targets, self.ignore_index, True, "AdaFocalLoss.on_epoch_end")
        keep = batch.row_weight() > 0
        log_probs = F.log_softmax(batch.logits.double(), dim=1)[keep]
        if log_probs.shape[0] == 0:
            raise ValueError("AdaFocalLoss.on_epoch_end: no validation samples")
        log_conf, pred = log_probs.max(dim=1)
        conf = log_conf.exp()
        correct = (pred == batch.target_dominant()[keep]).double()
        edges = equal_mass_edges(conf, self.n_bins)
        index = bin_index(conf, edges, equal_width=False)  # (lo, hi]; below the first edge -> bin 0
        count, conf_sum, acc_sum = bin_sums(index, self.n_bins, conf, correct)
        gap = torch.where(count > 0, (conf_sum - acc_sum) / count.clamp_min(1.0), torch.zeros_like(count))

        gamma = self.bin_gamma.double().cpu()
        gap = gap.cpu()
        new = torch.where(gamma > 0, gamma * torch.exp(self.lam * gap), gamma * torch.exp(-self.lam * gap))
        flipped = torch.where(new > 0, torch.full_like(new, -self.switch), torch.full_like(new, self.switch))
        new = torch.where(new.abs() < self.switch, flipped, new)
        new = new.clamp(self.gamma_min, self.gamma_max)
        self.bin_gamma.copy_(new.to(self.bin_gamma))
        self.bin_edges.copy_(edges.to(self.bin_edges))
