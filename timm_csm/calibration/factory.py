"""``create_calibrator(name, **kwargs)`` for the registered post-hoc calibrators."""
from __future__ import annotations

import functools
from typing import Callable, Dict, List

from .base import PostHocCalibrator
from .temperature import TemperatureScaling
from .vector import VectorScaling

__all__ = ["create_calibrator", "list_calibrators"]

_CALIBRATORS: Dict[str, Callable[..., PostHocCalibrator]] = {
    "temperature_scaling": TemperatureScaling,  # grid_ece by default (the paper protocol)
    "temperature_scaling_nll": functools.partial(TemperatureScaling, method="nll"),
    "vector_scaling": VectorScaling,
}


def create_calibrator(name: str, **kwargs) -> PostHocCalibrator:
    """``create_calibrator("temperature_scaling", method="nll")``; unknown names list the known ones."""
    if name not in _CALIBRATORS:
        raise ValueError(f"unknown calibrator {name!r}; known calibrators: {', '.join(sorted(_CALIBRATORS))}")
    return _CALIBRATORS[name](**kwargs)


def list_calibrators() -> List[str]:
    return sorted(_CALIBRATORS)
