"""Datasets, transforms, collators and samplers."""
from .collators import (CSMCollator, ImageCollator, MixupCollator, RankMixupCollator, RegMixupCollator,
                        mix_soft_targets)
from .csm import REQUIRED_CSM_COLUMNS, CSMCompanionSampler, CSMGroups, check_class_names
from .embedded import FASHION_MNIST_CLASSES, ImageArrays, load_digits, load_fashion_mnist, read_idx
from .loader import GlobalBatchSampler, IndexDataset, SampleRef
from .seeding import batch_generator, derive_seed
from .sources import EMBEDDED_DATASETS, hf_split_to_arrays, load_image_arrays
from .transforms import BatchTransform, channel_stats, convert_channels, create_transforms
