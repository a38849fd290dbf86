"""The package as a newcomer gets it: the sdist and the wheel build without a warning, the wheel (built from the
sdist) installs into a clean virtual environment, and every shell and Python block of the README runs there as
written, in a fresh ``HF_HOME`` and a working directory outside the repository.

The clean environment reuses the test environment's installed dependencies (torch alone is several GB) through a
folder of links added as a site directory, which leaves out timm-csm itself: what imports as ``timm_csm`` there is
the wheel."""
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

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("setup.cfg", "pyproject.toml", "README.md", "LICENSE", "timm_csm")
README_BLOCK = re.compile(r"^```(bash|python)\n(.*?)^```", re.M | re.S)


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


def _clean_venv(root: Path) -> Path:
    """A new virtual environment whose site directories include a folder of links to this environment's installed
    distributions, timm-csm's own files left out."""
    venv = root / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    python = venv / "bin" / "python"
    _run([str(python), "-m", "pip", "uninstall", "--yes", "setuptools"])  # an old copy: torch needs the newer one
    deps = root / "dependencies" / "site-packages"  # dill pickles modules from a "site-packages" path by reference
    deps.mkdir(parents=True)
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not re.search(r"timm[_-]csm|^__editable__", entry.name, re.I):
            (deps / entry.name).symlink_to(entry)
    site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    Path(site, "dependencies.pth").write_text(f"import site; site.addsitedir({str(deps)!r})\n")
    return venv


@pytest.fixture(scope="module")
def newcomer(built, tmp_path_factory):
    """(environment, working directory): a fresh shell's variables with the clean environment first on PATH, a new
    HF_HOME and no PYTHONPATH; the working directory is outside the repository and holds the wheel in dist/."""
    root = tmp_path_factory.mktemp("newcomer")
    venv = _clean_venv(root)
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
