"""The calibrators of ``timm-csm-calibrate`` (:func:`timm_csm.calibrate.calibrate`): which ones to fit, which one
to export (never by a test-split number), and each one fitted on the calibration split and scored on both splits,
with conformal sets on top (the calibrator refitted on a part of the calibration split, the quantile on the rest)."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from .calibrate_report import prediction_curves
from .calibration import (TemperatureScaling, auto_candidates, calibrator_spec, create_calibrator, fold_table_markdown,
                          select_calibrator)
from .calibration.conformal import calibrator_part_unmet, coverage_outside_range, fit_conformal_sets
from .training.evaluation import temperature_spread
from .training.shift import prediction_intervals, prediction_scores

__all__ = ["create_with_penalties", "fit_candidates", "choose_export", "fit_and_score", "conformal_on_each",
           "OWN_TEMPERATURE"]


def create_with_penalties(name: str, penalties: Dict[str, float]):
    """The calibrator ``name`` with the strengths of ``penalties`` it takes (its registered ``penalties``)."""
    return create_calibrator(name, **calibrator_spec(name).penalty_options(penalties))


#: the conformal sets with their own temperature, fitted for set size (a key of the report's "conformal")
OWN_TEMPERATURE = "set_size_temperature"


def fit_and_score(names: Sequence[str], cal, test, n_bins: int, alpha: float, conformal: Sequence[str], seed: int,
                  log, odir: Dict[str, float], bootstrap: int) -> Dict[str, Any]:
    """Fit each calibrator on ``cal`` (``odir``: the ODIR penalty strengths, for those that take them), score it on
    ``test`` and ``cal`` (with ``bootstrap`` resamples: the interval of every number); conformal sets on top of
    each (and of none), and with their own temperature fitted for set size (:func:`conformal_on_each`)."""
    fitted, rows = {}, {}
    for name in names:
        calibrator = create_with_penalties(name, odir).fit(*cal)
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
    sets, left_out = conformal_on_each(names, cal, test, alpha, conformal, seed, log, odir, bootstrap)
    return {"fitted": fitted, "rows": rows, "conformal": sets, "conformal_left_out": left_out}


def conformal_on_each(names: Sequence[str], cal, test, alpha: float, conformal: Sequence[str], seed: int, log,
                      odir: Dict[str, float], bootstrap: int) -> Tuple[Dict[str, Any], Dict[str, str]]:
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
        unfitted = create_with_penalties(base, odir) if base in names else None
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
                  odir: Dict[str, float], left_out: Dict[str, str], log) -> Tuple[Dict[str, Any], Optional[dict]]:
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
                                      options={name: calibrator_spec(name).penalty_options(odir) for name in names})
    log(f"calibrators by {folds}-fold cross-validated {by.upper()} on the calibration split (chosen: {chosen}; "
        f"left out: {left_out or 'none'}):\n{fold_table_markdown(table)}")
    return ({"kind": chosen, "chosen_by": f"the lowest {folds}-fold cross-validated {by.upper()} on the calibration "
             "split"}, dict(table, left_out=left_out))
