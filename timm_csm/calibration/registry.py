"""The calibrator registry, in the style of timm's model registry: each calibrator declares what it can do where it
is defined, and every consumer (the factory, ``--calibrators auto``, the sample checks of ``timm-csm-calibrate``,
its ODIR flags, the documentation's table) reads it here.

    @register_calibrator("vector_scaling", summary="one scale and bias per class")
    class VectorScaling(PostHocCalibrator): ...

    register_calibrator("temperature_scaling_nll", preset={"method": "nll"}, summary="...")(TemperatureScaling)

    create_calibrator("dirichlet", reg_lambda=1e-3)    # ready to fit
    list_calibrators(default=True)                      # ['temperature_scaling']: what a calibrate run fits
    list_calibrators(num_classes=10)                    # those that calibrate ten-class models
    calibrator_spec("dirichlet").penalties              # ('reg_lambda', 'reg_mu')

A class registered without ``preset`` is that name's kind: ``save`` writes it into the file and
:func:`~timm_csm.calibration.load_calibrator` reads the class back from it. A ``preset`` registration is the same
class with other constructor defaults (its files hold the class's kind and the preset in their config).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..registry import Registry

__all__ = ["CalibratorSpec", "CALIBRATORS", "register_calibrator", "create_calibrator", "list_calibrators", "calibrator_spec",
           "calibrator_class", "check_calibration_samples"]


@dataclass(frozen=True)
class CalibratorSpec:
    """A registered calibrator and its capabilities.

    * ``cls``: the :class:`~timm_csm.calibration.PostHocCalibrator` subclass; ``preset``: constructor defaults of
      this name (``temperature_scaling_nll``: ``method="nll"``).
    * ``summary``: what it fits, in a few words (the documentation's table).
    * ``binary_only``: it calibrates two-class models only (Platt, beta).
    * ``penalties``: the constructor arguments that take the penalty strengths a front end sets for every
      calibrator that has them (``timm-csm-calibrate --reg-lambda / --reg-mu``: the ODIR penalty of Kull et al.
      2019, ``("reg_lambda", "reg_mu")``).
    * ``min_samples``: the fewest fitting samples for ``num_classes`` classes beyond the one per class that every
      calibrator needs (matrix scaling, Dirichlet: one per parameter, C (C + 1)); None: no more than that.
    * ``options``: ``{constructor argument: the front end's option that sets it}``, for the calibrator's own
      settings a command exposes (temperature scaling: ``{"method": "ts_method", "n_bins": "n_bins"}``, the fitting
      rule ``timm-csm-train --ts-method`` chooses); read by :meth:`front_end_options`.
    * ``default``: fitted by ``timm-csm-calibrate`` when no calibrator is named.
    """

    name: str
    cls: type
    summary: str
    preset: Mapping[str, object] = field(default_factory=dict)
    binary_only: bool = False
    penalties: Tuple[str, ...] = ()
    min_samples: Optional[Callable[[int], int]] = None
    default: bool = False
    options: Mapping[str, str] = field(default_factory=dict)

    def front_end_options(self, values: Mapping[str, object]) -> Dict[str, object]:
        """The keyword arguments this calibrator takes from a front end's option ``values`` (``{option: value}``):
        its penalties and its own :attr:`options`, each where ``values`` holds it."""
        own = {arg: values[opt] for arg, opt in self.options.items() if opt in values}
        return {**self.penalty_options(values), **own}

    def penalty_options(self, strengths: Mapping[str, float]) -> Dict[str, float]:
        """The keyword arguments of ``strengths`` (``{"reg_lambda": 0.01, "reg_mu": 0.01}``) this calibrator takes."""
        return {k: v for k, v in strengths.items() if k in self.penalties}

    def unmet(self, num_classes: int, n_samples: int, where: str = "the calibration split") -> Optional[str]:
        """Why this calibrator cannot be fitted on ``n_samples`` samples (those of ``where``) of ``num_classes``
        classes, in a few words, or None when it can as far as its capabilities tell."""
        if self.binary_only and num_classes != 2:
            return "two-class models only"
        needed = self.min_samples(num_classes) if self.min_samples is not None else 0
        if n_samples < needed:
            return f"needs at least {needed} samples for {num_classes} classes, {where} has {n_samples}"
        return None


_INTERFACE = ("fit", "transform", "save", "state_dict", "load_state_dict", "config", "check_fit_dependencies")


def _create_calibrator(name: str, cls: type, spec: CalibratorSpec, **kwargs):
    calibrator = cls(**{**spec.preset, **kwargs})
    calibrator.check_fit_dependencies()
    return calibrator


#: the registered calibrators: name -> class, with its :class:`CalibratorSpec`
CALIBRATORS = Registry("calibrator", create=_create_calibrator)


def register_calibrator(name: str, cls: Optional[type] = None, *, overwrite: bool = False,
                        summary: Optional[str] = None, preset: Optional[Mapping[str, object]] = None,
                        binary_only: bool = False, penalties: Sequence[str] = (),
                        min_samples: Optional[Callable[[int], int]] = None, default: bool = False,
                        options: Optional[Mapping[str, str]] = None):
    """Register a :class:`~timm_csm.calibration.PostHocCalibrator` subclass under ``name`` with its capabilities
    (see :class:`CalibratorSpec`; ``summary`` defaults to the first line of the class docstring); without ``cls``,
    a decorator. Without ``preset`` the class takes ``name`` as its kind (``cls.kind``, written into saved files);
    with one, the class must be registered already. A name registered twice raises ``ValueError`` unless
    ``overwrite``."""
    def _register(cls):
        # the interface of PostHocCalibrator, read off the class (base.py imports this module, not the reverse)
        if not (isinstance(cls, type) and all(callable(getattr(cls, m, None)) for m in _INTERFACE)):
            raise ValueError(f"register_calibrator({name!r}): expected a PostHocCalibrator subclass, got {cls!r}")
        kinds = {spec.cls: kind for kind, spec in CALIBRATORS.items() if not spec.preset and kind != name}
        if preset is None and cls in kinds:
            raise ValueError(f"register_calibrator({name!r}): {cls.__name__} is registered as {kinds[cls]!r}; "
                             "register another name of it with preset=...")
        if preset is not None and cls not in kinds:
            raise ValueError(f"register_calibrator({name!r}, preset=...): register {cls.__name__} without a preset "
                             "first")
        text = summary if summary is not None else (cls.__doc__ or cls.__name__).strip().splitlines()[0]
        spec = CalibratorSpec(name, cls, text, dict(preset or {}), bool(binary_only), tuple(penalties), min_samples,
                              bool(default), dict(options or {}))
        CALIBRATORS.register(name, cls, overwrite=overwrite, spec=spec)
        if preset is None:
            cls.kind = name
        return cls

    return _register if cls is None else _register(cls)


def calibrator_spec(name: str) -> CalibratorSpec:
    """The :class:`CalibratorSpec` of ``name``; unknown names raise ``ValueError`` listing the known ones."""
    return CALIBRATORS.get_spec(name)


def calibrator_class(kind: str) -> Optional[type]:
    """The class a saved file's ``calibrator`` metadata names, or None for an unknown kind."""
    spec = CALIBRATORS.get_spec(kind) if kind in CALIBRATORS else None
    return spec.cls if spec is not None and not spec.preset else None


def create_calibrator(name: str, **kwargs):
    """``create_calibrator("temperature_scaling", method="nll")``, ready to fit; unknown names list the known
    ones, and a calibrator whose fit needs an optional package that is absent names the extra that installs it."""
    return CALIBRATORS.create(name, **kwargs)


def list_calibrators(filter: str = "", *, default: Optional[bool] = None, binary_only: Optional[bool] = None,
                     penalty: Optional[str] = None, num_classes: Optional[int] = None) -> List[str]:
    """Sorted registered names, optionally those matching a shell-style wildcard (``"temperature*"``), those fitted
    by default (``default=True``), the two-class ones (``binary_only``), those taking a ``penalty`` argument
    (``"reg_lambda"``) or those that calibrate ``num_classes``-class models."""
    return [name for name in CALIBRATORS.list(filter, default=default, binary_only=binary_only)
            if (penalty is None or penalty in CALIBRATORS.get_spec(name).penalties)
            and (num_classes is None or num_classes == 2 or not CALIBRATORS.get_spec(name).binary_only)]


def check_calibration_samples(names: Sequence[str], n_samples: int, n_present: int, num_classes: int) -> None:
    """One line (``ValueError``) when calibrators ``names`` cannot be fitted on a calibration split of ``n_samples``
    samples of ``n_present`` distinct classes, for a ``num_classes``-class model: a two-class calibrator of more
    classes, fewer samples than classes or a single class, fewer samples than a calibrator's ``min_samples``."""
    for name in names:
        if calibrator_spec(name).binary_only and num_classes != 2:
            raise ValueError(f"calibrator {name!r} is for two-class models; this one has {num_classes} classes")
    if n_samples < num_classes or n_present < 2:
        raise ValueError(f"the calibration split has {n_samples} samples of {n_present} classes; the calibrators "
                         f"need at least {num_classes} samples (one per class) of several classes")
    for name in names:
        why = calibrator_spec(name).unmet(num_classes, n_samples)
        if why is not None:
            fitting = [n for n in list_calibrators(num_classes=num_classes)
                       if calibrator_spec(n).unmet(num_classes, n_samples) is None]
            raise ValueError(f"calibrator {name!r} {why}; use more samples, or one of {', '.join(fitting)}")
