"""timm-csm: calibrated image classifiers for timm and Hugging Face (CSM, ICML 2025, and its baselines).

Importing the package is light: it registers the small-image timm models and writes the `evaluate` modules into
evaluate's offline cache (so a bare ``evaluate.load("ece")`` works). evaluate, diffusers and open_clip are only
imported by the functions that need them.
"""
import importlib

__version__ = "0.1.0"

# public name -> module that defines it (imported on first access)
_LAZY = {
    "load_metric": "timm_csm.hf_metrics",
    "metric_path": "timm_csm.hf_metrics",
    "install_evaluate_modules": "timm_csm.hf_metrics",
    "load_csm_dataset": "timm_csm.hub",
    "install_dataset": "timm_csm.hub",
    "shipped_generator": "timm_csm.recipes.steps",
    "create_loss": "timm_csm.losses",
    "list_losses": "timm_csm.losses",
    "register_loss": "timm_csm.losses",
    "calibration_metrics": "timm_csm.metrics",
    "TemperatureScaling": "timm_csm.calibration",
    "create_calibrator": "timm_csm.calibration",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'timm_csm' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def _on_import():
    from . import models  # noqa: F401  registers the small-image timm models
    from .hf_metrics import install_evaluate_modules

    try:
        install_evaluate_modules()
    except OSError:  # a read-only cache: load_metric(name) still works by path
        pass


_on_import()
