"""Semantic mixing with diffusers: soft class conditioning, group plans, samplers, generator training."""
from .conditioning import (SoftClassEmbedding, enable_soft_class_conditioning, enable_soft_dit_conditioning,
                           mix_prompt_embeddings, mix_weights)
from .models import GENERATOR_PROFILES, GeneratorConfig, create_class_unet, load_generator, save_generator
