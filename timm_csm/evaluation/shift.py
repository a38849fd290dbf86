"""Calibration under distribution shift and out-of-distribution detection, for ``timm-csm-train --eval-shift /
--ood`` and ``timm-csm-calibrate --shift / --ood``.

    shift = ShiftEvaluation.create("all", severities=(1, 2, 3, 4, 5), ood="digits", seed=0,
                                   in_dataset="fashion_mnist", class_names=names)   # every check, nothing run
    results.update(shift.run(predict_split, test_split, test_predictions, calibration_predictions,
                             {"temperature_scaling": scaler, "dirichlet": dirichlet}, n_bins=15))

Under each corruption x severity (:mod:`timm_csm.data.corruptions`, applied lazily to the test split with the
command's seed, at the model's input size: :func:`~timm_csm.data.corruptions.corrupt_at_input`) the caller's own
prediction loop gives the logits, scored by the one metric implementation
(:func:`prediction_scores`: :func:`~timm_csm.metrics.calibration_metrics` and the selective metrics) before and after
each calibrator fitted on the clean calibration split (Ovadia et al., NeurIPS 2019: calibrators are fitted in
distribution), with split-conformal sets fitted there too (their coverage under shift is what they promise in
distribution; on top of a calibrator, a copy of it fitted on one part of the split and the quantile on the other).
The OOD source's images, none of the model's classes, are scored against the test images by the maximum softmax
probability, the maximum logit, the energy and the negative entropy
(:mod:`timm_csm.metrics.ood`), before and after each calibrator. Reports: :mod:`~timm_csm.evaluation.shift_report`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from ..calibration import CONFORMAL_METHODS, ConformalClassifier
from ..calibration.conformal import calibrator_part_unmet, fit_conformal_sets
from ..data.corruptions import (SEVERITIES, corrupt_split, corruption_site, corruption_spec, create_corruption,
                                list_corruptions)
from ..metrics import bootstrap_metrics, calibration_metrics, metrics_for
from ..metrics.intervals import bootstrap_with_estimates
from ..metrics.intervals import intervals_from_distribution
from ..metrics.ood import OOD_SCORES, bootstrap_ood_metrics, ood_metrics, ood_score
from ..metrics.selective import selective_metrics_from_points
from ..trainer import progress_bar
from .shift_report import ood_reading

__all__ = ["SHIFT_METRICS", "ShiftEvaluation", "prediction_scores", "prediction_intervals", "resolve_corruptions",
           "check_severities", "open_ood_split", "evaluate_ood"]

#: the metrics of each cell of the shift table (besides conformal coverage and set size): the metric table's
#: ``"shift"`` view
SHIFT_METRICS = tuple(metrics_for("shift"))
#: the test images each corruption is timed on before the shift evaluation starts, for its projected time
PROBE_IMAGES = 16

Predictions = Tuple[torch.Tensor, torch.Tensor]


def prediction_scores(logits: torch.Tensor, labels: torch.Tensor, n_bins: int) -> Dict[str, float]:
    """Every calibration metric (:func:`~timm_csm.metrics.calibration_metrics`) and the selective ones (AURC,
    E-AURC, AUGRC) of ``logits``, as floats."""
    out = {k: float(v) for k, v in calibration_metrics(logits, labels, n_bins=n_bins).items()}
    conf, pred = torch.softmax(logits.double(), dim=1).max(dim=1)
    out.update(selective_metrics_from_points(conf, (pred == labels).double()))
    return out


def prediction_intervals(logits: torch.Tensor, labels: torch.Tensor, n_bins: int, resamples: int,
                         seed: int) -> Dict[str, Dict[str, float]]:
    """``{metric: {"low", "high"}}``: the 95% bootstrap interval (each metric's default method) of every number of
    :func:`prediction_scores` (the same keys), over ``resamples`` seeded resamples of the samples
    (:func:`~timm_csm.metrics.bootstrap_metrics`)."""
    return bootstrap_metrics(logits, labels, n_bins, resamples=resamples, seed=seed, selective=True)


def _duration(seconds: float) -> str:
    """``seconds`` for a person: "40 s", "3.5 min", "12 min"."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 600 else f"{seconds / 60:.0f} min"


def resolve_corruptions(spec: Union[str, Sequence[str], None]) -> List[str]:
    """The corruption names of ``spec``: ``"all"`` (every registered one) or names, comma-separated or a list;
    an unknown name is a one-line error listing the known ones."""
    names = spec.split(",") if isinstance(spec, str) else list(spec or [])
    names = [n.strip() for n in names if n and n.strip()]
    if names == ["all"]:
        return list_corruptions()
    if not names:
        raise ValueError("name the corruptions to evaluate under: 'all' or names from "
                         f"{', '.join(list_corruptions())}")
    for name in names:
        corruption_spec(name)
    return list(dict.fromkeys(names))


def check_severities(severities: Sequence[int]) -> List[int]:
    """``severities`` as sorted distinct ints, each in 1..5; anything else is a one-line error."""
    out = []
    for s in severities:
        if isinstance(s, bool) or not isinstance(s, int) or s not in SEVERITIES:
            raise ValueError(f"corruption severities must be among {list(SEVERITIES)}, got {s!r}")
        out.append(s)
    if not out:
        raise ValueError(f"give at least one corruption severity among {list(SEVERITIES)}")
    return sorted(set(out))


def open_ood_split(source: str, split: Optional[str], in_dataset, class_names: Sequence[str], **read_options):
    """The split of the OOD ``source`` (``split``, else its test split, else ``train``), read as the commands read
    any dataset (``read_options``: ``image_column``, ``label_column``, ``data_dir``). Refused in one line when it is
    the in-distribution dataset or names one of the model's ``class_names``: it must hold none of the model's
    classes."""
    from ..data import open_image_split
    from ..data.sources import dataset_split_names, detect_test_split, same_dataset

    if same_dataset(source, in_dataset):
        raise ValueError(f"--ood {source} is the dataset the model is evaluated on; an OOD source holds images of "
                         "none of the model's classes")
    try:
        split = split or detect_test_split(dataset_split_names(source)) or "train"
        data = open_image_split(str(source), split, **read_options)
    except (ValueError, ImportError):  # bad input, a missing optional package: their own one line
        raise
    except Exception as e:  # a missing dataset, an offline Hub: one line
        raise ValueError(f"--ood {source!r} could not be opened: {type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''}") from None
    shared = sorted(set(map(str, data.class_names)) & set(map(str, class_names)))
    if shared:
        raise ValueError(f"--ood {source} (split {split!r}) names the model's classes {shared[:5]}: an OOD source "
                         "must hold none of them (its images would be scored as unknown while the model knows them)")
    if len(data) == 0:
        raise ValueError(f"--ood {source} (split {split!r}) has no images")
    return data, split


def _calibrated(logits: torch.Tensor, calibrators: Dict[str, Any]) -> Dict[str, torch.Tensor]:
    """The logits before (``"uncalibrated"``) and after each calibrator."""
    return {"uncalibrated": logits, **{name: c.transform(logits) for name, c in calibrators.items()}}


def evaluate_ood(in_logits: torch.Tensor, out_logits: torch.Tensor, calibrators: Dict[str, Any],
                 resamples: int = 0, seed: int = 0) -> Dict[str, Any]:
    """``{"methods": {method: {score: {"auroc", "aupr_in", "aupr_out", "fpr95"}}}}`` of the in- against the
    out-of-distribution logits, before and after each calibrator, for every score of
    :data:`~timm_csm.metrics.ood.OOD_SCORES`; with ``resamples``, ``"intervals"`` holds the same nesting down to
    each metric's 95% bootstrap ``{"low", "high", "method"}`` (:func:`~timm_csm.metrics.ood.bootstrap_ood_metrics`,
    the in- and out-of-distribution images resampled apart)."""
    ins, outs = _calibrated(in_logits, calibrators), _calibrated(out_logits, calibrators)
    scores = {method: {kind: (ood_score(ins[method], kind), ood_score(outs[method], kind)) for kind in OOD_SCORES}
              for method in ins}
    out = {"methods": {m: {kind: ood_metrics(*pair) for kind, pair in by_kind.items()}
                       for m, by_kind in scores.items()}}
    if resamples:
        out["intervals"] = {m: {kind: bootstrap_ood_metrics(*pair, resamples=resamples, seed=seed)
                                for kind, pair in by_kind.items()} for m, by_kind in scores.items()}
    return out


def _cell(logits, labels, calibrators, sets: Dict[str, Dict[str, ConformalClassifier]], n_bins, resamples: int = 0,
          seed: int = 0) -> Tuple[Dict[str, Any], Dict[str, Dict[str, torch.Tensor]]]:
    """The shift metrics of one set of predictions, per method, with conformal coverage and set size, and with
    ``resamples`` each metric's 95% bootstrap interval (``"intervals"``); also the resampled values
    ``{method: {metric: (resamples,)}}`` that the severity means' intervals average (empty without resamples)."""
    cell, resampled = {}, {}
    for method, z in _calibrated(logits, calibrators).items():
        scores = prediction_scores(z, labels, n_bins)
        row: Dict[str, Any] = {k: scores[k] for k in SHIFT_METRICS}
        row["conformal"] = {}
        for name, cp in sets.get(method, {}).items():
            r = cp.evaluate(logits, labels)  # the classifier applies its calibrator itself
            row["conformal"][name] = {"coverage": r["coverage"], "mean_set_size": r["mean_set_size"]}
        if resamples:
            dist, _ = bootstrap_with_estimates(z, labels, n_bins, resamples=resamples, seed=seed, selective=True)
            resampled[method] = {k: dist[k] for k in SHIFT_METRICS}
            row["intervals"] = intervals_from_distribution(resampled[method], estimates=scores)
        cell[method] = row
    return cell, resampled


def _summary(table: Dict[str, Dict[str, Dict[str, Any]]], severities, methods,
             resampled: Optional[Dict[str, Dict[str, Dict[str, Dict[str, torch.Tensor]]]]] = None) -> Dict[str, Any]:
    """Per severity and method: the mean of every metric over the corruptions and the corruption of highest ECE;
    with the cells' ``resampled`` values (``[corruption][severity][method][metric]``), the mean's 95% interval:
    every corruption corrupts the same images and is resampled with the same indices, so the mean of the cells'
    resampled values is the resampled mean."""
    out: Dict[str, Any] = {}
    for s in severities:
        out[str(s)] = {}
        for m in methods:
            rows = {name: cells[str(s)][m] for name, cells in table.items()}
            mean = {k: sum(r[k] for r in rows.values()) / len(rows) for k in SHIFT_METRICS}
            first = next(iter(rows.values()))
            mean["conformal"] = {c: {k: sum(r["conformal"][c][k] for r in rows.values()) / len(rows)
                                     for k in ("coverage", "mean_set_size")} for c in first["conformal"]}
            worst = max(rows, key=lambda name: rows[name]["ece"])
            out[str(s)][m] = {"mean": mean, "worst": {"corruption": worst, "ece": rows[worst]["ece"],
                                                      "accuracy": rows[worst]["accuracy"]}}
            if resampled:
                out[str(s)][m]["intervals"] = intervals_from_distribution(
                    {k: sum(resampled[name][str(s)][m][k] for name in rows) / len(rows) for k in SHIFT_METRICS},
                    estimates=mean)
    return out


@dataclass
class ShiftEvaluation:
    """What a command was asked to evaluate besides the clean test split: ``corruptions`` x ``severities`` (drawn
    with ``seed``) and / or the OOD split ``ood`` (read from ``ood_source``); :meth:`create` checks it all before
    anything is predicted or written."""

    corruptions: List[str]
    severities: List[int]
    seed: int
    ood: Any = None
    ood_source: Optional[str] = None
    ood_split: Optional[str] = None

    @classmethod
    def create(cls, corruptions=None, severities: Sequence[int] = SEVERITIES, ood: Optional[str] = None,
               ood_split: Optional[str] = None, *, seed: int = 0, in_dataset=None,
               class_names: Sequence[str] = (), **read_options) -> Optional["ShiftEvaluation"]:
        """None when neither corruptions nor an OOD source are asked for; bad names, severities or an OOD source
        with the model's classes: one line."""
        if not corruptions and not ood:
            return None
        names = resolve_corruptions(corruptions) if corruptions else []
        sevs = check_severities(list(severities)) if names else []
        data, split = open_ood_split(ood, ood_split, in_dataset, class_names, **read_options) if ood else (None, None)
        return cls(names, sevs, int(seed), data, ood, split)

    def run(self, predict_split: Callable[[Any], Predictions], test_split, test: Predictions,
            calibration: Optional[Predictions], calibrators: Dict[str, Any], n_bins: int = 15,
            conformal: Sequence[str] = CONFORMAL_METHODS, alpha: float = 0.1, resamples: int = 0,
            log: Callable[[str], None] = print, transform=None, progress: bool = True) -> Dict[str, Any]:
        """``{"shift": ..., "ood": ...}`` (the keys asked for): ``predict_split(split)`` -> (logits, labels) is the
        command's prediction loop, ``test`` the clean test predictions, ``calibration`` the clean calibration
        predictions the ``calibrators`` were fitted on (the conformal sets are fitted there too; None: no sets);
        ``resamples``: bootstrap resamples behind the 95% interval of every number (0: none); ``transform``: the
        evaluation transform ``predict_split`` applies, for the report's line on where the corruptions are applied
        (``shift.applied``, :func:`~timm_csm.data.corruptions.corruption_site`); ``progress``: a bar over the
        corruption x severity cells (main process)."""
        out: Dict[str, Any] = {}
        if self.corruptions:
            applied = corruption_site(transform) if transform is not None else None
            if applied:
                log(f"shift: {applied}")
            out["shift"] = self._shift(predict_split, test_split, test, calibration, calibrators, n_bins, conformal,
                                       alpha, resamples, log, progress)
            if applied:
                out["shift"]["applied"] = applied
        if self.ood is not None:
            logits, _ = predict_split(self.ood)
            out["ood"] = {"source": str(self.ood_source), "split": self.ood_split, "n_in": len(test[1]),
                          "n_out": len(logits), "scores": list(OOD_SCORES),
                          **evaluate_ood(test[0], logits, calibrators, resamples, self.seed)}
            for line in ood_reading(out["ood"]):
                log(line)
        return out

    def projected_seconds(self, predict_split, test_split) -> float:
        """Wall seconds the corrupted predictions of :meth:`run` should take: each corruption timed on the first
        :data:`PROBE_IMAGES` test images at the middle severity asked for, less a call's own cost (one image, timed
        first), scaled to the whole split, plus that cost once per cell. Scoring the cells is not counted (it is
        fast beside the predictions)."""
        probe = test_split.subset(np.arange(min(len(test_split), PROBE_IMAGES)))
        severity = self.severities[len(self.severities) // 2]
        corruptions = [create_corruption(name, severity, seed=self.seed) for name in self.corruptions]
        start = time.perf_counter()
        predict_split(corrupt_split(probe.subset(np.arange(1)), corruptions[0]))
        per_call = time.perf_counter() - start
        per_image = 0.0
        for corruption in corruptions:
            start = time.perf_counter()
            predict_split(corrupt_split(probe, corruption))
            per_image += max(0.0, time.perf_counter() - start - per_call) / max(1, len(probe) - 1)
        return len(self.severities) * (len(self.corruptions) * per_call + per_image * len(test_split))

    def _shift(self, predict_split, test_split, test, calibration, calibrators, n_bins, conformal, alpha, resamples,
               log, progress):
        sets: Dict[str, Dict[str, ConformalClassifier]] = {}
        if calibration is not None:  # each calibrator refitted on its part of the split, the quantile on the rest
            for method in ["uncalibrated", *calibrators]:
                base = calibrators.get(method)
                if base is None or calibrator_part_unmet(base.kind, len(calibration[1]),
                                                         calibration[0].shape[1]) is None:
                    sets[method] = fit_conformal_sets(conformal, *calibration, alpha=alpha, seed=self.seed,
                                                      calibrator=base.unfitted() if base is not None else None)
        clean = _cell(test[0], test[1], calibrators, sets, n_bins, resamples, self.seed)[0]
        table: Dict[str, Dict[str, Any]] = {}
        resampled: Dict[str, Dict[str, Any]] = {}
        seconds = self.projected_seconds(predict_split, test_split)
        log(f"shift: {len(self.corruptions)} corruptions x {len(self.severities)} severities x {len(test_split)} "
            f"images, about {_duration(seconds)} projected")
        bar = progress_bar("shift", total=len(self.corruptions) * len(self.severities), unit="cell",
                           enabled=progress)
        for name in self.corruptions:
            table[name], resampled[name] = {}, {}
            for s in self.severities:
                logits, labels = predict_split(corrupt_split(test_split, create_corruption(name, s, seed=self.seed)))
                table[name][str(s)], resampled[name][str(s)] = _cell(logits, labels, calibrators, sets, n_bins,
                                                                     resamples, self.seed)
                bar.update()
            shown = ", ".join(f"{table[name][str(s)]['uncalibrated']['accuracy']:.3f}" for s in self.severities)
            log(f"shift: {name}: accuracy {shown} at severities {self.severities}")
        bar.close()
        methods = list(clean)
        return {"corruptions": self.corruptions, "severities": self.severities, "seed": self.seed,
                "methods": methods, "metrics": list(SHIFT_METRICS), "conformal_methods": list(conformal),
                "alpha": alpha, "n": len(test[1]), "clean": clean, "table": table,
                "summary": _summary(table, self.severities, methods, resampled if resamples else None),
                **({"bootstrap": {"resamples": resamples, "seed": self.seed, "level": 0.95}} if resamples else {})}
