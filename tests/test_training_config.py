"""TrainConfig: one typed field per flag of timm-csm-train, built from the command line, a dict, YAML or Python."""
import argparse
import dataclasses
import typing

import pytest
import yaml

from timm_csm.options import comma_separated
from timm_csm.training import TrainConfig, build_parser, parse_args, resolve_config
from timm_csm.training.config import option_names, option_types


def test_every_flag_is_a_field_with_its_default_and_type():
    parser = build_parser()
    actions = {a.dest: a for a in parser._actions if a.dest != "help"}
    assert list(actions) == list(option_names())  # same options, same order (args.yaml keeps its key order)
    defaults = TrainConfig().options()
    hints = typing.get_type_hints(TrainConfig)
    for name, action in actions.items():
        one_value = action.type is comma_separated  # a list given as one comma-separated value ("a,b" in --help)
        assert (comma_separated(action.default) if one_value else action.default) == defaults[name], name
        kind, many = option_types()[name]
        if kind is bool:
            assert action.nargs == 0, name  # a switch
            continue
        if kind in (int, float):
            assert action.type is kind, name
        assert (action.nargs in ("+", "*") or isinstance(action.nargs, int) or one_value) == many, name
        value = defaults[name]
        if value is not None:  # the default has the annotated type (an int stands for a float, as in PEP 484)
            values = value if many else [value]
            accepted = (int, float) if kind is float else kind
            assert all(isinstance(v, accepted) for v in values), (name, value, hints[name])


def test_parsed_flags_are_typed_and_explicit():
    config = parse_args(["--dataset", "digits", "-b", "16", "--lr", "0.05", "--decay-milestones", "3", "5"])
    assert isinstance(config, TrainConfig)
    assert (config.batch_size, config.lr, config.decay_milestones) == (16, 0.05, [3, 5])
    assert config.explicit == {"dataset", "batch_size", "lr", "decay_milestones"}
    assert parse_args([]).options() == TrainConfig().options()


def test_a_decay_beyond_epochs_is_scaled_from_the_defaults_and_refused_when_given():
    """docs/own_folder.md's ``--epochs 60 --lr 0.1`` kept the milestones 80 and 120 of 200 epochs: lr 0.1 to the
    end. Defaults are scaled to the run (one line says so); values the user gave are refused."""
    from timm_csm.training.optim import fit_decay_to_epochs

    documented = parse_args(["--epochs", "60", "--lr", "0.1"])
    assert fit_decay_to_epochs(documented) == (
        "the default --decay-milestones 80 120 (of 200 epochs) lies beyond --epochs 60: scaled to 24 36, the same "
        "share of the run (give --decay-milestones to choose)")
    assert documented.decay_milestones == [24, 36]
    step = parse_args(["--sched", "step", "--epochs", "30"])
    assert "--decay-epochs 100 (of 200 epochs)" in fit_decay_to_epochs(step) and step.decay_epochs == 15
    for argv in ([], ["--epochs", "120"], ["--epochs", "10", "--sched", "cosine"]):  # inside the run, or no decay
        config = parse_args(argv)
        assert fit_decay_to_epochs(config) is None and config.options() == parse_args(argv).options()
    for argv, flag in ((["--epochs", "60", "--decay-milestones", "30", "80"], "--decay-milestones 30 80"),
                       (["--sched", "step", "--epochs", "30", "--decay-epochs", "40"], "--decay-epochs 40")):
        with pytest.raises(ValueError, match=f"^{flag} lies beyond --epochs (60|30): the learning rate would never"):
            fit_decay_to_epochs(parse_args(argv))


def test_a_config_built_in_python_counts_what_differs_from_the_defaults():
    config = TrainConfig(dataset="digits", epochs=2, lr=0.1)  # lr is the default: not explicit
    assert config.explicit == {"dataset", "epochs"}
    assert TrainConfig(epochs=3, explicit={"epochs", "lr"}).explicit == frozenset({"epochs", "lr"})


def test_from_dict_names_the_closest_option_of_an_unknown_key():
    config = TrainConfig.from_dict({"batch-size": 8, "--model": "small_cnn", "loss_kwargs": {"margin": 6}})
    assert (config.batch_size, config.model, config.loss_kwargs) == (8, "small_cnn", [("margin", 6)])
    assert config.explicit == {"batch_size", "model", "loss_kwargs"}
    with pytest.raises(ValueError, match=r"^unknown option\(s\) in the configuration: 'bach_size' \(did you mean "
                                         r"'batch_size'\?\)$"):
        TrainConfig.from_dict({"bach_size": 8})
    with pytest.raises(ValueError, match="'config'"):  # the file of a command line, not an option of a run
        TrainConfig.from_dict({"config": "c.yaml"})


def test_from_yaml_reads_as_the_command_line_does(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model: small_cnn\nbatch-size: 16\nlr: 1e-3\nloss_kwargs: {margin: 6}\nmean: [0.5]\n")
    config = TrainConfig.from_yaml(path)
    assert config.lr == 0.001 and isinstance(config.lr, float)  # YAML reads 1e-3 as a string; the flag's type parses it
    assert config == dataclasses.replace(parse_args(["-c", str(path)]), config=None)
    assert config.explicit == {"model", "batch_size", "lr", "loss_kwargs", "mean"}


def test_from_yaml_reads_timm_args_yaml(tmp_path):
    path = tmp_path / "args.yaml"
    path.write_text(yaml.safe_dump({"model": "resnet18", "dataset": "hfds/cifar10", "val_split": "test",
                                    "input_size": [3, 32, 32], "clip_grad": None, "lr_noise": None}))
    with pytest.warns(UserWarning, match="lr_noise"):
        config = TrainConfig.from_yaml(path)
    assert (config.model, config.dataset, config.test_split, config.in_chans, config.img_size, config.clip_grad) == (
        "resnet18", "cifar10", "test", 3, 32, 0.0)


def test_resolve_config_gives_the_run_a_config_of_its_own():
    given = TrainConfig(dataset="digits")
    resolved = resolve_config(given)
    resolved.test_split = "test"
    assert given.test_split is None and resolved.explicit == given.explicit
    namespace = argparse.Namespace(dataset="digits", epochs=3)
    assert resolve_config(namespace).options() == TrainConfig(dataset="digits", epochs=3).options()
    assert resolve_config(namespace).explicit == {"dataset", "epochs"}
    with pytest.raises(ValueError, match="did you mean 'epochs'"):
        TrainConfig.from_namespace(argparse.Namespace(epoch=3))
    with pytest.raises(TypeError, match="TrainConfig"):
        resolve_config(["--epochs", "3"])
