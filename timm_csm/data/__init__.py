"""Datasets, transforms, collators and samplers."""
from .arrays import ImageArrays
from .collators import (CSMCollator, ImageCollator, MixupCollator, RankMixupCollator, RegMixupCollator,
                        TimmMixupCollator, mix_soft_targets)
from .csm import CSMCompanionSampler, CSMGroups
from .csm_format import (CSM_COLUMNS, RAW_COLUMNS, REQUIRED_CSM_COLUMNS, GroupCheck, check_class_names,
                         check_groups, check_soft_labels, csm_dataset_from_columns, csm_features)
from .embedded import FASHION_MNIST_CLASSES, load_digits, load_fashion_mnist, load_mnist5k, read_idx
from .lazy import (ArrowImages, DatasetImages, FolderImages, LazyImages, LazySplit, column_arrays, image_geometry,
                   pil_mode, sampled_channel_stats, split_digest, stack_images, take_images)
from .loader import GlobalBatchSampler, IndexDataset, SampleRef
from .sample_transforms import SampleTransform, create_timm_transforms
from .seeding import batch_generator, derive_seed
from .sources import EMBEDDED_DATASETS, hf_split_to_arrays, hf_split_to_lazy, load_image_arrays, open_image_split
from .transforms import BatchTransform, channel_stats, convert_channels, create_transforms

__all__ = [
    "ImageArrays", "FASHION_MNIST_CLASSES", "load_fashion_mnist", "load_digits", "load_mnist5k", "read_idx",
    "EMBEDDED_DATASETS",
    "hf_split_to_arrays", "hf_split_to_lazy", "load_image_arrays", "open_image_split",
    "LazyImages", "ArrowImages", "DatasetImages", "FolderImages", "LazySplit", "column_arrays", "stack_images",
    "take_images", "pil_mode", "image_geometry", "sampled_channel_stats", "split_digest",
    "BatchTransform", "convert_channels", "channel_stats", "create_transforms", "SampleTransform",
    "create_timm_transforms",
    "CSMGroups", "CSMCompanionSampler",
    "CSM_COLUMNS", "RAW_COLUMNS", "REQUIRED_CSM_COLUMNS", "csm_features", "csm_dataset_from_columns",
    "check_class_names", "check_soft_labels", "GroupCheck", "check_groups",
    "ImageCollator", "CSMCollator", "MixupCollator", "RegMixupCollator", "RankMixupCollator", "TimmMixupCollator",
    "mix_soft_targets",
    "SampleRef", "IndexDataset", "GlobalBatchSampler", "derive_seed", "batch_generator",
]
