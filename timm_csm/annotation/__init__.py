"""Calibrated re-annotation (CSM step 2): encoders, class prototypes, projection coefficients, soft labels.

    encoder = OpenClipEncoder("ViT-B-32", pretrained="openai")          # or TimmEncoder / a reference encoder
    result = annotate_generated(generated, plan, real_train, encoder, "auto")  # prototypes, s on held-out images
    protos = load_or_compute_prototypes(encoder, real_train)              # the steps one by one: class means, cached
    annotated = annotate(generated, class_names, encoder, protos, s=4.0)  # lambda_hat + soft labels

Modules import downwards only: ``preprocess`` <- ``encoders`` <- ``prototypes``, ``reference`` <- ``factory``;
``cache`` (dataset fingerprints, damaged-cache reads) <- ``prototypes``, ``reference``; ``soft_labels``,
``prototypes`` <- ``label_groups`` (lambda-hat and soft labels of every group member); ``label_groups``,
``checks`` <- ``pipeline`` (the entry point, :func:`annotate_generated`). The dataset format
(columns, features, class-name, soft-label and group checks) is :mod:`timm_csm.data.csm_format`.
"""
from .cache import dataset_fingerprint, load_cache
from .checks import annotation_report, drop_groups, flag_groups, group_spearman, soft_label_confidence
from .encoders import (DEFAULT_ZERO_SHOT_TEMPLATES, ImageEncoder, OpenClipEncoder, TimmEncoder, encode_images,
                       weights_fingerprint)
from .config import AUTO, LABEL_MODES, AnnotationConfig, parse_s
from .factory import (ENCODERS, EncoderFlag, EncoderSpec, create_encoder, create_encoder_checked, encoder_from_options,
                      encoder_spec, list_encoders, parse_encoder_spec, register_encoder)
from .label_groups import annotate, decode_images, rescale_soft_labels
from .pipeline import AnnotatedSet, annotate_generated, choose_scale, holdout_rows, holdout_split
from .preprocess import ImagePreprocessor
from .prototypes import (ClassPrototypes, HeldOutFeatures, compute_prototypes, load_or_compute_prototypes,
                         prototypes_and_held_out)
from .reference import REFERENCE_MODEL, ReferenceEncoder, load_reference_encoder, train_reference_encoder
from .soft_labels import (PAPER_S, paper_s, dominant_class, generation_class_labels, pair_soft_labels,
                          pairwise_true_lambda, projection_coefficient, scale_nll, select_scale)

__all__ = [
    "AnnotationConfig", "AUTO", "parse_s",
    "ImageEncoder", "OpenClipEncoder", "TimmEncoder", "ReferenceEncoder", "REFERENCE_MODEL",
    "create_encoder", "register_encoder", "list_encoders", "parse_encoder_spec", "ENCODERS", "EncoderSpec",
    "EncoderFlag", "encoder_spec", "encoder_from_options", "create_encoder_checked",
    "encode_images", "weights_fingerprint", "ImagePreprocessor",
    "DEFAULT_ZERO_SHOT_TEMPLATES", "train_reference_encoder", "load_reference_encoder",
    "ClassPrototypes", "HeldOutFeatures", "compute_prototypes", "load_or_compute_prototypes",
    "prototypes_and_held_out", "dataset_fingerprint", "load_cache",
    "PAPER_S", "paper_s", "projection_coefficient", "pair_soft_labels", "generation_class_labels",
    "dominant_class", "select_scale", "scale_nll", "pairwise_true_lambda",
    "annotate", "rescale_soft_labels", "decode_images", "LABEL_MODES",
    "annotate_generated", "AnnotatedSet", "holdout_rows", "holdout_split", "choose_scale",
    "annotation_report", "drop_groups", "flag_groups", "group_spearman", "soft_label_confidence",
]
