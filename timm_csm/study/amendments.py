"""A spec's history: the original text, the dated amendments appended to it, its digest, and whether a file is still
the spec a study's first cell ran under.

A spec file is its original text followed by zero or more amendments, each a TOML array-of-tables entry appended at
the end of the file, never edited once a cell has run::

    [[amendment]]
    date = 2026-12-08                 # a TOML date, not before the previous amendment's
    reason = "seeds 10-14 as a secondary extension"
    [amendment.set.seeds]             # the changed fields, merged into the spec (a table into a table,
    decision = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]   # any other value replaced)

The original ends where the first ``[[amendment]]`` line begins; amendment ``k``'s text runs from its line to the
next one. :func:`spec_digest` (sha256 of the text, line ends and trailing blank space normalised) covers all of it,
so each cell records the digest of the spec it ran under. :func:`spec_status` tells, from the digest the first cell
recorded and the file now, whether the file is that spec (``same``), that spec with amendments appended after it
(``amended``: allowed), or anything else (``changed``: refused, in one line that names the changed fields when the
recorded text is at hand).
"""
from __future__ import annotations

import dataclasses
import datetime
import hashlib
import re
import sys
from typing import Any, Dict, List, Mapping, Optional, Tuple

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, before it joined the standard library
    import tomli as tomllib

__all__ = ["SpecError", "Amendment", "SAME", "AMENDED", "CHANGED", "SpecStatus", "read_toml", "split_spec_text",
           "spec_digest", "read_amendments", "apply_amendment", "spec_status"]

SAME, AMENDED, CHANGED = "same", "amended", "changed"
_AMENDMENT_LINE = re.compile(r"^[ \t]*\[\[[ \t]*amendment[ \t]*\]\][ \t]*(#.*)?$", re.MULTILINE)
#: a table header: a key (bare, dotted or quoted) in one or two brackets, not an array value on a line of its own
_HEADER_LINE = re.compile(r"^[ \t]*\[{1,2}[ \t]*([A-Za-z0-9_\-.\"' ]+?)[ \t]*\]{1,2}[ \t]*(#.*)?$", re.MULTILINE)
_AMENDMENT_KEYS = ("date", "reason", "set")


class SpecError(ValueError):
    """A spec that does not read or does not validate; the message is one line that names the field."""


@dataclasses.dataclass(frozen=True)
class Amendment:
    """One dated amendment: when, why, and the fields it sets (``{"seeds": {"decision": [...]}}``)."""

    date: datetime.date
    reason: str
    changes: Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class SpecStatus:
    """:data:`SAME`, :data:`AMENDED` (``appended`` amendments after the recorded spec) or :data:`CHANGED`; ``message``
    says it in one line."""

    kind: str
    message: str
    appended: int = 0

    @property
    def allowed(self) -> bool:
        return self.kind != CHANGED


def read_toml(text: str, where: str = "spec") -> Dict[str, Any]:
    """The TOML ``text`` as a dict; a :class:`SpecError` naming the line where it does not read."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"{where}: not valid TOML ({e})") from None


def _normalised(text: str) -> str:
    return text.replace("\r\n", "\n").rstrip() + "\n"


def split_spec_text(text: str) -> Tuple[str, List[str]]:
    """``(original, [amendment texts])``: the text before the first ``[[amendment]]`` line and each amendment's text
    from its line to the next. A table header after the first amendment other than an amendment's own is refused:
    the original ends where the amendments begin."""
    text = text.replace("\r\n", "\n")
    starts = [m.start() for m in _AMENDMENT_LINE.finditer(text)]
    if not starts:
        return text, []
    for header in _HEADER_LINE.finditer(text, starts[0]):
        name = header.group(1).strip()
        if name != "amendment" and not name.startswith("amendment."):
            raise SpecError(f"spec: table [{name}] comes after the first [[amendment]]: the original spec ends where "
                            "its amendments begin, so move it above them")
    bounds = starts + [len(text)]
    return text[:starts[0]], [text[a:b] for a, b in zip(bounds, bounds[1:])]


def spec_digest(text: str) -> str:
    """sha256 (hex) of the spec's text, line ends as ``\\n`` and trailing blank space dropped: the original and
    every amendment appended to it."""
    return hashlib.sha256(_normalised(text).encode("utf-8")).hexdigest()


def read_amendments(entries: Any) -> Tuple[Amendment, ...]:
    """The ``[[amendment]]`` entries of a parsed spec as :class:`Amendment` s, checked: a date (not before the one
    before it), a reason, and a non-empty ``set`` table, nothing else."""
    if entries is None:
        return ()
    if not isinstance(entries, list):
        raise SpecError("amendment: write each amendment as an [[amendment]] table appended to the spec")
    out: List[Amendment] = []
    for i, entry in enumerate(entries, 1):
        where = f"amendment {i}"
        unknown = sorted(set(entry) - set(_AMENDMENT_KEYS))
        if unknown:
            raise SpecError(f"{where}: unknown key {unknown[0]!r} (an amendment has {', '.join(_AMENDMENT_KEYS)})")
        date, reason, changes = entry.get("date"), entry.get("reason"), entry.get("set")
        if not isinstance(date, datetime.date) or isinstance(date, datetime.datetime):
            raise SpecError(f"{where}.date: expected a TOML date such as 2026-12-08, got {date!r}")
        if out and date < out[-1].date:
            raise SpecError(f"{where}.date: {date} is before amendment {i - 1}'s {out[-1].date}: amendments are "
                            "appended in date order")
        if not isinstance(reason, str) or not reason.strip():
            raise SpecError(f"{where}.reason: say why the spec changes (a non-empty string)")
        if not isinstance(changes, dict) or not changes:
            raise SpecError(f"{where}.set: expected a table of the changed fields ([amendment.set.<section>])")
        if "amendment" in changes:
            raise SpecError(f"{where}.set: an amendment cannot change the amendments")
        out.append(Amendment(date, reason.strip(), changes))
    return tuple(out)


def apply_amendment(raw: Mapping[str, Any], changes: Mapping[str, Any]) -> Dict[str, Any]:
    """``raw`` with ``changes`` merged in: a table into a table, key by key; any other value replaced."""
    merged = dict(raw)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = apply_amendment(merged[key], value)
        else:
            merged[key] = value
    return merged


def _leaves(value: Any, where: str = "") -> Dict[str, Any]:
    """``{dotted field: value}`` of a parsed spec, the amendments' tables by index (``amendment[1].set.seeds``)."""
    if isinstance(value, dict):
        return {k: v for key in value for k, v in _leaves(value[key], f"{where}.{key}" if where else key).items()}
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return {k: v for i, item in enumerate(value, 1) for k, v in _leaves(item, f"{where}[{i}]").items()}
    return {where: value}


def _changed_fields(recorded_text: str, text: str, amendments: int) -> str:
    """The fields where ``text`` (its original and first ``amendments`` amendments) differs from ``recorded_text``."""
    original, blocks = split_spec_text(text)
    before = _leaves(read_toml(recorded_text, "recorded spec"))
    now = _leaves(read_toml(original + "".join(blocks[:amendments]), "spec"))
    fields = [k for k in sorted(set(before) | set(now)) if before.get(k, "<absent>") != now.get(k, "<absent>")]
    if not fields:
        return "its text differs outside every field (comments or layout)"
    shown = [f"{k} (was {before.get(k, '<absent>')!r}, now {now.get(k, '<absent>')!r})" for k in fields[:3]]
    return "changed " + "; ".join(shown) + (f" and {len(fields) - 3} more field(s)" if len(fields) > 3 else "")


def spec_status(recorded_digest: str, text: str, recorded_text: Optional[str] = None) -> SpecStatus:
    """Whether ``text`` (the spec file now) is the spec whose digest the study's first cell recorded: the same text,
    that text with dated amendments appended (each prefix of the file that ends before an amendment is digested),
    or changed. With ``recorded_text`` (the spec as the first cell ran it) a change names the fields."""
    original, blocks = split_spec_text(text)
    prefixes = [original + "".join(blocks[:k]) for k in range(len(blocks) + 1)]
    digests = [spec_digest(p) for p in prefixes]
    if digests[-1] == recorded_digest:
        return SpecStatus(SAME, f"the spec is the one its first cell ran under ({recorded_digest[:12]})")
    if recorded_digest in digests:
        k = digests.index(recorded_digest)
        appended = len(blocks) - k
        dates = ", ".join(str(d.date) for d in read_amendments(read_toml(text).get("amendment"))[k:])
        return SpecStatus(AMENDED, f"the spec its first cell ran under ({recorded_digest[:12]}) with {appended} "
                                   f"amendment(s) appended ({dates})", appended)
    what = ("the file is not the spec its first cell ran under, nor that spec with amendments appended"
            if recorded_text is None else
            _changed_fields(recorded_text, text, len(split_spec_text(recorded_text)[1])))
    return SpecStatus(CHANGED, f"spec changed after its first cell ({recorded_digest[:12]}): {what}; restore it "
                               "and append the change as a dated [[amendment]]")
