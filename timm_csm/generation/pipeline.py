"""Semantic-mixing pipelines: groups in, uint8 images out.

The model and its sampler are kept apart (diffusers' split): :class:`SemanticMixingPipeline` runs a diffusers model
(UNet2DModel or DiTTransformer2DModel with a soft class table) through any diffusers scheduler;
:class:`EDMSemanticMixingPipeline` runs an EDM-preconditioned denoiser through the EDM Heun sampler.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

import torch

from .conditioning import find_soft_class_table, mix_weights
from .plan import Group, group_noise
from .sampling import edm_heun_sample, sample_with_scheduler, to_uint8

__all__ = ["SemanticMixingPipeline", "EDMSemanticMixingPipeline", "expand_groups"]


def expand_groups(groups: Sequence[Group], lambdas: Sequence[float], num_classes: int, image_shape):
    """Rows of a batch of groups: (class weights (G*L, K), noise (G*L, *image_shape), member list)."""
    members = [(g, lam) for g in groups for lam in lambdas]
    if not members:
        raise ValueError("no groups to generate")
    for g in groups:
        if not (0 <= g.class_a < num_classes and 0 <= g.class_b < num_classes):
            raise ValueError(f"group {g.group_id}: class index out of range [0, {num_classes}): "
                             f"({g.class_a}, {g.class_b})")
    w = mix_weights([m[0].class_a for m in members], [m[0].class_b for m in members],
                    [m[1] for m in members], num_classes)
    noise = torch.stack([group_noise(g.seed, image_shape) for g in groups])
    noise = noise.repeat_interleave(len(lambdas), 0)
    return w, noise, members


class SemanticMixingPipeline:
    """A diffusers model + scheduler that generates semantic-mixing groups.

    ``num_classes`` is K; the model's class table has K rows, or K + 1 with the null class of guidance last.

    Real-anchored mode: with an :class:`~timm_csm.generation.anchors.AnchorPool` and ``strength`` t < 1, each group
    starts from its anchor (a real image of class a or b) noised to strength t with the group's noise, instead of
    pure noise; ``strength = 1`` (the default) is the paper's mode.
    """

    def __init__(self, model, scheduler, num_classes: int, num_inference_steps: int = 50,
                 guidance_scale: float = 1.0, anchors=None, strength: float = 1.0):
        table = find_soft_class_table(model)
        if table.num_embeddings not in (num_classes, num_classes + 1):
            raise ValueError(f"the model's class table has {table.num_embeddings} rows, which does not fit "
                             f"{num_classes} classes (expected K or K + 1)")
        if guidance_scale != 1.0 and table.num_embeddings != num_classes + 1:
            raise ValueError("classifier-free guidance needs a null-class row (a table of K + 1 rows)")
        self.model, self.scheduler = model.eval(), scheduler
        self.num_classes = num_classes
        self.num_inference_steps = num_inference_steps
        self.guidance_scale = guidance_scale
        cfg = model.config
        self.image_shape = (cfg.in_channels, cfg.sample_size, cfg.sample_size)
        self.set_anchors(anchors, strength)

    def set_anchors(self, anchors, strength: float = 1.0) -> None:
        """Switch to the real-anchored mode (``anchors`` and ``strength < 1``) or back to pure noise."""
        if not 0.0 < strength <= 1.0:
            raise ValueError(f"strength must lie in (0, 1], got {strength}")
        if strength < 1.0 and anchors is None:
            raise ValueError(f"strength {strength} < 1 needs an anchor pool of real images")
        if anchors is not None and tuple(anchors.images.shape[1:]) != self.image_shape:
            raise ValueError(f"anchor images are {tuple(anchors.images.shape[1:])}, the generator makes "
                             f"{self.image_shape}")
        self.anchors, self.strength = (anchors if strength < 1.0 else None), float(strength)

    def anchor_index(self, group: Group) -> int:
        """The anchor pool row ``group`` starts from; -1 in the paper's mode (pure noise)."""
        return -1 if self.anchors is None else self.anchors.index_for(group)

    @property
    def device(self):
        return next(self.model.parameters()).device

    @classmethod
    def from_pretrained(cls, folder, scheduler: str = "ddim", num_inference_steps: int = 50,
                        guidance_scale: Optional[float] = None, device="cpu", anchors=None,
                        strength: float = 1.0) -> "SemanticMixingPipeline":
        """Load a generator folder (see ``load_generator``) with a DDIM (eta 0) or DPM-Solver++ scheduler.

        ``guidance_scale=None`` takes the folder's ``recommended_guidance_scale`` (measured with
        ``pure_class_accuracy`` when the generator was shipped), else 1 (no guidance, as the paper).

        ``pipeline.provenance`` records the generator's name, weight digest, sampler, steps and start (pure noise, or
        real anchors at strength t) for the dataset card.
        """
        from diffusers import DDIMScheduler, DPMSolverMultistepScheduler

        from .models import load_generator, weights_digest

        unet, sched, meta = load_generator(folder, device)
        if guidance_scale is None:
            guidance_scale = float(meta.get("recommended_guidance_scale", 1.0))
        if scheduler == "dpm":
            sched = DPMSolverMultistepScheduler.from_config(sched.config)
        elif scheduler != "ddim":
            raise ValueError(f"unknown scheduler {scheduler!r}; choose 'ddim' or 'dpm'")
        pipe = cls(unet, sched, len(meta["class_names"]), num_inference_steps, guidance_scale, anchors, strength)
        pipe.class_names = list(meta["class_names"])
        pipe.provenance = {
            "name": meta.get("name", Path(folder).name),
            "revision": weights_digest(folder),
            "sampler": f"{scheduler} (eta 0)" if scheduler == "ddim" else "dpm-solver++",
            "steps": num_inference_steps,
            "guidance_scale": guidance_scale,
            "dataset": meta.get("dataset", ""),
            "recipe": meta.get("recipe", {}),
        }
        if pipe.anchors is not None:
            pipe.provenance["start"] = f"real anchors, strength {pipe.strength:g}"
        return pipe

    @torch.no_grad()
    def __call__(self, groups: Sequence[Group], lambdas: Sequence[float]) -> Tuple[torch.Tensor, List]:
        """Returns uint8 images (G * L, C, H, W) in group-major order and the (group, lambda) of each row."""
        w, noise, members = expand_groups(groups, lambdas, self.num_classes, self.image_shape)
        init = None
        if self.anchors is not None:
            init = self.anchors.images_for(groups).repeat_interleave(len(lambdas), 0).to(self.device)
        x = sample_with_scheduler(self.model, self.scheduler, w.to(self.device), noise.to(self.device),
                                  self.num_inference_steps, self.guidance_scale, init_images=init,
                                  strength=self.strength)
        return to_uint8(x).cpu(), members


class EDMSemanticMixingPipeline:
    """An EDM denoiser ``D(x, sigma, class_weights) -> x0`` sampled with the deterministic Heun sampler, as the
    official CSM generation: for example an NVlabs EDM network pickle (:meth:`from_edm_pickle`) or any callable.

    ``sigma_min`` / ``sigma_max``: the sampler's noise range (EDM's 0.002 and 80, clamped to what the network
    supports).
    """

    def __init__(self, denoiser: Callable, num_classes: int, image_shape, num_steps: int = 18, device="cpu",
                 sigma_min: float = 0.002, sigma_max: float = 80.0):
        self.denoiser, self.num_classes = denoiser, num_classes
        self.image_shape, self.num_steps, self.device = tuple(image_shape), num_steps, device
        self.sigma_min, self.sigma_max = float(sigma_min), float(sigma_max)
        self.strength = 1.0

    def anchor_index(self, group: Group) -> int:
        """Always -1: the EDM route samples from pure noise (the paper's mode)."""
        return -1

    @classmethod
    def from_edm_pickle(cls, path, num_steps: Optional[int] = None, device="cpu",
                        class_names: Optional[Sequence[str]] = None, key: str = "ema") -> "EDMSemanticMixingPipeline":
        """A pipeline over the network of an NVlabs EDM pickle (``edm-cifar10-32x32-cond-vp.pkl``, ...), read
        without running code from the file (:func:`~timm_csm.generation.edm.load_edm_network`).

        ``num_steps=None`` takes the paper's: 20 Heun steps for 10 classes (CIFAR-10), 25 otherwise (CIFAR-100);
        no guidance. ``class_names`` default to CIFAR-10's or CIFAR-100's by the label dimension. The noise range is
        EDM's [0.002, 80] clamped to the network's, as EDM's sampler. ``pipeline.provenance`` records the file's
        name and digest, the sampler, steps and the network's constructor arguments for the dataset card.
        """
        from .edm import load_edm_network
        from .edm.labels import default_class_names
        from .models import file_digest

        net = load_edm_network(path, key, device)
        k = net.label_dim
        if k == 0:
            raise ValueError(f"{path} holds an unconditional network; semantic mixing needs a class-conditional one")
        names = list(class_names) if class_names is not None else default_class_names(k)
        if len(names) != k:
            raise ValueError(f"{len(names)} class names for a network of {k} classes")
        steps = int(num_steps) if num_steps is not None else (20 if k == 10 else 25)
        shape = (net.img_channels, net.img_resolution, net.img_resolution)
        pipe = cls(net, k, shape, steps, device, sigma_min=max(0.002, net.sigma_min),
                   sigma_max=min(80.0, net.sigma_max))
        pipe.class_names = names
        pipe.provenance = {
            "name": Path(path).stem,
            "revision": file_digest(path),
            "sampler": "edm heun (S_churn 0, rho 7)",
            "steps": steps,
            "guidance_scale": 1.0,
            "sigma_range": [pipe.sigma_min, pipe.sigma_max],
            "dataset": "",
            "recipe": {"network": type(net).__name__, **net.init_kwargs},
        }
        return pipe

    @torch.no_grad()
    def __call__(self, groups: Sequence[Group], lambdas: Sequence[float]):
        w, noise, members = expand_groups(groups, lambdas, self.num_classes, self.image_shape)
        x = edm_heun_sample(self.denoiser, w.to(self.device), noise.to(self.device), self.num_steps,
                            sigma_min=self.sigma_min, sigma_max=self.sigma_max)
        return to_uint8(x.float()).cpu(), members
