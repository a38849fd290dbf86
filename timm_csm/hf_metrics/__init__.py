"""Hugging Face ``evaluate`` modules for the calibration metrics, shipped as package data.

One folder per module (``ece``, ``aece``, ``cece``, ``mce``, ``debiased_ce``, ``nll``, ``brier``, ``smece`` and the
selective-prediction ``aurc``, ``eaurc``, ``augrc``: the metrics of the table :mod:`timm_csm.metrics.table`
registered with ``evaluate=True``), each holding ``<name>/<name>.py``, a thin :class:`evaluate.Metric` over
:mod:`timm_csm.metrics`.

* :func:`load_metric` loads a module by its file path: works offline, from any directory, with no warning.
* :func:`install_evaluate_modules` copies the scripts into evaluate's module cache, where ``evaluate.load(name)``
  falls back to when the Hub has no such module (or is unreachable). After it ran once (``import timm_csm`` does it),
  a bare ``evaluate.load("ece")`` - and ``evaluate.load("timm-csm/ece")`` - works in any later process. evaluate
  logs "Using the latest cached version of the module" for such loads; :func:`load_metric` avoids that.

This file must not import evaluate (``import timm_csm`` stays light): the cache location is computed from the
environment exactly as ``evaluate.config`` does.
"""
from __future__ import annotations

import hashlib
import os
import warnings
from pathlib import Path
from typing import Iterable, List, Optional

from ..io import write_bytes_atomic
from ..metrics.table import LEGACY_NAMES, list_metrics

__all__ = ["METRIC_NAMES", "NAMESPACE", "metric_path", "load_metric", "install_evaluate_modules",
           "evaluate_modules_cache"]

#: the modules of the built-in metrics (``list_metrics(evaluate=True)`` also lists those registered later)
METRIC_NAMES = tuple(list_metrics(evaluate=True))
# evaluate's cache folder prefixes: "evaluate-metric--ece" serves evaluate.load("ece"), "timm-csm--ece" serves
# evaluate.load("timm-csm/ece")
NAMESPACE = "timm-csm"
_CACHE_PREFIXES = ("evaluate-metric", NAMESPACE)
_HERE = Path(__file__).resolve().parent


def _check_name(name: str) -> str:
    """``name``, or the current name of a renamed module (:data:`~timm_csm.metrics.table.LEGACY_NAMES`, with a
    ``FutureWarning``); an unknown name is a ``ValueError`` listing the known ones."""
    if name in LEGACY_NAMES:
        warnings.warn(f"the metric {name!r} is named {LEGACY_NAMES[name]!r} now (its result key too; see "
                      "CHANGELOG.md): the old name will stop resolving", FutureWarning, stacklevel=3)
        name = LEGACY_NAMES[name]
    if name not in list_metrics(evaluate=True):
        raise ValueError(f"unknown metric {name!r}; available: {', '.join(list_metrics(evaluate=True))}")
    return name


def metric_path(name: str) -> str:
    """Absolute path of the module script ``timm_csm/hf_metrics/<name>/<name>.py`` (a renamed module's old name
    gives the module under its new name, with a ``FutureWarning``)."""
    name = _check_name(name)
    path = _HERE / name / f"{name}.py"
    if not path.is_file():  # an incomplete installation (package data missing)
        raise FileNotFoundError(f"metric script {path} is missing; reinstall timm-csm")
    return str(path)


def load_metric(name: str, **kwargs):
    """``evaluate.load`` by path: ``load_metric("ece", n_bins=10, input_type="probs")``.

    Keyword arguments are evaluate's (``keep_in_memory``, ``experiment_id``, ``num_process``, ...) and the
    module options (``n_bins``, ``input_type``, ``task``, ``num_classes``, ``ignore_index``).
    """
    import evaluate  # heavy: only here

    return evaluate.load(metric_path(name), **kwargs)


def evaluate_modules_cache() -> Path:
    """The folder evaluate imports dynamic modules from: ``$HF_MODULES_CACHE/evaluate_modules``, where
    ``HF_MODULES_CACHE`` defaults to ``$HF_HOME/modules`` and ``HF_HOME`` to ``$XDG_CACHE_HOME/huggingface``
    (``~/.cache/huggingface``) - the rules of ``evaluate.config``."""
    if os.getenv("HF_MODULES_CACHE"):
        modules = Path(os.path.expanduser(os.environ["HF_MODULES_CACHE"]))
    else:
        xdg = os.getenv("XDG_CACHE_HOME", "~/.cache")
        hf_home = os.path.expanduser(os.getenv("HF_HOME", os.path.join(xdg, "huggingface")))
        modules = Path(hf_home) / "modules"
    return modules / "evaluate_modules"


def _touch_init(folder: Path) -> None:
    init = folder / "__init__.py"
    if not init.exists():
        init.touch(exist_ok=True)


def install_evaluate_modules(names: Optional[Iterable[str]] = None, cache_dir: Optional[os.PathLike] = None
                             ) -> List[Path]:
    """Write the module scripts into evaluate's module cache; returns the written script paths.

    Layout (what evaluate's cached-module fallback reads): ``<cache>/metrics/<prefix>--<name>/<sha256>/<name>.py``
    plus ``__init__.py`` files, for the prefixes ``evaluate-metric`` (bare names) and ``timm-csm``. evaluate imports
    the newest script of a module folder, so the installed package's copy is made the newest: an existing identical
    copy gets its modification time refreshed, and it is set a second past any other cached version (an older
    release, or one written in the same clock tick), whose script must not be used after an upgrade. Writes are
    atomic (temp file + ``os.replace``), safe with concurrent processes. Raises ``OSError`` if the cache is not
    writable.
    """
    root = Path(cache_dir) if cache_dir is not None else evaluate_modules_cache()
    selected = list_metrics(evaluate=True) if names is None else tuple(_check_name(n) for n in names)
    metrics_dir = root / "metrics"
    metrics_dir.mkdir(parents=True, exist_ok=True)
    _touch_init(root)
    _touch_init(metrics_dir)
    written = []
    for name in selected:
        code = Path(metric_path(name)).read_bytes()
        digest = hashlib.sha256(code).hexdigest()  # evaluate accepts any 64-character folder name
        for prefix in _CACHE_PREFIXES:
            module_dir = metrics_dir / f"{prefix}--{name}"
            target_dir = module_dir / digest
            target_dir.mkdir(parents=True, exist_ok=True)
            _touch_init(module_dir)
            _touch_init(target_dir)
            target = target_dir / f"{name}.py"
            try:
                same = target.read_bytes() == code
            except FileNotFoundError:
                same = False
            if same:
                os.utime(target)
            else:
                write_bytes_atomic(target, code)
            _make_newest(target, module_dir)
            written.append(target)
    return written


def _make_newest(target: Path, module_dir: Path) -> None:
    """Give ``target`` a modification time at least a second after every other cached copy of the module.

    evaluate's cached-module fallback imports the copy whose script has the latest ``st_mtime`` (float seconds).
    A copy of another version - written within the same clock tick, or refreshed later by another installation
    sharing the cache - must not win over the code of the installed package.
    """
    others = []
    for script in module_dir.glob(f"*/{target.name}"):
        if script.parent != target.parent and len(script.parent.name) == 64:
            try:
                others.append(script.stat().st_mtime_ns)
            except FileNotFoundError:  # removed meanwhile
                pass
    newest = max(others, default=None)
    if newest is not None and target.stat().st_mtime_ns < newest + 10**9:
        later = newest + 10**9
        os.utime(target, ns=(later, later))
