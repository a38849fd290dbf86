"""Logit-margin regularisers of the label-smoothing family: MbLS, ACLS and CALS.

All three penalise logit distances d_ik = max_j z_ij - z_ik measured from the *predicted* class (not the label),
so the regulariser needs no target and works unchanged with soft targets; only the cross-entropy term sees y.
Dense inputs are flattened to pixels, and ignored pixels are excluded from both terms (as the released MbLS code
does for ``ignore_index >= 0``); ACLS and CALS take ``regularize_ignored=True`` to regularise them too, as their
released code does.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from .base import LossBase
from .batch import check_finite_number, flatten_batch, masked_mean, mean_ce
from .registry import register_loss

__all__ = ["MbLSLoss", "ACLSLoss", "CALSLoss", "augmented_lagrangian_penalty"]


def _hinge_scale(batch, per_entry: bool):
    """What the fused regularisers multiply each row's sum by to give ``masked_mean``'s value: a number when every
    row counts, else a (M, 1) column of row weights over the kept rows' count (times K when the mean runs over the
    K entries of a row)."""
    divisor = batch.num_classes if per_entry else 1
    if batch.weight is None:
        return 1.0 / max(batch.num_rows * divisor, 1)
    return (batch.weight / (batch.weight.sum().clamp_min(1.0) * divisor)).unsqueeze(1)


def _weighted_sum(a: torch.Tensor, b: torch.Tensor, scale) -> torch.Tensor:
    """sum_i scale_i sum_k a_ik b_ik, ``scale`` a number or a (M, 1) column, as one dot product (one kernel)."""
    if torch.is_tensor(scale):
        return (a * b).sum(dim=1).dot(scale.reshape(-1))
    return a.reshape(-1).dot(b.reshape(-1)) * scale


class _MarginHinge(torch.autograd.Function):
    """MbLS's regulariser ``sum_{i,k} scale_i ReLU(max_j z_ij - z_ik - margin)`` with a hand-written backward.

    The gradient of the max goes to one index per row (``torch.max``'s), as in the released code. Written out, the
    forward and backward take about half the kernels of the autograd graph (max, two subtractions, clamp, mean and
    their backward), which at classification sizes each cost about as much as the fused cross-entropy.
    """

    @staticmethod
    def forward(ctx, logits, margin, scale):
        z_max, arg = logits.max(dim=1, keepdim=True)
        hinge = ((z_max - margin) - logits).clamp_min_(0.0)
        ctx.save_for_backward(hinge, arg)
        ctx.scale = scale  # a number, or a (M, 1) column of row weights (no gradient)
        return (hinge * scale).sum() if torch.is_tensor(scale) else hinge.sum() * scale

    @staticmethod
    def backward(ctx, grad):
        hinge, arg = ctx.saved_tensors
        step = grad * ctx.scale
        # sign() of the non-negative hinge is the 0/1 mask of active entries; boolean masks (a comparison, where)
        # run several times slower on the CPU than this float kernel
        grad_logits = torch.sign(hinge).mul_(-step)
        # every active entry pulls its row's maximum up by the same step
        grad_logits.scatter_add_(1, arg, grad_logits.sum(dim=1, keepdim=True).neg_())
        return grad_logits, None, None


class _ACLSPenalty(torch.autograd.Function):
    """ACLS's regulariser with a hand-written backward:

        pos_scale_i * ties_i * ReLU(z_max,i - margin)^2 + neg_scale_i * sum_k ReLU(z_max,i - z_ik - margin)^2

    summed over rows; the positive term's gradient goes to one argmax per row, the negative term treats the max as
    a constant (both as released). Same reason as :class:`_MarginHinge`: half the kernels of the autograd graph.
    """

    @staticmethod
    def forward(ctx, logits, margin, pos_scale, neg_scale):
        z_max, arg = logits.max(dim=1, keepdim=True)
        ties = (logits == z_max).sum(dim=1, keepdim=True).to(logits.dtype)  # every entry equal to the max counts
        shifted = z_max - margin
        pos = shifted.clamp_min(0.0)
        pos_ties = pos * ties
        neg = (shifted - logits).clamp_min_(0.0)  # 0 at the max itself, so the negative term needs no mask
        ctx.save_for_backward(pos_ties, neg, arg)
        ctx.scales = pos_scale, neg_scale
        return _weighted_sum(pos_ties, pos, pos_scale) + _weighted_sum(neg, neg, neg_scale)

    @staticmethod
    def backward(ctx, grad):
        pos_ties, neg, arg = ctx.saved_tensors
        pos_scale, neg_scale = ctx.scales
        grad_logits = neg * (grad * (-2.0 * neg_scale))
        grad_logits.scatter_add_(1, arg, pos_ties * (grad * (2.0 * pos_scale)))
        return grad_logits, None, None, None


@register_loss("mbls")
class MbLSLoss(LossBase):
    """Margin-based label smoothing (Liu et al., CVPR 2022):

        L = CE(z, y) + alpha * mean_{i,k} ReLU(max_j z_ij - z_ik - margin),

    the mean running over all N*K entries (the argmax entry contributes 0). Defaults margin = 10, alpha = 0.1 (the
    paper's setting; no alpha schedule). Gradient flows through the max, as in the official code.
    """

    def __init__(self, margin: float = 10.0, alpha: float = 0.1, ignore_index: int = -100, validate: bool = True):
        super().__init__(ignore_index, validate)
        self.margin = check_finite_number("margin", margin, 0.0)
        self.alpha = check_finite_number("alpha", alpha, 0.0)

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        batch = self._flat(logits, target)
        ce = mean_ce(batch)
        reg = _MarginHinge.apply(batch.logits, self.margin, _hinge_scale(batch, per_entry=True))
        self._record(ce=ce, reg=reg)
        return ce + self.alpha * reg


@register_loss("acls")
class ACLSLoss(LossBase):
    """Adaptive and conditional label smoothing (Park et al., ICCV 2023), in the released code's form:

        R = pos_lambda * (1/N) sum_i ReLU(z_max,i - margin)^2
          + neg_lambda * (1/(N(K-1))) sum_i sum_{k != j_i} ReLU(z_max,i - z_ik - margin)^2,
        L = CE + alpha * R,

    with j_i the predicted class (ties all count as positives, decided on detached logits). The winning logit is
    pulled down once it exceeds the margin; losing logits are pulled up once their gap to the (detached) max exceeds
    it. Defaults pos_lambda = 1.0, neg_lambda = 0.1, alpha = 0.1, margin = 10 (``configs/loss/acls.yaml`` of
    cvlab-yonsei/ACLS).

    Deviation: ignored pixels are left out of R (N counts the kept rows). The released class never reads its
    ``ignore_index``: its R runs over every row, ignored pixels included, while its CE skips PyTorch's default
    ignore index -100; ``regularize_ignored=True`` reproduces that.
    """

    def __init__(self, pos_lambda: float = 1.0, neg_lambda: float = 0.1, alpha: float = 0.1, margin: float = 10.0,
                 regularize_ignored: bool = False, ignore_index: int = -100, validate: bool = True):
        super().__init__(ignore_index, validate)
        self.regularize_ignored = bool(regularize_ignored)
        self.pos_lambda = check_finite_number("pos_lambda", pos_lambda, 0.0)
        self.neg_lambda = check_finite_number("neg_lambda", neg_lambda, 0.0)
        self.alpha = check_finite_number("alpha", alpha, 0.0)
        self.margin = check_finite_number("margin", margin, 0.0)

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        batch = self._flat(logits, target)
        num_classes = batch.num_classes
        ce = mean_ce(batch)
        # the positive term is a mean over rows, the negative one over the K - 1 other entries of each row
        row_scale = _hinge_scale(batch.unmasked() if self.regularize_ignored else batch, per_entry=False)
        reg = _ACLSPenalty.apply(batch.logits, self.margin, self.pos_lambda * row_scale,
                                 self.neg_lambda / (num_classes - 1) * row_scale)
        self._record(ce=ce, reg=reg)
        return ce + self.alpha * reg


def augmented_lagrangian_penalty(h: torch.Tensor, lambd: torch.Tensor, rho: torch.Tensor, kind: str = "phr"):
    """Penalty-Lagrangian P(h; lambda, rho) and its derivative dP/dh for constraints h <= 0 (CALS).

    * ``"phr"`` (Powell-Hestenes-Rockafellar): P = ((lambda + rho h)^2 - lambda^2) / (2 rho) if lambda + rho h >= 0,
      else -lambda^2 / (2 rho); P' = max(lambda + rho h, 0).
    * ``"p2"``: P = lambda h + lambda rho h^2 + rho^2 h^3 / 6 for h >= 0, else lambda h / (1 - rho h).
    * ``"p3"``: P = lambda h + lambda rho h^2 for h >= 0, else lambda h / (1 - rho h).
    """
    if kind == "phr":
        x = lambd + rho * h
        value = torch.where(x >= 0, (x * x - lambd * lambd) / (2 * rho), -lambd * lambd / (2 * rho))
        return value, x.clamp_min(0.0)
    positive = h >= 0
    h_neg = h.clamp(max=0.0)
    inf_value = lambd * h_neg / (1 - rho * h_neg)
    inf_grad = lambd / (1 - rho * h_neg) ** 2
    h_pos = h.clamp(min=0.0)
    if kind == "p2":
        sup_value = lambd * h_pos + lambd * rho * h_pos ** 2 + rho ** 2 * h_pos ** 3 / 6
        sup_grad = lambd + 2 * lambd * rho * h_pos + rho ** 2 * h_pos ** 2 / 2
    elif kind == "p3":
        sup_value = lambd * h_pos + lambd * rho * h_pos ** 2
        sup_grad = lambd + 2 * lambd * rho * h_pos
    else:
        raise ValueError(f"unknown penalty {kind!r}; expected 'phr', 'p2' or 'p3'")
    return torch.where(positive, sup_value, inf_value), torch.where(positive, sup_grad, inf_grad)


_RHO_UPDATES = ("class", "scalar")


@register_loss("cals")
class CALSLoss(LossBase):
    """Class-adaptive label smoothing via an augmented Lagrangian (Liu et al., CVPR 2023), as released
    (``AugLagrangianClass`` of by-liu/CALS).

    Constraints per sample i and class k: h_ik = (max_j z_ij - z_ik - margin) / margin <= 0 (unnormalised with
    ``normalize=False``; the max is ``amax``, so tied maxima share its gradient). Training minimises

        L = CE + mean_{i,k} P(h_ik; lambda_k, rho_k),

    the mean over all N*K entries (pixels too), with the PHR penalty by default (:func:`augmented_lagrangian_penalty`).
    The per-class multipliers lambda_k (initially ``lambd_min``, so training starts close to plain CE) and the
    per-class penalty parameters rho_k (initially ``rho_init``) are the state.

    Hook: ``on_epoch_end(val_logits, val_targets=None)`` runs the outer ALM step on the validation logits (targets
    only mark ignored pixels): every ``lambd_step`` epochs, lambda_k <- clamp(mean_i clamp(P'(h_ik; lambda_k, rho_k),
    lambd_min, lambd_max), lambd_min, lambd_max); with ``rho_step > 0``, every epoch records the mean validation
    constraint c_k = mean_i h_ik, and every ``rho_step`` epochs rho_k <- clamp(gamma rho_k, rho_init, rho_max) for the
    classes whose c_k exceeds tau * max(c_k of the previous epoch, 0). ``rho_step <= 0`` disables the rho update.

    Options for the earlier form of this package (and of the released class's commented-out line):
    ``class_sum=True`` sums the penalty over classes (K times the released mean); ``rho_update="scalar"`` keeps one
    rho for all classes, raised every ``rho_step`` epochs if the validation penalty did not drop below tau times its
    value at the previous rho step (``AugLagrangian.update_rho_by_val`` of the same repository).

    Ignored pixels are left out of the penalty and of the hook; ``regularize_ignored=True`` includes them, as the
    released trainers do (they pass every pixel's logits to the Lagrangian). Defaults: margin 10 (the README command;
    the yaml default is 20), PHR, lambda in [1e-6, 1e6], rho_init 1, rho_max 10, rho_step 10, gamma 1.2, tau 0.9.
    State is in buffers (sized lazily to the number of classes).
    """

    def __init__(self, margin: float = 10.0, penalty: str = "phr", lambd_min: float = 1e-6, lambd_max: float = 1e6,
                 lambd_step: int = 1, rho_init: float = 1.0, rho_max: float = 10.0, rho_step: int = 10,
                 gamma: float = 1.2, tau: float = 0.9, normalize: bool = True, class_sum: bool = False,
                 rho_update: str = "class", regularize_ignored: bool = False, num_classes: Optional[int] = None,
                 ignore_index: int = -100, validate: bool = True):
        super().__init__(ignore_index, validate)
        if penalty not in ("phr", "p2", "p3"):
            raise ValueError(f"penalty must be 'phr', 'p2' or 'p3', got {penalty!r}")
        if rho_update not in _RHO_UPDATES:
            raise ValueError(f"rho_update must be one of {_RHO_UPDATES}, got {rho_update!r}")
        self.margin = check_finite_number("margin", margin, 0.0, low_open=True)
        self.penalty = penalty
        self.lambd_min = check_finite_number("lambd_min", lambd_min, 0.0)
        self.lambd_max = check_finite_number("lambd_max", lambd_max, self.lambd_min)
        self.lambd_step = max(int(lambd_step), 1)
        self.rho_max = check_finite_number("rho_max", rho_max, 0.0, low_open=True)
        self.rho_init = check_finite_number("rho_init", rho_init, 0.0, self.rho_max, low_open=True)
        self.rho_step = int(rho_step)
        self.gamma = check_finite_number("gamma", gamma, 1.0)
        self.tau = check_finite_number("tau", tau, 0.0)
        self.normalize = bool(normalize)
        self.class_sum = bool(class_sum)
        self.rho_update = rho_update
        self.regularize_ignored = bool(regularize_ignored)
        size = 0 if num_classes is None else int(num_classes)
        self.register_buffer("lambd", torch.full((size,), self.lambd_min, dtype=torch.float32))
        self.register_buffer("rho", torch.full((size,), self.rho_init, dtype=torch.float32))
        # mean validation constraint per class at the previous epoch (NaN: none yet), for rho_update="class"
        self.register_buffer("prev_constraint", torch.full((size,), float("nan"), dtype=torch.float32))
        # validation penalty at the previous rho step, for rho_update="scalar"
        self.register_buffer("prev_penalty", torch.tensor(float("nan"), dtype=torch.float32))
        self.register_buffer("epoch", torch.tensor(0, dtype=torch.int64))

    def _ensure_classes(self, num_classes: int) -> None:
        for name, value in (("lambd", self.lambd_min), ("rho", self.rho_init), ("prev_constraint", math.nan)):
            buf = getattr(self, name)
            if buf.numel() == 0:
                setattr(self, name, torch.full((num_classes,), value, dtype=buf.dtype, device=buf.device))
            elif buf.numel() != num_classes:
                raise ValueError(f"CALSLoss holds {name} for {buf.numel()} classes, got {num_classes}")

    def constraints(self, logits2d: torch.Tensor) -> torch.Tensor:
        h = logits2d.amax(dim=1, keepdim=True) - logits2d - self.margin
        return h / self.margin if self.normalize else h

    def _penalty(self, h: torch.Tensor):
        lambd = self.lambd.to(h).unsqueeze(0)
        rho = self.rho.to(h).unsqueeze(0)
        return augmented_lagrangian_penalty(h, lambd, rho, self.penalty)

    def _phr_penalty(self, batch) -> torch.Tensor:
        """mean_{i,k} P_phr(h_ik), using P = ReLU(lambda + rho h)^2 / (2 rho) - lambda^2 / (2 rho): the factor
        1 / sqrt(2 rho_k) is folded into the affine map of the logits, and the constant part is averaged once."""
        z = batch.logits
        lambd = self.lambd.to(z)  # state buffers follow the logits (dtype and device)
        rho = self.rho.to(z)
        root = (2.0 * rho).rsqrt()
        scale = rho / self.margin if self.normalize else rho
        # (lambda + rho h) / sqrt(2 rho) = (max - z) * scale / sqrt(2 rho) + (lambda - scale * margin) / sqrt(2 rho)
        x = (z.amax(dim=1, keepdim=True) - z) * (scale * root) + (lambd - scale * self.margin) * root
        active = masked_mean(x.clamp_min(0.0).square(), batch)
        constant = (lambd.square() / (2.0 * rho)).mean()
        if batch.weight is not None:  # an all-ignored batch has an empty mean: 0
            constant = constant * (batch.weight.sum() > 0).to(z.dtype)
        elif batch.num_rows == 0:
            constant = constant * 0.0
        return active - constant

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        batch = self._flat(logits, target)
        self._ensure_classes(batch.num_classes)
        ce = mean_ce(batch)
        reg_batch = batch.unmasked() if self.regularize_ignored else batch
        if self.penalty == "phr":
            reg = self._phr_penalty(reg_batch)
        else:
            reg = masked_mean(self._penalty(self.constraints(batch.logits))[0], reg_batch)
        if self.class_sum:
            reg = reg * batch.num_classes
        self._record(ce=ce, reg=reg)
        return ce + reg

    @torch.no_grad()
    def on_epoch_end(self, val_logits: torch.Tensor, val_targets: Optional[torch.Tensor] = None) -> None:
        """Outer augmented-Lagrangian step from validation logits (see the class docstring)."""
        if val_targets is None:
            shape = (val_logits.shape[0], *val_logits.shape[2:])
            val_targets = torch.zeros(shape, dtype=torch.long, device=val_logits.device)
        batch = flatten_batch(val_logits, val_targets, self.ignore_index, True, "CALSLoss.on_epoch_end")
        self._ensure_classes(batch.num_classes)
        z = batch.logits.double()
        if not self.regularize_ignored:
            z = z[batch.row_weight() > 0]
        if z.shape[0] == 0:
            raise ValueError("CALSLoss.on_epoch_end: no validation samples")
        h = self.constraints(z)
        value, grad = self._penalty(h)
        epoch = int(self.epoch) + 1  # 1-based count of finished epochs
        if epoch % self.lambd_step == 0:
            new = grad.clamp(self.lambd_min, self.lambd_max).mean(dim=0).clamp(self.lambd_min, self.lambd_max)
            self.lambd.copy_(new.to(self.lambd))
        if self.rho_step > 0 and self.rho_update == "class":
            self._rho_step_per_class(h.mean(dim=0), epoch)
        elif self.rho_step > 0:
            self._rho_step_scalar(float(value.mean()), epoch)  # the sign and ratios do not depend on the scale
        self.epoch.fill_(epoch)

    def _rho_step_per_class(self, constraint: torch.Tensor, epoch: int) -> None:
        prev = self.prev_constraint.to(constraint)
        if epoch % self.rho_step == 0 and not bool(prev.isnan().any()):
            rho = self.rho.to(constraint)
            rho = torch.where(constraint > prev.clamp_min(0.0) * self.tau, rho * self.gamma, rho)
            self.rho.copy_(rho.clamp(self.rho_init, self.rho_max).to(self.rho))
        self.prev_constraint.copy_(constraint.to(self.prev_constraint))

    def _rho_step_scalar(self, val_penalty: float, epoch: int) -> None:
        if epoch % self.rho_step:
            return
        prev = float(self.prev_penalty)
        if prev == prev and prev > 0 and val_penalty > 0 and val_penalty > self.tau * prev:
            self.rho.copy_((self.rho * self.gamma).clamp(max=self.rho_max))
        self.prev_penalty.fill_(val_penalty)
