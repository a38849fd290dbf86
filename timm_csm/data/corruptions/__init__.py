"""Image corruptions for shift evaluation: the noise, blur, weather and digital families of ImageNet-C / CIFAR-10-C
and the digital and geometric ones of MNIST-C, at five severities each, on grey or RGB images of any size.

    from timm_csm.data.corruptions import create_corruption, list_corruptions, corrupt_split
    list_corruptions()                                  # 23 names
    fog3 = create_corruption("fog", severity=3, seed=0)
    fog3(image)                                         # uint8 (C, H, W) tensor or PIL image, same shape and dtype
    corrupt_split(test, fog3)                           # the split, corrupted as batches are read (nothing copied),
                                                        # at the model's input size (corrupt_at_input)

The registry (:mod:`~timm_csm.data.corruptions.registry`) says for each corruption where it comes from (the
torchvision function it applies, or hand-written) and what its five levels are; ``docs/corruptions.md`` tabulates
them.
"""
from . import blur, digital, geometric, noise, weather  # noqa: F401  (register the corruptions)
from .dataset import CorruptedImages, corrupt_at_input, corrupt_split, corruption_site
from .registry import (CORRUPTION_FAMILIES, CORRUPTIONS, REFERENCE_SIDE, SEVERITIES, BatchRandom, Corruption,
                       CorruptionSpec, corruption_spec, create_corruption, list_corruptions, register_corruption, side_scale)

__all__ = ["Corruption", "CorruptionSpec", "CORRUPTIONS", "BatchRandom", "register_corruption", "create_corruption",
           "list_corruptions", "corruption_spec", "side_scale", "SEVERITIES", "CORRUPTION_FAMILIES", "REFERENCE_SIDE",
           "CorruptedImages", "corrupt_split", "corrupt_at_input", "corruption_site"]
