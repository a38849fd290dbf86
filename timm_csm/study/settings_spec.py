"""The optional ``[settings]`` table of a study spec: how the study builds its ``matched`` setting where no generated
set or teacher is given for it (:mod:`.settings`). Every key is optional; what it leaves out follows from the images
and the cells' recipe.

::

    [settings.matched]
    generator_profile = "digits"          # default: from the image size (8 px digits, 16-32 px fmnist)
    generator_steps = 3000                # default: the size's profile's (digits 3 000, fmnist 6 000)
    num_groups = 3375                     # default: 75 per class pair
    num_lambdas = 4
    sampler_steps = 8                     # DDIM steps, no guidance (scheduler, guidance_scale)
    annotator_epochs = 60                 # default: the cells' epochs
    accept_poor_generator = false         # true: annotate even where the checks find the generator poor
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional, Tuple

from .amendments import SpecError

__all__ = ["MatchedSettingSpec", "read_settings"]


@dataclasses.dataclass(frozen=True)
class MatchedSettingSpec:
    """How the ``matched`` setting is built from the study's real training images; None: the default for the images
    (their size, the cells' epochs)."""

    generator_profile: Optional[str] = None
    generator_steps: Optional[int] = None
    num_groups: Optional[int] = None
    num_lambdas: int = 4
    sampler_steps: int = 8
    scheduler: str = "ddim"
    guidance_scale: float = 1.0
    annotator_epochs: Optional[int] = None
    #: build the set even where the annotation's checks find the generator poor (the smoke profile's noise)
    accept_poor_generator: bool = False


#: each key's type and, for the counts, its least value
_KEYS: Dict[str, Tuple[type, Optional[int]]] = {
    "generator_profile": (str, None), "generator_steps": (int, 1), "num_groups": (int, 1), "num_lambdas": (int, 2),
    "sampler_steps": (int, 1), "scheduler": (str, None), "guidance_scale": (float, None),
    "annotator_epochs": (int, 1), "accept_poor_generator": (bool, None)}


def read_settings(raw: Dict[str, Any], settings: Tuple[str, ...]) -> MatchedSettingSpec:
    """The :class:`MatchedSettingSpec` of the spec's raw ``[settings]`` table (``{}``: the defaults), checked against
    the study's ``settings``; a one-line :class:`SpecError` naming the field."""
    from ..generation.config import SCHEDULER_NAMES
    from ..generation.models import GENERATOR_PROFILES

    for name in raw:
        if name != "matched":
            raise SpecError(f"settings.{name}: unknown key (known: matched; the other settings' sets are given)")
    if not raw:
        return MatchedSettingSpec()
    if "matched" not in settings:
        raise SpecError(f"settings.matched: the study has no matched setting (study.settings: {list(settings)})")
    table = raw["matched"]
    if not isinstance(table, dict):
        raise SpecError(f"settings.matched: expected a table, got {table!r}")
    values = {}
    for key, value in table.items():
        if key not in _KEYS:
            raise SpecError(f"settings.matched.{key}: unknown key (known: {', '.join(_KEYS)})")
        kind, least = _KEYS[key]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if isinstance(value, bool) != (kind is bool) or not isinstance(value, kind):
            raise SpecError(f"settings.matched.{key}: expected a {kind.__name__}, got {value!r}")
        if least is not None and value < least:
            raise SpecError(f"settings.matched.{key}: expected an integer >= {least}, got {value}")
        values[key] = value
    choices = {"generator_profile": tuple(GENERATOR_PROFILES), "scheduler": SCHEDULER_NAMES}
    for key, known in choices.items():
        if key in values and values[key] not in known:
            raise SpecError(f"settings.matched.{key}: unknown {values[key]!r}; choose from {', '.join(known)}")
    if values.get("guidance_scale", 1.0) < 1.0:
        raise SpecError(f"settings.matched.guidance_scale: expected a number >= 1 (1: no guidance), got "
                        f"{values['guidance_scale']}")
    return MatchedSettingSpec(**values)
