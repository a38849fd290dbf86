"""Publishing CSM-augmented datasets: build the ``DatasetDict``, save it in the Hub layout with a dataset card,
install it for bare-name ``load_dataset``, load it by name or path, push it to the Hub.

    dd = build_csm_dataset(annotated, real.class_names)
    folder = save_csm_dataset(dd, "out/csm-fmnist-aug", provenance)
    install_dataset(folder)                      # then: datasets.load_dataset("csm-fmnist-aug")
    push_csm_dataset(folder, "my-org/csm-fmnist-aug")
"""
from ..data.csm_format import CSM_COLUMNS, csm_features
from .build import build_csm_dataset, csm_dataset_name, dataset_short_name, validate_csm_dataset
from .card import SOURCE_LICENSES, card_metadata, class_counts, provenance_from_plan, render_card_body
from .install import install_dataset, is_installed, load_csm_dataset, load_folder
from .content import content_fingerprint, csm_dataset_problem, train_split
from .layout import data_files, folder_fingerprint, save_csm_dataset
from .push import PushError, push_csm_dataset

__all__ = [
    "CSM_COLUMNS", "csm_features", "csm_dataset_name", "dataset_short_name", "build_csm_dataset",
    "validate_csm_dataset",
    "class_counts", "card_metadata", "render_card_body", "provenance_from_plan", "SOURCE_LICENSES",
    "save_csm_dataset", "data_files", "folder_fingerprint", "install_dataset", "is_installed", "load_csm_dataset",
    "load_folder", "push_csm_dataset", "PushError", "content_fingerprint", "csm_dataset_problem", "train_split",
]
