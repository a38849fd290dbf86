"""timm-csm: calibrated image classifiers for timm and Hugging Face (CSM, ICML 2025, and its baselines)."""
__version__ = "0.1.0"
