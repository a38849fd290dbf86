"""Semantic mixing with diffusers: soft class conditioning, group plans, samplers, pipelines, generator training.

The public names are imported on first access, so reading a generated folder (``load_generated``) does not import
diffusers; the pipelines do.
"""
import importlib

# public name -> submodule that defines it
_LAZY = {
    **dict.fromkeys(["SoftClassEmbedding", "enable_soft_class_conditioning", "enable_soft_dit_conditioning",
                     "find_soft_class_table", "mix_prompt_embeddings", "mix_weights"], "conditioning"),
    **dict.fromkeys(["MixingConfig", "SCHEDULERS", "register_scheduler"], "config"),
    **dict.fromkeys(["GENERATOR_PROFILES", "register_generator_profile", "GeneratorConfig", "create_class_unet",
                     "weights_digest"], "models"),
    **dict.fromkeys(["EDMSemanticMixingPipeline", "SemanticMixingPipeline", "SemanticMixingPipelineOutput",
                     "create_scheduler"], "pipeline"),
    **dict.fromkeys(["Group", "class_pair", "lambda_grid", "plan_groups"], "plan"),
    **dict.fromkeys(["edm_heun_sample", "sample_with_edm_scheduler", "sample_with_scheduler"], "sampling"),
    **dict.fromkeys(["EDMHeunScheduler"], "scheduling_edm"),
    **dict.fromkeys(["GeneratorKind", "GENERATORS", "register_generator", "list_generators", "generator_spec",
                     "generator_kind", "create_generator"], "registry"),
    **dict.fromkeys(["generate_to_folder", "load_generated", "make_plan"], "writer"),
    **dict.fromkeys(["pure_class_accuracy", "two_sample_accuracy"], "quality"),
}

__all__ = list(_LAZY)


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
