"""A table of a study spec read key by key (:class:`SpecTable`): each value type-checked, any key left over refused,
every error one line naming the field (``<table>.<key>``)."""
from __future__ import annotations

from typing import Any, Sequence, Tuple, Union

from .amendments import SpecError

__all__ = ["SpecTable"]


class SpecTable:
    """A table of the spec read key by key: each value type-checked, any key left over refused."""

    def __init__(self, raw: Any, where: str):
        if not isinstance(raw, dict):
            raise SpecError(f"{where or 'spec'}: expected a table, got {raw!r}")
        self.raw, self.where, self.seen = raw, where, set()

    def _field(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def get(self, key: str, kind: Union[type, Tuple[type, ...]], default: Any = ..., what: str = "") -> Any:
        self.seen.add(key)
        if key not in self.raw:
            if default is ...:
                raise SpecError(f"{self._field(key)}: missing")
            return default
        value = self.raw[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if float in kinds and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
            raise SpecError(f"{self._field(key)}: expected {what or ' or '.join(k.__name__ for k in kinds)}, got "
                            f"{value!r}")
        return value

    def ints(self, key: str, low: int = 0, default: Any = ...) -> Tuple[int, ...]:
        values = self.get(key, list, default, "a list of integers")
        if any(isinstance(v, bool) or not isinstance(v, int) or v < low for v in values):
            raise SpecError(f"{self._field(key)}: expected integers >= {low}, got {values!r}")
        if len(set(values)) != len(values):
            raise SpecError(f"{self._field(key)}: a value appears twice in {values!r}")
        return tuple(values)

    def names(self, key: str, known: Sequence[str], default: Any = ...) -> Tuple[str, ...]:
        values = self.get(key, list, default, "a list of names")
        for v in values:
            if v not in known:
                raise SpecError(f"{self._field(key)}: unknown {v!r}; choose from {', '.join(map(str, known))}")
        return tuple(values)

    def table(self, key: str, default: Any = ...) -> "SpecTable":
        return SpecTable(self.get(key, dict, default, "a table"), self._field(key))

    def done(self) -> None:
        unknown = sorted(set(self.raw) - self.seen)
        if unknown:
            raise SpecError(f"{self._field(unknown[0])}: unknown key (known: {', '.join(sorted(self.seen))})")
