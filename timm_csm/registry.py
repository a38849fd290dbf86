"""The one registry of the package, in the shape of timm's model registry (``timm/models/_registry.py``): every
pluggable axis (losses, calibrators, conformal methods, corruptions, encoders, generators, metrics, interval
methods, samplers, label modes, training tasks, recipe profiles, study executors, ...) is a :class:`Registry`, and
its module's ``register_<kind>`` / ``create_<kind>`` / ``list_<kinds>`` / ``<kind>_spec`` are thin names over it.

    LOSSES = Registry("loss", spec_of=LossSpec.of)

    @LOSSES.register("focal")
    class FocalLoss(LossBase): ...

    LOSSES.register("csm_soft_ce", functools.partial(CSMLoss, kind="soft_ce"), spec=LossSpec.of(CSMLoss))
    LOSSES.create("focal", gamma=2.0)
    LOSSES.list("csm*")                 # sorted names matching a shell-style wildcard
    LOSSES.get_spec("focal")            # what the entry declares of itself
    "focal" in LOSSES                   # True; argparse takes a registry as ``choices=``: the names, live

Each name holds an *entry* (what ``create`` builds from: a class, a factory, a function) and a *spec* (what
consumers read without building it: capabilities, flags, defaults); an axis whose entries describe themselves
stores the entry as its own spec. A name is registered once: a second registration is a one-line ``ValueError``
unless ``overwrite=True``. An unknown name is a one-line ``ValueError`` listing the registered names and naming
the closest ones.
"""
from __future__ import annotations

import contextlib
import difflib
import fnmatch
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Union

__all__ = ["Registry"]

_UNSET = object()


class Registry:
    """The names of one pluggable kind and what each holds.

    Args:
        kind: the kind in words, singular (``"loss"``), for messages.
        plural: its plural (default ``kind + "s"``).
        sort: ``list`` returns names sorted (timm's ``list_models``); False keeps registration order (the metric
            table's report order, a default first).
        spec_of: ``(entry) -> spec`` when ``register`` is given no spec (default: the entry is its own spec).
        create: ``(name, entry, spec, *args, **kwargs) -> object`` for :meth:`create` (default: ``entry(*args,
            **kwargs)``).
        check: ``(name, entry, spec)`` raising ``ValueError`` on an entry this axis cannot take.
    """

    def __init__(self, kind: str, *, plural: Optional[str] = None, sort: bool = True,
                 spec_of: Optional[Callable[[Any], Any]] = None, create: Optional[Callable[..., Any]] = None,
                 check: Optional[Callable[[str, Any, Any], None]] = None):
        self.kind, self.plural, self.sort = kind, plural or kind + "s", sort
        self._spec_of, self._create, self._check = spec_of, create, check
        self._entries: Dict[str, Any] = {}
        self._specs: Dict[str, Any] = {}

    def register(self, name: str, entry: Any = _UNSET, *, overwrite: bool = False, spec: Any = None):
        """Register ``entry`` as ``name`` (with ``spec``, default ``spec_of(entry)`` or the entry itself) and return
        it; without ``entry``, a decorator. A name taken already is a ``ValueError`` unless ``overwrite``."""
        if not isinstance(name, str) or not name or name != name.strip():
            raise ValueError(f"{self.kind} name must be a non-empty string without surrounding spaces, got {name!r}")

        def add(item):
            if name in self._entries and not overwrite:
                raise ValueError(f"a {self.kind} named {name!r} is already registered (pass overwrite=True to "
                                 "replace it)")
            item_spec = spec if spec is not None else self._spec_of(item) if self._spec_of is not None else item
            if self._check is not None:
                self._check(name, item, item_spec)
            self._entries[name], self._specs[name] = item, item_spec
            return item

        return add if entry is _UNSET else add(entry)

    def _unknown(self, name) -> ValueError:
        known = self.list()
        close = difflib.get_close_matches(str(name), known, n=3, cutoff=0.6)
        hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
        return ValueError(f"unknown {self.kind} {name!r}; known {self.plural}: {', '.join(known)}{hint}")

    def get(self, name: str) -> Any:
        """The entry registered as ``name``; unknown names: one line listing the registered ones, the closest named."""
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise self._unknown(name) from None

    def get_spec(self, name: str) -> Any:
        """The spec of ``name`` (unknown names as :meth:`get`)."""
        try:
            return self._specs[name]
        except (KeyError, TypeError):
            raise self._unknown(name) from None

    def create(self, name: str, *args, **kwargs) -> Any:
        """What the entry of ``name`` builds from ``args`` and ``kwargs``."""
        entry, spec = self.get(name), self._specs[name]
        return self._create(name, entry, spec, *args, **kwargs) if self._create is not None else entry(*args, **kwargs)

    def list(self, filter: Union[str, Sequence[str]] = "", **where: Any) -> List[str]:
        """Registered names (sorted, or in registration order), those matching ``filter`` (a shell-style wildcard
        or several) and whose spec has each attribute of ``where`` at its value (None: any value)."""
        patterns = [filter] if isinstance(filter, str) else list(filter)
        names = sorted(self._entries) if self.sort else list(self._entries)
        return [n for n in names if (not any(patterns) or any(fnmatch.fnmatchcase(n, p) for p in patterns if p))
                and all(v is None or getattr(self._specs[n], k) == v for k, v in where.items())]

    def items(self) -> List[tuple]:
        """``(name, spec)`` pairs in :meth:`list` order."""
        return [(n, self._specs[n]) for n in self.list()]

    @contextlib.contextmanager
    def restored(self) -> Iterator["Registry"]:
        """A block after which the registry holds what it held before (what a test registers in it goes)."""
        entries, specs = dict(self._entries), dict(self._specs)
        try:
            yield self
        finally:
            self._entries.clear()
            self._entries.update(entries)
            self._specs.clear()
            self._specs.update(specs)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.list())

    def __len__(self) -> int:
        return len(self._entries)

    def __getitem__(self, index: Union[int, slice]):
        """The name at ``index`` in :meth:`list` order (``LABEL_MODES[0]``: the first registered)."""
        if isinstance(index, str):
            return self.get_spec(index)
        return self.list()[index]

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self.list())})"
