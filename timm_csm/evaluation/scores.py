"""Calibration of a trained classifier from its predictions: metrics before and after each calibrator fitted on
the validation split (temperature scaling by default), PIECE.

:func:`evaluate_calibration` is pure: it takes the validation and test predictions (logits, labels and, for PIECE,
penultimate features) and returns the metrics, the temperature and the calibrated test logits; it reads and writes
no files and runs no model.
"""
from __future__ import annotations

import warnings
from typing import Any, Dict, Mapping, NamedTuple, Optional, Sequence, Tuple

import torch

from ..calibration import TemperatureScaling, calibrator_spec
from ..metrics import DEFAULT_N_BINS, bootstrap_metrics, calibration_metrics, piece, proximity
from ..metrics.interval_methods import INTERVAL_NOTE
from ..metrics.intervals import DEFAULT_LEVEL, DEFAULT_RESAMPLES
from .calibrators import create_with_options, temperature_spread

__all__ = ["Evaluation", "evaluate_calibration", "metric_row", "RUN_TEMPERATURE"]

#: the calibrator whose phase is a run's ``post_ts`` (its ``temperature`` and ``temperature.safetensors``: what the
#: comparisons, the studies and ``load_trained_classifier(calibrated=True)`` read); every other calibrator of a run
#: has its own entry under ``calibrators``
RUN_TEMPERATURE = "temperature_scaling"


class _Scored(NamedTuple):
    metrics: Dict[str, Any]
    post_logits: Optional[torch.Tensor]
    scaler: Optional[TemperatureScaling]
    test_proximity: Optional[torch.Tensor]  # PIECE's proximities of the test samples


class Evaluation(NamedTuple):
    """What :func:`evaluate_calibration` returns: ``metrics`` (``{"temperature", "test", "val"}``, the results.json
    entries), ``post_logits`` (the temperature-scaled test logits, the validation ones without a test split, None
    without TS), ``scaler`` (the fitted :class:`~timm_csm.calibration.TemperatureScaling`, None without TS) and
    ``calibrators`` (every fitted calibrator by name, TS included: what the shift evaluation applies)."""

    metrics: Dict[str, Any]
    post_logits: Optional[torch.Tensor]
    scaler: Optional[TemperatureScaling]
    calibrators: Dict[str, Any] = {}


def metric_row(prefix: str, metrics: Dict[str, float]) -> Dict[str, float]:
    """``{f"{prefix}_{name}": float(value)}`` of a metrics dict."""
    return {f"{prefix}_{k}": float(v) for k, v in metrics.items()}


def _scores(logits, labels, n_bins: int) -> Dict[str, float]:
    return {k: float(v) for k, v in calibration_metrics(logits, labels, n_bins=n_bins).items()}


def _piece(logits, labels, feats, ref_feats, n_bins: int, prox=None) -> Tuple[float, torch.Tensor]:
    """PIECE of ``logits``; the proximity is to the validation features (the calibration set), as ProCal."""
    if prox is None:
        prox = proximity(feats, ref_feats)
    return float(piece(logits, labels, feats, n_conf_bins=n_bins, prox=prox)), prox


def evaluate_calibration(val: Optional[Sequence[torch.Tensor]], test: Optional[Sequence[torch.Tensor]],
                         n_bins: int = DEFAULT_N_BINS, calibrators: Sequence[str] = (RUN_TEMPERATURE,),
                         options: Optional[Mapping[str, Any]] = None, with_piece: bool = False,
                         fitted: Optional[TemperatureScaling] = None,
                         bootstrap: int = DEFAULT_RESAMPLES) -> Evaluation:
    """Score ``test`` = (logits, labels[, features]) before and after each of ``calibrators`` (registry names,
    created with the front end's option values ``options``: :func:`~.calibrators.create_with_options`; ``n_bins``
    is one of them) fitted on ``val`` (same layout; None: no validation split, pre-TS metrics only).

    * ``metrics["test"]["pre_ts"]`` / ``["post_ts"]``: :func:`timm_csm.metrics.calibration_metrics` of the test
      logits and of the scaled ones; ``metrics["val"]`` the same on the validation split;
    * ``metrics["intervals"]``: the 95% intervals of every one of those numbers (each metric's default method),
      ``{split: {phase: {metric: {"low", "high", "method"}}}}``, from ``bootstrap`` resamples of the split's samples
      (:func:`timm_csm.metrics.bootstrap_metrics`, seed 0; the temperature is not refitted per resample), described
      by ``metrics["bootstrap"]``; both absent with ``bootstrap=0``;
    * ``metrics["temperature_interval"]``: the temperature's own 95% interval, ``{"low", "high", "resamples"}``,
      refitted on resamples of the validation images (:func:`temperature_spread`); with few of them (below
      ``SMALL_VALIDATION``), ``metrics["post_ts_spread"]`` holds the 95% range of the test ECE and NLL after TS
      over those temperatures (``{"n_val", "ece": {"low", "high"}, "nll": {...}}``): how far the after-TS numbers
      move with the temperature alone. Absent with ``bootstrap=0`` or without a temperature fitted here;
    * TS (:data:`RUN_TEMPERATURE`, when listed): :class:`~timm_csm.calibration.TemperatureScaling` (its option
      ``ts_method``: NLL as Guo et al., a training run's default, or the grid 0.1..10 by ECE of the CSM paper); a
      fit that fails (e.g. fewer validation samples than classes) is skipped with a warning, as for every
      calibrator;
    * every other calibrator: ``metrics["calibrators"][name]`` = ``{"test", "val"}``, the metrics of its
      calibrated logits (PIECE too with ``with_piece``), with ``"intervals"`` ``{split: {metric: ...}}`` as above;
      absent when only TS is listed;
    * ``test`` None (a dataset with no test split): ``metrics["test"]`` is None, the validation metrics are the
      report (after TS in-sample) and ``post_logits`` are the scaled validation logits;
    * ``with_piece``: the proximity-informed ECE (Xiong et al., NeurIPS 2023) of the test logits before and after
      TS, with the validation features as the reference set (skipped with a warning without a validation or a
      test split);
    * ``fitted``: without validation predictions, a temperature fitted before (the training run's, for an
      eval-only run on a folder of held-out images) is applied to the test logits as it is.
    """
    values = {"n_bins": n_bins, **(options or {})}
    skipped: Dict[str, str] = {}  # calibrators asked for and not fitted, with the reason (said in the report)
    scaler = (_fit(RUN_TEMPERATURE, values, val, skipped) if RUN_TEMPERATURE in calibrators and val is not None
              else None)
    scored = _evaluate(val, test, n_bins, scaler, with_piece, fitted)
    metrics = scored.metrics
    asked = [name for name in calibrators if name != RUN_TEMPERATURE]
    if asked and val is None:
        warnings.warn(f"calibrators {', '.join(asked)} skipped: no validation images to fit them on")
        skipped.update(dict.fromkeys(asked, "no validation images to fit it on"))
    others = {name: _fit(name, values, val, skipped) for name in asked if val is not None}
    others = {name: c for name, c in others.items() if c is not None}
    if asked:
        metrics["calibrators"] = _score_others(others, val, test, n_bins, bootstrap, scored.test_proximity,
                                               with_piece and val is not None and test is not None)
    if skipped:
        metrics["calibrators_skipped"] = skipped
    if bootstrap:
        val_post = scored.scaler.transform(val[0]) if scored.scaler is not None and val is not None else None
        splits = {"test": (test, scored.post_logits, scored.test_proximity), "val": (val, val_post, None)}
        metrics["intervals"] = {}
        for split, (data, post, prox) in splits.items():
            if metrics[split] is None:
                continue
            phases = {"pre_ts": data[0], "post_ts": post if metrics[split]["post_ts"] is not None else None}
            metrics["intervals"][split] = {
                phase: bootstrap_metrics(logits, data[1], n_bins, resamples=bootstrap, prox=prox)
                for phase, logits in phases.items() if logits is not None}
        metrics["bootstrap"] = {"resamples": int(bootstrap), "seed": 0, "level": DEFAULT_LEVEL,
                                "interval": INTERVAL_NOTE, "resampled": "the samples of each split"}
        if scored.scaler is not None and val is not None:
            metrics.update(temperature_spread(scored.scaler, val, test, n_bins, bootstrap))
    fitted_all = {**({RUN_TEMPERATURE: scored.scaler} if scored.scaler is not None else {}), **others}
    return Evaluation(metrics, scored.post_logits, scored.scaler, fitted_all)


def _fit(name: str, values: Mapping[str, Any], val, skipped: Dict[str, str]):
    """Calibrator ``name`` fitted on the validation predictions, None when it cannot be fitted there
    (:meth:`~timm_csm.calibration.CalibratorSpec.unmet`) or its fit fails: then warned and its reason kept in
    ``skipped``, which the report states."""
    what = "temperature scaling" if name == RUN_TEMPERATURE else f"calibrator {name}"
    unmet = calibrator_spec(name).unmet(val[0].shape[1], len(val[1]), "the validation split")
    try:
        if unmet is None:
            return create_with_options(name, values).fit(val[0], val[1])
        why = f"it {unmet}"
    except ValueError as e:  # e.g. fewer validation samples than classes: reported without it
        why = str(e)
    warnings.warn(f"{what} skipped: {why}")
    skipped[name] = why
    return None


def _score_others(others: Dict[str, Any], val, test, n_bins: int, bootstrap: int, prox,
                  with_piece: bool) -> Dict[str, Any]:
    """``{name: {"test", "val"[, "intervals"]}}`` of each calibrator but TS (see :func:`evaluate_calibration`)."""
    out: Dict[str, Any] = {}
    for name, calibrator in others.items():
        row: Dict[str, Any] = {"test": None, "val": None}
        splits = {"test": (test, prox), "val": (val, None)}
        for split, (data, split_prox) in splits.items():
            if data is None:
                continue
            logits = calibrator.transform(data[0])
            row[split] = _scores(logits, data[1], n_bins)
            if with_piece and split == "test":
                row[split]["piece"] = _piece(logits, data[1], data[2], val[2], n_bins, split_prox)[0]
            if bootstrap:
                row.setdefault("intervals", {})[split] = bootstrap_metrics(logits, data[1], n_bins,
                                                                           resamples=bootstrap, prox=split_prox)
        out[name] = row
    return out


def _evaluate(val, test, n_bins: int, scaler: Optional[TemperatureScaling], with_piece: bool,
              fitted: Optional[TemperatureScaling] = None) -> "_Scored":
    """The metrics of :func:`evaluate_calibration` before and after ``scaler`` (fitted on ``val``; None: not asked
    or its fit failed), before their intervals."""
    if val is None and test is None:
        raise ValueError("nothing to evaluate: no validation and no test predictions")
    metrics: Dict[str, Any] = {"temperature": None, "test": None, "val": None}
    if test is not None:
        metrics["test"] = {"pre_ts": _scores(test[0], test[1], n_bins), "post_ts": None}
    if with_piece and (val is None or test is None):
        warnings.warn("--piece needs a validation split (the proximity's reference set) and a test split; skipped")
        with_piece = False
    if val is None:
        if fitted is None or test is None:
            return _Scored(metrics, None, None, None)
        post_logits = fitted.transform(test[0])
        metrics["temperature"] = float(fitted.temperature)
        metrics["test"]["post_ts"] = _scores(post_logits, test[1], n_bins)
        return _Scored(metrics, post_logits, fitted, None)
    val_logits, val_y = val[0], val[1]
    metrics["val"] = {"pre_ts": _scores(val_logits, val_y, n_bins), "post_ts": None}
    prox = None
    if with_piece:
        metrics["test"]["pre_ts"]["piece"], prox = _piece(test[0], test[1], test[2], val[2], n_bins)
    if scaler is None:
        return _Scored(metrics, None, None, prox)
    metrics["temperature"] = float(scaler.temperature)
    metrics["val"]["post_ts"] = _scores(scaler.transform(val_logits), val_y, n_bins)
    if test is None:
        return _Scored(metrics, scaler.transform(val_logits), scaler, None)
    post_logits = scaler.transform(test[0])
    metrics["test"]["post_ts"] = _scores(post_logits, test[1], n_bins)
    if with_piece:
        metrics["test"]["post_ts"]["piece"] = _piece(post_logits, test[1], test[2], val[2], n_bins, prox)[0]
    return _Scored(metrics, post_logits, scaler, prox)
