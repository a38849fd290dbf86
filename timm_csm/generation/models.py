"""Class-conditional diffusers UNets for the generator profiles, and the digests that name a generator's weights.

A trained generator is saved and loaded as a :class:`~timm_csm.generation.pipeline.SemanticMixingPipeline`
(``save_pretrained`` / ``from_pretrained``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, Optional, Tuple

from ..io import file_sha256
from ..registry import Registry
from .conditioning import enable_soft_class_conditioning

__all__ = [
    "GeneratorConfig", "GENERATOR_PROFILES", "register_generator_profile", "create_class_unet", "weights_digest",
    "file_digest", "revision",
]


@dataclass
class GeneratorConfig:
    """Architecture and training recipe of a class-conditional DDPM (epsilon prediction)."""

    sample_size: int = 28
    in_channels: int = 1
    block_out_channels: Tuple[int, ...] = (32, 64, 64)
    down_block_types: Tuple[str, ...] = ("DownBlock2D", "DownBlock2D", "AttnDownBlock2D")
    up_block_types: Tuple[str, ...] = ("AttnUpBlock2D", "UpBlock2D", "UpBlock2D")
    layers_per_block: int = 1
    norm_num_groups: int = 8
    num_train_timesteps: int = 1000
    beta_schedule: str = "squaredcos_cap_v2"
    # training
    steps: int = 6000
    batch_size: int = 64
    lr: float = 1e-3
    warmup_steps: int = 200
    ema_decay: float = 0.999
    cond_drop_prob: float = 0.1  # label dropout so classifier-free guidance stays available (scale 1 = unused)
    checkpoint_every: int = 250
    seed: int = 0
    hflip: bool = False

    def to_dict(self) -> Dict:
        return asdict(self)


#: the generator-training profiles, in registration order: name -> :class:`GeneratorConfig`
#: (``GENERATOR_PROFILES["smoke"]``); ``timm-csm-train-generator --profile`` takes their names
GENERATOR_PROFILES = Registry("generator profile", sort=False, create=lambda name, config, spec, **changes:
                              dataclasses.replace(config, **changes))


def register_generator_profile(name: str, config: Optional[GeneratorConfig] = None, *, overwrite: bool = False):
    """Register ``config`` as the generator-training profile ``name``."""
    return GENERATOR_PROFILES.register(name, config, overwrite=overwrite)


for _name, _config in {
    # a few steps of a tiny net: exercises every code path in seconds
    "smoke": GeneratorConfig(block_out_channels=(16, 16, 32), norm_num_groups=8, steps=4, batch_size=8,
                             warmup_steps=1, checkpoint_every=2),
    # the embedded default, trained on CPU with one thread
    "fmnist": GeneratorConfig(),
    # scikit-learn's 8x8 digits (the fallback when Fashion-MNIST is absent): minutes of CPU
    "digits": GeneratorConfig(sample_size=8, block_out_channels=(32, 64), down_block_types=("DownBlock2D",
                              "AttnDownBlock2D"), up_block_types=("AttnUpBlock2D", "UpBlock2D"), steps=3000,
                              batch_size=64, checkpoint_every=500),
    # GPU profiles (CIFAR at 32 px); the EDM paper's DDPM++ is larger, these are the diffusers-UNet equivalents
    "cifar10": GeneratorConfig(sample_size=32, in_channels=3, block_out_channels=(128, 256, 256, 256),
                               down_block_types=("DownBlock2D", "AttnDownBlock2D", "DownBlock2D", "DownBlock2D"),
                               up_block_types=("UpBlock2D", "UpBlock2D", "AttnUpBlock2D", "UpBlock2D"),
                               layers_per_block=2, norm_num_groups=32, steps=200000, batch_size=128, lr=2e-4,
                               warmup_steps=5000, ema_decay=0.9999, checkpoint_every=5000, hflip=True),
    "cifar100": GeneratorConfig(sample_size=32, in_channels=3, block_out_channels=(128, 256, 256, 256),
                                down_block_types=("DownBlock2D", "AttnDownBlock2D", "DownBlock2D", "DownBlock2D"),
                                up_block_types=("UpBlock2D", "UpBlock2D", "AttnUpBlock2D", "UpBlock2D"),
                                layers_per_block=2, norm_num_groups=32, steps=300000, batch_size=128, lr=2e-4,
                                warmup_steps=5000, ema_decay=0.9999, checkpoint_every=5000, hflip=True),
}.items():
    register_generator_profile(_name, _config)


def create_class_unet(config: GeneratorConfig, num_classes: int):
    """A ``UNet2DModel`` with ``num_classes + 1`` class embeddings (the last row is the null class for guidance),
    made to accept soft class weights."""
    from diffusers import UNet2DModel

    unet = UNet2DModel(
        sample_size=config.sample_size,
        in_channels=config.in_channels,
        out_channels=config.in_channels,
        block_out_channels=tuple(config.block_out_channels),
        down_block_types=tuple(config.down_block_types),
        up_block_types=tuple(config.up_block_types),
        layers_per_block=config.layers_per_block,
        norm_num_groups=config.norm_num_groups,
        num_class_embeds=num_classes + 1,
    )
    return enable_soft_class_conditioning(unet)


def revision(sha256: str) -> str:
    """A generator's revision in dataset provenance: the first 12 hex digits of its weights file's SHA-256."""
    return sha256[:12]


def file_digest(path) -> str:
    """The :func:`revision` of a file (its SHA-256 read here; a loader that hashes as it reads gives the same)."""
    return revision(file_sha256(path))


def weights_digest(folder) -> str:
    """:func:`file_digest` of a generator folder's UNet weights (``unet/diffusion_pytorch_model.safetensors``) only:
    ``model_index.json`` and the configs can change without changing the generator's revision (caches key on it)."""
    return file_digest(Path(folder) / "unet" / "diffusion_pytorch_model.safetensors")
