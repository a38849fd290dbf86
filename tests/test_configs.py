"""Each default of the annotation and the generation is written once, on a field of
:class:`~timm_csm.annotation.AnnotationConfig` or :class:`~timm_csm.generation.MixingConfig`: the commands' flags,
the recipe profiles and the library functions below them all read it there."""
import dataclasses
import inspect

import pytest

from timm_csm.recipes import steps
from timm_csm.annotation import AUTO, AnnotationConfig, annotate_generated, holdout_split, parse_s
from timm_csm.annotation.checks import annotation_report
from timm_csm.commands import annotate, generate
from timm_csm.generation import MixingConfig, generate_to_folder, lambda_grid, make_plan
from timm_csm.options import add_options, option_fields, options_from_namespace
from timm_csm.recipes import RecipeProfile, get_profile
from timm_csm.recipes.profiles import RECIPE_SHARDS


def _parser_defaults(parser):
    return {a.dest: a.default for a in parser._actions}


@pytest.mark.parametrize("command, config", [(annotate, AnnotationConfig), (generate, MixingConfig)])
def test_a_commands_flags_are_its_configs_fields(command, config):
    parser = command.build_parser()
    defaults = _parser_defaults(parser)
    for f in option_fields(config):
        assert defaults[f.name] == getattr(config(), f.name), f.name
        action = next(a for a in parser._actions if a.dest == f.name)
        assert action.help == f.metadata["help"], f.name
    # the parsed flags are the configuration, and a flag reaches its field
    args = parser.parse_args(["--generated", "g"] if command is annotate else ["--generator", "g", "--num-groups",
                                                                               "1", "--output", "o"])
    assert options_from_namespace(config, args) == config()


def test_the_command_and_the_recipe_read_the_same_defaults():
    recipe, mixing = RecipeProfile(), MixingConfig()
    # the recipe holds the command's configurations: its own sampler steps and shards, the rest the command's
    assert recipe.mixing == dataclasses.replace(mixing, steps=recipe.mixing.steps, **RECIPE_SHARDS)
    cli = options_from_namespace(AnnotationConfig, annotate.build_parser().parse_args(["--generated", "g"]))
    assert recipe.annotation == cli
    # a profile that changes a setting hands it on, and its seed is its annotation's
    demo = get_profile("demo")
    assert (demo.mixing.num_lambdas, demo.mixing.steps, demo.mixing.timestep_spacing,
            demo.annotation.drop_flagged) == (4, 4, "trailing", True)
    assert dataclasses.replace(demo, seed=3).annotation.seed == 3
    assert RecipeProfile(mixing=MixingConfig(groups_per_shard=5)).mixing.groups_per_shard == 32
    with pytest.raises(ValueError, match="annotation an AnnotationConfig"):
        RecipeProfile(annotation={"s": 4.0})


def test_the_sampler_steps_have_one_owner_each():
    from timm_csm.commands import evaluate_generator
    from timm_csm.generation import SemanticMixingPipeline, sample_with_scheduler
    from timm_csm.generation.quality import QUALITY_SAMPLER_STEPS
    from timm_csm.generation.sampling import DEFAULT_INFERENCE_STEPS

    # a quality measurement and the recipe's groups: the same sampler
    assert evaluate_generator.build_parser().get_default("steps") == QUALITY_SAMPLER_STEPS == RecipeProfile(
        ).mixing.steps
    # a generation that names no steps: the generator's own (None), a folder's being the pipeline's default
    assert MixingConfig().steps is None and generate.build_parser().get_default("steps") is None
    assert _default(SemanticMixingPipeline.__init__, "num_inference_steps") == DEFAULT_INFERENCE_STEPS
    assert _default(sample_with_scheduler, "num_inference_steps") == DEFAULT_INFERENCE_STEPS


def _default(function, parameter):
    return inspect.signature(function).parameters[parameter].default


def test_the_library_functions_default_to_the_configs():
    annotation, mixing = AnnotationConfig(), MixingConfig()
    for name, value in annotation.annotate_kwargs().items():
        assert _default(annotate_generated, name) == value, name
    assert _default(holdout_split, "fraction") == annotation.holdout_fraction
    assert _default(holdout_split, "seed") == annotation.seed
    assert _default(annotation_report, "min_spearman") == annotation.min_spearman
    assert _default(make_plan, "groups_per_shard") == mixing.groups_per_shard
    assert _default(generate_to_folder, "batch_groups") == mixing.batch_groups
    assert len(lambda_grid()) == mixing.num_lambdas


def test_s_none_means_the_papers_value_where_published_else_auto():
    config = AnnotationConfig()
    assert config.resolved("cifar100").s == 2.3 and not config.holds_out("cifar100")
    assert config.resolved("fashion_mnist").s == AUTO and config.holds_out("fashion_mnist")
    assert config.resolved("uoft-cs/cifar10").s == 4.0
    assert AnnotationConfig(holdout_encoder=True).holds_out("cifar100")
    assert AnnotationConfig(s="3").s == 3.0 and AnnotationConfig(s="auto").resolved("cifar100").s == AUTO


@pytest.mark.parametrize("bad", ["fast", "0", -1.0, float("nan"), float("inf"), True])
def test_s_is_read_once_a_positive_number_or_auto(bad):
    with pytest.raises(ValueError, match="s must be a positive number or 'auto'"):
        AnnotationConfig(s=bad)
    with pytest.raises(ValueError, match="s must be a positive number or 'auto'"):
        parse_s(bad)
    assert parse_s(None) is None and parse_s("auto") == AUTO and parse_s("2.3") == 2.3


def test_add_options_builds_a_flag_per_field():
    import argparse

    parser = add_options(argparse.ArgumentParser(), AnnotationConfig, skip=("label_mode",))
    args = parser.parse_args(["--val-fraction", "0.25", "--drop-flagged", "--s", "auto"])
    config = options_from_namespace(AnnotationConfig, args)
    assert (config.holdout_fraction, config.drop_flagged, config.s, config.label_mode) == (0.25, True, "auto",
                                                                                          "projection")
    with pytest.raises(SystemExit):
        parser.parse_args(["--label-mode", "generation"])  # skipped: the field keeps its default
