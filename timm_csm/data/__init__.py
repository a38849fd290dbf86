"""Datasets, transforms, collators and samplers."""
from .embedded import FASHION_MNIST_CLASSES, ImageArrays, load_digits, load_fashion_mnist, read_idx
from .sources import EMBEDDED_DATASETS, hf_split_to_arrays, load_image_arrays
