"""``create_encoder``: any of the annotation encoders by kind, the one place that knows all three."""
from __future__ import annotations

from .encoders import ImageEncoder, OpenClipEncoder, TimmEncoder
from .reference import load_reference_encoder

__all__ = ["create_encoder", "ENCODER_KINDS"]

ENCODER_KINDS = ("open_clip", "timm", "reference")


def create_encoder(kind: str, **kwargs) -> ImageEncoder:
    """``create_encoder("open_clip", model_name="ViT-B-32", pretrained="openai")``,
    ``create_encoder("timm", model="resnet18", checkpoint_path="w.safetensors")`` or
    ``create_encoder("reference", path="runs/reference-fmnist")``."""
    if kind == "open_clip":
        return OpenClipEncoder(**kwargs)
    if kind == "timm":
        return TimmEncoder(**kwargs)
    if kind == "reference":
        return load_reference_encoder(**kwargs)
    raise ValueError(f"unknown encoder kind {kind!r}; choose one of {', '.join(ENCODER_KINDS)}")
