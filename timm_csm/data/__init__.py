"""Datasets, transforms, collators and samplers."""
from .collators import (CSMCollator, ImageCollator, MixupCollator, RankMixupCollator, RegMixupCollator,
                        mix_soft_targets)
from .csm import REQUIRED_CSM_COLUMNS, CSMCompanionSampler, CSMGroups, check_class_names
from .embedded import FASHION_MNIST_CLASSES, ImageArrays, load_digits, load_fashion_mnist, read_idx
from .loader import GlobalBatchSampler, IndexDataset, SampleRef
from .seeding import batch_generator, derive_seed
from .sources import EMBEDDED_DATASETS, hf_split_to_arrays, load_image_arrays
from .transforms import BatchTransform, channel_stats, convert_channels, create_transforms

__all__ = [
    "ImageArrays", "FASHION_MNIST_CLASSES", "load_fashion_mnist", "load_digits", "read_idx", "EMBEDDED_DATASETS",
    "hf_split_to_arrays", "load_image_arrays",
    "BatchTransform", "convert_channels", "channel_stats", "create_transforms",
    "CSMGroups", "CSMCompanionSampler", "REQUIRED_CSM_COLUMNS", "check_class_names",
    "ImageCollator", "CSMCollator", "MixupCollator", "RegMixupCollator", "RankMixupCollator", "mix_soft_targets",
    "SampleRef", "IndexDataset", "GlobalBatchSampler", "derive_seed", "batch_generator",
]
