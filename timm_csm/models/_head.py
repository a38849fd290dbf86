"""The classifier-head half of timm's model interface, shared by the hand-written small-image networks."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import SelectAdaptivePool2d

__all__ = ["PooledLinearHead"]


class PooledLinearHead:
    """Mixin for an ``nn.Module`` with ``global_pool``, ``fc``, ``num_features``, ``num_classes`` and ``drop_rate``:
    ``get_classifier``, ``reset_classifier``, ``forward_head`` and ``forward`` as timm models have them."""

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.fc

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None):
        self.num_classes = num_classes
        if global_pool is not None:
            self.global_pool = SelectAdaptivePool2d(pool_type=global_pool, flatten=True)
        self.fc = (nn.Linear(self.num_features * self.global_pool.feat_mult(), num_classes)
                   if num_classes > 0 else nn.Identity())

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = self.global_pool(x)
        if self.drop_rate > 0:
            x = F.dropout(x, p=self.drop_rate, training=self.training)
        return x if pre_logits else self.fc(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))
