"""The configuration of a semantic-mixing generation: :class:`MixingConfig`, one typed field per sampling option of
``timm-csm-generate`` (its flags are built from the fields, :func:`timm_csm.options.add_options`), which the command,
the steps (:func:`timm_csm.recipes.steps.generate_groups`) and the recipe's generate stage all take.

Its defaults are the generation's: the lambda grid (``linspace(0, 1, 8)``, the paper's), the sampler (the
generator's own number of steps: 50 for a generator folder, the paper's 20 / 25 Heun steps for an EDM network;
DDIM; the generator's recommended guidance; float32), the shards (64 groups a file, the unit of resuming; 16 groups a forward
pass) and the start (pure noise, strength 1).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..options import option
from ..registry import Registry

__all__ = ["MixingConfig", "SCHEDULERS", "SCHEDULER_NAMES", "register_scheduler", "TIMESTEP_SPACINGS", "PRECISIONS",
           "DEFAULTS"]


def _from_config(name: str, class_name: str, spec, config):
    import diffusers

    return getattr(diffusers, class_name).from_config(config)


#: the samplers of a generator folder, in the order of ``--scheduler``'s choices: name -> the diffusers scheduler
#: class (by name: diffusers is imported when one is built, :func:`~timm_csm.generation.create_scheduler`)
SCHEDULERS = Registry("scheduler", sort=False, create=_from_config)
#: the samplers' names (the registry: ``--scheduler``'s choices)
SCHEDULER_NAMES = SCHEDULERS


def register_scheduler(name: str, class_name: Optional[str] = None, *, overwrite: bool = False):
    """Register the diffusers scheduler class ``class_name`` (``"DDIMScheduler"``) as the sampler ``name``."""
    return SCHEDULERS.register(name, class_name, overwrite=overwrite)


# DDIM (eta 0, Song et al. 2021), DPM-Solver++ 2M (Lu et al. 2022) and UniPC multistep (Zhao et al., NeurIPS 2023)
register_scheduler("ddim", "DDIMScheduler")
register_scheduler("dpm", "DPMSolverMultistepScheduler")
register_scheduler("unipc", "UniPCMultistepScheduler")

#: the sampler's time steps (diffusers' ``timestep_spacing``): ``leading`` (the shipped generators' scheduler config)
#: starts N steps at ``T - T/N``, ``trailing`` at the last training step T - 1, where the pure noise it starts from
#: belongs (Lin et al., "Common Diffusion Noise Schedules and Sample Steps are Flawed", WACV 2024)
TIMESTEP_SPACINGS = ("leading", "trailing", "linspace")

#: the precisions the network of a generator folder runs in while sampling: float32, or bfloat16 / float16 autocast
#: (the sampler's own arithmetic stays float32; float16 is a GPU's: CPUs run it, slowly)
PRECISIONS = ("float32", "bfloat16", "float16")

_anchored = "real-anchored mode"


@dataclass(frozen=True)
class MixingConfig:
    """How groups are sampled: the fields are the sampling flags of ``timm-csm-generate`` (same name with ``-``;
    ``steps`` is ``--steps``)."""

    num_lambdas: int = option(8, help="lambda grid linspace(0, 1, n)")
    steps: Optional[int] = option(
        None, help="sampler steps; default 50 for a generator folder, the paper's 20 / 25 for an EDM pickle")
    scheduler: str = option(SCHEDULER_NAMES[0], choices=SCHEDULER_NAMES,
                            help="generator folder: DDIM (eta 0), DPM-Solver++ 2M or UniPC multistep")
    timestep_spacing: Optional[str] = option(
        None, choices=TIMESTEP_SPACINGS, help="generator folder: the sampler's time steps (diffusers' timestep_spacing); "
                                              "default: the generator's scheduler config (leading)")
    guidance_scale: Optional[float] = option(
        None, help="classifier-free guidance; 1 = none (the paper); default: the generator's recommendation")
    groups_per_shard: int = option(64, help="groups per shard file (the unit of resuming)")
    batch_groups: int = option(16, help="groups per forward batch")
    seed_offset: int = option(0, help="seed of the first group (group i has seed offset + i)")
    precision: str = option(PRECISIONS[0], choices=PRECISIONS,
                            help="generator folder: the network in float32, or under bfloat16 autocast (faster only "
                                 "where the CPU has bfloat16 instructions, or on a GPU: benchmarks/generation.md), "
                                 "or float16 autocast (a GPU's)")
    strength: float = option(1.0, _anchored, help="SDEdit strength t in (0, 1]; 1 = pure noise (the paper), < 1 = "
                                                  "start from real anchors")


#: the defaults, read by the functions whose parameters these fields are
DEFAULTS = MixingConfig()
