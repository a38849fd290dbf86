"""Generator quality, measured: how often a classifier trained on real data recognises pure-class samples.

A group's endpoints (lambda = 1: pure class a, lambda = 0: pure class b) should look like their class; the accuracy of
a real-data classifier on them, next to its accuracy on real test images, says how usable the generator is.
"""
from __future__ import annotations

from typing import Callable, Dict

import numpy as np
import torch

from .plan import plan_groups

__all__ = ["pure_class_accuracy"]


@torch.no_grad()
def pure_class_accuracy(pipeline, classify: Callable[[torch.Tensor], torch.Tensor], num_groups: int = 90,
                        batch_groups: int = 16, seed_offset: int = 10_000_000) -> Dict:
    """Accuracy of ``classify`` (uint8 (B, C, H, W) -> logits (B, K)) on the pure endpoints of ``num_groups``
    groups (2 images each), overall and per class. Seeds start at ``seed_offset`` so they never overlap a dataset's.
    """
    groups = plan_groups(pipeline.num_classes, num_groups, seed_offset)
    correct = np.zeros(pipeline.num_classes)
    total = np.zeros(pipeline.num_classes)
    for i in range(0, len(groups), batch_groups):
        images, members = pipeline(groups[i: i + batch_groups], [0.0, 1.0])
        intended = torch.tensor([g.class_a if lam == 1.0 else g.class_b for g, lam in members])
        pred = classify(images).argmax(1).cpu()
        np.add.at(total, intended.numpy(), 1)
        np.add.at(correct, intended.numpy(), (pred == intended).numpy().astype(float))
    per_class = (correct / np.maximum(total, 1)).tolist()
    return {"accuracy": float(correct.sum() / total.sum()), "per_class": per_class, "num_images": int(total.sum())}
