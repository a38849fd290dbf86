"""Post-hoc calibrators, fitted on validation logits and applied to test logits (never fitted on test).

    ts = TemperatureScaling(method="grid_ece").fit(val_logits, val_targets)   # the paper protocol
    test_probs = ts.predict_proba(test_logits); ts.temperature; ts.save("ts.safetensors")
    create_calibrator("dirichlet", reg_lambda=1e-3, reg_mu=1e-3).fit(val_logits, val_targets)

The registry (:mod:`timm_csm.calibration.registry`): ``@register_calibrator(name, ...)`` declares a calibrator and
its capabilities (two-class only, penalties, minimum samples, fitted by default) where it is defined;
``create_calibrator``, ``list_calibrators`` and ``calibrator_spec`` read them.

Every calibrator maps logits to calibrated logits (``transform``) with one ``fit / transform / save / load``
interface: temperature, vector and matrix scaling, Dirichlet calibration, one-vs-rest isotonic regression and
histogram binning, and (two-class models) Platt scaling and beta calibration. Split-conformal prediction sets
(LAC, APS, RAPS) on top of any of them (refitted on a part of the calibration split that the quantile never
sees), or with their own temperature fitted for set size: :class:`ConformalClassifier`. One of several
calibrators chosen on the calibration split alone, by k-fold cross-validated NLL or ECE: :func:`select_calibrator`.
"""
from .base import PostHocCalibrator, load_calibrator
from .binary import BetaCalibration, PlattScaling
from .conformal import (CONFORMAL_METHODS, ConformalClassifier, ConformalMethod, conformal_method_spec,
                        fit_conformal_sets, list_conformal_methods, register_conformal_method)
from .linear import DirichletCalibration, MatrixScaling
from .one_vs_rest import HistogramBinning, IsotonicCalibration
from .registry import (CALIBRATORS, CalibratorSpec, calibrator_spec, check_calibration_samples, create_calibrator,
                       list_calibrators, register_calibrator)
from .selection import SELECTION_METRICS, auto_candidates, fold_table_markdown, select_calibrator
from .temperature import (DEFAULT_TEMPERATURE_METHOD, PAPER_TEMPERATURE_METHOD, TEMPERATURE_METHODS,
                          TemperatureScaling, bootstrap_temperatures, register_temperature_method, temperature_grid)
from .vector import VectorScaling

__all__ = [
    "PostHocCalibrator", "TemperatureScaling", "VectorScaling", "MatrixScaling", "DirichletCalibration",
    "IsotonicCalibration", "HistogramBinning", "PlattScaling", "BetaCalibration", "temperature_grid",
    "create_calibrator", "list_calibrators", "load_calibrator", "register_calibrator", "calibrator_spec",
    "CalibratorSpec", "CALIBRATORS", "check_calibration_samples", "ConformalClassifier", "fit_conformal_sets",
    "CONFORMAL_METHODS", "ConformalMethod", "register_conformal_method", "conformal_method_spec",
    "list_conformal_methods", "TEMPERATURE_METHODS", "register_temperature_method", "DEFAULT_TEMPERATURE_METHOD", "PAPER_TEMPERATURE_METHOD",
    "bootstrap_temperatures", "select_calibrator",
    "auto_candidates", "fold_table_markdown", "SELECTION_METRICS",
]
