"""The stage cache: each stage of a recipe runs once per configuration.

A stage named ``name`` with configuration ``config`` (a JSON-able dict: its own settings and the configurations of
the stages it reads) owns the folder ``<root>/<name>-<key>/``, ``key`` being the first 10 hex digits of the SHA-256
of ``json.dumps(config, sort_keys=True, default=str)``. The marker ``DONE.json`` (the configuration and the seconds
the stage took) is written last, atomically: a folder with the marker is done and skipped on a re-run; a stage
killed before its marker runs again in the same folder (the long stages resume from what they left there).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator

from ..io import write_json_atomic

__all__ = ["MARKER", "Stage", "StageCache", "stage_key"]

MARKER = "DONE.json"


def stage_key(config: Dict[str, Any]) -> str:
    """The folder key of a stage configuration: 10 hex digits of the SHA-256 of its sorted-key JSON (values JSON
    cannot hold, such as paths, as ``str``)."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:10]


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
        folder = self.folder(name, config)
        if (folder / MARKER).exists():
            self.log(f"[{name}] done already: {folder}")
            yield Stage(name, folder, config, done=True)
            return
        folder.mkdir(parents=True, exist_ok=True)
        self.log(f"[{name}] -> {folder}")
        t0 = time.time()
        yield Stage(name, folder, config, done=False)
        self.timings[name] = round(time.time() - t0, 1)
        write_json_atomic(folder / MARKER, {"config": config, "seconds": self.timings[name]})
