"""Semantic mixing with diffusers: soft class conditioning, group plans, samplers, pipelines, generator training."""
from .conditioning import (SoftClassEmbedding, enable_soft_class_conditioning, enable_soft_dit_conditioning,
                           find_soft_class_table, mix_prompt_embeddings, mix_weights)
from .models import GENERATOR_PROFILES, GeneratorConfig, create_class_unet, load_generator, save_generator
from .pipeline import EDMSemanticMixingPipeline, SemanticMixingPipeline
from .plan import Group, class_pair, lambda_grid, plan_groups
from .sampling import edm_heun_sample, sample_with_scheduler
from .writer import generate_to_folder, load_generated, make_plan
from .quality import pure_class_accuracy, two_sample_accuracy
