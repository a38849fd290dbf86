"""Generator quality, measured: how often a classifier trained on real data recognises pure-class samples, and how
well a classifier tells generated images from real ones.

A group's endpoints (lambda = 1: pure class a, lambda = 0: pure class b) should look like their class; the accuracy of
a real-data classifier on them, next to its accuracy on real test images, says how usable the generator is. The
two-sample accuracy says how far the generated domain is from the real one.
"""
from __future__ import annotations

from typing import Callable, Dict

import numpy as np
import torch

from .plan import plan_groups

__all__ = ["pure_class_accuracy", "two_sample_accuracy", "QUALITY_SAMPLER_STEPS"]

#: the sampler steps of a generator-quality measurement (``timm-csm-evaluate-generator``) and of the recipe's groups,
#: whose quality the recipe measures with the same sampler: fewer than a generator folder's default (50), which costs
#: 2.5 times as much on a CPU
QUALITY_SAMPLER_STEPS = 20


@torch.no_grad()
def pure_class_accuracy(pipeline, classify: Callable[[torch.Tensor], torch.Tensor], num_groups: int = 90,
                        batch_groups: int = 16, seed_offset: int = 10_000_000) -> Dict:
    """Accuracy of ``classify`` (uint8 (B, C, H, W) -> logits (B, K)) on the pure endpoints of ``num_groups``
    groups (2 images each), overall and per class, with the pipeline's sampling defaults (and its step bar off).
    Seeds start at ``seed_offset`` so they never overlap a dataset's.
    """
    groups = plan_groups(pipeline.num_classes, num_groups, seed_offset)
    if hasattr(pipeline, "set_progress_bar_config"):
        pipeline.set_progress_bar_config(disable=True)
    correct = np.zeros(pipeline.num_classes)
    total = np.zeros(pipeline.num_classes)
    for i in range(0, len(groups), batch_groups):
        images, members = pipeline(groups[i: i + batch_groups], [0.0, 1.0], output_type="pt", return_dict=False)
        intended = torch.tensor([g.class_a if lam == 1.0 else g.class_b for g, lam in members])
        pred = classify(images).argmax(1).cpu()
        np.add.at(total, intended.numpy(), 1)
        np.add.at(correct, intended.numpy(), (pred == intended).numpy().astype(float))
    per_class = (correct / np.maximum(total, 1)).tolist()
    return {"accuracy": float(correct.sum() / total.sum()), "per_class": per_class, "num_images": int(total.sum())}


def two_sample_accuracy(real: torch.Tensor, generated: torch.Tensor, epochs: int = 5, seed: int = 0) -> float:
    """Classifier two-sample test: a ``small_cnn`` learns to tell real from generated uint8 images on half of an equal
    number of each and is scored on the other half. 0.5: indistinguishable; 1.0: the two domains are separable, so
    a classifier can be soft on generated images and sharp on real ones at the same time. With fewer than a few
    thousand images of each kind the test cannot separate even clearly different sets (about 0.6 for 1 600 each)."""
    import timm

    from .. import models  # noqa: F401  (registers small_cnn with timm)

    g = torch.Generator().manual_seed(seed)
    n = min(len(real), len(generated))
    x = torch.cat([real[torch.randperm(len(real), generator=g)[:n]],
                   generated[torch.randperm(len(generated), generator=g)[:n]]]).float() / 255.0 - 0.5
    y = torch.cat([torch.zeros(n, dtype=torch.long), torch.ones(n, dtype=torch.long)])
    order = torch.randperm(2 * n, generator=g)
    train, test = order[:n], order[n:]
    torch.manual_seed(seed)
    model = timm.create_model("small_cnn", num_classes=2, in_chans=x.shape[1])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(epochs):
        model.train()
        for batch in train[torch.randperm(n, generator=g)].split(128):
            loss = torch.nn.functional.cross_entropy(model(x[batch]), y[batch])
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        pred = torch.cat([model(x[b]).argmax(1) for b in test.split(500)])
    return float((pred == y[test]).float().mean())
