"""Set-up on a fresh machine: `make test` / `make demo` install Fashion-MNIST or stop naming the command, and the
pipeline never switches dataset on its own.

The Makefile runs against a fake data folder and fake `id` / `apt-get` / `python3` on PATH, so the machine's own
Fashion-MNIST and virtual environment are never touched."""
import dataclasses
import os
import subprocess
from pathlib import Path

import pytest

from timm_csm.data.embedded import FASHION_MNIST_INSTALL
from timm_csm.recipes import get_profile, resolve_dataset, run_recipe

ROOT = Path(__file__).resolve().parents[1]
IDX = "train-images-idx3-ubyte.gz"


def _fake_tools(tmp_path: Path, uid: int, apt_rc: int = 0) -> Path:
    """`id -u` prints ``uid``; `apt-get` logs its arguments and, on install, creates the IDX file of $FAKE_DATA;
    `python3` logs that it was called and fails (no virtual environment must be created)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scripts = {
        "id": f'#!/bin/sh\necho {uid}\n',
        "apt-get": ('#!/bin/sh\necho "$*" >> "$FAKE_LOG"\n'
                    f'if [ "$1" = install ] && [ {apt_rc} = 0 ]; then mkdir -p "$FAKE_DATA"; '
                    f'touch "$FAKE_DATA/{IDX}"; fi\nexit {apt_rc}\n'),
        "python3": '#!/bin/sh\necho "python3 $*" >> "$FAKE_LOG"\nexit 1\n',
    }
    for name, text in scripts.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return bin_dir


def _make(tmp_path: Path, target: str, uid: int, apt_rc: int = 0, present: bool = False):
    data = tmp_path / "fashion-mnist"
    if present:
        data.mkdir()
        (data / IDX).touch()
    bin_dir = _fake_tools(tmp_path, uid, apt_rc)
    log = tmp_path / "calls.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TIMM_CSM", "MAKE"))}
    env.update(PATH=f"{bin_dir}:{env['PATH']}", FAKE_LOG=str(log), FAKE_DATA=str(data))
    work = tmp_path / "checkout"
    work.mkdir()
    res = subprocess.run(["make", "-s", "-f", str(ROOT / "Makefile"), "-C", str(work), target,
                          f"TIMM_CSM_FASHION_MNIST={data}", f"PY={bin_dir / 'python3'}"],
                         env=env, capture_output=True, text=True, timeout=60)
    calls = log.read_text().splitlines() if log.exists() else []
    return res, calls, data, work


@pytest.mark.parametrize("target", ["test", "demo"])
def test_make_without_root_stops_at_once_naming_the_install_command(tmp_path, target):
    res, calls, data, work = _make(tmp_path, target, uid=1000)
    assert res.returncode != 0
    assert f"sudo sh -c '{FASHION_MNIST_INSTALL}'" in res.stderr
    assert calls == []  # neither apt-get nor the virtual-environment set-up ran
    assert not (work / ".venv").exists() and not (data / IDX).exists()


def test_make_as_root_updates_then_installs_the_package(tmp_path):
    res, calls, data, _ = _make(tmp_path, "fashion-mnist", uid=0)
    assert res.returncode == 0, res.stderr
    assert calls == ["update", "install -y dataset-fashion-mnist"]  # a fresh machine has no package lists
    assert (data / IDX).exists()


def test_make_as_root_stops_when_apt_fails(tmp_path):
    res, calls, data, work = _make(tmp_path, "test", uid=0, apt_rc=100)
    assert res.returncode != 0
    assert calls == ["update"]  # `&&`: no install after a failed update, and no set-up after that
    assert not (work / ".venv").exists()


def test_make_with_the_data_present_calls_no_apt(tmp_path):
    res, calls, _, _ = _make(tmp_path, "fashion-mnist", uid=0, present=True)
    assert res.returncode == 0 and calls == []


def test_make_demo_installs_the_demo_extras_unless_the_dev_environment_exists(tmp_path):
    data = tmp_path / "fashion-mnist"
    data.mkdir()
    (data / IDX).touch()
    work = tmp_path / "checkout"
    (work / ".venv" / "bin").mkdir(parents=True)
    for name in ("setup.cfg", "pyproject.toml"):
        (work / name).touch()
    (work / ".venv" / "bin" / "python").touch()

    def dry_run():
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TIMM_CSM", "MAKE"))}
        res = subprocess.run(["make", "-n", "-f", str(ROOT / "Makefile"), "-C", str(work), "demo",
                              f"TIMM_CSM_FASHION_MNIST={data}"], env=env, capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        return res.stdout

    fresh = dry_run()
    assert '-e ".[gen,plots,calibration]"' in fresh and ".[dev]" not in fresh
    (work / ".venv" / ".installed").touch()  # `make test` set up the dev extras: the demo installs nothing more
    assert "pip install" not in dry_run()


def test_ci_entry_point_is_the_readme_command():
    script = (ROOT / ".ci" / "run").read_text()
    assert script.strip().splitlines()[-1] == "make test" and "apt-get" not in script


def test_pipeline_without_fashion_mnist_is_an_error_not_digits(tmp_path, monkeypatch):
    monkeypatch.setenv("TIMM_CSM_FASHION_MNIST", str(tmp_path / "absent"))
    out = tmp_path / "run"
    with pytest.raises(FileNotFoundError, match=f"sudo sh -c '{FASHION_MNIST_INSTALL}'.*--dataset digits"):
        run_recipe(get_profile("smoke"), out, log=lambda line: None)
    assert not out.exists()
    from timm_csm.data import load_image_arrays

    with pytest.raises(FileNotFoundError, match="apt-get update && apt-get install -y dataset-fashion-mnist"):
        load_image_arrays("fashion_mnist")  # offline (the tests' environment): no Hub attempt, the install command


def test_digits_is_an_explicit_choice(tmp_path, monkeypatch):
    monkeypatch.setenv("TIMM_CSM_FASHION_MNIST", str(tmp_path / "absent"))
    lines = []
    demo = get_profile("demo")
    run = resolve_dataset(dataclasses.replace(demo, dataset="digits"), lines.append)
    assert run.dataset == "digits" and run.generator == "digits" and "model_kwargs" not in run.train_extra
    assert run.train_extra == {k: v for k, v in demo.train_extra.items() if k != "model_kwargs"}
    assert lines and "digits" in lines[0]
    kept = resolve_dataset(dataclasses.replace(demo, dataset="digits", generator="smoke"), lines.append)
    assert kept.generator == "smoke"
