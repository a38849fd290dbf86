"""``create_calibrator(name, **kwargs)`` for the registered post-hoc calibrators."""
from __future__ import annotations

import functools
from typing import Callable, Dict, List

from .base import PostHocCalibrator
from .binary import BetaCalibration, PlattScaling
from .linear import DirichletCalibration, MatrixScaling
from .one_vs_rest import HistogramBinning, IsotonicCalibration
from .temperature import TemperatureScaling
from .vector import VectorScaling

__all__ = ["create_calibrator", "list_calibrators", "BINARY_CALIBRATORS"]

_CALIBRATORS: Dict[str, Callable[..., PostHocCalibrator]] = {
    "temperature_scaling": TemperatureScaling,  # grid_ece by default (the paper protocol)
    "temperature_scaling_nll": functools.partial(TemperatureScaling, method="nll"),
    "vector_scaling": VectorScaling,
    "matrix_scaling": MatrixScaling,
    "dirichlet": DirichletCalibration,
    "isotonic": IsotonicCalibration,
    "histogram_binning": HistogramBinning,
    "platt": PlattScaling,
    "beta": BetaCalibration,
}
#: the calibrators that take two-class models only
BINARY_CALIBRATORS = ("platt", "beta")


def create_calibrator(name: str, **kwargs) -> PostHocCalibrator:
    """``create_calibrator("temperature_scaling", method="nll")``, ready to fit; unknown names list the known
    ones, and a calibrator whose fit needs an optional package that is absent names the extra that installs it."""
    if name not in _CALIBRATORS:
        raise ValueError(f"unknown calibrator {name!r}; known calibrators: {', '.join(sorted(_CALIBRATORS))}")
    calibrator = _CALIBRATORS[name](**kwargs)
    calibrator.check_fit_dependencies()
    return calibrator


def list_calibrators() -> List[str]:
    return sorted(_CALIBRATORS)
