"""Executors: where a study's cells run. A small registry (:func:`create_executor`, :func:`list_executors`) of two
kinds, the only runners of cells there are:

* ``local`` (the default): ``lanes`` worker processes on this machine, each running one cell at a time with
  ``threads`` torch threads;
* ``ray``: each cell one Ray task asking for ``threads`` CPUs (and ``gpus`` GPUs), on the Ray cluster at ``address``
  (default: a Ray instance started here, with ``lanes * threads`` CPUs, or the one this process has initialised
  already). Ray is the ``[ray]`` extra.

Both call the same function on the same item with torch's thread count set the same way, so a cell computes the
same numbers, and records the same thread count, on either. ``env`` adds variables to the workers' environment
before torch starts in them (the instruction-set pins, :data:`timm_csm.recipes.cells.INSTRUCTION_SET_PINS`)::

    with create_executor("local", lanes=2, threads=1) as executor:
        for item, result in executor.map_unordered(run_one, items):   # in the order they finish
            ...
"""
from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Any, Callable, Iterable, Iterator, List, Mapping, Optional, Tuple

from ..extras import require, require_installed
from ..registry import Registry

__all__ = ["CellExecutor", "LocalExecutor", "RayExecutor", "EXECUTORS", "register_executor", "create_executor",
           "list_executors",
           "call_with_threads"]

#: the registered cell executors: name -> :class:`CellExecutor` subclass
EXECUTORS = Registry("executor")


def register_executor(name: str, cls: Optional[type] = None, *, overwrite: bool = False):
    """Register an executor class under ``name`` (without ``cls``, a decorator); a name is registered once unless
    ``overwrite``."""
    def add(cls: type) -> type:
        EXECUTORS.register(name, cls, overwrite=overwrite)
        cls.name = name
        return cls
    return add if cls is None else add(cls)


def list_executors(filter: str = "") -> List[str]:
    """The registered executors' names, sorted."""
    return EXECUTORS.list(filter)


def create_executor(name: str, **options: Any) -> "CellExecutor":
    """The executor registered as ``name`` with ``options`` (``lanes``, ``threads``; Ray's ``address``, ``gpus``)."""
    return EXECUTORS.create(name, **options)


def call_with_threads(fn: Callable[[Any], Any], threads: int, item: Any) -> Any:
    """``fn(item)`` with torch's intra-op threads set to ``threads``: what a cell's numbers depend on, set the same
    way in every executor's workers."""
    import torch

    torch.set_num_threads(threads)
    return fn(item)


class CellExecutor:
    """Runs ``fn(item)`` for many items, each with ``threads`` torch threads, and yields ``(item, result)`` as each
    one finishes; a context manager that starts its workers on entry and stops them on exit."""

    name = ""
    #: the options of this executor beyond ``lanes`` and ``threads`` (a command's flags of the same names)
    own_options: Tuple[str, ...] = ()

    def __init__(self, lanes: int = 1, threads: int = 1, env: Optional[Mapping[str, str]] = None):
        if lanes < 1 or threads < 1:
            raise ValueError(f"an executor needs at least one lane and one thread, got lanes={lanes}, "
                             f"threads={threads}")
        self.lanes, self.threads, self.env = int(lanes), int(threads), dict(env or {})

    def __enter__(self) -> "CellExecutor":
        return self

    def __exit__(self, *exc) -> None:
        return None

    def map_unordered(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[Tuple[Any, Any]]:
        raise NotImplementedError

    def describe(self) -> str:
        """In a few words, for the command's output."""
        return f"{self.name}: {self.lanes} lane(s) of {self.threads} thread(s)"


@register_executor("local")
class LocalExecutor(CellExecutor):
    """``lanes`` worker processes on this machine, started fresh (``spawn``: no thread pool or CUDA state carried
    over from this process), each running one item at a time. A worker starts with this process's environment,
    which holds ``env`` while the executor is open (workers start as items arrive)."""

    def __enter__(self) -> "LocalExecutor":
        self._saved = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)
        self._pool = ProcessPoolExecutor(max_workers=self.lanes, mp_context=multiprocessing.get_context("spawn"))
        return self

    def __exit__(self, *exc) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        for key, value in self._saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

    def map_unordered(self, fn, items):
        futures = {self._pool.submit(call_with_threads, fn, self.threads, item): item for item in items}
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                yield futures[future], future.result()


@register_executor("ray")
class RayExecutor(CellExecutor):
    """Each item one Ray task with ``threads`` CPUs and ``gpus`` GPUs, on the cluster at ``address`` (None: the Ray
    instance this process has initialised, else a new local one with ``lanes * threads`` CPUs, shut down on exit)."""

    own_options = ("address", "gpus")

    def __init__(self, lanes: int = 1, threads: int = 1, env: Optional[Mapping[str, str]] = None,
                 address: Optional[str] = None, gpus: float = 0.0):
        super().__init__(lanes, threads, env)
        require_installed("ray", "the ray executor")  # before anything runs, without importing it
        if gpus < 0:
            raise ValueError(f"gpus must be 0 or more, got {gpus}")
        self.address, self.gpus = address, gpus

    def __enter__(self) -> "RayExecutor":
        self._ray = require("ray", "the ray executor")
        self._started = not self._ray.is_initialized()
        if self._started:
            local = {} if self.address else {"num_cpus": self.lanes * self.threads}
            self._ray.init(address=self.address, include_dashboard=False, log_to_driver=False, **local)
        return self

    def __exit__(self, *exc) -> None:
        if self._started:
            self._ray.shutdown()

    def map_unordered(self, fn, items):
        ray = self._ray
        runtime = {"runtime_env": {"env_vars": self.env}} if self.env else {}
        task = ray.remote(num_cpus=self.threads, num_gpus=self.gpus, max_retries=0, **runtime)(call_with_threads)
        refs = {task.remote(fn, self.threads, item): item for item in items}
        pending = list(refs)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                yield refs[done[0]], ray.get(done[0])
        finally:
            for ref in pending:  # an error or an interrupt: the cells still queued are not started
                ray.cancel(ref)

    def describe(self) -> str:
        where = self.address or "a local Ray instance"
        return f"ray at {where}: tasks of {self.threads} CPU(s)" + (f" and {self.gpus:g} GPU(s)" if self.gpus else "")
