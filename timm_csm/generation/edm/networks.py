"""EDM's U-Nets: DDPM++ / NCSN++ (``SongUNet``) and ADM (``DhariwalUNet``), re-implemented from NVlabs/edm
``training/networks.py`` (Karras et al., NeurIPS 2022) with the same module names, so a checkpoint's state dict
loads strictly.

* ``SongUNet``: Song et al., "Score-Based Generative Modeling through Stochastic Differential Equations" (ICLR 2021)
  as EDM re-implements it. DDPM++ is ``embedding_type='positional', encoder_type='standard', resample_filter=[1,1],
  channel_mult_noise=1``; NCSN++ is ``'fourier', 'residual', [1,3,3,1], 2``. Blocks: shift conditioning,
  skip scale sqrt(1/2), GroupNorm eps 1e-6, single-head attention at ``attn_resolutions``.
* ``DhariwalUNet``: Dhariwal & Nichol, "Diffusion Models Beat GANs on Image Synthesis" (NeurIPS 2021): scale-and-shift
  conditioning, attention with 64 channels per head (no attention below 64 channels, as EDM).

Both take ``class_labels`` (B, K) as a real-valued vector through a linear ``map_label`` (DDPM++ / NCSN++ scale it by
sqrt(K) first), so soft class weights (a convex mix of one-hot labels) condition on the same mix of the class
embeddings: the semantic mixing of CSM.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .layers import Conv2d, FourierEmbedding, GroupNorm, Linear, PositionalEmbedding, UNetBlock

__all__ = ["SongUNet", "DhariwalUNet", "UNETS"]


def _check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not one of {list(choices)}")


def _drop_labels(labels: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Label dropout of classifier-free-guidance training: zero each row's labels with probability p."""
    if not (training and p):
        return labels
    keep = torch.rand([labels.shape[0], 1], device=labels.device) >= p
    return labels * keep.to(labels.dtype)


class SongUNet(nn.Module):
    """DDPM++ / NCSN++ as in EDM; ``forward(x, noise_labels, class_labels, augment_labels=None)``."""

    def __init__(self, img_resolution: int, in_channels: int, out_channels: int, label_dim: int = 0,
                 augment_dim: int = 0, model_channels: int = 128, channel_mult: Sequence[int] = (1, 2, 2, 2),
                 channel_mult_emb: int = 4, num_blocks: int = 4, attn_resolutions: Sequence[int] = (16,),
                 dropout: float = 0.10, label_dropout: float = 0.0, embedding_type: str = "positional",
                 channel_mult_noise: int = 1, encoder_type: str = "standard", decoder_type: str = "standard",
                 resample_filter: Sequence[float] = (1, 1)):
        _check_choice("embedding_type", embedding_type, ("fourier", "positional"))
        _check_choice("encoder_type", encoder_type, ("standard", "skip", "residual"))
        _check_choice("decoder_type", decoder_type, ("standard", "skip"))
        super().__init__()
        self.label_dropout = float(label_dropout)
        emb_channels, noise_channels = model_channels * channel_mult_emb, model_channels * channel_mult_noise
        block = dict(emb_channels=emb_channels, dropout=dropout, skip_scale=math.sqrt(0.5), eps=1e-6,
                           resample_filter=list(resample_filter), resample_proj=True, adaptive_scale=False)
        self.map_noise = (PositionalEmbedding(noise_channels, endpoint=True) if embedding_type == "positional"
                          else FourierEmbedding(noise_channels))
        self.map_label = Linear(label_dim, noise_channels) if label_dim else None
        self.map_augment = Linear(augment_dim, noise_channels, bias=False) if augment_dim else None
        self.map_layer0 = Linear(noise_channels, emb_channels)
        self.map_layer1 = Linear(emb_channels, emb_channels)
        rf, attn = list(resample_filter), set(attn_resolutions)
        self.enc = nn.ModuleDict()
        cout = caux = in_channels
        for level, mult in enumerate(channel_mult):
            res = img_resolution >> level
            if level == 0:
                self.enc[f"{res}x{res}_conv"] = Conv2d(cout, model_channels, 3)
                cout = model_channels
            else:
                self.enc[f"{res}x{res}_down"] = UNetBlock(cout, cout, down=True, **block)
                if encoder_type == "skip":
                    self.enc[f"{res}x{res}_aux_down"] = Conv2d(caux, caux, 0, down=True, resample_filter=rf)
                    self.enc[f"{res}x{res}_aux_skip"] = Conv2d(caux, cout, 1)
                if encoder_type == "residual":
                    self.enc[f"{res}x{res}_aux_residual"] = Conv2d(caux, cout, 3, down=True, resample_filter=rf,
                                                                   fused_resample=True)
                    caux = cout
            for idx in range(num_blocks):
                cin, cout = cout, model_channels * mult
                self.enc[f"{res}x{res}_block{idx}"] = UNetBlock(cin, cout, num_heads=int(res in attn), **block)
        skips = [block.out_channels for name, block in self.enc.items() if "aux" not in name]
        self.dec = nn.ModuleDict()
        for level, mult in reversed(list(enumerate(channel_mult))):
            res = img_resolution >> level
            if level == len(channel_mult) - 1:
                self.dec[f"{res}x{res}_in0"] = UNetBlock(cout, cout, num_heads=1, **block)
                self.dec[f"{res}x{res}_in1"] = UNetBlock(cout, cout, **block)
            else:
                self.dec[f"{res}x{res}_up"] = UNetBlock(cout, cout, up=True, **block)
            for idx in range(num_blocks + 1):
                cin, cout = cout + skips.pop(), model_channels * mult
                heads = int(idx == num_blocks and res in attn)
                self.dec[f"{res}x{res}_block{idx}"] = UNetBlock(cin, cout, num_heads=heads, **block)
            if decoder_type == "skip" or level == 0:
                if decoder_type == "skip" and level < len(channel_mult) - 1:
                    self.dec[f"{res}x{res}_aux_up"] = Conv2d(out_channels, out_channels, 0, up=True,
                                                             resample_filter=rf)
                self.dec[f"{res}x{res}_aux_norm"] = GroupNorm(cout, eps=1e-6)
                self.dec[f"{res}x{res}_aux_conv"] = Conv2d(cout, out_channels, 3)

    def _embedding(self, noise_labels, class_labels, augment_labels) -> torch.Tensor:
        emb = self.map_noise(noise_labels)
        emb = emb.reshape(emb.shape[0], 2, -1).flip(1).reshape(emb.shape)  # [sin, cos], as the checkpoints
        if self.map_label is not None:
            labels = _drop_labels(class_labels, self.label_dropout, self.training)
            emb = emb + self.map_label(labels * math.sqrt(self.map_label.in_features))
        if self.map_augment is not None and augment_labels is not None:
            emb = emb + self.map_augment(augment_labels)
        return F.silu(self.map_layer1(F.silu(self.map_layer0(emb))))

    def forward(self, x: torch.Tensor, noise_labels: torch.Tensor, class_labels: Optional[torch.Tensor],
                augment_labels: Optional[torch.Tensor] = None) -> torch.Tensor:
        emb = self._embedding(noise_labels, class_labels, augment_labels)
        skips, aux = [], x
        for name, block in self.enc.items():
            if "aux_down" in name:
                aux = block(aux)
            elif "aux_skip" in name:
                x = skips[-1] = x + block(aux)
            elif "aux_residual" in name:
                x = skips[-1] = aux = (x + block(aux)) / math.sqrt(2)
            else:
                x = block(x, emb) if isinstance(block, UNetBlock) else block(x)
                skips.append(x)
        aux = tmp = None
        for name, block in self.dec.items():
            if "aux_up" in name:
                aux = block(aux)
            elif "aux_norm" in name:
                tmp = block(x)
            elif "aux_conv" in name:
                tmp = block(F.silu(tmp))
                aux = tmp if aux is None else tmp + aux
            else:
                if x.shape[1] != block.in_channels:
                    x = torch.cat([x, skips.pop()], dim=1)
                x = block(x, emb)
        return aux


class DhariwalUNet(nn.Module):
    """ADM as in EDM; ``forward(x, noise_labels, class_labels, augment_labels=None)``."""

    def __init__(self, img_resolution: int, in_channels: int, out_channels: int, label_dim: int = 0,
                 augment_dim: int = 0, model_channels: int = 192, channel_mult: Sequence[int] = (1, 2, 3, 4),
                 channel_mult_emb: int = 4, num_blocks: int = 3, attn_resolutions: Sequence[int] = (32, 16, 8),
                 dropout: float = 0.10, label_dropout: float = 0.0):
        super().__init__()
        self.label_dropout = float(label_dropout)
        emb_channels = model_channels * channel_mult_emb
        block = dict(emb_channels=emb_channels, dropout=dropout)
        attn = set(attn_resolutions)

        def heads(channels: int, attention: bool) -> int:  # 64 channels per head
            return channels // 64 if attention else 0

        self.map_noise = PositionalEmbedding(model_channels)
        self.map_augment = Linear(augment_dim, model_channels, bias=False) if augment_dim else None
        self.map_layer0 = Linear(model_channels, emb_channels)
        self.map_layer1 = Linear(emb_channels, emb_channels)
        self.map_label = Linear(label_dim, emb_channels, bias=False) if label_dim else None
        self.enc = nn.ModuleDict()
        cout = in_channels
        for level, mult in enumerate(channel_mult):
            res = img_resolution >> level
            if level == 0:
                self.enc[f"{res}x{res}_conv"] = Conv2d(cout, model_channels * mult, 3)
                cout = model_channels * mult
            else:
                self.enc[f"{res}x{res}_down"] = UNetBlock(cout, cout, down=True, **block)
            for idx in range(num_blocks):
                cin, cout = cout, model_channels * mult
                self.enc[f"{res}x{res}_block{idx}"] = UNetBlock(cin, cout, num_heads=heads(cout, res in attn),
                                                                **block)
        skips = [b.out_channels for b in self.enc.values()]
        self.dec = nn.ModuleDict()
        for level, mult in reversed(list(enumerate(channel_mult))):
            res = img_resolution >> level
            if level == len(channel_mult) - 1:
                self.dec[f"{res}x{res}_in0"] = UNetBlock(cout, cout, num_heads=heads(cout, True), **block)
                self.dec[f"{res}x{res}_in1"] = UNetBlock(cout, cout, **block)
            else:
                self.dec[f"{res}x{res}_up"] = UNetBlock(cout, cout, up=True, **block)
            for idx in range(num_blocks + 1):
                cin, cout = cout + skips.pop(), model_channels * mult
                self.dec[f"{res}x{res}_block{idx}"] = UNetBlock(cin, cout, num_heads=heads(cout, res in attn),
                                                                **block)
        self.out_norm = GroupNorm(cout)
        self.out_conv = Conv2d(cout, out_channels, 3)

    def forward(self, x: torch.Tensor, noise_labels: torch.Tensor, class_labels: Optional[torch.Tensor],
                augment_labels: Optional[torch.Tensor] = None) -> torch.Tensor:
        emb = self.map_noise(noise_labels)
        if self.map_augment is not None and augment_labels is not None:
            emb = emb + self.map_augment(augment_labels)
        emb = self.map_layer1(F.silu(self.map_layer0(emb)))
        if self.map_label is not None:
            emb = emb + self.map_label(_drop_labels(class_labels, self.label_dropout, self.training))
        emb = F.silu(emb)
        skips = []
        for block in self.enc.values():
            x = block(x, emb) if isinstance(block, UNetBlock) else block(x)
            skips.append(x)
        for block in self.dec.values():
            if x.shape[1] != block.in_channels:
                x = torch.cat([x, skips.pop()], dim=1)
            x = block(x, emb)
        return self.out_conv(F.silu(self.out_norm(x)))


UNETS = {"SongUNet": SongUNet, "DhariwalUNet": DhariwalUNet}
