"""The metric table: each metric's one name and everything the package says about it, in one place.

A metric's name is its key in every result (``calibration_metrics``, ``results.json``, ``report.json``, the
bootstrap intervals), its ``evaluate`` module's name and its report column. Its :class:`MetricSpec` holds the
functional form, the statistics of one pass it needs and how it reads them, the report's label and scale, its
direction, and whether it ships as an ``evaluate`` module. Every consumer reads the table: the one-pass
:func:`calibration_metrics` and :class:`~timm_csm.metrics.CalibrationAccumulator`, the bootstrap
(:mod:`timm_csm.metrics.intervals`), the ``evaluate`` modules (:mod:`timm_csm.hf_metrics`) and the reports.

    register_metric(MetricSpec("gap", "accuracy - confidence gap", scale=100, from_state=my_gap))
    list_metrics()                      # every name, in report order
    list_metrics(family="selective")    # ['aurc', 'eaurc', 'augrc']
    metrics_for("shift")                # ['accuracy', 'ece', 'aece', 'nll', 'brier', 'aurc']
    metric_spec("cece").label           # 'Classwise ECE'

Families: ``"calibration"`` (computed by :func:`calibration_metrics` from its one pass), ``"smooth"`` (the same
pass, on request: ``smooth=True``), ``"selective"`` (from the kept confidences, beside the calibration metrics in
the reports), ``"proximity"`` (from penultimate features).

Views: every list of metrics the package shows or chooses by is the table's metrics of one view
(:func:`metrics_for`), in table order; a spec names the views it belongs to (:data:`VIEWS`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

from ..registry import Registry
from .binning import (DEFAULT_N_BINS, calibration_error_from_bins, classwise_error_from_bins,
                      debiased_error_from_bins, overconfidence_from_bins, underconfidence_from_bins)
from .functional import (_state, adaptive_ece, adaptive_ece_from_points, brier_score, classwise_ece, debiased_ce,
                         ece, mce, nll, overconfidence_error, smooth_ece, underconfidence_error)
from .proximity import piece
from .selective import augrc, aurc, eaurc, selective_metrics_from_points
from .smooth import smooth_calibration_error
from .state import CalibrationState

__all__ = ["MetricSpec", "METRICS", "register_metric", "metric_spec", "metric_of_abbrev", "list_metrics",
           "metrics_for", "metrics_from_state", "calibration_metrics", "METRIC_KEYS", "SELECTIVE_KEYS", "FAMILIES",
           "VIEWS", "LEGACY_NAMES"]

FAMILIES = ("calibration", "smooth", "selective", "proximity")
#: the named views of the table: where each list of metrics is shown or chosen by
VIEWS = {
    "headline": "the columns of the reports' summary tables (timm-csm-calibrate's report.md)",
    "report": "the rows of a training run's report (results.md) and of timm-csm-compare",
    "shift": "the columns of the shift and OOD evaluation, per corruption and severity",
    "per_seed": "a per-seed row of a cell or a study, and the side-by-side table of runs",
    "page": "the mean and spread columns of the benchmarks' calibration pages",
    "checkpoint": "timm-csm-train --select-by: the validation metric that picks the best checkpoint",
    "calibrator_selection": "timm-csm-calibrate --select-by: the cross-validated metric that picks the calibrator",
    "diagnostics": "the real images' row of the CSM diagnostics: accuracy, mean confidence, ECE",
}
#: the statistics of one pass (the flags of :func:`~timm_csm.metrics.state.accumulate`)
_STATISTICS = ("binned", "classwise", "nll", "brier", "points")


@dataclass(frozen=True)
class MetricSpec:
    """A metric of the table.

    * ``name``: its one name (result key, ``evaluate`` module, report column); ``label``: the report's words;
      ``short``: a narrow column's header (default: ``label``).
    * ``scale``: 100 for the fractions a report shows in percent, 1 for raw values; ``higher_is_better``: its
      direction (True for accuracy, False for every error, None for the mean confidence, which has none).
    * ``from_state``: its value from an accumulated :class:`~timm_csm.metrics.state.CalibrationState` holding the
      statistics ``needs`` (names of :data:`_STATISTICS`); ``function``: its functional form (its docstring is the
      ``evaluate`` module's description); ``family``: see the module docstring.
    * ``evaluate``: shipped as the ``evaluate`` module ``name`` (``timm_csm/hf_metrics/<name>/<name>.py``), with
      ``citation``; ``description``: what it is, for the documentation's table.
    * ``views``: the names of :data:`VIEWS` it belongs to (``"headline"`` by default: a column of the reports'
      summary tables; the mean confidence, over- and under-confidence are details kept in the results only).
    * ``abbrev``: its abbreviation in per-seed row keys (``acc_pre_ts``) and ``--select-by`` (default: ``name``);
      ``in_text``: its words in running text (``"test classwise ECE before TS"``; default: ``label``).
    """

    name: str
    label: str
    short: str = ""
    scale: float = 1.0
    higher_is_better: Optional[bool] = False
    from_state: Optional[Callable[[CalibrationState], float]] = None
    needs: Tuple[str, ...] = ()
    function: Optional[Callable] = None
    family: str = "calibration"
    evaluate: bool = False
    citation: str = ""
    description: str = field(default="", compare=False)
    views: Tuple[str, ...] = ("headline",)
    abbrev: str = ""
    in_text: str = ""

    def __post_init__(self):
        if not self.name or not self.name.isidentifier():
            raise ValueError(f"a metric name is a Python identifier, got {self.name!r}")
        if self.family not in FAMILIES:
            raise ValueError(f"metric {self.name!r}: family must be one of {FAMILIES}, got {self.family!r}")
        unknown = sorted(set(self.needs) - set(_STATISTICS))
        if unknown:
            raise ValueError(f"metric {self.name!r}: unknown statistics {unknown}; known: {_STATISTICS}")
        if self.family in ("calibration", "smooth") and self.from_state is None:
            raise ValueError(f"metric {self.name!r} of the one pass needs from_state")
        if self.evaluate and self.function is None:
            raise ValueError(f"metric {self.name!r}: an evaluate module needs the functional form (function=)")
        unknown = sorted(set(self.views) - set(VIEWS))
        if unknown:
            raise ValueError(f"metric {self.name!r}: unknown views {unknown}; known: {', '.join(VIEWS)}")
        for attr, default in (("short", self.label), ("abbrev", self.name), ("in_text", self.label)):
            if not getattr(self, attr):
                object.__setattr__(self, attr, default)

    @property
    def unit(self) -> str:
        """``"%"`` for a metric shown in percent, else ``""``."""
        return "%" if self.scale == 100 else ""

    @property
    def heading(self) -> str:
        """The report's row or column title: the label and its unit (``"ECE (%)"``, ``"NLL"``)."""
        return f"{self.label} ({self.unit})" if self.unit else self.label

    @property
    def short_heading(self) -> str:
        """A narrow column's title: the short label, capitalised, and its unit (``"Acc (%)"``, ``"NLL"``)."""
        text = self.short[:1].upper() + self.short[1:]
        return f"{text} ({self.unit})" if self.unit else text

    @property
    def digits(self) -> int:
        """Decimals of a compact table: 2 for a value in percent, 4 for a raw one."""
        return 2 if self.unit else 4

    @property
    def state_flags(self) -> Dict[str, bool]:
        """The flags of :func:`~timm_csm.metrics.state.accumulate` that keep the statistics it needs, and no more."""
        return {k: k in self.needs for k in _STATISTICS}

    @property
    def accumulator_flags(self) -> Dict[str, bool]:
        """The same as :class:`~timm_csm.metrics.CalibrationAccumulator`'s options (it always bins)."""
        flags = self.state_flags
        return {"classwise": flags["classwise"], "nll": flags["nll"], "brier": flags["brier"],
                "keep_confidences": flags["points"]}


#: earlier names still read from saved files: an evaluate module cache written by an earlier release holds the
#: classwise ECE as the script ``cwece``
LEGACY_NAMES = {"cwece": "cece"}


def _check_metric(name: str, entry, spec) -> None:
    if not isinstance(spec, MetricSpec) or spec.name != name:
        raise ValueError(f"register_metric: expected a MetricSpec named {name!r}, got {spec!r}")
    if name in LEGACY_NAMES:
        raise ValueError(f"a metric named {name!r} is already registered")
    if any(other.abbrev == spec.abbrev for other_name, other in METRICS.items() if other_name != name):
        raise ValueError(f"metric {name!r}: the abbreviation {spec.abbrev!r} is already taken")


#: the metric table: name -> :class:`MetricSpec`, in report order
METRICS = Registry("metric", sort=False, check=_check_metric)


def register_metric(spec: Union[MetricSpec, str], *args, overwrite: bool = False, **fields) -> MetricSpec:
    """Add a metric to the table (after the metrics already there, in report order): its :class:`MetricSpec`, or
    its name and the spec's other fields (``register_metric("gap", "Confidence - accuracy", scale=100, ...)``); a
    name registered twice raises ``ValueError`` unless ``overwrite``."""
    if isinstance(spec, str):
        spec = MetricSpec(spec, *args, **fields)
    elif args or fields:
        raise ValueError("register_metric: give a MetricSpec, or a name and the spec's fields, not both")
    if not isinstance(spec, MetricSpec):
        raise ValueError(f"register_metric: expected a MetricSpec, got {type(spec).__name__}")
    return METRICS.register(spec.name, spec, overwrite=overwrite)


def metric_spec(name: str) -> MetricSpec:
    """The :class:`MetricSpec` of ``name``; unknown names raise ``ValueError`` listing the known ones."""
    return METRICS.get_spec(name)


def metric_of_abbrev(abbrev: str) -> MetricSpec:
    """The :class:`MetricSpec` abbreviated ``abbrev`` (``"acc"``: accuracy); unknown ones raise ``ValueError``."""
    for _, spec in METRICS.items():
        if spec.abbrev == abbrev:
            return spec
    raise ValueError(f"unknown metric abbreviation {abbrev!r}; known: "
                     f"{', '.join(spec.abbrev for _, spec in METRICS.items())}")


def list_metrics(family: Union[str, Sequence[str], None] = None, *, evaluate: Optional[bool] = None,
                 headline: Optional[bool] = None) -> List[str]:
    """The registered names in report order, optionally of one ``family`` (or several), those with
    (``evaluate=True``) or without an ``evaluate`` module, those in (``headline=True``) or out of the
    ``"headline"`` view."""
    families = (family,) if isinstance(family, str) else family
    return [name for name, spec in METRICS.items() if (families is None or spec.family in families)
            and (evaluate is None or spec.evaluate == evaluate)
            and (headline is None or ("headline" in spec.views) == headline)]


def metrics_for(view: str, family: Union[str, Sequence[str], None] = None) -> List[str]:
    """The names of one of :data:`VIEWS` in table order (optionally of one ``family`` or several): every list of
    metrics a report, a page or an option shows is one of these."""
    if view not in VIEWS:
        raise ValueError(f"unknown metric view {view!r}; known: {', '.join(VIEWS)}")
    families = (family,) if isinstance(family, str) else family
    return [name for name, spec in METRICS.items()
            if view in spec.views and (families is None or spec.family in families)]


def metrics_from_state(state: CalibrationState, smooth: bool = False) -> Dict[str, float]:
    """Every metric of the ``"calibration"`` family whose statistics the state tracks, in table order, and with
    ``smooth`` those of the ``"smooth"`` family (their statistics are required)."""
    if float(state.n) <= 0:
        raise ValueError("no samples: calibration metrics of an empty set are undefined")
    return {name: spec.from_state(state) for name, spec in METRICS.items()
            if (spec.family == "calibration" and all(state.flags[k] for k in spec.needs))
            or (spec.family == "smooth" and smooth)}


def calibration_metrics(preds, target, n_bins: int = DEFAULT_N_BINS, input_type: str = "logits", *,
                        task: str = "multiclass", num_classes: Optional[int] = None,
                        ignore_index: Optional[int] = None, smooth: bool = False) -> Dict[str, float]:
    """All metrics of the table's ``"calibration"`` family in one pass: ``accuracy, confidence, ece, aece, cece,
    mce, oe, ue, debiased_ce, nll, brier`` and any registered since (+ ``smece`` with ``smooth``).

    Values are fractions (multiply by 100 for the percent tables of the papers).
    """
    st = _state(preds, target, n_bins, input_type, task, num_classes, ignore_index, binned=True, classwise=True,
                nll=True, brier=True, points=True)
    return metrics_from_state(st, smooth=smooth)


def _bins(from_bins, *args) -> Callable[[CalibrationState], float]:
    return lambda st: from_bins(st.count, st.conf_sum, st.acc_sum, *args)


def _selective(key: str) -> Callable[[CalibrationState], float]:
    return lambda st: selective_metrics_from_points(*st.points())[key]


_GUO = """\
@inproceedings{guo2017calibration,
  title={On Calibration of Modern Neural Networks},
  author={Guo, Chuan and Pleiss, Geoff and Sun, Yu and Weinberger, Kilian Q.},
  booktitle={ICML}, year={2017}
}
"""
_GEIFMAN = """\
@inproceedings{geifman2019bias,
  title={Bias-Reduced Uncertainty Estimation for Deep Neural Classifiers},
  author={Geifman, Yonatan and Uziel, Guy and El-Yaniv, Ran},
  booktitle={ICLR}, year={2019}
}
"""
_KUMAR = """\
@inproceedings{kumar2019verified,
  title={Verified Uncertainty Calibration},
  author={Kumar, Ananya and Liang, Percy and Ma, Tengyu},
  booktitle={NeurIPS}, year={2019}
}
"""
_BINNED, _POINTS = ("binned",), ("points",)
#: the views of the metrics every table shows (headline, report, shift, per-seed rows, pages)
_SHOWN = ("headline", "report", "shift", "per_seed", "page")

for _spec in (
    MetricSpec("accuracy", "Accuracy", "acc", 100, True, lambda st: float(st.correct) / float(st.n),
               views=(*_SHOWN, "checkpoint", "diagnostics"), abbrev="acc", in_text="accuracy",
               description="top-1 accuracy (the target mass on the predicted class for soft targets)"),
    MetricSpec("confidence", "Confidence", scale=100, higher_is_better=None, views=("diagnostics",),
               from_state=lambda st: float(st.confidence) / float(st.n), description="mean top-label confidence"),
    MetricSpec("ece", "ECE", scale=100, from_state=_bins(calibration_error_from_bins, "l1"), needs=_BINNED,
               function=ece, evaluate=True, citation=_GUO,
               views=(*_SHOWN, "checkpoint", "calibrator_selection", "diagnostics"),
               description="expected calibration error (equal-width bins; confidence 1.0 in the last bin)"),
    MetricSpec("aece", "AECE", scale=100, needs=_POINTS, function=adaptive_ece, evaluate=True, citation=_GUO,
               from_state=lambda st: adaptive_ece_from_points(*st.points(), st.n_bins),
               description="adaptive (equal-mass) ECE", views=_SHOWN),
    MetricSpec("cece", "Classwise ECE", "CECE", 100, needs=("classwise",), function=classwise_ece, evaluate=True,
               citation=_GUO, from_state=lambda st: classwise_error_from_bins(st.cw_count, st.cw_prob_sum,
                                                                              st.cw_label_sum, float(st.n)),
               description="classwise ECE", views=("headline", "report", "per_seed", "page"),
               in_text="classwise ECE"),
    MetricSpec("mce", "MCE", scale=100, from_state=_bins(calibration_error_from_bins, "max"), needs=_BINNED,
               function=mce, evaluate=True, citation=_GUO, description="maximum calibration error",
               views=("headline", "report")),
    MetricSpec("oe", "Over-confidence", "OE", 100, from_state=_bins(overconfidence_from_bins), needs=_BINNED,
               function=overconfidence_error, description="over-confidence error", views=("report",)),
    MetricSpec("ue", "Under-confidence", "UE", 100, from_state=_bins(underconfidence_from_bins), needs=_BINNED,
               function=underconfidence_error, description="under-confidence error", views=("report",)),
    MetricSpec("debiased_ce", "Debiased CE", "dCE", 100, needs=_BINNED, function=debiased_ce, evaluate=True,
               citation=_KUMAR,
               from_state=lambda st: float(debiased_error_from_bins(st.count, st.conf_sum, st.acc_sum, st.acc_sq_sum)),
               description="debiased l2 calibration error (Kumar et al., 2019; ECE's bins)",
               views=("headline", "report")),
    MetricSpec("nll", "NLL", from_state=lambda st: float(st.nll) / float(st.n), needs=("nll",), function=nll,
               evaluate=True, citation=_GUO, description="negative log-likelihood",
               views=(*_SHOWN, "checkpoint", "calibrator_selection")),
    MetricSpec("brier", "Brier", from_state=lambda st: float(st.brier) / float(st.n), needs=("brier",),
               function=brier_score, evaluate=True, citation=_GUO, description="Brier score",
               views=("headline", "report", "shift", "per_seed")),
    MetricSpec("smece", "smooth ECE", "smECE", 100, family="smooth", needs=_POINTS, function=smooth_ece,
               evaluate=True, citation=_GUO, from_state=lambda st: smooth_calibration_error(*st.points()),
               description="smooth ECE (relplot's)"),
    MetricSpec("aurc", "AURC", family="selective", from_state=_selective("aurc"), needs=_POINTS, function=aurc,
               evaluate=True, citation=_GEIFMAN, description="area under the risk-coverage curve",
               views=("headline", "shift")),
    MetricSpec("eaurc", "E-AURC", family="selective", from_state=_selective("eaurc"), needs=_POINTS,
               function=eaurc, evaluate=True, citation=_GEIFMAN, description="excess AURC (over the ideal ordering)"),
    MetricSpec("augrc", "AUGRC", family="selective", from_state=_selective("augrc"), needs=_POINTS,
               function=augrc, evaluate=True, citation=_GEIFMAN,
               description="area under the generalised risk-coverage curve"),
    MetricSpec("piece", "PIECE", scale=100, family="proximity", function=piece,
               description="proximity-informed ECE, from penultimate features", views=("headline", "report")),
):
    register_metric(_spec)

#: the names of the built-in one-pass metrics and of the selective ones (:func:`list_metrics` also lists those
#: registered later)
METRIC_KEYS = tuple(list_metrics("calibration"))
SELECTIVE_KEYS = tuple(list_metrics("selective"))
