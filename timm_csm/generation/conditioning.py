"""Soft class conditioning for diffusers models.

A condition is a weight vector over classes: ``lambda`` on class a and ``1 - lambda`` on class b. Class embeddings
in UNet2DModel and DiT are lookup tables, hence linear in a one-hot label, so a convex mix of one-hot vectors
gives the convex mix of the two embedding rows, as EDM's ``map_label`` does for real-valued label vectors
(CSM spec section 2.2).
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

__all__ = [
    "SoftClassEmbedding",
    "mix_weights",
    "enable_soft_class_conditioning",
    "enable_soft_dit_conditioning",
    "mix_prompt_embeddings",
    "find_soft_class_table",
]


class SoftClassEmbedding(nn.Embedding):
    """An ``nn.Embedding`` that also takes float class weights.

    * int64 (B,) indices: the ordinary lookup;
    * float (B, K') weights with K' <= num_embeddings: ``weights @ weight[:K']``.

    The parameter keeps the name ``weight``, so state dicts and safetensors files stay compatible with the plain
    embedding.
    """

    def forward(self, labels: torch.Tensor) -> torch.Tensor:
        if labels.is_floating_point():
            if labels.ndim != 2 or labels.shape[1] > self.num_embeddings:
                raise ValueError(
                    f"soft class weights must be (B, K) with K <= {self.num_embeddings}, got {tuple(labels.shape)}"
                )
            return labels.to(self.weight.dtype) @ self.weight[: labels.shape[1]]
        return super().forward(labels)

    @classmethod
    def from_embedding(cls, embedding: nn.Embedding) -> "SoftClassEmbedding":
        if isinstance(embedding, cls):
            return embedding
        soft = cls(embedding.num_embeddings, embedding.embedding_dim, padding_idx=embedding.padding_idx)
        soft.weight = embedding.weight  # share, do not copy: the module keeps training the same parameter
        return soft


def mix_weights(class_a, class_b, lam, num_classes: int, dtype=torch.float32) -> torch.Tensor:
    """(B, num_classes) weights with ``lam`` on class a and ``1 - lam`` on class b.

    ``lam = 1`` is pure class a, ``lam = 0`` pure class b (the paper's convention, CSM spec section 2.2).
    """
    class_a = torch.as_tensor(class_a, dtype=torch.long).reshape(-1)
    class_b = torch.as_tensor(class_b, dtype=torch.long).reshape(-1)
    lam = torch.as_tensor(lam, dtype=torch.float64).reshape(-1)
    n = max(len(class_a), len(class_b), len(lam))
    class_a, class_b, lam = (t.expand(n) if len(t) == 1 else t for t in (class_a, class_b, lam))
    if len({len(class_a), len(class_b), len(lam)}) != 1:
        raise ValueError("class_a, class_b and lam must have matching lengths")
    for name, c in (("class_a", class_a), ("class_b", class_b)):
        if len(c) and (c.min() < 0 or c.max() >= num_classes):
            raise ValueError(f"{name} out of range [0, {num_classes}): {c.tolist()}")
    if torch.isnan(lam).any() or (lam < 0).any() or (lam > 1).any():
        raise ValueError(f"lambda must lie in [0, 1], got {lam.tolist()}")
    w = torch.zeros(n, num_classes, dtype=torch.float64)
    rows = torch.arange(n)
    w[rows, class_a] += lam
    w[rows, class_b] += 1 - lam
    return w.to(dtype)


def enable_soft_class_conditioning(unet) -> "torch.nn.Module":
    """Make a diffusers ``UNet2DModel`` (or ``UNet2DConditionModel``) built with ``num_class_embeds`` accept float
    class weights. Idempotent; call it again after ``from_pretrained``, which rebuilds a plain ``nn.Embedding``."""
    emb = getattr(unet, "class_embedding", None)
    if not isinstance(emb, nn.Embedding):
        raise ValueError(
            "this generator has no class-embedding table (build the UNet with num_class_embeds=K, "
            "class_embed_type=None): it cannot be class-conditioned"
        )
    unet.class_embedding = SoftClassEmbedding.from_embedding(emb)
    return unet


def enable_soft_dit_conditioning(dit) -> "torch.nn.Module":
    """Make a diffusers ``DiTTransformer2DModel`` accept float class weights.

    Every block owns a ``LabelEmbedding`` whose table has ``num_classes + 1`` rows (the last one is the null class of
    classifier-free guidance); each table is swapped for a :class:`SoftClassEmbedding` sharing the parameter.
    Float labels skip ``LabelEmbedding.token_drop`` (which only handles int labels), so sample in ``eval()`` mode.
    """
    found = 0
    for module in dit.modules():
        table = getattr(module, "embedding_table", None)
        if isinstance(table, nn.Embedding) and hasattr(module, "num_classes"):
            module.embedding_table = SoftClassEmbedding.from_embedding(table)
            found += 1
    if not found:
        raise ValueError("this DiT has no label-embedding table: it cannot be class-conditioned")
    return dit


def mix_prompt_embeddings(embeds_a: torch.Tensor, embeds_b: torch.Tensor, lam: Sequence[float]) -> torch.Tensor:
    """Semantic mixing for text-conditioned pipelines (Stable Diffusion): ``lam * e_a + (1 - lam) * e_b`` per row.

    ``embeds_a`` / ``embeds_b`` are the encoded class prompts, (B, L, D) or broadcastable; pass the result as
    ``prompt_embeds`` to the pipeline.
    """
    lam = torch.as_tensor(lam, dtype=embeds_a.dtype, device=embeds_a.device).reshape(-1, *([1] * (embeds_a.ndim - 1)))
    if ((lam < 0) | (lam > 1)).any():
        raise ValueError("lambda must lie in [0, 1]")
    return lam * embeds_a + (1 - lam) * embeds_b


def find_soft_class_table(model) -> SoftClassEmbedding:
    """The first :class:`SoftClassEmbedding` of a model (its class table, null row last when it has one)."""
    for module in model.modules():
        if isinstance(module, SoftClassEmbedding):
            return module
    raise ValueError("the generator has no soft class table: call enable_soft_class_conditioning "
                     "(UNet2DModel) or enable_soft_dit_conditioning (DiT) first")
