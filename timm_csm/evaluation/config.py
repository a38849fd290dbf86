"""The configuration of a calibration of a model already trained: :class:`CalibrateConfig`, one typed field per option
of ``timm-csm-calibrate`` besides the model, the data and the output folder.

Each field carries its flag's help (:func:`timm_csm.options.option`, the mechanism of every configuration of the
package): ``timm-csm-calibrate``'s flags are built from the fields (:func:`timm_csm.options.add_options`) and
:func:`~timm_csm.evaluation.calibrate` reads its defaults from them, so that each default is written once.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from ..calibration import SELECTION_METRICS, list_calibrators, list_conformal_methods
from ..data.corruptions import SEVERITIES
from ..metrics import DEFAULT_N_BINS
from ..metrics.intervals import DEFAULT_RESAMPLES
from ..options import comma_separated, option
from .classifier import CROP_MODES, INTERPOLATIONS

__all__ = ["CalibrateConfig"]

_data = functools.partial(option, group="Data")
_calibrators = functools.partial(option, group="Calibrators")
_report = functools.partial(option, group="Report")
_shift = functools.partial(option, group="Shift and out-of-distribution")
_model = functools.partial(option, group="Model")
_pre = functools.partial(option, group="preprocessing of a timm model name (timm's validate.py flags; default: the "
                                       "model's pretrained_cfg, and for weights trained elsewhere the images' own "
                                       "size, said as a guess)")
_run = functools.partial(option, group="Run")
_LIST = dict(type=comma_separated, nargs=None)  # a list given as one comma-separated value


@dataclass
class CalibrateConfig:
    """The options of :func:`~timm_csm.evaluation.calibrate` (``timm-csm-calibrate --help`` describes each; the
    fields are its flags with ``_``). List fields also take one comma-separated string."""

    # Data
    calibration_split: Optional[str] = _data(None, help="the split the calibrators are fitted on")
    calibration_fraction: Optional[float] = _data(
        None, help="hold out this seeded fraction of the test split for fitting instead")
    test_split: Optional[str] = _data(
        None, help="the split the report scores (a flat <class>/* folder is split 'train'); default, for a train.py "
                   "run: the test images the run held out, with its validation images as the calibration split "
                   "(checked against the digests the run recorded)")
    allow_training_split: bool = _data(False, help="score the split the model was trained on (refused otherwise)")
    image_column: Optional[str] = _data(None, help="image column (detected when omitted)")
    label_column: Optional[str] = _data(None, help="label column (detected when omitted)")
    data_dir: Optional[str] = _data(None, help="root folder of a timm torch/<name> dataset")

    # Calibrators
    calibrators: Optional[List[str]] = _calibrators(
        factory=functools.partial(list_calibrators, default=True), metavar="NAME[,NAME...]", **_LIST,
        help="comma-separated registry names (timm_csm.calibration.list_calibrators(); None: those registered as "
             "default), or 'auto': every registered one that applies")
    export: Optional[str] = _calibrators(None, help="the calibrator exported with the model (default: the lowest "
                                                    "cross-validated --select-by on the calibration split)")
    select_by: str = _calibrators("nll", choices=SELECTION_METRICS,
                                  help="the held-out metric that chooses the exported calibrator among several")
    folds: int = _calibrators(5, help="folds of the calibration split in that cross-validation")
    reg_lambda: float = _calibrators(0.0, help=f"{' / '.join(list_calibrators(penalty='reg_lambda'))}: the "
                                               "off-diagonal weight penalty (ODIR, Kull et al. 2019)")
    reg_mu: float = _calibrators(0.0, help=f"{' / '.join(list_calibrators(penalty='reg_mu'))}: the intercept "
                                           "penalty")
    conformal: List[str] = _calibrators(factory=list_conformal_methods, metavar="METHOD[,METHOD...]", **_LIST,
                                        help="conformal methods ('' for none)")
    alpha: float = _calibrators(0.1, help="conformal miscoverage level")

    # Report
    bootstrap: int = _report(DEFAULT_RESAMPLES, help="bootstrap resamples behind the 95%% interval of every number "
                                                     "of the report (0: none)")
    n_bins: int = _report(DEFAULT_N_BINS, help="confidence bins of ECE-type metrics")
    reliability: List[str] = _report([], metavar="KIND[,KIND...]", **_LIST,
                                     help="extra reliability diagrams, comma-separated: adaptive (equal-mass bins), "
                                          "classwise (one-vs-rest pairs of every class)")

    # Shift and out-of-distribution
    shift: Optional[str] = _shift(
        None, nargs="?", const="all", metavar="NAMES",
        help="also score the test split under corruptions, before and after each calibrator: 'all' (the flag alone) "
             "or comma-separated names of timm_csm.data.corruptions.list_corruptions()")
    shift_severities: List[int] = _shift(list(SEVERITIES), help="the corruption severities of --shift (1-5)")
    ood: Optional[str] = _shift(None, help="an image source of none of the model's classes (any --dataset form): OOD "
                                           "detection scores against the test images")
    ood_split: Optional[str] = _shift(None, help="the split of --ood (default: its test split, else 'train')")

    # Model
    checkpoint: Optional[str] = _model(None, help="weights (safetensors) of a timm model name, trained anywhere; or "
                                                  "the file to use in a run folder")
    pretrained_path: Optional[str] = _model(None, help="timm's own pretrained weights (safetensors) of a timm model "
                                                       "name: its pretrained_cfg describes them")
    num_classes: Optional[int] = _model(None, help="classes of a timm model name (default: the run's)")
    class_names: Optional[List[str]] = _model(
        None, metavar="NAME[,NAME...]", **_LIST,
        help="comma-separated names of the model's outputs, in output order (a plain timm model carries none); the "
             "data's classes must carry the same names in timm's order (natural sort: 1, 2, 10), so map by renaming "
             "class folders")
    input_size: Optional[List[int]] = _pre(None, nargs=3, metavar=("C", "H", "W"),
                                           help="input channels and size (H = W)")
    in_chans: Optional[int] = _pre(None, help="input channels (default: the model's, 3 for most)")
    img_size: Optional[int] = _pre(None, help="input size")
    mean: Optional[List[float]] = _pre(None, help="normalisation mean, one value per channel")
    std: Optional[List[float]] = _pre(None, help="normalisation std, one value per channel")
    crop_pct: Optional[float] = _pre(None, help="resize to size / crop-pct, then crop")
    crop_mode: Optional[str] = _pre(None, choices=CROP_MODES, help="timm's crop mode")
    interpolation: Optional[str] = _pre(None, choices=INTERPOLATIONS, help="resize interpolation")

    # Run
    batch_size: int = _run(128, help="images per prediction batch")
    seed: int = _run(0, help="seed of the calibration split and of the calibrators")
    device: str = _run("cpu", help="torch device of the model")
    workers: int = _run(0, help="DataLoader worker processes")

    def __post_init__(self):
        for name in ("calibrators", "conformal", "reliability", "class_names"):
            value = getattr(self, name)
            if value is not None:  # a list, or one comma-separated string as the flag takes it
                setattr(self, name, comma_separated(value))

    def data_config(self) -> Dict[str, Any]:
        """The given values of timm's data config (None: not given), for
        :func:`~timm_csm.evaluation.classifier.merge_data_config`."""
        return {"input_size": self.input_size, "mean": self.mean, "std": self.std, "crop_pct": self.crop_pct,
                "crop_mode": self.crop_mode, "interpolation": self.interpolation}

    def calibrator_options(self) -> Dict[str, float]:
        """The option values the calibrators take (:func:`~.calibrators.create_with_options`): the ODIR penalties."""
        return {"reg_lambda": self.reg_lambda, "reg_mu": self.reg_mu}
