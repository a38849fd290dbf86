"""Calibrated re-annotation (CSM step 2): encoders, class prototypes, projection coefficients, soft labels.

    encoder = OpenClipEncoder("ViT-B-32", pretrained="openai")          # or TimmEncoder / a reference encoder
    protos = load_or_compute_prototypes(encoder, real_train)              # class means, cached
    annotated = annotate(generated, class_names, encoder, protos, s=4.0)  # lambda_hat + soft labels
"""
from .annotate import (LABEL_MODES, GroupCheck, annotate, check_class_names, check_groups, decode_images,
                       rescale_soft_labels)
from .checks import annotation_report, drop_groups, flag_groups, group_spearman, soft_label_confidence
from .encoders import (DEFAULT_ZERO_SHOT_TEMPLATES, ImageEncoder, OpenClipEncoder, TimmEncoder, create_encoder,
                       encode_images, weights_fingerprint)
from .preprocess import ImagePreprocessor
from .prototypes import ClassPrototypes, compute_prototypes, dataset_fingerprint, load_or_compute_prototypes
from .reference import (REFERENCE_MODEL, ReferenceCNN, ReferenceEncoder, load_reference_encoder,
                        train_reference_encoder)
from .schema import CSM_COLUMNS, RAW_COLUMNS, csm_features
from .soft_labels import (DEFAULT_SCALES, default_scale, dominant_class, generation_class_labels, pair_soft_labels,
                          pairwise_true_lambda, projection_coefficient, scale_nll, select_scale)

__all__ = [
    "ImageEncoder", "OpenClipEncoder", "TimmEncoder", "ReferenceEncoder", "ReferenceCNN", "REFERENCE_MODEL",
    "create_encoder", "encode_images", "weights_fingerprint", "ImagePreprocessor", "DEFAULT_ZERO_SHOT_TEMPLATES",
    "train_reference_encoder", "load_reference_encoder",
    "ClassPrototypes", "compute_prototypes", "load_or_compute_prototypes", "dataset_fingerprint",
    "DEFAULT_SCALES", "default_scale", "projection_coefficient", "pair_soft_labels", "generation_class_labels",
    "dominant_class", "select_scale", "scale_nll", "pairwise_true_lambda",
    "annotate", "check_groups", "check_class_names", "GroupCheck", "rescale_soft_labels", "decode_images",
    "LABEL_MODES", "CSM_COLUMNS", "RAW_COLUMNS", "csm_features",
    "annotation_report", "drop_groups", "flag_groups", "group_spearman", "soft_label_confidence",
]
