"""The ``full`` recipe rehearsed end to end on the CPU: every stage of the paper's CIFAR-100 recipe at toy size, on
the same code path as the GPU run (only the sizes and the three files differ).

The files stand in for the user's: a CIFAR-100 dataset in the Hub's layout (``uoft-cs/cifar100``: columns ``img``,
``fine_label``, ``coarse_label``; its class names, which spell class 26 ``cra``; train and test splits), an NVlabs
EDM network pickle of a tiny conditional DDPM++ at 32 px for 100 classes, and the weights file of a shrunk
``ViT-B-32-quickgelu`` open_clip model.
"""
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from test_edm import _random_net, write_edm_pickle

from timm_csm.commands.pipeline import build_parser, main, profile_from_args
from timm_csm.generation.edm import EDMPrecond
from timm_csm.generation.edm.labels import CIFAR100_CLASSES
from timm_csm.recipes import StageCache, get_profile, rehearsal_profile, stages
from timm_csm.recipes.profiles import REHEARSAL_SIZES, REHEARSAL_VAL_FRACTION

# the Hub's CIFAR-100 (the loader of huggingface/datasets): fine names with class 26 spelled "cra", the 20 coarse
# names and each fine class's coarse class (Krizhevsky, 2009)
HUB_FINE = [("cra" if n == "crab" else n) for n in CIFAR100_CLASSES]
HUB_COARSE = ["aquatic_mammals", "fish", "flowers", "food_containers", "fruit_and_vegetables",
              "household_electrical_devices", "household_furniture", "insects", "large_carnivores",
              "large_man-made_outdoor_things", "large_natural_outdoor_scenes", "large_omnivores_and_herbivores",
              "medium_mammals", "non-insect_invertebrates", "people", "reptiles", "small_mammals", "trees",
              "vehicles_1", "vehicles_2"]
FINE_TO_COARSE = [4, 1, 14, 8, 0, 6, 7, 7, 18, 3, 3, 14, 9, 18, 7, 11, 3, 9, 7, 11, 6, 11, 5, 10, 7, 6, 13, 15, 3,
                  15, 0, 11, 1, 10, 12, 14, 16, 9, 11, 5, 5, 19, 8, 8, 15, 13, 14, 17, 18, 10, 16, 4, 17, 4, 2, 0, 17,
                  4, 18, 17, 10, 3, 2, 12, 12, 16, 12, 1, 9, 19, 2, 10, 0, 1, 16, 12, 9, 13, 15, 13, 16, 19, 2, 4, 6,
                  19, 5, 5, 8, 19, 18, 1, 2, 15, 6, 0, 17, 8, 14, 13]
# the EDM CIFAR networks' DDPM++ (NVlabs/edm train.py --arch=ddpmpp, EDM preconditioning), shrunk
TINY_DDPMPP = dict(img_resolution=32, img_channels=3, label_dim=100, model_type="SongUNet", model_channels=4,
                   channel_mult=[1, 2, 2], channel_mult_emb=2, num_blocks=1, attn_resolutions=[8], dropout=0.13,
                   augment_dim=9, embedding_type="positional", encoder_type="standard", decoder_type="standard",
                   channel_mult_noise=1, resample_filter=[1, 1])
TINY_CLIP = "ViT-B-32-quickgelu-tiny"


def _split(per_class: int, seed: int):
    """``per_class`` 32x32 RGB images of each class: a class colour plus noise, so that classes differ."""
    import datasets

    rng = np.random.default_rng(seed)
    colours = np.random.default_rng(0).integers(30, 226, size=(100, 3))
    labels = np.repeat(np.arange(100), per_class)
    noise = rng.normal(0, 25, size=(len(labels), 32, 32, 3))
    images = np.clip(colours[labels][:, None, None, :] + noise, 0, 255).astype(np.uint8)
    features = datasets.Features({"img": datasets.Image(), "fine_label": datasets.ClassLabel(names=HUB_FINE),
                                  "coarse_label": datasets.ClassLabel(names=HUB_COARSE)})
    return datasets.Dataset.from_dict({"img": list(images), "fine_label": labels.tolist(),
                                       "coarse_label": [FINE_TO_COARSE[y] for y in labels]}, features=features)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The three files of the rehearsal: dataset folder, EDM pickle, open_clip weights (its config registered)."""
    import open_clip
    from safetensors.torch import save_file

    root = tmp_path_factory.mktemp("full")
    dataset = root / "cifar100"  # the Hub's parquet layout, as push_to_hub writes it
    for split, per_class, seed in (("train", 2, 1), ("test", 1, 2)):
        _split(per_class, seed).to_parquet(str(dataset / "data" / f"{split}-00000-of-00001.parquet"))
    pickle = write_edm_pickle(root / "edm-cifar100-cond-32x32-cond-vp.pkl", _random_net(EDMPrecond, TINY_DDPMPP),
                              TINY_DDPMPP)
    cfg = open_clip.get_model_config("ViT-B-32-quickgelu")
    cfg.update(embed_dim=32, vision_cfg=dict(image_size=32, layers=1, width=32, patch_size=8, head_width=16),
               text_cfg=dict(cfg["text_cfg"], context_length=16, width=32, heads=2, layers=1))
    (root / f"{TINY_CLIP}.json").write_text(json.dumps(cfg))
    open_clip.add_model_config(root / f"{TINY_CLIP}.json")
    torch.manual_seed(0)
    clip = root / "tiny_clip.safetensors"
    save_file(open_clip.create_model(TINY_CLIP).state_dict(), str(clip))
    return {"dataset": str(dataset), "generator": str(pickle), "encoder": f"open_clip:{TINY_CLIP}:{clip}"}


def _argv(files, output):
    return ["--profile", "full", "--rehearse", "--output", str(output)] + [
        a for k in ("dataset", "generator", "encoder") for a in (f"--{k}", files[k])]


def test_the_rehearsal_differs_from_full_only_in_sizes_and_files(files, tmp_path):
    full = get_profile("full")
    rehearsal = profile_from_args(build_parser().parse_args(_argv(files, tmp_path)))
    assert rehearsal == rehearsal_profile(dataclasses.replace(full, **files))
    for field in dataclasses.fields(full):
        got, want = getattr(rehearsal, field.name), getattr(full, field.name)
        if field.name in REHEARSAL_SIZES:
            assert got == REHEARSAL_SIZES[field.name]
        elif field.name in files:
            assert got == files[field.name] != want
        elif field.name == "train_extra":  # the milestones keep their share of the epochs: 80, 120 of 200 -> 1, 1 of 1
            assert want["decay_milestones"] == [80, 120] and "val_fraction" not in want
            assert got == dict(want, decay_milestones=[1, 1], val_fraction=REHEARSAL_VAL_FRACTION)
        elif field.name == "mixing":  # its sampler steps are a size
            assert got == dataclasses.replace(want, steps=REHEARSAL_SIZES["sampler_steps"]) != want
        elif field.name == "annotation":  # a generator of 2 steps is poor: the check warns
            assert got == dataclasses.replace(want, accept_poor_generator=True) != want
        else:
            assert got == want, field.name


def test_full_runs_end_to_end_at_toy_size(files, tmp_path):
    out = tmp_path / "run"
    assert main(_argv(files, out)) == 0
    done = sorted(p.name.rsplit("-", 1)[0] for p in out.iterdir() if (p / "DONE.json").exists())
    # the EDM pickle needs no generator stage and open_clip no encoder; the quality stage needs the reference encoder
    assert done == ["annotated", "generated", "train-ce", "train-csm"]
    report = (out / "report.md").read_text()
    for row in ("| CE | before", "| CE | after", "| CSM | before", "| CSM | after"):
        assert row in report
    assert "Generator quality" not in report and (out / "groups.png").stat().st_size > 1000

    plan = json.loads(next(out.glob("generated-*/plan.json")).read_text())
    assert plan["class_names"] == HUB_FINE and plan["num_groups"] == 100 and len(plan["lambdas"]) == 8
    assert plan["generator"]["name"] == "edm-cifar100-cond-32x32-cond-vp" and plan["generator"]["steps"] == 2
    assert plan["generator"]["sampler"].startswith("edm heun") and plan["generator"]["guidance_scale"] == 1.0

    from timm_csm.hub import load_csm_dataset

    csm = load_csm_dataset(str(next(out.glob("annotated-*/csm-cifar100-aug"))))["train"]
    assert csm.features["label"].names == HUB_FINE and len(csm) == 800
    assert json.loads(next(out.glob("annotated-*/annotation.json")).read_text())["s"] == 2.3

    for loss in ("ce", "csm"):
        res = json.loads(next(out.glob(f"train-{loss}-*/results.json")).read_text())
        assert res["loss"] == loss and res["model"] == "resnet50_cifar" and 0.0 <= res["test"]["pre_ts"]["ece"] <= 1.0
        assert res["n_val"] >= 100 and res["temperature"] is not None  # temperature scaling over 100 classes ran


def test_quality_measures_an_edm_pickle_with_the_reference_encoder(files, tmp_path):
    """With the reference encoder in place of CLIP, the quality stage samples the EDM pickle's pure endpoints."""
    from timm_csm.data import load_image_arrays

    profile = rehearsal_profile(dataclasses.replace(get_profile("full"), **{**files, "encoder": "reference"}),
                                num_groups=4)
    cache, log = StageCache(tmp_path, lambda line: None), lambda line: None
    train, test = load_image_arrays(profile.dataset, "train"), load_image_arrays(profile.dataset, "test")
    assert train.class_names == HUB_FINE
    generated = stages.generate(cache, profile, stages.generator(cache, profile, train, log), train.class_names)
    encoder_dir = stages.encoder(cache, profile, train, test, log)
    q = stages.quality(cache, profile, Path(files["generator"]), generated, encoder_dir, train.class_names)
    assert q["num_images"] == 8 and 0.0 <= q["accuracy"] <= 1.0 and q["guidance_scale"] == 1.0
