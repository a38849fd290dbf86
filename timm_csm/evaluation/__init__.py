"""Evaluation of a classifier's calibration, below both the training library and ``timm-csm-calibrate``: both call
it, so that a training run and a calibration of a model trained anywhere fit, score and report calibrators alike.

* :mod:`~timm_csm.evaluation.model`: the classifier factory, weight loading and :func:`load_trained_classifier`
  (a run folder, or a calibrated-model folder, back as one module); :mod:`~timm_csm.evaluation.classifier`: a
  classifier trained anywhere, with its preprocessing resolved as timm's ``validate.py`` does;
* :mod:`~timm_csm.evaluation.predict`: a model's logits over a loader (:mod:`~timm_csm.evaluation.memory`: freed
  heap memory handed back to the system during prediction, glibc);
* :mod:`~timm_csm.evaluation.calibrators`: the calibrators created from the registry with their front end's
  options, checked once, fitted, chosen by cross-validation and scored, with conformal sets on top;
* :mod:`~timm_csm.evaluation.scores`: a training run's scores before and after each of its calibrators (TS's is
  the run's temperature), PIECE;
* :mod:`~timm_csm.evaluation.shift`: calibration under corruption x severity and OOD detection, for every
  calibrator; :mod:`~timm_csm.evaluation.shift_report`: their report sections and ``shift.png``;
* :mod:`~timm_csm.evaluation.config`: :class:`CalibrateConfig`; :mod:`~timm_csm.evaluation.calibrate`:
  :func:`calibrate` (what ``timm-csm-calibrate`` runs), its checks (:mod:`~timm_csm.evaluation.checks`) and its
  report (:mod:`~timm_csm.evaluation.report`).
"""
from .calibrate import calibrate
from .calibrators import check_calibrators, create_with_options
from .classifier import Classifier, load_classifier, require_safetensors
from .config import CalibrateConfig
from .model import CalibratedClassifier, load_trained_classifier
from .predict import predict, predict_split
from .scores import RUN_TEMPERATURE, Evaluation, evaluate_calibration
from .shift import ShiftEvaluation

__all__ = ["calibrate", "CalibrateConfig", "check_calibrators", "create_with_options", "Classifier",
           "load_classifier", "require_safetensors", "CalibratedClassifier", "load_trained_classifier", "predict",
           "predict_split", "RUN_TEMPERATURE", "Evaluation", "evaluate_calibration", "ShiftEvaluation"]
