"""The package as a newcomer gets it: the sdist and the wheel build without a warning, the wheel (built from the
sdist) installs into a clean virtual environment, and every shell and Python block of the README runs there as
written, in a fresh ``HF_HOME`` and a working directory outside the repository.

The clean environment reuses the test environment's installed dependencies (torch alone is several GB) through a
folder of links added as a site directory. It links only what the wheel and the extras of the README's install line
need, so an extra the README forgets is missing there as after a real install, and it leaves out timm-csm itself:
what imports as ``timm_csm`` there is the wheel. A static reading of the README checks the same without the run."""
import ast
import email.parser
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

from test_import_graph import all_imports

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs"))
import build_hooks  # noqa: E402  setup.cfg's console scripts

SOURCES = ("setup.cfg", "pyproject.toml", "README.md", "LICENSE", "timm_csm")
README_BLOCK = re.compile(r"^```(bash|python)\n(.*?)^```", re.M | re.S)
INSTALL_LINE = re.compile(r'^pip install "?dist/timm_csm-[^\s"\[]+\.whl(?:\[([a-z,]*)\])?"?$', re.M)


def _run(cmd, **kwargs):
    result = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    assert result.returncode == 0, f"{cmd} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def _build(src: Path, dist: Path, hook: str) -> str:
    """Run setuptools' PEP 517 ``hook`` in ``src``; returns what it printed."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # else distutils says so
    code = f"from setuptools import build_meta; build_meta.{hook}({str(dist)!r})"
    result = _run([sys.executable, "-W", "default", "-c", code], cwd=src, env=env)
    return result.stdout + result.stderr


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(sdist, wheel): the sdist built from the package's sources, the wheel built from the unpacked sdist."""
    tmp = tmp_path_factory.mktemp("dist")
    src, dist = tmp / "src", tmp / "dist"
    src.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, src / name)
    log = _build(src, dist, "build_sdist")
    (sdist,) = dist.glob("*.tar.gz")
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp / "unpacked", filter="data")
    (unpacked,) = (tmp / "unpacked").iterdir()
    log += _build(unpacked, dist, "build_wheel")
    assert not re.search(r"warn", log, re.I), log[-5000:]
    (wheel,) = dist.glob("*.whl")
    return sdist, wheel


def test_the_sdist_and_the_wheel_carry_the_license_the_data_and_the_commands(built):
    sdist, wheel = built
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {"LICENSE", "README.md", "setup.cfg", "timm_csm/commands/generate.py"} <= names
    with zipfile.ZipFile(wheel) as whl:
        names = set(whl.namelist())
        entry_points = whl.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    for path in ("timm_csm/hf_metrics/ece/ece.py", "timm_csm/assets/generator-fmnist/model_index.json",
                 "timm_csm/assets/generator-fmnist/unet/diffusion_pytorch_model.safetensors",
                 "timm_csm/commands/annotate.py"):
        assert path in names, path
    for command in ("timm-csm-train", "timm-csm-generate", "timm-csm-annotate", "timm-csm-publish",
                    "timm-csm-pipeline", "timm-csm-install-metrics"):
        assert f"{command} = " in entry_points, command


def _wheel_requirements(wheel: Path) -> list:
    with zipfile.ZipFile(wheel) as whl:
        text = whl.read(next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    return email.parser.Parser().parsestr(text).get_all("Requires-Dist")


def _distributions_for(requirements, extras) -> set:
    """The installed distributions that ``requirements`` with ``extras`` need, transitively (what pip would
    install): an optional package that no named extra requires is left out."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    needed = {}  # name -> the extras asked of it

    def add(requirement: str, active: set) -> None:
        req = Requirement(requirement)
        if req.marker and not any(req.marker.evaluate({"extra": e}) for e in active or {""}):
            return
        name = canonicalize_name(req.name)
        if name in needed and set(req.extras) <= needed[name]:
            return
        needed[name] = needed.get(name, set()) | set(req.extras)
        for child in importlib.metadata.distribution(name).requires or []:
            add(child, needed[name])

    for requirement in requirements:
        add(requirement, set(extras))
    return set(needed)


def _installed_files(names) -> set:
    """The top-level entries of this environment's site directory that the distributions ``names`` installed."""
    entries = set()
    for name in names:
        dist = importlib.metadata.distribution(name)
        assert dist.files, f"{name} lists no files (no RECORD): the clean environment cannot hold it"
        entries |= {f.parts[0] for f in dist.files if f.parts[0] not in ("..", "__pycache__")}
    return entries


def _clean_venv(root: Path, wheel: Path, extras) -> Path:
    """A new virtual environment whose site directories include a folder of links to the installed distributions
    that the wheel with ``extras`` needs, and nothing else (timm-csm's own files and every other package left out),
    so that a missing extra shows as it would after a real install."""
    venv = root / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    python = venv / "bin" / "python"
    _run([str(python), "-m", "pip", "uninstall", "--yes", "setuptools"])  # an old copy: torch needs the newer one
    deps = root / "dependencies" / "site-packages"  # dill pickles modules from a "site-packages" path by reference
    deps.mkdir(parents=True)
    site_packages = Path(sysconfig.get_paths()["purelib"])
    for entry in sorted(_installed_files(_distributions_for(_wheel_requirements(wheel), extras))):
        if (site_packages / entry).exists():
            (deps / entry).symlink_to(site_packages / entry)
    site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    Path(site, "dependencies.pth").write_text(f"import site; site.addsitedir({str(deps)!r})\n")
    return venv


@pytest.fixture(scope="module")
def newcomer(built, tmp_path_factory):
    """(environment, working directory): a fresh shell's variables with the clean environment first on PATH, a new
    HF_HOME and no PYTHONPATH; the working directory is outside the repository and holds the wheel in dist/."""
    root = tmp_path_factory.mktemp("newcomer")
    venv = _clean_venv(root, built[1], readme_install_extras())
    work = root / "work"
    (work / "dist").mkdir(parents=True)
    shutil.copy2(built[1], work / "dist")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith("HF_")}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", HF_HOME=str(root / "hf"),
               HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_EVALUATE_OFFLINE="1", OMP_NUM_THREADS="1",
               PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env, work


def _readme_blocks():
    return [(lang, body) for lang, body in README_BLOCK.findall((ROOT / "README.md").read_text())]


def readme_install_extras() -> set:
    """The extras of the README's ``pip install "dist/<wheel>[extra,...]"`` line."""
    (extras,) = INSTALL_LINE.findall((ROOT / "README.md").read_text())
    return set(filter(None, extras.split(",")))


def _snippet_modules(code: str) -> set:
    modules = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            modules.add(node.module)
    return modules


def _quickstart_modules() -> set:
    """The modules the README's blocks after its install line start from: each console script's module, and what
    each Python block or ``python -c`` imports."""
    scripts = {name: target.split(":")[0] for name, target in build_hooks.console_scripts().items()}
    modules = set()
    blocks = _readme_blocks()
    first = next(i for i, (_, body) in enumerate(blocks) if INSTALL_LINE.search(body))
    for lang, body in blocks[first + 1:]:
        if lang == "python":
            modules |= _snippet_modules(body)
            continue
        modules.update(scripts[c] for c in re.findall(r"(?:^|&&|;)\s*(timm-csm-[a-z-]+)", body, re.M))
        for code in re.findall(r'python -c "(.*?)"', body):
            modules |= _snippet_modules(code)
    return modules


def _reachable_packages(start: set) -> set:
    """The top-level names of everything the package modules reachable from ``start`` import (function-level
    imports included: a command may reach any of them)."""
    graph, seen, found = all_imports(), set(), set()
    todo = list(start)
    while todo:
        module = todo.pop()
        found.add(module.split(".")[0])
        if module.split(".")[0] != "timm_csm" or module in seen or module not in graph:
            continue
        seen.add(module)
        parents = [module.rsplit(".", i)[0] for i in range(1, module.count(".") + 1)]
        todo += [*graph[module], *parents]
    return found


def test_the_readme_install_line_names_every_extra_its_quickstart_needs():
    """A static reading of the Quickstart (fast; the clean-environment test below runs it): every optional package
    that the commands and snippets after the install line can import belongs to an extra that the line names."""
    from timm_csm.extras import OPTIONAL_DEPENDENCIES

    packages = _reachable_packages(_quickstart_modules())
    needed = {OPTIONAL_DEPENDENCIES[name].extra for name in packages & set(OPTIONAL_DEPENDENCIES)} - {None}
    assert {"gen", "calibration", "plots"} <= needed  # the pipeline and timm-csm-calibrate are in the Quickstart
    named = readme_install_extras()
    assert needed <= named, f"the README's install line lacks {sorted(needed - named)}"


def _is_setup(body: str) -> bool:
    return all(line.startswith("make ") for line in body.strip().splitlines())


@pytest.mark.slow
def test_every_readme_block_runs_as_written_in_a_clean_environment_with_the_wheel(newcomer):
    """The set-up block (``make ...``: what CI itself runs, and ``make demo``, whose stages the smoke profile runs
    below) is checked with ``make -n``; every other block runs, in order, in one fresh shell environment."""
    env, work = newcomer
    blocks = _readme_blocks()
    assert sum(_is_setup(body) for _, body in blocks) == 1 and len(blocks) >= 6
    printed = []
    for i, (lang, body) in enumerate(blocks):
        if _is_setup(body):
            for line in body.strip().splitlines():
                target = line.split("#")[0].split()[1]
                _run(["make", "-n", target], cwd=ROOT)
            continue
        if lang == "bash":
            cmd = ["bash", "-euo", "pipefail", "-c", body]
        else:
            (work / f"readme_block_{i}.py").write_text(body)
            cmd = ["python", f"readme_block_{i}.py"]
        printed.append(_run(cmd, cwd=work, env=env, timeout=900).stdout)
    text = "\n".join(printed)
    assert "run folder: output/train/fashion_mnist-small_cnn-csm (results.json" in text
    assert "small_cnn 10 " in text  # the loaded classifier's metadata
    assert re.search(r"DatasetDict\(\{\s*train: Dataset\(\{\s*features: \['image', 'label', 'soft_label'", text)
    assert "{'ece': 0.1" in text


@pytest.mark.slow
def test_the_installed_wheel_is_what_runs(newcomer):
    env, work = newcomer
    if subprocess.run(["python", "-c", "import timm_csm"], cwd=work, env=env).returncode:  # the README's test not run
        _run(["pip", "install", str(next((work / "dist").glob("*.whl")))], cwd=work, env=env)
    where = _run(["python", "-c", "import timm_csm; print(timm_csm.__file__)"], cwd=work, env=env).stdout
    assert "site-packages" in where and str(ROOT) not in where
    help_text = _run(["timm-csm-train", "--help"], cwd=work, env=env).stdout
    assert help_text.startswith("usage: timm-csm-train") and "epochs to train (default: 200)" in help_text


def test_make_dist_builds_with_the_packaging_tools_only(tmp_path):
    """``make dist`` takes a small environment of PyPA's build (not the development environment, torch and every
    extra, minutes to install) and builds the sdist and, from it, the wheel."""
    plan = _run(["make", "-n", "-f", str(ROOT / "Makefile"), "-C", str(tmp_path), "dist"]).stdout
    assert "pip install --quiet --upgrade build setuptools wheel" in plan
    assert "-m build --no-isolation --outdir dist ." in plan
    assert not re.search(r"\.\[dev\]|torch|\.venv/", plan), plan
