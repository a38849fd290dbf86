"""The package's import graph: subpackages import only downwards (the layers the README draws), and no module
imports itself back through others. Function-level imports count: a cycle hidden in a function is still a cycle."""
import ast
from collections import defaultdict
from pathlib import Path

import timm_csm

ROOT = Path(timm_csm.__file__).parent

# what each part of the package may import (the README's "Architecture"); "timm_csm" is the package itself, whose
# import registers the models and the evaluate modules
ALLOWED = {
    "registry": set(),
    "io": set(),
    "options": set(),
    "extras": set(),
    "cli": {"extras"},
    "trainer": {"io"},
    "models": set(),
    "data": {"metrics", "io", "extras"},
    "metrics": {"io", "extras"},
    "losses": {"metrics"},
    "calibration": {"metrics", "io", "extras"},
    "hf_metrics": {"metrics", "io"},
    "annotation": {"data", "models", "io", "trainer", "options"},
    "generation": {"data", "models", "io", "trainer", "options"},
    "hub": {"data", "io"},
    "evaluation": {"data", "models", "metrics", "calibration", "io", "trainer", "extras", "options"},
    "training": {"evaluation", "data", "models", "losses", "metrics", "calibration", "hub", "annotation", "io",
                 "trainer", "extras", "options", "cli", "timm_csm"},
    "recipes": {"training", "annotation", "generation", "hub", "data", "losses", "metrics", "io", "cli", "timm_csm"},
    "study": {"recipes", "generation", "training", "calibration", "annotation", "data", "metrics", "io", "extras",
              "trainer"},
    "commands": {"evaluation", "calibration", "hf_metrics", "recipes", "training", "annotation", "generation",
                 "hub", "data", "metrics", "io", "options", "timm_csm", "cli", "study"},
    "timm_csm": {"models", "hf_metrics"},
}
# the one registry class lies beneath every part
for _part_name, _imports in ALLOWED.items():
    if _part_name != "registry":
        _imports.add("registry")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_require(node) -> bool:
    return (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "require"
            and bool(node.args) and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str))


def all_imports():
    """{module: every module it imports, of the package or not, ``timm_csm.extras.require`` included}, relative
    imports resolved; ``from .. import x`` names the submodule ``x`` when there is one."""
    graph = {}
    for path in sorted(ROOT.rglob("*.py")):
        name, package = _module_name(path), path.name == "__init__.py"
        here = name if package else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = here.rsplit(".", node.level - 1)[0] if node.level else ""
                target = ".".join(p for p in (base, node.module) if p)
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    is_module = (ROOT.parent / Path(*sub.split(".")).with_suffix(".py")).exists() or \
                        (ROOT.parent / Path(*sub.split(".")) / "__init__.py").exists()
                    edges.add(sub if is_module else target)
            elif isinstance(node, ast.Import):
                edges.update(a.name for a in node.names)
            elif _is_require(node):  # timm_csm.extras.require("scipy.optimize", ...): an import by name
                edges.add(node.args[0].value)
        graph[name] = edges
    return graph


def module_imports():
    """{module: the timm_csm modules it imports} (see :func:`all_imports`)."""
    return {name: {e for e in edges if e == "timm_csm" or e.startswith("timm_csm.")}
            for name, edges in all_imports().items()}


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "timm_csm"


def test_subpackages_import_only_downwards():
    graph = module_imports()
    assert set(map(_part, graph)) == set(ALLOWED), "a subpackage is missing from the declared layers"
    found = defaultdict(set)
    for module, edges in graph.items():
        for e in edges:
            if _part(e) != _part(module):
                found[_part(module)].add(_part(e))
    wrong = {p: sorted(found[p] - ALLOWED[p]) for p in found if found[p] - ALLOWED[p]}
    assert not wrong, f"imports against the layers: {wrong}"


def _find_cycle(graph):
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_no_import_cycles():
    assert _find_cycle(ALLOWED) is None  # the declared layers themselves are a DAG
    graph = module_imports()
    # inside a package its __init__ re-exports its modules: the edges that count are module to module
    modules = {m: {e for e in edges if e in graph and not (graph.get(e) is not None and _is_init_of(e, m))}
               for m, edges in graph.items()}
    cycle = _find_cycle(modules)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def _is_init_of(package: str, module: str) -> bool:
    """Whether ``package`` is a package that contains ``module`` (an import of its own package's re-exports)."""
    return module.startswith(package + ".") and (ROOT.parent / Path(*package.split(".")) / "__init__.py").exists()


def test_the_checks_find_a_cycle_and_an_upward_import():
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None
    graph = module_imports()
    assert "timm_csm.data.csm_format" in graph["timm_csm.hub.build"]  # relative imports are resolved
    assert "timm_csm.models" in graph["timm_csm.evaluation.model"]  # `from .. import models`: the submodule


def test_no_module_of_the_package_or_the_benchmarks_is_over_400_lines():
    """One concept a module: a module past 400 lines holds more than one, and is split."""
    too_long = {str(p.relative_to(ROOT.parent)): n for folder in (ROOT, ROOT.parent / "benchmarks")
                for p in sorted(folder.rglob("*.py")) if (n := len(p.read_text().splitlines())) > 400}
    assert not too_long, too_long
