"""RankMixup's ranking losses (Noh et al., ICCV 2023): MRL (mixup-based ranking loss) and M-NDCG.

Both train with cross-entropy on the *clean* batch plus a ranking term between clean and mixed samples; the mixed
targets are used only to mask same-class mixes (MRL) and as relevances (M-NDCG), never as CE targets.

Signature (``needs_mixed = True``)::

    loss(logits, target, logits_mixed, target_mixed)

* ``logits`` (B, K): the clean batch; ``target`` (B,) hard labels or (B, K) soft targets.
* ``logits_mixed`` (M * B, K): M mixed copies of the batch, copy-major: row ``q * B + i`` is copy q of sample i,
  x~ = lam_q x_i + (1 - lam_q) x_perm_q(i).
* ``target_mixed`` (M * B, K): the matching mixed targets lam_q y_i + (1 - lam_q) y_perm_q(i) (rows sum to 1).

MRL uses M = 1 in the paper (M > 1 compares every copy with its clean sample); M-NDCG uses M = 3.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import LossBase
from .batch import check_finite_number, flatten_batch, mean_ce, reduce_rows
from .registry import register_loss

__all__ = ["MRLLoss", "MNDCGLoss"]

_SAME_CLASS_TOL = 1e-6


class _RankMixupBase(LossBase):
    needs_mixed = True
    num_mixed = 1

    def _inputs(self, logits, target, logits_mixed, target_mixed):
        name = type(self).__name__
        if not isinstance(logits, torch.Tensor) or logits.ndim != 2:
            raise ValueError(f"{name}: logits must have shape (B, K), got {getattr(logits, 'shape', None)}")
        batch = self._flat(logits, target)
        if not isinstance(logits_mixed, torch.Tensor) or logits_mixed.ndim != 2 \
                or logits_mixed.shape[1] != logits.shape[1]:
            raise ValueError(f"{name}: logits_mixed must have shape (M * B, {logits.shape[1]}), got "
                             f"{getattr(logits_mixed, 'shape', None)}")
        b = logits.shape[0]
        if b == 0 or logits_mixed.shape[0] == 0 or logits_mixed.shape[0] % b:
            raise ValueError(f"{name}: logits_mixed has {logits_mixed.shape[0]} rows, not a positive multiple of the "
                             f"batch size {b}")
        if not isinstance(target_mixed, torch.Tensor) or not target_mixed.is_floating_point() \
                or target_mixed.shape != logits_mixed.shape:
            raise ValueError(f"{name}: target_mixed must be soft targets of shape {tuple(logits_mixed.shape)}, got "
                             f"{getattr(target_mixed, 'shape', None)}")
        mixed = flatten_batch(logits_mixed, target_mixed, self.ignore_index, self.validate, name + " (mixed)")
        return batch, mixed, logits_mixed.shape[0] // b


@register_loss("mrl")
class MRLLoss(_RankMixupBase):
    """Mixup-based ranking loss: the mixed sample must be less confident than its clean sample by a margin,

        L = CE(z, y) + alpha * mean_{q,i} s_qi ReLU(max_k z~_qik - max_k z_ik + margin),

    comparing max *logits*, as the released code does (so the margin is in logit units: 2.0 for CIFAR, the default,
    1.0 for Tiny-ImageNet). s_qi = 0 masks copies whose mixed target has an entry equal to 1 (mixed with the same
    class). alpha = 0.1. Signature in the module docstring.

    ``mask="row"`` (default) applies s_qi to its own copy, so a same-class mix contributes nothing. In the released
    ``RankMixup_MRL`` the mask has shape (B,) and the hinge (B, 1), so their product broadcasts to (B, B) and the
    term is mean(s) * mean(ReLU(...)): the hinges of same-class mixes count, and every hinge is scaled by the share
    of distinct mixes. ``mask="broadcast"`` reproduces that (over all M * B copies).
    """

    def __init__(self, margin: float = 2.0, alpha: float = 0.1, mask: str = "row", ignore_index: int = -100,
                 validate: bool = True):
        super().__init__(ignore_index, validate)
        if mask not in ("row", "broadcast"):
            raise ValueError(f"mask must be 'row' (per copy) or 'broadcast' (the released code's), got {mask!r}")
        self.margin = check_finite_number("margin", margin)
        self.alpha = check_finite_number("alpha", alpha, 0.0)
        self.mask = mask

    def forward(self, logits, target, logits_mixed, target_mixed) -> torch.Tensor:
        batch, mixed, copies = self._inputs(logits, target, logits_mixed, target_mixed)
        ce = mean_ce(batch)
        clean_max = batch.logits.max(dim=1).values.repeat(copies)
        mixed_max = mixed.logits.max(dim=1).values
        distinct = (mixed.soft < 1.0 - _SAME_CLASS_TOL).all(dim=1).to(logits.dtype)
        hinge = (mixed_max - clean_max + self.margin).clamp_min(0.0)
        rank = (distinct * hinge).mean() if self.mask == "row" else distinct.mean() * hinge.mean()
        self._record(ce=ce, rank=rank)
        return ce + self.alpha * rank


@register_loss("mndcg")
class MNDCGLoss(_RankMixupBase):
    """Mixup-based NDCG loss. For each sample the list is [clean (relevance 1), its M mixed copies with relevance
    max_k y~_qk = max(lam_q, 1 - lam_q)], ordered by relevance (descending, stable). With conf the top softmax
    probability of each list item in that order,

        DCG = sum_r conf_r / log2(r + 1),  IDCG = sum_r rel_r / log2(r + 1),
        NDCG = DCG / IDCG if IDCG > DCG else IDCG / DCG  (so NDCG <= 1),
        L = CE(z, y) + alpha * mean_i (1 - NDCG_i),  alpha = 0.1.

    Signature in the module docstring (M = 3 copies in the paper).
    """

    num_mixed = 3

    def __init__(self, alpha: float = 0.1, ignore_index: int = -100, validate: bool = True):
        super().__init__(ignore_index, validate)
        self.alpha = check_finite_number("alpha", alpha, 0.0)

    def forward(self, logits, target, logits_mixed, target_mixed) -> torch.Tensor:
        batch, mixed, copies = self._inputs(logits, target, logits_mixed, target_mixed)
        b, k = logits.shape
        ce = mean_ce(batch)
        clean_conf = F.softmax(batch.logits, dim=1).max(dim=1, keepdim=True).values  # (B, 1)
        mixed_conf = F.softmax(mixed.logits, dim=1).max(dim=1).values.reshape(copies, b).t()  # (B, M)
        relevance = mixed.soft.amax(dim=1).reshape(copies, b).t()  # (B, M)
        order = torch.sort(relevance, dim=1, descending=True, stable=True).indices
        conf_list = torch.cat([clean_conf, mixed_conf.gather(1, order)], dim=1)
        rel_list = torch.cat([torch.ones_like(clean_conf), relevance.gather(1, order)], dim=1)
        discount = torch.log2(torch.arange(2, copies + 3, device=logits.device, dtype=logits.dtype))
        dcg = (conf_list / discount).sum(dim=1)
        idcg = (rel_list / discount).sum(dim=1)
        ndcg = torch.where(idcg > dcg, dcg / idcg, idcg / dcg)
        rank = reduce_rows(1.0 - ndcg, batch)
        self._record(ce=ce, rank=rank)
        return ce + self.alpha * rank
