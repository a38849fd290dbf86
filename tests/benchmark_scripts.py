"""The benchmark scripts (``benchmarks/*.py``, not a package) imported by path, for their tests."""
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_benchmark(name: str):
    """The module ``benchmarks/<name>.py``, registered in ``sys.modules`` (its dataclasses need it there)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
