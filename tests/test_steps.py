"""The method's steps (timm_csm.recipes.steps) and their two front ends: the commands and the recipe's stages give the same
bytes on the same inputs; one dataset name, one default of s, one way to name a generator."""
import json
from pathlib import Path

import pytest

from timm_csm.recipes import steps
from timm_csm.annotation import AUTO, AnnotationConfig
from timm_csm.generation.config import MixingConfig
from timm_csm.recipes import RecipeProfile, Stage, StageCache, stages


@pytest.fixture(scope="module")
def digits_generator(tmp_path_factory):
    """A saved generator folder for digits' 10 classes and 8x8 grey images, random non-trivial weights."""
    from csm_fixtures import save_tiny_generator
    from timm_csm.data import load_digits

    return save_tiny_generator(tmp_path_factory.mktemp("gen-digits"), load_digits("train").class_names,
                               {"name": "tiny-digits", "dataset": "digits"}, sample_size=8)


def _files(folder: Path, pattern: str):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.glob(pattern))}


def _parquet(dataset_folder: Path):
    return [p.read_bytes() for p in sorted(dataset_folder.glob("data/*/train-*.parquet"))]


def test_the_commands_and_the_recipe_write_the_same_bytes(digits_generator, tmp_path, monkeypatch, capsys):
    """... and each command exits 0 and ends naming its output and the next step."""
    import datasets

    from timm_csm.commands import annotate, evaluate_generator, generate
    from timm_csm.data import load_image_arrays

    monkeypatch.chdir(tmp_path)  # the command's reference encoder goes to runs/reference-digits-holdout
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-datasets")
    assert generate.main(["--generator", str(digits_generator), "--num-groups", "10", "--num-lambdas", "3",
                          "--steps", "2", "--guidance-scale", "1.0", "--groups-per-shard", "32", "--batch-groups",
                          "32", "--output", "gen"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "generated 10 groups in gen; next: timm-csm-annotate --generated gen --install")
    # a generator of random weights: the generator check is told to go on
    assert annotate.main(["--generated", "gen", "--output", "hub", "--reference-epochs", "1",
                          "--cache-dir", "protos", "--accept-poor-generator"]) == 0
    script_folder = tmp_path / "hub" / "csm-digits-aug"
    *_, saved, next_step = capsys.readouterr().out.splitlines()
    assert saved == f"saved 30 images to {script_folder}"
    assert next_step == f"next: timm-csm-train --dataset digits --loss csm --csm-dataset {script_folder}"
    assert evaluate_generator.main(["--generator", str(digits_generator), "--classifier",
                                    "runs/reference-digits-holdout", "--dataset", "digits", "--num-groups", "1",
                                    "--steps", "1", "--output", "quality.json"]) == 0
    *_, written, next_step = capsys.readouterr().out.splitlines()
    judged = json.loads((tmp_path / "quality.json").read_text())
    assert judged["pure_class_recognition"]["num_images"] == 2 and judged["num_lambdas"] == 8
    assert written == "result: quality.json"
    assert next_step.startswith("the generator is poor: ")  # random weights: it says so instead of the next step

    profile = RecipeProfile(dataset="digits", num_groups=10,
                            mixing=MixingConfig(num_lambdas=3, steps=2, guidance_scale=1.0), encoder_epochs=1,
                            annotation=AnnotationConfig(accept_poor_generator=True))
    train, test = load_image_arrays("digits", "train"), load_image_arrays("digits", "test")
    cache = StageCache(tmp_path / "run", lambda line: None)
    generated = stages.generate(cache, profile, digits_generator, train.class_names)
    encoder_dir = stages.encoder(cache, profile, train, test, lambda line: None)
    annotated = stages.annotate(cache, profile, generated, encoder_dir, train)
    recipe_folder = stages.csm_dataset_folder(annotated, profile.dataset)

    assert _files(tmp_path / "gen", "**/*.parquet") == _files(generated.folder, "**/*.parquet") != {}
    assert (tmp_path / "gen" / "plan.json").read_bytes() == (generated.folder / "plan.json").read_bytes()
    assert script_folder.name == recipe_folder.name == "csm-digits-aug"
    assert _parquet(script_folder) == _parquet(recipe_folder) != []
    card = (recipe_folder / "README.md").read_text()  # one provenance: the plan, the choice of s, the package
    assert "maximum likelihood of the true class" in card and "tiny-digits" in card and "timm-csm" in card


def test_one_dataset_name_for_every_spelling_of_a_dataset(tmp_path):
    for dataset in ("fashion_mnist", "zalando-datasets/fashion_mnist", "fashion-mnist"):
        assert steps.csm_dataset_name(dataset) == "csm-fmnist-aug"
    assert steps.csm_dataset_name("tiny_imagenet") == steps.csm_dataset_name("zh-plus/tiny-imagenet")
    # a recipe stage written under the earlier name of a Hub id still gives its dataset to the training stages
    stage = Stage("annotated", tmp_path / "annotated-0", {}, done=True)
    (stage.folder / "csm-fashion_mnist-aug").mkdir(parents=True)
    assert stages.csm_dataset_folder(stage, "zalando-datasets/fashion_mnist").name == "csm-fashion_mnist-aug"
    (stage.folder / "csm-fmnist-aug").mkdir()
    assert stages.csm_dataset_folder(stage, "zalando-datasets/fashion_mnist").name == "csm-fmnist-aug"


def test_the_default_of_s_is_the_papers_value_where_it_published_one():
    assert AnnotationConfig().resolved("cifar100").s == 2.3 and AnnotationConfig().resolved("uoft-cs/cifar10").s == 4.0
    assert AnnotationConfig().resolved("fashion_mnist").s == AUTO
    assert AnnotationConfig(s="auto").resolved("cifar10").s == AUTO
    assert AnnotationConfig(s="1.5").resolved("digits").s == 1.5
    # the recipe keys the encoder by the same choice: held-out images only where s is chosen on them
    assert "held_out" in stages.encoder_config(RecipeProfile())
    assert "held_out" not in stages.encoder_config(RecipeProfile(dataset="cifar10"))


def test_a_generator_is_a_folder_a_pickle_or_a_shipped_name(tiny_generator, tmp_path):
    shipped = steps.shipped_generator("fashion_mnist")
    assert shipped is not None and steps.resolve_generator("fmnist") == shipped == steps.shipped_generator("fmnist")
    assert steps.resolve_generator(tiny_generator) == tiny_generator
    with pytest.raises(FileNotFoundError, match="'absent' does not exist; give an NVlabs EDM network pickle.*; or a "
                                                r"generator folder \(model_index.json.*shipped generator \(fmnist\)"):
        steps.resolve_generator("absent")
    with pytest.raises(FileNotFoundError, match="holds no generator"):
        steps.resolve_generator(tmp_path)  # a folder, but not a generator's
    (tmp_path / "last.safetensors").write_bytes(b"")  # a generator still training
    with pytest.raises(FileNotFoundError, match="has not finished training.*timm-csm-train-generator command resumes"):
        steps.resolve_generator(tmp_path)
    with pytest.raises(FileNotFoundError, match="absent.pkl"):
        steps.resolve_generator(tmp_path / "absent.pkl")
    with pytest.raises(ValueError, match="pure noise only"):
        steps.check_mixing_options("x.pkl", MixingConfig(strength=0.5))
    steps.check_mixing_options(tmp_path, MixingConfig(guidance_scale=2.0, scheduler="dpm", strength=0.5))  # any


def test_the_generated_folder_names_its_real_dataset(tmp_path):
    (tmp_path / "plan.json").write_text(json.dumps({"generator": {"dataset": "digits"}}))
    assert steps.generated_dataset(tmp_path) == "digits"
    (tmp_path / "plan.json").write_text(json.dumps({"generator": {}}))
    assert steps.generated_dataset(tmp_path) == "fashion_mnist"


def test_a_generator_trains_at_the_real_images_size(tmp_path):
    from timm_csm.data import load_digits

    digits = load_digits("train").subset(range(32))  # 8x8 grey; the smoke profile is made for 28x28
    steps.train_generator_folder(digits, tmp_path / "gen", "smoke", steps=1, meta={"dataset": "digits"},
                                 log=lambda line: None)
    unet = json.loads((tmp_path / "gen" / "unet" / "config.json").read_text())
    assert (unet["sample_size"], unet["in_channels"]) == (8, 1)
    pipe = steps.load_mixing_pipeline(tmp_path / "gen", MixingConfig(steps=1), device="cpu")
    assert pipe.class_names == digits.class_names and pipe.provenance["dataset"] == "digits"


def test_train_generator_exits_0_with_a_loadable_generator(tmp_path, capsys):
    from timm_csm.commands import train_generator

    assert train_generator.main(["--dataset", "digits", "--profile", "smoke", "--steps", "1", "--max-train-samples",
                                 "16", "--no-grid", "--output", str(tmp_path / "generator")]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith(f"generator saved in {tmp_path / 'generator'} (") and "; next, measure it: " in last
    assert steps.load_mixing_pipeline(tmp_path / "generator", MixingConfig(steps=1)).unet.config.sample_size == 8
