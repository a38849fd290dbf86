"""The fit shared by vector scaling, matrix scaling and Dirichlet calibration: multinomial logistic regression
``z' = W x + b`` on a fixed feature ``x`` of the logits (the logits, or the log-probabilities), with W full (C x C)
or diagonal (a vector), by the mean validation NLL plus an optional quadratic penalty.

* The objective and its gradient are computed analytically in fused passes over row blocks of ``x`` in the logits'
  precision (float32 for float32 logits: ``addmm`` / ``addcmul``, a max-shifted ``exp``, the row sums, and the
  gradient ``sum_i (p_i - e_{y_i}) x_i^T`` as a block matmul), every sum over rows accumulated in float64. The label
  terms ``sum_i z'_{i y_i}`` and their gradient are linear in (W, b): their per-class sums of ``x`` are taken once.
* L-BFGS (:func:`~timm_csm.calibration.optim.minimise_lbfgs`) runs on float64 parameters of standardised features
  ``(x - mean) / std`` (the same objective, better conditioned: log-probabilities far below 0 would otherwise couple
  the weights and the intercepts), warm-started from temperature scaling (``W = I / T``, ``b = 0``: for the
  log-probabilities too, since ``softmax(log_softmax(z) / T) = softmax(z / T)``), and stops when an iteration lowers
  the objective by less than :func:`~timm_csm.calibration.optim.objective_tolerance` of it.
"""
from __future__ import annotations

import time
from typing import Callable, Optional, Tuple

import torch

from ._kernels import NARROW_CLASSES, row_blocks
from .optim import minimise_lbfgs, objective_tolerance
from .temperature import fit_inverse_temperature

__all__ = ["AffineNLL", "fit_affine"]

_F64 = torch.float64
Penalty = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class AffineNLL:
    """``(value, grad_W, grad_b)`` of the mean NLL of ``softmax(W x + b)`` against ``targets`` (float64 results;
    ``W`` (C, C), or (C,) when ``diagonal``). The column means and standard deviations of ``x`` are taken in the same
    first pass as the per-class label sums. For fewer than 32 classes the passes run on a (C, N) copy of ``x``
    (sums over the classes along the samples, and ``W x^T`` with the samples as the long dimension)."""

    def __init__(self, x: torch.Tensor, targets: torch.Tensor, diagonal: bool):
        n, c = x.shape
        self.diagonal, self.n, self.device = diagonal, n, x.device
        self.label_count = torch.bincount(targets, minlength=c).to(_F64)
        self.label_x = torch.zeros((c,) if diagonal else (c, c), dtype=_F64, device=x.device)
        total = torch.zeros(c, dtype=_F64, device=x.device)
        squares = torch.zeros(c, dtype=_F64, device=x.device)
        blocks = row_blocks(n, c, 1 << 16 if diagonal else 1 << 21)
        for start, stop in blocks:
            block, y = x[start:stop].to(_F64), targets[start:stop]
            total += block.sum(0)
            squares += block.square().sum(0)
            if diagonal:
                self.label_x.index_add_(0, y, block.gather(1, y[:, None]).squeeze(1))
            else:
                self.label_x.index_add_(0, y, block)
        self.mean = total / n
        std = (squares / n - self.mean.square()).clamp_(min=0).sqrt_()
        self.scale = torch.where(std > 1e-12 * (1 + self.mean.abs()), std, torch.ones_like(std))
        self.columns = c < NARROW_CLASSES
        self.x = x.T.contiguous() if self.columns else x
        self.blocks = blocks

    def _block(self, start: int, stop: int):
        return self.x[:, start:stop] if self.columns else self.x[start:stop]

    def __call__(self, weight: torch.Tensor, bias: torch.Tensor) -> Tuple[float, torch.Tensor, torch.Tensor]:
        w, b = weight.to(self.x.dtype), bias.to(self.x.dtype)
        classes = 0 if self.columns else 1  # the dimension of the classes in a block
        if self.columns:
            w_, b_ = (w.unsqueeze(1) if self.diagonal else w), b.unsqueeze(1)
        else:
            w_, b_ = (w if self.diagonal else w.T), b
        log_sum = torch.zeros((), dtype=_F64, device=self.device)
        grad_w, grad_b = torch.zeros_like(weight), torch.zeros_like(bias)
        for start, stop in self.blocks:
            x = self._block(start, stop)
            if self.diagonal:
                z = torch.addcmul(b_, x, w_)
            else:
                z = torch.addmm(b_, w_, x) if self.columns else torch.addmm(b_, x, w_)
            top = z.amax(classes, keepdim=True)
            s = z.sub_(top).exp_().sum(classes, keepdim=True)
            log_sum += s.log().add_(top).sum(dtype=_F64)
            p = z.div_(s)
            grad_b += p.sum(1 - classes, dtype=_F64)
            if self.diagonal:
                grad_w += p.mul_(x).sum(1 - classes, dtype=_F64)
            else:  # a float32 matrix product per block (its sums over the block's rows), added up in float64
                grad_w += (p @ x.T if self.columns else p.T @ x).to(_F64)
        # the label terms, with the parameters as the blocks saw them (rounded to the blocks' precision)
        w64, b64 = w.to(_F64), b.to(_F64)
        label = (w64 * self.label_x).sum() + self.label_count @ b64
        value = float(log_sum - label) / self.n
        return value, (grad_w - self.label_x) / self.n, (grad_b - self.label_count) / self.n


def fit_affine(logits: torch.Tensor, targets: torch.Tensor, features: Callable[[torch.Tensor], torch.Tensor],
               diagonal: bool, max_iter: int, name: str, penalty: Optional[Penalty] = None):
    """``(W, b, fit_info)`` of the penalised multinomial regression on ``features(logits)`` (see the module
    docstring); ``fit_info`` holds the L-BFGS iterations and evaluations, the final objective, the iterations of
    the temperature-scaling warm start and ``trace``: ``(process CPU seconds since the fit began, objective)`` after
    each evaluation (what a comparison of optimisers that stop at different objectives needs)."""
    start = time.process_time()
    beta, warm = fit_inverse_temperature(logits, targets, 1.0 / 1.5, 50)
    objective = AffineNLL(features(logits), targets, diagonal)
    mean, scale = objective.mean, objective.scale
    c = logits.shape[1]
    # standardised parameters: W = W~ / scale (per column), b = b~ - W mean
    weight_s = (torch.full((c,), beta, dtype=_F64) * scale) if diagonal else torch.diag(beta * scale)
    bias_s = beta * mean

    def unscaled():
        weight = weight_s / scale
        return weight, bias_s - (weight * mean if diagonal else weight @ mean)

    trace = []

    def evaluate():
        weight, bias = unscaled()
        value, grad_w, grad_b = objective(weight, bias)
        if penalty is not None:
            with torch.enable_grad():
                w, b = weight.requires_grad_(True), bias.requires_grad_(True)
                extra = penalty(w, b)
                pw, pb = torch.autograd.grad(extra, [w, b])
            value, grad_w, grad_b = value + float(extra.detach()), grad_w + pw, grad_b + pb
        grad_ws = (grad_w - (grad_b * mean if diagonal else torch.outer(grad_b, mean))) / scale
        trace.append((time.process_time() - start, value))
        return value, [grad_ws, grad_b]

    result = minimise_lbfgs([weight_s, bias_s], evaluate, max_iter, name, ftol=objective_tolerance(logits.dtype))
    weight, bias = unscaled()
    info = {"iterations": result.iterations, "evaluations": result.evaluations, "objective": result.value,
            "warm_start_iterations": warm["iterations"], "trace": trace}
    return weight, bias, info
