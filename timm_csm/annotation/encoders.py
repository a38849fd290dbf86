"""Image encoders for calibrated re-annotation: uint8 images (B, C, H, W) -> features (B, D).

Three kinds share one interface (:class:`ImageEncoder`):

* ``open_clip``: any open_clip model (the paper: ViT-B-32, OpenAI weights) from a ``pretrained`` tag, a local
  weights file, or a ``local-dir:`` folder; features are ``encode_image`` outputs, *not* normalised by default
  (as the official annotation code), ``normalize=True`` unit-normalises them.
* ``timm``: any timm model, from a local checkpoint; features are the pooled pre-logit features
  (``forward_head(forward_features(x), pre_logits=True)``).
* ``reference``: a small classifier trained here on the real training data (:mod:`timm_csm.annotation.reference`,
  a :class:`TimmEncoder`), the offline default when no CLIP weights are available.

:func:`timm_csm.annotation.factory.create_encoder` builds any of the three from its spec string.

Every encoder carries an ``identity`` string (kind, weights, preprocessing, and a fingerprint of the parameters) that
keys the prototype cache, so a cache can never be reused with different weights.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ..io import state_dict_mismatch
from .preprocess import ImagePreprocessor, as_uint8_batch

__all__ = [
    "ImageEncoder",
    "OpenClipEncoder",
    "TimmEncoder",
    "encode_images",
    "weights_fingerprint",
    "DEFAULT_ZERO_SHOT_TEMPLATES",
]

DEFAULT_ZERO_SHOT_TEMPLATES = ("a photo of a {}.",)


def weights_fingerprint(module: nn.Module) -> str:
    """A short hash of a module's parameters and buffers (names, shapes, sums, sums of squares, a strided sample).

    Cheap (one pass over the weights, no copy to bytes) and different for any two models that differ in practice.
    """
    h = hashlib.sha256()
    with torch.no_grad():
        for name, t in module.state_dict().items():
            if not torch.is_tensor(t) or t.numel() == 0:
                continue
            flat = t.detach().reshape(-1)
            x = flat.double() if flat.is_floating_point() else flat.to(torch.float64)
            sample = x[:: max(1, x.numel() // 64)][:64]
            h.update(f"{name}:{tuple(t.shape)}:{x.sum().item():.10e}:{(x * x).sum().item():.10e}:".encode())
            h.update(np.ascontiguousarray(sample.cpu().numpy()).tobytes())
    return h.hexdigest()[:16]


class ImageEncoder:
    """Base class: ``encode(images_uint8) -> (B, D) float32``.

    Subclasses set ``model``, ``preprocessor`` and ``identity`` and implement :meth:`forward_features` (the raw
    forward pass on preprocessed pixels).
    """

    kind: str = "base"

    def __init__(self, model: nn.Module, preprocessor: ImagePreprocessor, identity: str, device="cpu",
                 dtype: torch.dtype = torch.float32, channels_last: bool = False):
        self.device = torch.device(device)
        self.dtype = dtype
        self.channels_last = channels_last
        self.model = model.to(self.device, dtype).eval()
        if channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
        self.preprocessor = preprocessor
        self.identity = identity
        self._feature_dim: Optional[int] = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.identity})"

    def forward_features(self, pixels: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def preprocess(self, images) -> torch.Tensor:
        """uint8 (B, C, H, W) -> model input on the encoder's device and dtype."""
        x = self.preprocessor(images, device=self.device, dtype=self.dtype)
        return x.contiguous(memory_format=torch.channels_last) if self.channels_last else x

    @torch.inference_mode()
    def encode(self, images) -> torch.Tensor:
        """Features (B, D) in float32 on the encoder's device, for one batch of uint8 images (B, C, H, W)."""
        return self.forward_features(self.preprocess(images)).float()

    @property
    def feature_dim(self) -> int:
        if self._feature_dim is None:
            c = self.preprocessor.channels
            h, w = self.preprocessor.size or (32, 32)
            self._feature_dim = int(self.encode(torch.zeros(1, c, h, w, dtype=torch.uint8)).shape[-1])
        return self._feature_dim

    def describe(self) -> Dict:
        """What the dataset card records about the encoder."""
        return {"kind": self.kind, "model_name": getattr(self, "model_name", ""),
                "weights": getattr(self, "weights", ""), "identity": self.identity,
                "preprocess": self.preprocessor.to_dict()}


def _is_weights_file(pretrained: str) -> bool:
    return "/" in pretrained or "\\" in pretrained or bool(Path(pretrained).suffix) or Path(pretrained).is_file()


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _create_open_clip(model_name: str, pretrained: Optional[str], **create_kwargs) -> nn.Module:
    """``open_clip.create_model`` on CPU, with errors that say what to do.

    A ``pretrained`` tag downloads through open_clip (the Hugging Face Hub cache). A tag the model does not have
    names the model's tags; a tag whose weights cannot be fetched (offline, ``HF_HUB_OFFLINE=1``, or no network)
    names the tag and the local-file alternative.
    """
    import open_clip

    if model_name.startswith("local-dir:") and pretrained is not None:
        raise ValueError("a 'local-dir:' model carries its own weights; do not pass pretrained")
    if pretrained is not None and _is_weights_file(pretrained):
        if not Path(pretrained).is_file():
            raise FileNotFoundError(f"open_clip weights file not found: {pretrained}")
        return open_clip.create_model(model_name, pretrained=pretrained, device="cpu", **create_kwargs)
    tags = open_clip.list_pretrained_tags_by_model(model_name) if pretrained else []
    if tags and pretrained not in tags:
        raise ValueError(f"{pretrained!r} is not an open_clip tag of {model_name}; its tags: {', '.join(tags)} "
                         "(or pass a local weights file)")
    try:
        return open_clip.create_model(model_name, pretrained=pretrained, device="cpu", **create_kwargs)
    except RuntimeError as e:
        if not pretrained:
            raise
        why = "HF_HUB_OFFLINE is set" if _hub_offline() else "no network, or the Hub refused"
        raise RuntimeError(
            f"open_clip could not download the weights of tag {pretrained!r} for {model_name} ({why}). Offline, a "
            f"local weights file works: pretrained='/path/to/weights.safetensors' (OpenAI weights from a file also "
            f"need force_quick_gelu=True), or a 'local-dir:' folder; download them once with network "
            f"(open_clip.create_model({model_name!r}, pretrained={pretrained!r}) fills the Hub cache). open_clip "
            f"said: {str(e)[:300]}") from e


class OpenClipEncoder(ImageEncoder):
    """An open_clip image tower.

    Args:
        model_name: an open_clip config name (``"ViT-B-32"``), or ``"local-dir:/folder"`` holding
            ``open_clip_config.json`` and weights.
        pretrained: a tag (``"openai"``: downloaded through open_clip when online; offline it needs the weights in
            the Hub cache, else the error names the tag and the local-file way), a local weights file
            (``.safetensors``, ``.bin``, ``.pt``), or None for random weights (tests only).
        normalize: unit-normalise the features (a deviation from the paper, which projects raw features).
        **create_kwargs: passed to ``open_clip.create_model`` (e.g. ``force_quick_gelu=True`` for OpenAI weights
            loaded from a file).
    """

    kind = "open_clip"

    def __init__(self, model_name: str = "ViT-B-32", pretrained: Optional[str] = None, normalize: bool = False,
                 device="cpu", dtype: torch.dtype = torch.float32, **create_kwargs):
        model = _create_open_clip(model_name, pretrained, **create_kwargs)
        cfg = dict(model.visual.preprocess_cfg)
        pre = ImagePreprocessor(size=cfg.get("size", 224), mean=cfg.get("mean"), std=cfg.get("std"), channels=3,
                                interpolation=cfg.get("interpolation", "bicubic"),
                                resize_mode="squash" if cfg.get("resize_mode") == "squash" else "shortest")
        weights = Path(pretrained).name if pretrained and Path(pretrained).is_file() else pretrained
        identity = (f"open_clip:{model_name}:{weights or 'random'}:normalize={int(normalize)}:"
                    f"{weights_fingerprint(model)}")
        super().__init__(model, pre, identity, device, dtype)
        self.model_name = model_name
        self.weights = weights or "random"
        self.normalize = normalize
        self._tokenizer = None

    def forward_features(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.model.encode_image(pixels, normalize=self.normalize)

    def describe(self) -> Dict:
        return {**super().describe(), "normalize": self.normalize}

    @torch.inference_mode()
    def text_classifier(self, class_names: Sequence[str],
                        templates: Sequence[str] = DEFAULT_ZERO_SHOT_TEMPLATES) -> torch.Tensor:
        """(K, D) unit text embeddings: per class, the normalised mean over templates of normalised prompt
        embeddings (the usual open_clip zero-shot classifier)."""
        import open_clip

        if self._tokenizer is None:
            self._tokenizer = open_clip.get_tokenizer(self.model_name)
        rows = []
        for name in class_names:
            tokens = self._tokenizer([t.format(name) for t in templates]).to(self.device)
            emb = self.model.encode_text(tokens, normalize=True).float().mean(0)
            rows.append(F.normalize(emb, dim=-1))
        return torch.stack(rows)

    @torch.inference_mode()
    def zero_shot_probs(self, features: torch.Tensor, class_names: Sequence[str],
                        templates: Sequence[str] = DEFAULT_ZERO_SHOT_TEMPLATES,
                        classifier: Optional[torch.Tensor] = None) -> torch.Tensor:
        """CLIP zero-shot class probabilities over all K classes: softmax(exp(logit_scale) * cos(f, t_k)).

        This is the rebuttal's variant 1 ("directly adopting CLIP labels").
        """
        t = classifier if classifier is not None else self.text_classifier(class_names, templates)
        f = F.normalize(features.float(), dim=-1)
        return (self.model.logit_scale.exp().float() * f @ t.to(f.device).T).softmax(-1)


def _strip_prefix(state_dict: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    for prefix in ("module.", "_orig_mod."):
        if state_dict and all(k.startswith(prefix) for k in state_dict):
            state_dict = {k[len(prefix):]: v for k, v in state_dict.items()}
    return state_dict


def _load_state_dict(path) -> Dict[str, torch.Tensor]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return _strip_prefix(load_file(str(path)))
    from timm.models import load_state_dict

    return _strip_prefix(load_state_dict(str(path)))


class TimmEncoder(ImageEncoder):
    """Pooled pre-logit features of a timm model (or any module with timm's ``forward_features`` /
    ``forward_head(x, pre_logits=True)`` interface and a ``pretrained_cfg``).

    Args:
        model: a timm model name or an ``nn.Module``.
        checkpoint_path: local weights (safetensors, or a torch checkpoint timm can read); the number of classes is
            taken from the checkpoint's classifier.
        input_size: (C, H, W) to feed the model; default: the model's ``pretrained_cfg["input_size"]``.
        model_kwargs: passed to ``timm.create_model`` (e.g. ``in_chans=1``).
        channels_last: run in channels-last memory format (oneDNN's fast path for convolutions; about 1.6x
            faster for small CNNs on CPU).
    """

    kind = "timm"

    def __init__(self, model, checkpoint_path=None, device="cpu", dtype: torch.dtype = torch.float32,
                 input_size: Optional[Sequence[int]] = None, model_kwargs: Optional[Dict] = None,
                 identity_prefix: Optional[str] = None, weights_label: Optional[str] = None,
                 channels_last: bool = True):
        import timm

        model_kwargs = dict(model_kwargs or {})
        state_dict = _load_state_dict(checkpoint_path) if checkpoint_path is not None else None
        if isinstance(model, str):
            name = model
            if state_dict is not None and "num_classes" not in model_kwargs:
                model_kwargs["num_classes"] = self._num_classes_in(name, state_dict, model_kwargs)
            model = timm.create_model(name, pretrained=False, **model_kwargs)
        else:
            name = type(model).__name__
        if state_dict is not None:
            mismatch = state_dict_mismatch(model, state_dict)
            if mismatch is not None:
                raise ValueError(f"checkpoint {checkpoint_path} does not fit {name}: {mismatch}")
            model.load_state_dict(state_dict)
        for attr in ("forward_features", "forward_head"):
            if not hasattr(model, attr):
                raise ValueError(f"{name} has no {attr}(); it does not follow timm's model interface")
        cfg = timm.data.resolve_model_data_config(model)
        size = tuple(input_size) if input_size is not None else (_in_chans(model, cfg), *cfg["input_size"][1:])
        pre = ImagePreprocessor(size=size[1:], mean=cfg["mean"], std=cfg["std"], channels=size[0],
                                interpolation=cfg.get("interpolation", "bicubic"),
                                crop_pct=float(cfg.get("crop_pct", 1.0)))
        weights = weights_label or (Path(checkpoint_path).name if checkpoint_path is not None else "random")
        identity = (f"{identity_prefix or 'timm'}:{name}:{weights}:"
                    f"{json.dumps(pre.to_dict(), sort_keys=True)}:{weights_fingerprint(model)}")
        super().__init__(model, pre, identity, device, dtype, channels_last=channels_last)
        self.model_name = name
        self.weights = weights

    @staticmethod
    def _num_classes_in(name: str, state_dict, model_kwargs) -> int:
        import timm

        probe = timm.create_model(name, pretrained=False, **model_kwargs)
        classifier = probe.pretrained_cfg.get("classifier")
        if isinstance(classifier, (list, tuple)):
            classifier = classifier[0]
        key = f"{classifier}.weight" if classifier else None
        if key in state_dict:
            return int(state_dict[key].shape[0])
        return 0  # the checkpoint has no classifier: a feature extractor

    def forward_features(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.model.forward_features(pixels)
        return self.model.forward_head(x, pre_logits=True)

    @property
    def num_classes(self) -> int:
        return int(getattr(self.model, "num_classes", 0))

    @torch.inference_mode()
    def logits_from_features(self, features: torch.Tensor) -> torch.Tensor:
        """The model's classifier applied to pooled features (B, D) -> (B, K)."""
        if self.num_classes <= 0:
            raise ValueError(f"{self.model_name} has no classifier head")
        return self.model.get_classifier()(features.to(self.device, self.dtype)).float()


def _in_chans(model: nn.Module, cfg: Dict) -> int:
    """Input channels of a timm model: its first conv's weight, else the data config (which keeps the pretrained
    value even when the model was built with another ``in_chans``)."""
    first = (getattr(model, "pretrained_cfg", None) or {}).get("first_conv")
    if isinstance(first, (list, tuple)):
        first = first[0]
    if first:
        try:
            weight = model.get_submodule(first).weight
            return int(weight.shape[1])
        except AttributeError:
            pass
    return int(cfg["input_size"][0])


def encode_images(encoder: ImageEncoder, images, batch_size: int = 256, progress: bool = False,
                  desc: str = "encode", reduce: Optional[Callable[[torch.Tensor, slice], None]] = None
                  ) -> Optional[torch.Tensor]:
    """Encode uint8 images (N, C, H, W) in batches.

    Returns the (N, D) float32 features on the CPU, or, when ``reduce(features, rows)`` is given, calls it per batch
    and returns None (so large datasets can be streamed without holding every feature).
    """
    from tqdm.auto import tqdm

    images = as_uint8_batch(images) if not isinstance(images, np.ndarray) else images
    n = len(images)
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    out: List[torch.Tensor] = []
    for start in tqdm(range(0, n, batch_size), desc=desc, disable=not progress, unit="batch", dynamic_ncols=True):
        rows = slice(start, min(n, start + batch_size))
        feats = encoder.encode(images[rows])
        if reduce is not None:
            reduce(feats, rows)
        else:
            out.append(feats.cpu())
    if reduce is not None:
        return None
    if not out:
        return torch.zeros(0, encoder.feature_dim)
    return torch.cat(out)
