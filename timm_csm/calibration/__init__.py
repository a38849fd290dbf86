"""Post-hoc calibrators, fitted on validation logits and applied to test logits (never fitted on test).

    ts = TemperatureScaling(method="grid_ece").fit(val_logits, val_targets)   # the paper protocol
    test_probs = ts.predict_proba(test_logits); ts.temperature; ts.save("ts.safetensors")
"""
from .base import PostHocCalibrator, load_calibrator
from .factory import create_calibrator, list_calibrators
from .temperature import TemperatureScaling, temperature_grid
from .vector import VectorScaling

__all__ = [
    "PostHocCalibrator", "TemperatureScaling", "VectorScaling", "temperature_grid", "create_calibrator",
    "list_calibrators", "load_calibrator",
]
