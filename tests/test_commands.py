"""The command lines a pip install gives: console scripts, --help texts and defaults, what a run prints, Ctrl-C."""
import argparse
import configparser
import importlib
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMMAND_MODULES = ("timm_csm.train", "timm_csm.recipes.run", "timm_csm.commands.train_generator",
                   "timm_csm.commands.generate", "timm_csm.commands.annotate", "timm_csm.commands.publish",
                   "timm_csm.commands.evaluate_generator", "timm_csm.calibrate", "timm_csm.commands.compare")


def _console_scripts():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    lines = [line.split("=") for line in cfg["options.entry_points"]["console_scripts"].strip().splitlines()]
    return {name.strip(): target.strip() for name, target in lines}


def test_console_scripts_are_the_commands_main_functions():
    scripts = _console_scripts()
    for name in ("timm-csm-train", "timm-csm-generate", "timm-csm-annotate", "timm-csm-publish", "timm-csm-pipeline",
                 "timm-csm-install-metrics", "timm-csm-calibrate", "timm-csm-compare"):
        assert name in scripts, name
    for name, target in scripts.items():
        module, function = target.split(":")
        assert function == "main" and callable(getattr(importlib.import_module(module), function)), name
    assert scripts["timm-csm-train"] == "timm_csm.train:main"


class _Parsed(Exception):
    pass


def _parser_of(module_name, monkeypatch):
    """The argument parser a command's ``main`` builds (caught as it parses, so nothing runs)."""
    def capture(parser, *args, **kwargs):
        raise _Parsed(parser)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", capture)
    with pytest.raises(_Parsed) as caught:
        importlib.import_module(module_name).main([])
    return caught.value.args[0]


@pytest.mark.parametrize("module_name", COMMAND_MODULES)
def test_every_option_has_a_help_text_and_its_default_once(module_name, monkeypatch):
    parser = _parser_of(module_name, monkeypatch)
    formatter = parser.formatter_class(parser.prog)
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        assert action.help and action.help.strip(), f"{module_name} {action.option_strings[-1]} has no help"
        shown = formatter._get_help_string(action).replace("%(default)s", "")
        assert shown.count("default") <= 1, f"{module_name} {action.option_strings[-1]}: {shown}"
        switch = action.nargs == 0 and action.default is False
        assert switch or "default" in shown or "when omitted" in shown or action.required, \
            f"{module_name} {action.option_strings[-1]} shows no default"


def test_train_help_shows_the_defaults_it_lacked():
    from timm_csm.training import build_parser

    text = " ".join(build_parser().format_help().split())
    for shown in ("epochs to train (default: 200)", "base learning rate (default: 0.1)", "(default: 12345)",
                  "SGD momentum (default: 0.9)", "weight decay (default: 0.0005)",
                  "progress bar on the main process (default: True)"):
        assert shown in text, shown
    assert "(default: None)" not in text and "default: 'test', else 'validation', else 'val') (default" not in text


def test_reliability_diagrams_are_titled_with_model_dataset_split_and_size():
    from timm_csm.training.reporting import reliability_title

    results = {"model": "resnet18_cifar", "loss": "csm", "dataset": "/data/my_cifar", "n_test": 10000, "n_val": 500,
               "test": {"pre_ts": {}}}
    assert reliability_title(results, "test") == "resnet18_cifar / csm, my_cifar test, N=10000"
    # a run without a test split shows its validation images
    assert reliability_title(dict(results, test=None), "validation") == "resnet18_cifar / csm, my_cifar validation, N=500"


def _interrupt(cmd, env, started, tmp_path):
    """Start ``cmd``, send it Ctrl-C (SIGINT) once ``started()`` holds; returns (exit status, stdout, stderr)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    deadline = time.time() + 300
    while not started() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


@pytest.mark.slow
def test_ctrl_c_names_the_folder_and_the_resume_command_and_a_rerun_says_why_it_takes_a_new_folder(tmp_path, capsys,
                                                                                                   monkeypatch):
    import os

    from timm_csm.train import run

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    options = dict(dataset="digits", model="small_cnn", batch_size=32, max_train_samples=320, max_test_samples=100,
                   val_fraction=0.25, output="out", experiment="x")
    cmd = [sys.executable, "-m", "timm_csm.train", "--epochs", "1000"]
    for key, value in options.items():
        cmd += [f"--{key.replace('_', '-')}", str(value)]
    first = tmp_path / "out" / "x"
    code, out, err = _interrupt(cmd, env, (first / "last.safetensors").exists, tmp_path)
    assert code == 130 and "Traceback" not in err and "KeyboardInterrupt" not in err
    assert out.splitlines()[0] == "run folder: out/x"
    resume = "timm-csm-train --resume out/x/last.safetensors"
    assert err.strip().splitlines()[-1] == f"interrupted: the run is in out/x; continue it with: {resume}"

    monkeypatch.chdir(tmp_path)  # the same options again (no epoch, to be quick): a new folder, and why
    run(dict(options, epochs=0, progress=False))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (f"run folder: out/x-1 (out/x holds an interrupted run; to continue that one instead: "
                        f"{resume}, or add --auto-resume)")
    assert lines[-1] == "run folder: out/x-1 (results.json, results.md, reliability diagrams)"


def test_an_interrupted_run_without_a_finished_epoch_says_there_is_nothing_to_resume(tmp_path):
    from timm_csm.train import RunInterrupted

    assert RunInterrupted(tmp_path / "x", eval_only=False).message == (
        f"the run in {tmp_path / 'x'} had not finished an epoch, so there is nothing to resume; run the same command "
        "again to start over")
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "last.safetensors").write_bytes(b"")
    assert RunInterrupted(tmp_path / "x", eval_only=False).message.endswith(
        f"continue it with: timm-csm-train --resume {tmp_path / 'x' / 'last.safetensors'}")
