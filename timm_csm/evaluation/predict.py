"""Prediction: a model's logits over a loader, the one implementation behind a training run's validation and test
passes and ``timm-csm-calibrate``'s splits (:func:`predict_split` of a :class:`~.classifier.Classifier`)."""
from __future__ import annotations

import contextlib

import torch
import torch.nn as nn

from .memory import release_freed_memory

__all__ = ["predict", "predict_split", "OneDevice"]

_RELEASE_EVERY = 20  # batches of an evaluation pass between two returns of freed memory to the system


@torch.no_grad()
def predict(model: nn.Module, loader, accelerator, features: bool = False, channels_last: bool = False):
    """Logits (N, K), labels (N,) and optionally penultimate features (N, D) over ``loader``, gathered from
    every process in dataset order (float32 on the CPU); ``channels_last``: inputs in that memory layout."""
    was_training = model.training
    model.eval()
    logits_all, labels_all, feats_all = [], [], []
    for step, batch in enumerate(loader):
        if step % _RELEASE_EVERY == 0:  # else glibc's heap grows with the number of batches (evaluation.memory)
            release_freed_memory()
        x = batch["pixel_values"].to(accelerator.device)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        y = batch["labels"].to(accelerator.device)
        with accelerator.autocast():
            if features:
                fmap = model.forward_features(x)
                feats = model.forward_head(fmap, pre_logits=True)
                logits = model.forward_head(fmap)
            else:
                logits = model(x)
        gathered = accelerator.gather_for_metrics((logits.float(), y) + ((feats.float(),) if features else ()))
        logits_all.append(gathered[0].cpu())
        labels_all.append(gathered[1].cpu())
        if features:
            feats_all.append(gathered[2].cpu())
    model.train(was_training)
    out = (torch.cat(logits_all), torch.cat(labels_all))
    return out + ((torch.cat(feats_all),) if features else ())


class OneDevice:
    """What :func:`predict` asks of its accelerator, for one process in full precision on the ``device`` the caller
    names (any torch device, ``cuda:1`` included): no autocast, nothing to gather."""

    def __init__(self, device):
        self.device = torch.device(device)

    @staticmethod
    def autocast():
        return contextlib.nullcontext()

    @staticmethod
    def gather_for_metrics(tensors):
        return tensors


def predict_split(classifier, split, batch_size: int, device: str, workers: int):
    """(logits float32 (N, C), labels (N,)) of ``split`` through the :class:`~.classifier.Classifier`'s eval
    transform, by :func:`predict` on one ``device``."""
    from torch.utils.data import DataLoader

    from ..data import BatchTransform, ImageCollator, IndexDataset, LazyImages, pil_mode

    images, tf = split.images, classifier.transform
    if isinstance(tf, BatchTransform) and isinstance(images, LazyImages):  # one size, to be stacked into a batch
        images = images.with_output(pil_mode(tf.in_chans), tf.img_size)
    loader = DataLoader(IndexDataset(len(split)), batch_size=batch_size, shuffle=False, num_workers=workers,
                        collate_fn=ImageCollator(images, split.labels, tf, 0))
    return predict(classifier.model.to(device), loader, OneDevice(device))
