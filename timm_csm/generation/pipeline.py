"""Semantic-mixing pipelines: groups in, images out.

The model and its sampler are kept apart (diffusers' split). :class:`SemanticMixingPipeline` is a
``diffusers.DiffusionPipeline`` in the shape of diffusers' ``DDPMPipeline`` / ``DiTPipeline``: a diffusers model
(UNet2DModel or DiTTransformer2DModel with a soft class table) and any diffusers scheduler, saved and loaded with
``save_pretrained`` / ``from_pretrained`` (``model_index.json``, ``unet/``, ``scheduler/``).
:class:`EDMSemanticMixingPipeline` runs an EDM-preconditioned denoiser through the EDM Heun sampler. Both are called
as ``pipe(groups, lambdas)`` and return a :class:`SemanticMixingPipelineOutput` (``images``, ``members``).

A generator folder loads with ``SemanticMixingPipeline.from_pretrained(folder)`` (diffusers' generic
``DiffusionPipeline.from_pretrained`` looks its ``_class_name`` up in the ``diffusers`` module, which this package
leaves as it is), or through the generator registry (:func:`~timm_csm.generation.registry.create_generator`).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from diffusers import DiffusionPipeline
from diffusers.models.modeling_utils import ModelMixin
from diffusers.schedulers.scheduling_utils import SchedulerMixin
from diffusers.utils import BaseOutput

from .conditioning import (enable_soft_class_conditioning, enable_soft_dit_conditioning, find_soft_class_table,
                           mix_weights)
from .config import PRECISIONS, SCHEDULERS
from .plan import Group, group_noise
from .sampling import DEFAULT_INFERENCE_STEPS, sample_with_edm_scheduler, sample_with_scheduler, to_uint8
from .scheduling_edm import EDMHeunScheduler

__all__ = ["SemanticMixingPipeline", "EDMSemanticMixingPipeline", "SemanticMixingPipelineOutput", "SCHEDULERS",
           "create_scheduler", "expand_groups"]

OUTPUT_TYPES = ("pt", "np", "pil")
#: the autocast dtype of each precision but float32's (:data:`~timm_csm.generation.config.PRECISIONS`)
AUTOCAST_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}



@dataclass
class SemanticMixingPipelineOutput(BaseOutput):
    """What a semantic-mixing pipeline returns.

    ``images``: G * L images in group-major order, as ``output_type`` says: ``"pt"`` a uint8 tensor (B, C, H, W);
    ``"np"`` a uint8 array (B, H, W, C); ``"pil"`` a list of PIL images (mode L or RGB). Pixels are EDM's
    ``clip(x * 127.5 + 128, 0, 255)`` of the sample x in [-1, 1] (uint8, not diffusers' float [0, 1], so every
    output type holds the same pixels as the stored dataset).
    ``members``: the ``(group, lambda)`` of each image.
    """

    images: Union[torch.Tensor, np.ndarray, List]
    members: List[Tuple[Group, float]]


def create_scheduler(name: str, config) -> SchedulerMixin:
    """The sampler ``name`` (registered in :data:`~timm_csm.generation.config.SCHEDULERS`) built from a scheduler
    config, the way diffusers swaps samplers: ``pipe.scheduler = create_scheduler("dpm", pipe.scheduler.config)``."""
    return SCHEDULERS.create(name, config)


def expand_groups(groups: Sequence[Group], lambdas: Sequence[float], num_classes: int, image_shape):
    """Rows of a batch of groups: (class weights (G*L, K), noise (G*L, *image_shape), member list).

    Every member of a group starts from the group's own noise, ``group_noise(group.seed)``."""
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


def _check_output_type(output_type: str) -> None:
    if output_type not in OUTPUT_TYPES:
        raise ValueError(f"output_type must be one of {OUTPUT_TYPES}, got {output_type!r}")


def _output(images: torch.Tensor, members, output_type: str, return_dict: bool):
    """uint8 (B, C, H, W) images as ``output_type``; the output dataclass, or ``(images, members)``."""
    if output_type != "pt":
        from PIL import Image

        images = images.permute(0, 2, 3, 1).numpy()
        if output_type == "pil":
            images = [Image.fromarray(a[..., 0] if a.shape[-1] == 1 else a) for a in images]
    return SemanticMixingPipelineOutput(images, members) if return_dict else (images, members)


def _soft_conditioned(model):
    """``model`` with float class weights enabled: a UNet's ``class_embedding`` or a DiT's label tables."""
    if hasattr(model, "class_embedding"):
        return enable_soft_class_conditioning(model)
    return enable_soft_dit_conditioning(model)


def _class_names(table_rows: int, class_names) -> List[str]:
    """The K class names of a class table of K or K + 1 rows (null class last); "0" .. "K-1" for K + 1 rows when
    none are given."""
    if class_names is None:
        return [str(i) for i in range(table_rows - 1)]
    if isinstance(class_names, str) or not isinstance(class_names, Sequence) \
            or not all(isinstance(n, str) for n in class_names):
        raise ValueError(f"class_names must be a list of strings, one per class in label order; got {class_names!r}")
    if table_rows not in (len(class_names), len(class_names) + 1):
        raise ValueError(f"the model's class table has {table_rows} rows, which does not fit {len(class_names)} "
                         f"class names (expected {len(class_names)}, or {len(class_names) + 1} with the null class "
                         "of guidance last): give one name per class of the model (model_index.json 'class_names')")
    return list(class_names)


def _sampler_name(scheduler) -> str:
    """How provenance names a scheduler: 'ddim (eta 0)', 'dpm-solver++', else its class name."""
    name = type(scheduler).__name__
    if name == "DDIMScheduler":
        return "ddim (eta 0)"
    if name == "DPMSolverMultistepScheduler" and scheduler.config.algorithm_type == "dpmsolver++":
        return "dpm-solver++"
    return name


class SemanticMixingPipeline(DiffusionPipeline):
    r"""Semantic mixing with a class-conditional diffusers model: every member of a group (class a, class b, seed)
    starts from the group's noise and is denoised under the condition ``lambda e_a + (1 - lambda) e_b``, one member
    per lambda (the CSM paper's generation, ICML 2025, here with diffusers models and schedulers).

    Components (``register_modules``): ``unet``, a ``UNet2DModel`` built with ``num_class_embeds`` or a
    ``DiTTransformer2DModel`` (its soft class tables are enabled here, so a plainly loaded model works), and
    ``scheduler``, any diffusers scheduler (:func:`create_scheduler` swaps DDIM for DPM-Solver++).

    Configuration (``register_to_config``, kept in ``model_index.json`` and restored by
    ``from_pretrained``): ``class_names`` (K names; the model's class table has K rows, or K + 1
    with the null class of guidance last; default "0" .. "K-1" for a table of K + 1 rows),
    ``recommended_guidance_scale`` (measured with ``pure_class_accuracy`` when the generator was shipped) and
    ``metadata`` (name, dataset, training recipe, losses).

    Sampling defaults (not configuration; ``from_pretrained(folder, num_inference_steps=20, ...)`` passes them):
    ``num_inference_steps``, ``guidance_scale`` (None: the recommended scale; 1 = none, as the paper), ``precision``
    (``"float32"``, or ``"bfloat16"`` / ``"float16"`` autocast of the network) and the start:
    with an :class:`~timm_csm.generation.anchors.AnchorPool` ``anchors`` and ``strength`` t < 1 each group starts
    from its anchor (a real image of class a or b) noised to strength t with the group's noise (SDEdit) instead of
    pure noise; ``strength = 1`` (the default) is the paper's mode.
    """

    model_cpu_offload_seq = "unet"

    def __init__(self, unet: ModelMixin, scheduler: SchedulerMixin, class_names: Optional[List[str]] = None,
                 recommended_guidance_scale: float = 1.0, metadata: Optional[Dict] = None,
                 num_inference_steps: int = DEFAULT_INFERENCE_STEPS, guidance_scale: Optional[float] = None,
                 anchors=None, strength: float = 1.0, precision: str = PRECISIONS[0]):
        super().__init__()
        rows = find_soft_class_table(_soft_conditioned(unet)).num_embeddings
        names = _class_names(rows, class_names)
        self.register_modules(unet=unet.eval(), scheduler=scheduler)
        self.register_to_config(class_names=names, recommended_guidance_scale=float(recommended_guidance_scale),
                                metadata=dict(metadata or {}))
        self.num_inference_steps = int(num_inference_steps)
        self.guidance_scale = self._guidance(guidance_scale)
        self.set_anchors(anchors, strength)
        self.set_precision(precision)

    @property
    def class_names(self) -> List[str]:
        return list(self.config.class_names)

    @property
    def num_classes(self) -> int:
        return len(self.config.class_names)

    @property
    def image_shape(self) -> Tuple[int, int, int]:
        cfg = self.unet.config
        return (cfg.in_channels, cfg.sample_size, cfg.sample_size)

    def _guidance(self, guidance_scale: Optional[float]) -> float:
        """``guidance_scale``, or the recommended one for None; refused without a null-class row."""
        scale = float(self.config.recommended_guidance_scale if guidance_scale is None else guidance_scale)
        if scale != 1.0 and find_soft_class_table(self.unet).num_embeddings != self.num_classes + 1:
            raise ValueError(f"classifier-free guidance (scale {scale:g}) needs a null-class row (a class table of "
                             f"K + 1 = {self.num_classes + 1} rows); use guidance_scale=1")
        return scale

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

    def set_precision(self, precision: str) -> None:
        """Run the network in ``precision`` while sampling: ``"float32"``, or ``"bfloat16"`` / ``"float16"`` under
        autocast (the sampler's arithmetic stays float32)."""
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {list(PRECISIONS)}, got {precision!r}")
        self.precision = precision

    def anchor_index(self, group: Group) -> int:
        """The anchor pool row ``group`` starts from; -1 in the paper's mode (pure noise)."""
        return -1 if self.anchors is None else self.anchors.index_for(group)

    @property
    def provenance(self) -> Dict:
        """The generator's name, weight digest (of the folder it was loaded from; "" for one built in memory),
        sampler, steps, guidance, dataset, recipe and start (pure noise, or real anchors at strength t), for the
        generation plan and the dataset card."""
        from .models import weights_digest

        folder = Path(str(self.name_or_path or ""))
        loaded = bool(self.name_or_path) and (folder / "unet").is_dir()
        meta = self.config.metadata
        out = {
            "name": meta.get("name", folder.name if loaded else ""),
            "revision": weights_digest(folder) if loaded else "",
            "sampler": _sampler_name(self.scheduler),
            "steps": self.num_inference_steps,
            "guidance_scale": self.guidance_scale,
            "dataset": meta.get("dataset", ""),
            "recipe": meta.get("recipe", {}),
        }
        if self.anchors is not None:
            out["start"] = f"real anchors, strength {self.strength:g}"
        spacing = self.scheduler.config.get("timestep_spacing", "leading")
        if spacing != "leading":  # as precision: the sets of the shipped generators' spacing keep their provenance
            out["timestep_spacing"] = spacing
        if self.precision != PRECISIONS[0]:  # float32 sets keep the provenance they were written with
            out["precision"] = self.precision
        return out

    @torch.no_grad()
    def __call__(self, groups: Sequence[Group], lambdas: Sequence[float], num_inference_steps: Optional[int] = None,
                 guidance_scale: Optional[float] = None, generator: Optional[torch.Generator] = None,
                 output_type: str = "pt", return_dict: bool = True):
        """Generate every (group, lambda) member: ``len(groups) * len(lambdas)`` images in group-major order.

        ``num_inference_steps`` / ``guidance_scale``: None takes the pipeline's defaults. ``generator`` seeds what is
        random beyond the groups' own noise (which stays ``group_noise(seed)``, shared by every lambda of a group):
        the step noise of stochastic schedulers (DDPM, DDIM with eta > 0, SDE solvers); DDIM with eta 0 and
        DPM-Solver++ draw none. ``self.progress_bar`` runs over the denoising steps
        (``set_progress_bar_config(disable=True)`` hides it). Returns a :class:`SemanticMixingPipelineOutput`, or
        ``(images, members)`` with ``return_dict=False``.
        """
        _check_output_type(output_type)
        steps = self.num_inference_steps if num_inference_steps is None else int(num_inference_steps)
        scale = self.guidance_scale if guidance_scale is None else self._guidance(guidance_scale)
        w, noise, members = expand_groups(groups, lambdas, self.num_classes, self.image_shape)
        device = self._execution_device
        init = None
        if self.anchors is not None:
            init = self.anchors.images_for(groups).repeat_interleave(len(lambdas), 0).to(device)
        x = sample_with_scheduler(self.unet, self.scheduler, w.to(device), noise.to(device), steps, scale,
                                  init_images=init, strength=self.strength, generator=generator,
                                  progress=self.progress_bar,
                                  autocast_dtype=AUTOCAST_DTYPES.get(self.precision))
        self.maybe_free_model_hooks()
        return _output(to_uint8(x).cpu(), members, output_type, return_dict)


class EDMSemanticMixingPipeline(DiffusionPipeline):
    """An EDM denoiser ``D(x, sigma, class_weights) -> x0`` sampled with EDM's deterministic Heun sampler
    (:class:`~timm_csm.generation.scheduling_edm.EDMHeunScheduler`, the pipeline's ``scheduler``), as the official CSM
    generation: for example an NVlabs EDM network pickle (:meth:`from_edm_pickle`) or any callable.

    A ``diffusers.DiffusionPipeline`` of a denoiser and a scheduler, called like :class:`SemanticMixingPipeline` and
    returning the same :class:`SemanticMixingPipelineOutput`; its network is no diffusers model, so it is built from
    the pickle, never ``save_pretrained``. ``sigma_min`` / ``sigma_max``: the sampler's noise range (EDM's 0.002 and
    80, clamped to what the network supports); ``device``: where the denoiser runs.
    """

    def __init__(self, denoiser: Callable, num_classes: int, image_shape, num_inference_steps: int = 18,
                 device="cpu", sigma_min: float = 0.002, sigma_max: float = 80.0):
        super().__init__()
        self.register_modules(denoiser=denoiser, scheduler=EDMHeunScheduler(sigma_min=float(sigma_min),
                                                                            sigma_max=float(sigma_max)))
        self.num_classes, self.image_shape = num_classes, tuple(image_shape)
        self.num_inference_steps, self._device, self.strength = num_inference_steps, torch.device(device), 1.0

    @property
    def device(self) -> torch.device:
        """Where the denoiser runs (an EDM network is a plain ``torch.nn.Module``, without diffusers' ``device``)."""
        return self._device

    @property
    def sigma_min(self) -> float:
        return self.scheduler.config.sigma_min

    @property
    def sigma_max(self) -> float:
        return self.scheduler.config.sigma_max

    def anchor_index(self, group: Group) -> int:
        """Always -1: the EDM route samples from pure noise (the paper's mode)."""
        return -1

    @classmethod
    def from_edm_pickle(cls, path, num_inference_steps: Optional[int] = None, device="cpu",
                        class_names: Optional[Sequence[str]] = None, key: str = "ema") -> "EDMSemanticMixingPipeline":
        """A pipeline over the network of an NVlabs EDM pickle (``edm-cifar10-32x32-cond-vp.pkl``, ...), read
        without running code from the file (:func:`~timm_csm.generation.edm.load_edm_network`).

        ``num_inference_steps=None`` takes the paper's: 20 Heun steps for 10 classes (CIFAR-10), 25 otherwise
        (CIFAR-100); no guidance. ``class_names`` default to CIFAR-10's or CIFAR-100's by the label dimension. The
        noise range is EDM's [0.002, 80] clamped to the network's, as EDM's sampler. ``pipeline.provenance`` records
        the file's name and digest (hashed in the one read that loads it), the sampler, steps and the network's
        constructor arguments for the dataset card.
        """
        from .edm import load_edm_network
        from .edm.labels import default_class_names
        from .models import revision

        net = load_edm_network(path, key, device)
        k = net.label_dim
        if k == 0:
            raise ValueError(f"{path} holds an unconditional network; semantic mixing needs a class-conditional one")
        names = list(class_names) if class_names is not None else default_class_names(k)
        if len(names) != k:
            raise ValueError(f"{len(names)} class names for a network of {k} classes")
        steps = int(num_inference_steps) if num_inference_steps is not None else (20 if k == 10 else 25)
        shape = (net.img_channels, net.img_resolution, net.img_resolution)
        pipe = cls(net, k, shape, steps, device, sigma_min=max(0.002, net.sigma_min),
                   sigma_max=min(80.0, net.sigma_max))
        pipe.class_names = names
        pipe.provenance = {
            "name": Path(path).stem,
            "revision": revision(net.file_sha256),  # the file's digest, hashed as it was read
            "sampler": "edm heun (S_churn 0, rho 7)",
            "steps": steps,
            "guidance_scale": 1.0,
            "sigma_range": [pipe.sigma_min, pipe.sigma_max],
            "dataset": "",
            "recipe": {"network": type(net).__name__, **net.init_kwargs},
        }
        return pipe

    @torch.no_grad()
    def __call__(self, groups: Sequence[Group], lambdas: Sequence[float], num_inference_steps: Optional[int] = None,
                 guidance_scale: Optional[float] = None, generator: Optional[torch.Generator] = None,
                 output_type: str = "pt", return_dict: bool = True):
        """As :meth:`SemanticMixingPipeline.__call__`. The Heun sampler with S_churn = 0 draws nothing beyond the
        groups' noise, so ``generator`` changes nothing; guidance is not part of this route (None or 1 only)."""
        _check_output_type(output_type)
        if guidance_scale not in (None, 1.0):
            raise ValueError(f"the EDM route samples without guidance (the paper); got guidance_scale={guidance_scale}")
        steps = self.num_inference_steps if num_inference_steps is None else int(num_inference_steps)
        w, noise, members = expand_groups(groups, lambdas, self.num_classes, self.image_shape)
        x = sample_with_edm_scheduler(self.denoiser, self.scheduler, w.to(self.device), noise.to(self.device), steps,
                                      progress=self.progress_bar)
        return _output(to_uint8(x.float()).cpu(), members, output_type, return_dict)

