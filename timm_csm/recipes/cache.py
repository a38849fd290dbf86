"""Folders keyed by a configuration: each computation runs once per configuration and resumes where it stopped.

:class:`KeyedFolder` is the one primitive: a folder holding what one configuration computed, with a JSON marker
that records the configuration (under ``config_field``, or as the whole marker). The marker says whether the folder
is done for a configuration (``"done"``), holds another one's output (``"other"``), or is still to be written
(``"new"``); each user decides what "other" means (run again in place, or refuse the folder). Its users: the stages
of a recipe (:class:`StageCache`), the derived CSM datasets (:mod:`timm_csm.recipes.derive`), the cells of the
benchmark tables (:mod:`timm_csm.recipes.cells`) and the benchmark's settings builder.

A stage named ``name`` with configuration ``config`` (a JSON-able dict: its own settings and the configurations of
the stages it reads) owns the folder ``<root>/<name>-<key>/``, ``key`` being the first 10 hex digits of the SHA-256
of ``json.dumps(config, sort_keys=True, default=str)``. The marker ``DONE.json`` (the configuration, and the wall and
CPU seconds the stage took) is written last, atomically: a folder with the marker is done and skipped on a re-run; a
stage killed before its marker runs again in the same folder (the long stages resume from what they left there).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional

from ..io import write_json_atomic

__all__ = ["MARKER", "KeyedFolder", "Stage", "StageCache", "stage_key"]

MARKER = "DONE.json"


def stage_key(config: Dict[str, Any]) -> str:
    """The folder key of a stage configuration: 10 hex digits of the SHA-256 of its sorted-key JSON (values JSON
    cannot hold, such as paths, as ``str``)."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:10]


def _as_json(value: Any) -> Any:
    """``value`` as its marker reads back (paths and other plain values as ``str``)."""
    return json.loads(json.dumps(value, default=str))


@dataclass(frozen=True)
class KeyedFolder:
    """``folder`` holding what ``config`` computes, its marker ``marker`` recording the configuration under
    ``config_field`` (``None``: the marker is the configuration itself)."""

    folder: Path
    config: Any
    marker: str = MARKER
    config_field: Optional[str] = "config"

    @property
    def marker_path(self) -> Path:
        return Path(self.folder) / self.marker

    def read(self) -> Optional[Any]:
        """The marker's content, None where there is none."""
        if not self.marker_path.exists():
            return None
        with open(self.marker_path) as f:
            return json.load(f)

    def recorded(self) -> Optional[Any]:
        """The configuration the marker records, None without a marker."""
        content = self.read()
        if content is None or self.config_field is None:
            return content
        return content.get(self.config_field)

    def state(self) -> str:
        """``"done"`` (the marker records ``config``), ``"other"`` (it records another configuration) or ``"new"``."""
        recorded = self.recorded()
        if recorded is None:
            return "new"
        return "done" if recorded == _as_json(self.config) else "other"

    def differences(self) -> List[str]:
        """The keys in which the recorded configuration differs from ``config``; the configuration's name
        (``config_field``) as a whole where either is not a dict."""
        recorded, config = self.recorded(), _as_json(self.config)
        if not (isinstance(recorded, dict) and isinstance(config, dict)):
            return [] if recorded == config else [self.config_field or "configuration"]
        return sorted(k for k in set(recorded) | set(config) if recorded.get(k) != config.get(k))

    def check(self) -> None:
        """ValueError naming the differing keys when the folder holds another configuration's output."""
        if self.state() == "other":
            raise ValueError(f"{self.folder} holds a run with other options (they differ in {self.differences()}); "
                             "choose another output folder")

    def write(self, content: Optional[Dict[str, Any]] = None, indent: Optional[int] = 2, **fields: Any) -> None:
        """Write the marker, atomically: ``content`` as given (it must record ``config``), else the configuration
        under ``config_field`` followed by ``fields``."""
        if content is None:
            content = self.config if self.config_field is None else {self.config_field: self.config, **fields}
        recorded = content if self.config_field is None else content.get(self.config_field)
        if recorded != self.config:
            raise ValueError(f"the marker of {self.folder} must record its configuration")
        Path(self.folder).mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.marker_path, content, indent=indent)


@dataclass(frozen=True)
class Stage:
    """A stage's folder and configuration; ``done`` says its marker was there when it was opened."""

    name: str
    folder: Path
    config: Dict[str, Any]
    done: bool


@dataclass
class StageCache:
    """Stages under ``root``, each run at most once; ``timings`` holds the seconds of the stages run this time."""

    root: Path
    log: Callable[[str], None] = print
    timings: Dict[str, float] = field(default_factory=dict)

    def __post_init__(self):
        self.root = Path(self.root)

    def folder(self, name: str, config: Dict[str, Any]) -> Path:
        """``<root>/<name>-<key>``, the folder of stage ``name`` under ``config``."""
        return self.root / f"{name}-{stage_key(config)}"

    @contextlib.contextmanager
    def stage(self, name: str, config: Dict[str, Any]) -> Iterator[Stage]:
        """Open stage ``name``: the body runs inside the ``with`` block when ``stage.done`` is False, writing into
        ``stage.folder`` (created); a clean exit then writes the marker with the time taken. An exception leaves
        no marker, so the next run repeats the stage."""
        keyed = KeyedFolder(self.folder(name, config), config)
        if keyed.marker_path.exists():  # the folder's name is the configuration's key
            self.log(f"[{name}] done already: {keyed.folder}")
            yield Stage(name, keyed.folder, config, done=True)
            return
        keyed.folder.mkdir(parents=True, exist_ok=True)
        self.log(f"[{name}] -> {keyed.folder}")
        t0, cpu0 = time.time(), time.process_time()
        yield Stage(name, keyed.folder, config, done=False)
        self.timings[name] = round(time.time() - t0, 1)
        # the CPU seconds of every thread of this process: a stage's cost, which wall time on a shared machine is not
        keyed.write(seconds=self.timings[name], cpu_seconds=round(time.process_time() - cpu0, 1))
