"""The calibrators of an evaluation, for ``timm-csm-train --calibrators`` and ``timm-csm-calibrate`` alike: each
created from the registry with the options of its front end (:func:`create_with_options`), which ones to fit, which
one to export (never by a test-split number), and each one fitted on the calibration split and scored on both
splits, with conformal sets on top (the calibrator refitted on a part of the calibration split, the quantile on the
rest)."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from ..calibration import (TemperatureScaling, auto_candidates, bootstrap_temperatures, calibrator_spec,
                           create_calibrator, fold_table_markdown, list_calibrators, select_calibrator)
from ..calibration.conformal import calibrator_part_unmet, coverage_outside_range, fit_conformal_sets
from ..calibration.temperature import SMALL_VALIDATION, TEMPERATURE_RESAMPLES
from ..metrics import ece, nll, percentile_interval
from .report import prediction_curves
from .shift import prediction_intervals, prediction_scores

__all__ = ["create_with_options", "check_calibrators", "fit_candidates", "choose_export", "fit_and_score",
           "conformal_on_each", "temperature_spread", "OWN_TEMPERATURE"]


def create_with_options(name: str, values: Dict[str, Any]):
    """The calibrator ``name`` of the registry, with the front end's option ``values`` it takes (its registered
    penalties and ``options``: :meth:`~timm_csm.calibration.CalibratorSpec.front_end_options`)."""
    return create_calibrator(name, **calibrator_spec(name).front_end_options(values))


def check_calibrators(calibrators: Sequence[str], export: Optional[str], values: Dict[str, Any],
                      allow_auto: bool = True, flag: str = "--calibrators") -> None:
    """The one check of a calibrator list, before anything is loaded: at least one, ``auto`` alone (where
    ``allow_auto``: a choice by cross-validation, ``timm-csm-calibrate``'s), every name registered and its option
    ``values`` valid (each created once), ``export`` one of them; one line for the first problem."""
    if not calibrators:
        raise ValueError(f"give at least one calibrator ({flag} NAME[,NAME...])")
    auto = list(calibrators) == ["auto"]
    if "auto" in calibrators and not allow_auto:
        raise ValueError(f"{flag} takes registered names here ({', '.join(list_calibrators())}); 'auto' is "
                         "timm-csm-calibrate's choice by cross-validation")
    if len(set(calibrators)) != len(calibrators):
        raise ValueError(f"{flag} {','.join(calibrators)} names a calibrator twice")
    if "auto" in calibrators and not auto:
        raise ValueError(f"{flag} auto chooses among every registered calibrator: give it alone")
    for name in [] if auto else calibrators:
        create_with_options(name, values)  # unknown names list the registered ones; bad option values: one line
    if export is not None:
        create_with_options(export, values)
        if not auto and export not in calibrators:
            raise ValueError(f"--export {export!r} is not one of {flag} {','.join(calibrators)}")


def temperature_spread(scaler: TemperatureScaling, val, test, n_bins: int, bootstrap: int) -> Dict[str, Any]:
    """``{"temperature_interval"[, "post_ts_spread"]}``: the interval of ``scaler``'s temperature over refits on
    resampled validation (or calibration) images ``val`` (``bootstrap`` resamples, at most
    :data:`~timm_csm.calibration.temperature.TEMPERATURE_RESAMPLES`), and with fewer than
    :data:`~timm_csm.calibration.temperature.SMALL_VALIDATION` of them the range of the ``test`` ECE and NLL after
    TS over the resampled temperatures (see :func:`~.scores.evaluate_calibration`)."""
    resamples = min(bootstrap, TEMPERATURE_RESAMPLES)
    temperatures = bootstrap_temperatures(val[0], val[1], scaler.method, n_bins, resamples=resamples)
    low, high = percentile_interval(temperatures)
    out: Dict[str, Any] = {"temperature_interval": {"low": low, "high": high, "resamples": resamples}}
    if test is None or len(val[1]) >= SMALL_VALIDATION:
        return out
    distinct, which = temperatures.unique(return_inverse=True)  # the grid's fits repeat: score each T once
    score = {"ece": lambda z: ece(z, test[1], n_bins), "nll": lambda z: nll(z, test[1])}
    spread = {}
    for key, of_logits in score.items():
        values = torch.tensor([of_logits(test[0] / t) for t in distinct.tolist()], dtype=torch.float64)[which]
        spread[key] = dict(zip(("low", "high"), percentile_interval(values)))
    out["post_ts_spread"] = {"n_val": len(val[1]), **spread}
    return out


#: the conformal sets with their own temperature, fitted for set size (a key of the report's "conformal")
OWN_TEMPERATURE = "set_size_temperature"


def fit_and_score(names: Sequence[str], cal, test, n_bins: int, alpha: float, conformal: Sequence[str], seed: int,
                  log, options: Dict[str, Any], bootstrap: int) -> Dict[str, Any]:
    """Fit each calibrator on ``cal`` (``options``: the front end's option values, :func:`create_with_options`), score
    it on ``test`` and ``cal`` (with ``bootstrap`` resamples: the interval of every number); conformal sets on top
    of each (and of none), and with their own temperature fitted for set size (:func:`conformal_on_each`)."""
    fitted, rows = {}, {}
    for name in names:
        calibrator = create_with_options(name, options).fit(*cal)
        out = calibrator.transform(test[0])
        fitted[name] = (calibrator, out)
        scored = {"test": (out, test[1]), "calibration_split": (calibrator.transform(cal[0]), cal[1])}
        rows[name] = {"test": prediction_scores(out, test[1], n_bins),
                      "curves": prediction_curves(out, test[1], n_bins),
                      "calibration_split": prediction_scores(*scored["calibration_split"], n_bins)}
        if bootstrap:
            rows[name]["intervals"] = {split: prediction_intervals(*pair, n_bins, bootstrap, seed)
                                       for split, pair in scored.items()}
            if isinstance(calibrator, TemperatureScaling):  # how far its temperature moves with the images
                rows[name].update(temperature=calibrator.temperature,
                                  **temperature_spread(calibrator, cal, test, n_bins, bootstrap))
        log(f"{name}: test ECE {rows[name]['test']['ece']:.4f}, NLL {rows[name]['test']['nll']:.4f}, "
            f"accuracy {rows[name]['test']['accuracy']:.4f}")
    sets, left_out = conformal_on_each(names, cal, test, alpha, conformal, seed, log, options, bootstrap)
    return {"fitted": fitted, "rows": rows, "conformal": sets, "conformal_left_out": left_out}


def conformal_on_each(names: Sequence[str], cal, test, alpha: float, conformal: Sequence[str], seed: int, log,
                      options: Dict[str, Any], bootstrap: int) -> Tuple[Dict[str, Any], Dict[str, str]]:
    """(``{base: {method: evaluation on test}}``, ``{calibrator: why no sets}``): conformal sets on the raw logits,
    on top of each calibrator of ``names`` (a copy fitted on its part of ``cal``, the quantile on the rest; none where
    that part is too small for it: :func:`~timm_csm.calibration.conformal.calibrator_part_unmet`) and with their own
    temperature (:data:`OWN_TEMPERATURE`); a coverage outside its expected range is logged as a warning."""
    sets: Dict[str, Dict[str, Any]] = {}
    left_out: Dict[str, str] = {}
    for base in ["none", *names, OWN_TEMPERATURE] if conformal else []:
        why = calibrator_part_unmet(base, len(cal[1]), cal[0].shape[1]) if base in names else None
        if why is not None:
            left_out[base] = why
            log(f"no conformal sets on {base}: it {why}")
            continue
        unfitted = create_with_options(base, options) if base in names else None
        temperature = "set_size" if base == OWN_TEMPERATURE else None
        classifiers = fit_conformal_sets(conformal, *cal, calibrator=unfitted, alpha=alpha, seed=seed,
                                         temperature=temperature)
        sets[base] = {method: classifier.evaluate(*test, bootstrap=bootstrap, seed=seed)
                      for method, classifier in classifiers.items()}
        for result in sets[base].values():
            warning = coverage_outside_range(result)
            if warning is not None:
                log(f"warning: conformal sets on {base}: {warning}")
    return sets, left_out


def fit_candidates(calibrators: List[str], export: Optional[str], k: int, n_cal: int, folds: int):
    """(the calibrators to fit, ``{name: why not}``): the listed ones, or for ``auto`` the registered ones that
    apply to ``k`` classes and ``n_cal`` calibration samples in ``folds`` folds (``export`` must be one)."""
    if calibrators != ["auto"]:
        return calibrators, {}
    names, left_out = auto_candidates(k, n_cal, folds)
    if export is not None and export not in names:
        raise ValueError(f"--export {export!r} does not apply here: {left_out[export]}")
    return names, left_out


def choose_export(names: List[str], export: Optional[str], cal, folds: int, by: str, seed: int, n_bins: int,
                  options: Dict[str, Any], left_out: Dict[str, str], log) -> Tuple[Dict[str, Any], Optional[dict]]:
    """(the calibrator to export and why, the fold table of the choice or None): ``export`` when given, the only
    one listed, else the lowest ``folds``-fold cross-validated ``by`` on the calibration split
    (:func:`~timm_csm.calibration.select_calibrator`; ``left_out``: the registered ones ``auto`` did not try);
    never a test-split number."""
    if export is not None:
        return {"kind": export, "chosen_by": "named by --export"}, None
    if len(names) == 1:
        return {"kind": names[0], "chosen_by": "the only calibrator listed"}, None
    folds = min(folds, len(cal[1]))
    chosen, table = select_calibrator(*cal, names, folds=folds, by=by, seed=seed, n_bins=n_bins,
                                      options={name: calibrator_spec(name).front_end_options(options)
                                               for name in names})
    log(f"calibrators by {folds}-fold cross-validated {by.upper()} on the calibration split (chosen: {chosen}; "
        f"left out: {left_out or 'none'}):\n{fold_table_markdown(table)}")
    return ({"kind": chosen, "chosen_by": f"the lowest {folds}-fold cross-validated {by.upper()} on the calibration "
             "split"}, dict(table, left_out=left_out))
