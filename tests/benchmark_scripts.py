"""The benchmark scripts (``benchmarks/*.py``, not a package) imported by name, for their tests: as when a script
runs, ``benchmarks/`` is on the path, so a script and the helper modules it imports load once each."""
import importlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_benchmark(name: str):
    """The module ``benchmarks/<name>.py`` (imported once, registered in ``sys.modules``)."""
    folder = str(ROOT / "benchmarks")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    module = importlib.import_module(name)
    if Path(module.__file__).resolve() != ROOT / "benchmarks" / f"{name}.py":
        raise ImportError(f"{name} resolves to {module.__file__}, not the benchmark script")
    return module
