"""A study spec: the pre-registered design of a calibration study, one TOML file (read with the standard library's
``tomllib``), loaded into a typed, frozen tree (:class:`StudySpec`) and validated once, at load, each error one line
that names the field.

::

    [study]
    name = "fmnist-resnet18"
    settings = ["matched", "annotated"]   # the generated sets (and KD's teacher) the methods read
    [data]
    dataset = "fashion_mnist"
    train_size = 2500                     # the real-image budget
    val_size = 2000                       # every choice is made on these images
    data_seed = 0
    [model]
    name = "resnet18"                     # a timm model, on a registered recipe profile (timm_csm.recipes)
    recipe = "demo"
    options = { epochs = 60, decay_milestones = [30, 45] }   # training options over the recipe's
    [seeds]
    tuning = [0, 1, 2]                    # stage 1: the choices, on validation
    decision = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]   # stage 2 (holds every tuning seed or none of them)
    [methods.ce]
    [methods.ls]
    grid = { smoothing = [0.02, 0.05, 0.1, 0.2] }   # crossed where a method has several axes
    [methods.kd]
    grid = { temperature = [2.0, 4.0], alpha = [0.5, 0.9] }
    settings = ["annotated"]              # default: every setting the method can run in
    [search]                              # CSM's coordinate-wise search, step by step
    method = "csm"
    steps = [{ axis = "s", values = [4.0, 8.0, "auto"] }, { axis = "filtered", values = [0, 1] }]
    [decision]
    metric = "ece_pre_ts"                 # a per-seed row key (timm_csm.recipes.cells.per_seed_row)
    others = ["ce", "best_other"]         # the searched row minus each, in every decision setting: one Holm family
    secondary = ["ls"]                    # its choice runs the decision seeds too (reported, no claim)
    family_alpha = 0.05
    planning_sd = 0.56                    # the paired sd the power statement assumes
    [calibrators]
    fit = ["temperature_scaling"]
    [shift]                               # optional: corrupted test images and OOD sets
    corruptions = "all"
    severities = [1, 2, 3, 4, 5]
    ood = ["mnist5k", "digits"]
    [settings.matched]                    # optional: how the matched setting is built (.settings_spec)
    generator_profile = "digits"
    generator_steps = 3000

Dated amendments are appended at the end (:mod:`.amendments`); the spec a study runs is the original with each
amendment's fields merged in, validated alike.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from . import amendments as history
from .amendments import Amendment, SpecError
from .decide import BEST_OTHER, FAMILY_ALPHA, POWER, metric_phase
from .methods import METHODS, TUNING_AXES, get_method, grid_configurations
from .report_spec import ReportSpec, read_report
from .settings_spec import MatchedSettingSpec, read_settings
from .spec_table import SpecTable

__all__ = ["DataSpec", "ModelSpec", "MethodSpec", "SearchSpec", "SeedsSpec", "DecisionSpec", "ShiftSpec",
           "MatchedSettingSpec", "StudySpec", "SpecError", "parse_spec", "load_spec"]

Grid = Tuple[Tuple[str, Tuple[Any, ...]], ...]


@dataclasses.dataclass(frozen=True)
class DataSpec:
    dataset: str
    train_size: int
    val_size: int
    data_seed: int = 0


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    name: str
    recipe: str
    options: Tuple[Tuple[str, Any], ...] = ()


@dataclasses.dataclass(frozen=True)
class MethodSpec:
    """A method (a row of :data:`~.methods.METHODS`), its stage-1 ``grid`` (``(axis, values)`` pairs) and the
    settings it runs in."""

    name: str
    grid: Grid
    settings: Tuple[str, ...]

    def configurations(self) -> List[str]:
        return grid_configurations(self.name, dict(self.grid))


@dataclasses.dataclass(frozen=True)
class SearchSpec:
    """The coordinate-wise search of ``method``: ``steps`` in order, each ``(axis, values)``."""

    method: str
    steps: Grid

    def size(self) -> int:
        return sum(len(values) for _, values in self.steps) - (len(self.steps) - 1)


@dataclasses.dataclass(frozen=True)
class SeedsSpec:
    tuning: Tuple[int, ...]
    decision: Tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class DecisionSpec:
    """The primary comparisons: in each of ``settings``, the searched row minus each of ``others`` on ``metric``,
    all of them one Holm family at ``family_alpha``; the power statement at ``planning_sd`` and ``power``. The
    ``secondary`` methods' choices run the decision seeds too, for comparisons reported without a claim."""

    settings: Tuple[str, ...]
    metric: str
    others: Tuple[str, ...]
    family_alpha: float
    planning_sd: Optional[float] = None
    power: float = POWER
    secondary: Tuple[str, ...] = ()

    def comparisons(self) -> int:
        return len(self.settings) * len(self.others)


@dataclasses.dataclass(frozen=True)
class ShiftSpec:
    corruptions: Tuple[str, ...]
    severities: Tuple[int, ...]
    ood: Tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class StudySpec:
    """A study as its spec states it (the original with its amendments applied); ``amendments`` is the history."""

    name: str
    settings: Tuple[str, ...]
    data: DataSpec
    model: ModelSpec
    seeds: SeedsSpec
    methods: Tuple[MethodSpec, ...]
    search: SearchSpec
    decision: DecisionSpec
    calibrators: Tuple[str, ...]
    shift: Optional[ShiftSpec] = None
    amendments: Tuple[Amendment, ...] = ()
    #: what the study's page shows (:mod:`.report_spec`); no cell or choice reads it
    report: ReportSpec = ReportSpec()
    #: ``[settings.matched]``: how the study builds its matched setting where no set is given
    matched_setting: MatchedSettingSpec = MatchedSettingSpec()

    def method(self, name: str) -> MethodSpec:
        return next(m for m in self.methods if m.name == name)


def _configuration(method: str, axis: str, value: Any, where: str) -> str:
    """The canonical name of ``method`` at ``axis`` = ``value``; a :class:`SpecError` where the method lacks the
    axis or the value is out of its range."""
    if axis not in TUNING_AXES:
        raise SpecError(f"{where}: {method} has no axis {axis!r} (tuning axes: {', '.join(sorted(TUNING_AXES))})")
    text = value if isinstance(value, str) else format(value, "g")
    try:
        return get_method(f"{method}@{axis}={text}").name
    except ValueError as e:
        raise SpecError(f"{where}: {e}") from None


def _grid(table: SpecTable, key: str, method: str) -> Grid:
    grid = table.table(key, {})
    out = []
    for axis in sorted(grid.raw):
        values = grid.get(axis, list, what="a list of values")
        if not values:
            raise SpecError(f"{grid._field(axis)}: an empty grid")
        for value in values:
            _configuration(method, axis, value, grid._field(axis))
        out.append((axis, tuple(values)))
    return tuple(out)


def _methods(raw: SpecTable, settings: Tuple[str, ...]) -> Tuple[MethodSpec, ...]:
    out = []
    for name in raw.raw:
        where = f"methods.{name}"
        if name not in METHODS:
            raise SpecError(f"{where}: unknown method; choose from {', '.join(METHODS)}")
        table = raw.table(name)
        runs_in = METHODS[name].recipes
        possible = tuple(s for s in settings if runs_in is None or s in runs_in)
        chosen = table.names("settings", possible, possible)
        if not chosen:
            raise SpecError(f"{where}: runs in none of the study's settings {list(settings)} (it runs in "
                            f"{', '.join(runs_in or ())})")
        out.append(MethodSpec(name, _grid(table, "grid", name), chosen))
        table.done()
    if not out:
        raise SpecError("methods: the study compares no method")
    return tuple(out)


def _search(table: SpecTable) -> SearchSpec:
    method = table.get("method", str)
    if method not in METHODS:
        raise SpecError(f"search.method: unknown method {method!r}")
    steps = []
    for i, raw in enumerate(table.get("steps", list, what="a list of {axis, values} tables")):
        step = SpecTable(raw, f"search.steps[{i}]")
        axis, values = step.get("axis", str), step.get("values", list)
        if not values or axis in dict(steps):
            raise SpecError(f"{step.where}: {'an empty step' if not values else f'axis {axis!r} searched twice'}")
        for value in values:
            _configuration(method, axis, value, f"{step.where}.values")
        steps.append((axis, tuple(values)))
        step.done()
    if not steps:
        raise SpecError("search.steps: a search needs at least one step")
    table.done()
    return SearchSpec(method, tuple(steps))


def _seeds(table: SpecTable) -> SeedsSpec:
    tuning, decision = table.ints("tuning"), table.ints("decision")
    table.done()
    if not tuning or len(decision) < 2:
        raise SpecError("seeds: stage 1 needs at least one tuning seed, the paired decision at least 2 seeds")
    shared = set(tuning) & set(decision)
    if shared and shared != set(tuning):
        raise SpecError(f"seeds.tuning: seeds {sorted(set(tuning) - shared)} are not decision seeds while "
                        f"{sorted(shared)} are: the decision reuses every stage-1 cell or none")
    return SeedsSpec(tuning, decision)


def _decision(table: SpecTable, settings: Tuple[str, ...], methods: Sequence[MethodSpec]) -> DecisionSpec:
    metric = table.get("metric", str, "ece_pre_ts")
    try:
        metric_phase(metric)
    except ValueError as e:
        raise SpecError(f"decision.metric: {e}") from None
    configurations = [c for m in methods for c in m.configurations()]
    others = table.names("others", [*configurations, BEST_OTHER])
    alpha = table.get("family_alpha", float, FAMILY_ALPHA)
    sd = table.get("planning_sd", float, None)
    power = table.get("power", float, POWER)
    secondary = table.names("secondary", [m.name for m in methods], [])
    spec = DecisionSpec(table.names("settings", settings, settings), metric, others, alpha, sd, power, secondary)
    table.done()
    if not others or not spec.settings:
        raise SpecError("decision: name the settings and the others the decision compares with")
    for method in methods:
        missing = [s for s in spec.settings if s not in method.settings]
        if missing and set(method.configurations()) & set(others):
            raise SpecError(f"decision.others: {method.name} does not run in the decision setting(s) {missing}")
    for key, value in (("family_alpha", alpha), ("power", power)):
        if not 0.0 < value < 1.0:
            raise SpecError(f"decision.{key}: expected a number in (0, 1), got {value}")
    if sd is not None and sd <= 0:
        raise SpecError(f"decision.planning_sd: expected a positive number, got {sd}")
    return spec


def _shift(table: SpecTable) -> ShiftSpec:
    from ..data.corruptions import list_corruptions

    known = list_corruptions()
    corruptions = table.get("corruptions", (str, list), "all")
    corruptions = tuple(known) if corruptions == "all" else table.names("corruptions", known)
    severities = table.ints("severities", 1, [1, 2, 3, 4, 5])
    if any(s > 5 for s in severities):
        raise SpecError(f"shift.severities: severities run from 1 to 5, got {list(severities)}")
    ood = tuple(table.get("ood", list, [], "a list of dataset names"))
    table.done()
    return ShiftSpec(corruptions, severities, ood)


def _study(raw: Dict[str, Any]) -> StudySpec:
    from ..calibration import list_calibrators

    top = SpecTable(raw, "")
    study = top.table("study")
    name = study.get("name", str)
    settings = tuple(study.get("settings", list, what="a list of setting names"))
    study.done()
    if not settings or len(set(settings)) != len(settings) or not all(isinstance(s, str) for s in settings):
        raise SpecError(f"study.settings: expected distinct setting names, got {list(settings)}")
    data = top.table("data")
    data_spec = DataSpec(data.get("dataset", str), data.get("train_size", int), data.get("val_size", int),
                         data.get("data_seed", int, 0))
    data.done()
    for key in ("train_size", "val_size"):
        if getattr(data_spec, key) <= 0:
            raise SpecError(f"data.{key}: expected a positive number of images, got {getattr(data_spec, key)}")
    model_spec = _model(top.table("model"))
    seeds = _seeds(top.table("seeds"))
    methods = _methods(top.table("methods"), settings)
    search = _search(top.table("search"))
    if search.method in {m.name for m in methods}:
        raise SpecError(f"methods.{search.method}: the searched method is stated by [search] alone")
    decision = _decision(top.table("decision"), settings, methods)
    calibrators = top.table("calibrators", {})
    fit = calibrators.names("fit", list_calibrators(), ["temperature_scaling"])
    calibrators.done()
    shift = _shift(top.table("shift")) if "shift" in raw else None
    report = read_report(top.get("report", dict, {}, "a table"), settings, tuple(m.name for m in methods))
    matched = read_settings(top.get("settings", dict, {}, "a table"), settings)
    top.done()
    return StudySpec(name, settings, data_spec, model_spec, seeds, methods, search, decision, fit, shift,
                     report=report, matched_setting=matched)


def _model(table: SpecTable) -> ModelSpec:
    import timm

    from ..recipes import list_profiles
    from ..training import TrainConfig

    name, recipe = table.get("name", str), table.get("recipe", str)
    options = table.get("options", dict, {}, "a table of training options")
    table.done()
    if not timm.is_model(name):
        raise SpecError(f"model.name: {name!r} is not a timm model (timm.list_models() names them)")
    if recipe not in list_profiles():
        raise SpecError(f"model.recipe: unknown profile {recipe!r}; choose from {', '.join(list_profiles())}")
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    for key in options:
        if key not in fields:
            raise SpecError(f"model.options.{key}: not a training option (timm-csm-train --help lists them)")
    # frozen: a list option (lr milestones) as a tuple
    return ModelSpec(name, recipe, tuple(sorted((k, tuple(v) if isinstance(v, list) else v)
                                                for k, v in options.items())))


def parse_spec(text: str) -> StudySpec:
    """The :class:`StudySpec` of a spec file's text: the original validated, then each amendment applied and the
    result validated again (an error in an amendment names it)."""
    original, _ = history.split_spec_text(text)
    entries = history.read_amendments(history.read_toml(text).get("amendment"))
    raw = history.read_toml(original)
    spec = _study(raw)
    for i, amendment in enumerate(entries, 1):
        raw = history.apply_amendment(raw, amendment.changes)
        try:
            spec = _study(raw)
        except SpecError as e:
            raise SpecError(f"amendment {i} ({amendment.date}): {e}") from None
    return dataclasses.replace(spec, amendments=entries)


def load_spec(path: Union[str, Path]) -> StudySpec:
    """:func:`parse_spec` of the file at ``path``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no study spec at {path}")
    return parse_spec(path.read_text(encoding="utf-8"))
