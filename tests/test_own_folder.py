"""A folder of one's own through the method (docs/own_folder.md): a flat ``<class>/*.png`` folder of digits through
every command in order, and through the pipeline, which holds out one test split for every stage."""
import json

import numpy as np
import pytest

from timm_csm.data import load_image_arrays


def write_digits_folder(root, rows):
    """scikit-learn's 8x8 digits ``rows`` as grey PNGs ``root/<digit>/<row>.png``; returns ``root``."""
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    for i in rows:
        folder = root / str(digits.target[i])
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray((digits.images[i] * 255 / 16).round().astype(np.uint8)).save(folder / f"{i}.png")
    return root


@pytest.fixture
def flat(tmp_path, monkeypatch):
    """A flat folder of 150 digits and a folder of 40 others kept apart, in a working directory of their own (the
    commands' default folders are under runs/), with a datasets cache of its own (installed CSM datasets)."""
    import datasets

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-datasets")
    return write_digits_folder(tmp_path / "my_digits", range(150)), write_digits_folder(tmp_path / "kept", range(150, 190))


def test_a_flat_folder_through_every_command_in_order(flat, capsys):
    from timm_csm.commands import annotate, evaluate_generator, generate, train_generator
    from timm_csm.training import run
    from timm_csm.training import parse_args

    folder, kept = (str(p.name) for p in flat)
    train_generator.main(["--profile", "smoke", "--dataset", folder, "--output", "runs/gen", "--steps", "3",
                          "--checkpoint-every", "2", "--no-grid"])
    out = capsys.readouterr()
    start = [line for line in out.out.splitlines() if line.startswith("generator: ")]
    assert len(start) == 1 and "150 images of 10 classes at 1x8x8" in start[0]
    for shown in ("AdamW lr 0.001", "warm-up over 1 steps", "EMA decay 0.999", "every 2 steps and every 2 min"):
        assert shown in start[0], shown
    assert out.out.strip().splitlines()[-1] == (
        "generator saved in runs/gen (model_index.json, unet/, scheduler/); next, measure it: "
        "timm-csm-evaluate-generator --generator runs/gen --dataset my_digits, then generate groups: "
        "timm-csm-generate --generator runs/gen --num-groups 900 --output runs/generated")
    assert "Downloading" not in out.out + out.err
    assert json.loads(open("runs/gen/model_index.json").read())["metadata"]["name"] == "timm-csm-my-digits-ddpm"

    # the toy generator makes noise: the generator check says so before any generation, with the annotation's
    # recogniser and thresholds ...
    evaluate_generator.main(["--generator", "runs/gen", "--dataset", folder, "--num-groups", "5", "--num-lambdas",
                             "3", "--steps", "2"])
    out = capsys.readouterr().out
    result = json.loads(out[out.index("{"):out.rindex("}") + 1])
    recognition = result["pure_class_recognition"]
    assert recognition["num_images"] == 10 and recognition["chance"] == 0.1 and result["num_groups"] == 5
    assert result["real_images"] == "the held-out tenth of the training split"
    assert result["real_recognition"]["by"] == "nearest real-class prototype"
    assert result["poor"] and result["verdict"].startswith("poor: ")
    assert "training the reference classifier into runs/reference-my-digits-holdout" in out
    verdict = out.strip().splitlines()[-1]
    assert verdict.startswith(f"the generator is {result['verdict']}; timm-csm-annotate would stop on its groups")

    generate.main(["--generator", "runs/gen", "--num-groups", "10", "--num-lambdas", "3", "--steps", "2",
                   "--output", "runs/generated"])
    # ... and the annotation's gate agrees on the same generator: no dataset is built, one line and exit status 2
    assert annotate.main(["--generated", "runs/generated", "--output", "runs/hub", "--install"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("timm-csm-annotate: error: the generator is poor: ")
    assert "--accept-poor-generator" in err and len(err) < 400 and not (flat[0].parent / "runs" / "hub").exists()
    kinds = [("recognised" in line, "groups flagged" in line) for line in (result["verdict"], err)]
    assert kinds[0] == kinds[1] and "nearest real-class prototype" in result["verdict"]
    annotate.main(["--generated", "runs/generated", "--output", "runs/hub", "--install", "--accept-poor-generator"])
    out = capsys.readouterr().out
    assert "reference encoder: reusing runs/reference-my-digits-holdout" in out  # the one evaluate-generator trained
    assert "WARNING: the generator is poor" in out and "!" * 100 in out

    trained = run(parse_args(["--dataset", folder, "--model", "small_cnn", "--loss", "csm", "--csm-dataset",
                              "csm-my-digits-aug", "--epochs", "1", "-b", "16", "--lr", "0.05", "--no-progress",
                              "--output", "runs/train", "--experiment", "csm"]))
    assert trained["test"] is None and trained["temperature"] is not None
    scored = run(parse_args(["--eval-only", "--checkpoint", "runs/train/csm/model_best.safetensors", "--dataset",
                             kept, "--no-progress"]))
    assert (scored["n_test"], scored["n_val"]) == (40, 0) and scored["output_dir"] == "runs/train/csm/eval-kept"
    assert scored["temperature"] == trained["temperature"] and scored["test"]["post_ts"] is not None


def test_the_pipeline_holds_out_one_test_split_of_a_flat_folder_for_every_stage(flat, capsys):
    """The pipeline on a flat folder: one seeded test split, left out by every stage; a poor generator stops it
    before the CSM dataset is built, and --accept-poor-generator continues from the finished stages."""
    import dataclasses

    from safetensors.torch import load_file
    from timm_csm.data.sources import hold_out_test_split
    from timm_csm.commands.pipeline import main
    from timm_csm.recipes import get_profile, run_recipe
    from timm_csm.recipes.steps import PoorGeneratorError

    folder = flat[0].name
    smoke = get_profile("smoke")
    strict = dataclasses.replace(smoke, dataset=folder, test_fraction=0.2,
                                 annotation=dataclasses.replace(smoke.annotation, accept_poor_generator=False))
    with pytest.raises(PoorGeneratorError, match="the generator is poor: .*--accept-poor-generator"):
        run_recipe(strict, "runs/pipe", log=lambda line: None)
    pipe = flat[0].parent / "runs" / "pipe"
    assert not list(pipe.glob("annotated-*/DONE.json")) and not list(pipe.glob("*/csm-*-aug"))
    capsys.readouterr()
    main(["--profile", "smoke", "--dataset", folder, "--output", "runs/pipe", "--test-fraction", "0.2"])
    assert capsys.readouterr().out.count("done already") == 4  # generator, generated, encoder, quality
    report = open("runs/pipe/report.md").read()
    assert "| CSM | after" in report
    train, test = hold_out_test_split(load_image_arrays(folder), 0.2, 0)
    assert (len(train), len(test)) == (120, 30)
    generator = json.loads(next(flat[0].parent.glob("runs/pipe/generator-*/model_index.json")).read_text())
    assert generator["metadata"]["name"] == "timm-csm-my-digits-ddpm"
    assert generator["metadata"]["num_train_images"] == 120 and "learned from 120 real images" in report
    encoder = json.loads(next(flat[0].parent.glob("runs/pipe/encoder-*/encoder/config.json")).read_text())
    assert encoder["results"]["test_accuracy"] is not None
    for loss in ("ce", "csm"):
        run_dir = next(flat[0].parent.glob(f"runs/pipe/train-{loss}-*"))
        results = json.loads((run_dir / "results.json").read_text())
        assert (results["n_test"], results["n_train"] + results["n_val"]) == (30, 120)
        scored = load_file(str(run_dir / "test_predictions.safetensors"))["targets"].numpy()
        assert np.array_equal(scored, test.labels)  # the images the recipe held out, in their order


def test_the_pipeline_uses_a_generator_folder_of_train_generator_as_it_is(flat, capsys):
    """--generator <a timm-csm-train-generator folder>: the pipeline generates from it without training a generator,
    and says that the generator may have seen its held-out test images; a value that names no generator is one line
    listing what is accepted, with nothing written."""
    from timm_csm.commands import train_generator
    from timm_csm.commands.pipeline import main

    folder = flat[0].name
    assert train_generator.main(["--profile", "smoke", "--dataset", folder, "--output", "runs/gen", "--steps", "1",
                                 "--no-grid"]) == 0
    weights = (flat[0].parent / "runs/gen/unet/diffusion_pytorch_model.safetensors").read_bytes()
    capsys.readouterr()
    assert main(["--profile", "smoke", "--dataset", folder, "--generator", "runs/gen", "--output", "runs/pipe"]) == 0
    out = capsys.readouterr().out
    assert "[generator] diffusers generator runs/gen, trained on 150 images of my_digits: used as it is" in out
    assert "it may have seen test images" in out  # it learned from the whole folder, the pipeline holds out 15
    pipe = flat[0].parent / "runs" / "pipe"
    assert not list(pipe.glob("generator-*")) and (pipe / "report.md").is_file()
    plan = json.loads(next(pipe.glob("generated-*/plan.json")).read_text())
    assert plan["generator"]["name"] == "timm-csm-my-digits-ddpm"
    assert (flat[0].parent / "runs/gen/unet/diffusion_pytorch_model.safetensors").read_bytes() == weights

    for given, expected in (("nothing", "generator 'nothing' does not exist; give 'shipped'; or a generator-training "
                                        "profile, trained here (cifar10, cifar100, digits, fmnist, smoke); or an "
                                        "NVlabs EDM network pickle"),
                            (folder, f"generator '{folder}' holds no generator; give 'shipped'")):
        assert main(["--profile", "smoke", "--dataset", folder, "--generator", given, "--output", "runs/bad"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and expected in err[0] and "a generator folder (model_index.json" in err[0], err
        assert not (flat[0].parent / "runs" / "bad").exists()
