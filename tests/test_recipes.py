"""Recipes: the profile registry, the stage cache (skip when done, re-run after a kill), stage keys that still
find the caches written before the recipes package (``runs/demo/<stage>-<key>/``), the EDM pickle route and the
open_clip encoder's checks, the command line's overrides."""
import contextlib
import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from timm_csm.commands.pipeline import build_parser, profile_from_args
from timm_csm.recipes import (RecipeProfile, Stage, StageCache, get_profile, list_profiles, register_profile,
                              rehearsal_profile, stage_key, stages)
from timm_csm.recipes.cache import MARKER
from timm_csm.annotation import AnnotationConfig
from timm_csm.commands.pipeline import build_parser, profile_from_args
from timm_csm.recipes.profiles import FULL_EDM_PICKLE_URL, RECIPE_MIXING

ROOT = Path(__file__).resolve().parents[1]

# A known configuration (the demo profile as first shipped, with a trained "fmnist" generator) and the folder keys
# that the main job computed for it before the recipes package existed (output folder "run", generator weights
# b"weights", whose digest is 9a129038d9a0). The annotated stage is given as it was then (its configuration
# OLD_ANNOTATED): its own key belongs to the annotation settings, which change with the annotation.
KNOWN = dict(dataset="fashion_mnist", generator="fmnist", generator_steps=None, num_groups=225,
             mixing=dataclasses.replace(RECIPE_MIXING, num_lambdas=8, steps=20, guidance_scale=None),
             encoder="reference", encoder_epochs=4, encoder_max_steps=None,
             annotation=AnnotationConfig(s=None), model="small_cnn", epochs=15, batch_size=128, lr=0.05,
             weight_decay=0.0, sched="cosine", max_train_samples=10000, max_test_samples=None, n_aug=1, seed=0,
             train_extra={"model_kwargs": {"widths": [16, 32, 64, 128, 256]}, "crop_pad": 0, "hflip": 0.0})
OLD_KEYS = {"generator": "bcff3caadb", "generated": "c79ad41b7f", "encoder": "0c6d8e1c53", "quality": "371daf07b6",
            "annotated": "25ccce37a8", "train-ce": "9fc2804ca2", "train-csm": "5a268d0217"}
# The reference encoder (and the quality measured with it) changed on purpose: with s chosen on held-out real images
# it no longer trains on them. Its folders of then were encoder-e1dd1a8d6e and quality-b42ad6716a.
RETRAINED = {"encoder": "e1dd1a8d6e", "quality": "b42ad6716a"}
OLD_ANNOTATED = {"generated": {"generator": "9a129038d9a0", "num_groups": 225, "lambdas": 8, "steps": 20,
                               "guidance": None},
                 "encoder": {"dataset": "fashion_mnist", "encoder": "reference", "epochs": 4, "max_steps": None,
                             "seed": 0},
                 "s": None}


class _DoneOnly(StageCache):
    """The real cache, failing on any stage it would run: every stage must find its old folder."""

    @contextlib.contextmanager
    def stage(self, name, config):
        with super().stage(name, config) as stage:
            assert stage.done, f"[{name}] key changed: {stage.folder.name}, was {name}-{OLD_KEYS[name]}"
            yield stage


def test_stage_keys_equal_the_keys_of_existing_caches(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    weights = Path("gen/unet/diffusion_pytorch_model.safetensors")
    weights.parent.mkdir(parents=True)
    weights.write_bytes(b"weights")
    for name, key in OLD_KEYS.items():
        folder = Path("run") / f"{name}-{key}"
        folder.mkdir(parents=True)
        (folder / MARKER).write_text("{}")
    (Path("run") / f"quality-{OLD_KEYS['quality']}" / "quality.json").write_text('{"accuracy": 0.5}')
    for loss in ("ce", "csm"):
        (Path("run") / f"train-{loss}-{OLD_KEYS[f'train-{loss}']}" / "results.json").write_text(f'{{"loss": "{loss}"}}')
    profile, log = RecipeProfile(**KNOWN), []
    cache = _DoneOnly(Path("run"), log.append)

    assert stages.generator(cache, profile, None, log.append) == Path("run") / f"generator-{OLD_KEYS['generator']}"
    generated = stages.generate(cache, profile, Path("gen"))
    for other in ({"precision": "bfloat16"}, {"scheduler": "unipc"}, {"timestep_spacing": "trailing"}):  # another set
        with pytest.raises(AssertionError, match=r"\[generated\] key changed"):
            stages.generate(cache, dataclasses.replace(profile, mixing=dataclasses.replace(profile.mixing, **other)),
                            Path("gen"))
    encoder_dir = stages.encoder(cache, profile, None, None, log.append)
    assert stages.quality(cache, profile, Path("gen"), generated, encoder_dir) == {"accuracy": 0.5}
    annotated = Stage("annotated", Path("run") / f"annotated-{OLD_KEYS['annotated']}", OLD_ANNOTATED, done=True)
    assert stage_key(annotated.config) == OLD_KEYS["annotated"]
    results = {loss: stages.train(cache, profile, loss, annotated) for loss in ("ce", "csm")}
    assert results["csm"]["loss"] == "csm" and results["ce"]["output"].endswith(OLD_KEYS["train-ce"])
    assert sum("done already" in line for line in log) == 6 and cache.timings == {}
    # with s given, the encoder still trains on the whole training split, under its key of then
    given_s = dataclasses.replace(profile, annotation=AnnotationConfig(s=4.0))
    assert stage_key(stages.encoder_config(given_s)) == RETRAINED["encoder"]


def test_a_done_stage_is_skipped_on_a_rerun(tmp_path):
    calls, log = [], []
    for _ in range(2):
        cache = StageCache(tmp_path, log.append)
        with cache.stage("work", {"n": 3}) as stage:
            if not stage.done:
                calls.append(stage.folder)
                (stage.folder / "out.txt").write_text("3")
    assert len(calls) == 1 and (calls[0] / "out.txt").read_text() == "3"
    marker = json.loads((calls[0] / MARKER).read_text())
    assert marker["config"] == {"n": 3} and marker["seconds"] >= 0 and marker["cpu_seconds"] >= 0
    assert "done already" in log[-1] and cache.timings == {}
    with StageCache(tmp_path, log.append).stage("work", {"n": 4}) as other:  # another configuration: another folder
        assert not other.done and other.folder != calls[0]


_KILLED_BODY = """
import os, signal, sys
from timm_csm.recipes import StageCache
with StageCache(sys.argv[1], print).stage("work", {"n": 1}) as stage:
    (stage.folder / "partial.txt").write_text("half")
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_stage_killed_before_its_marker_runs_again(tmp_path):
    killed = subprocess.run([sys.executable, "-c", _KILLED_BODY, str(tmp_path)], capture_output=True, text=True)
    assert killed.returncode == -9, killed.stderr[-2000:]
    with StageCache(tmp_path, lambda line: None).stage("work", {"n": 1}) as stage:
        assert not stage.done and (stage.folder / "partial.txt").read_text() == "half"  # same folder: it resumes
        (stage.folder / "partial.txt").write_text("whole")
    assert (stage.folder / MARKER).exists()


def test_a_failed_stage_writes_no_marker(tmp_path):
    cache = StageCache(tmp_path, lambda line: None)
    with pytest.raises(RuntimeError, match="broken"):
        with cache.stage("work", {}) as stage:
            raise RuntimeError("broken")
    assert stage.folder.is_dir() and not (stage.folder / MARKER).exists() and "work" not in cache.timings


def test_unknown_profile_names_the_known_ones():
    assert list_profiles() == ["demo", "full", "noaug", "smoke"] and list_profiles("s*") == ["smoke"]
    with pytest.raises(ValueError, match="unknown recipe profile 'demoo'; known profiles: demo, full, noaug, smoke; "
                                         "did you mean 'demo'"):
        get_profile("demoo")
    with pytest.raises(ValueError, match="already registered"):
        register_profile("demo", RecipeProfile())
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--profile", "demoo"])


def test_get_profile_returns_a_copy():
    demo = get_profile("demo")
    demo.train_extra["model_kwargs"]["widths"].append(512)
    assert get_profile("demo").train_extra["model_kwargs"]["widths"] == [16, 32, 64, 128, 256]
    with pytest.raises(dataclasses.FrozenInstanceError):
        demo.epochs = 1
    assert dataclasses.replace(demo, epochs=1).epochs == 1


def test_module_cli_lists_the_profiles():
    res = subprocess.run([sys.executable, "-m", "timm_csm.commands.pipeline", "--help"], capture_output=True, text=True,
                         cwd=ROOT)
    assert res.returncode == 0 and "{demo,full,noaug,smoke}" in res.stdout, res.stderr[-2000:]


def test_the_full_profile_builds_openai_clip_with_quickgelu():
    import open_clip

    model_name, pretrained = stages.recipe_encoder(get_profile("full").encoder)[1].values()
    assert pretrained == "openai" and pretrained in open_clip.list_pretrained_tags_by_model(model_name)
    assert open_clip.get_model_config(model_name)["quick_gelu"] is True
    assert open_clip.get_pretrained_cfg(model_name, pretrained)["quick_gelu"] is True


def test_the_full_profile_samples_the_papers_cifar100_edm_network():
    full = get_profile("full")
    assert full.generator == FULL_EDM_PICKLE_URL.rsplit("/", 1)[1] == "edm-cifar100-cond-32x32-cond-vp.pkl"
    assert FULL_EDM_PICKLE_URL.startswith("https://huggingface.co/wzekai99/DM-Improves-AT/")
    assert (full.mixing.steps, full.mixing.guidance_scale, full.mixing.scheduler) == (25, None, "ddim")
    # the released CIFAR-100 run: seeds 0-19799, 8 lambdas each
    assert full.num_groups * full.mixing.num_lambdas == 19800 * 8 == 158400
    # the paper's s of CIFAR-100, kept when --dataset names a copy of it by another name (a folder)
    assert (full.dataset, full.model, full.epochs, full.annotation.s) == ("cifar100", "resnet50_cifar", 200, 2.3)


def _tiny_edm_pickle(path, seed=0):
    from test_edm import _random_net, write_edm_pickle

    from timm_csm.generation.edm import EDMPrecond

    kwargs = dict(img_resolution=8, img_channels=3, label_dim=4, model_type="SongUNet", model_channels=4,
                  channel_mult=[1, 2], channel_mult_emb=2, num_blocks=1, attn_resolutions=[4])
    return write_edm_pickle(path, _random_net(EDMPrecond, kwargs, seed), kwargs)


def test_an_edm_pickle_generates_keyed_by_its_file_digest(tmp_path):
    profile = RecipeProfile(generator=str(_tiny_edm_pickle(tmp_path / "a.pkl")), num_groups=3,
                            mixing=dataclasses.replace(RECIPE_MIXING, num_lambdas=3, steps=2))
    names = ["w", "x", "y", "z"]
    log = []
    cache = StageCache(tmp_path / "run", log.append)
    path = stages.generator(cache, profile, None, log.append)
    assert path == Path(profile.generator) and list((tmp_path / "run").glob("generator-*")) == []
    first = stages.generate(cache, profile, path, names)
    plan = json.loads((first.folder / "plan.json").read_text())
    assert plan["class_names"] == names and plan["generator"]["name"] == "a" and plan["generator"]["steps"] == 2
    from timm_csm.generation import load_generated

    images, _ = load_generated(first.folder)
    assert len(images) == 9 and np.asarray(images[0]["image"]).shape == (8, 8, 3)

    moved = tmp_path / "elsewhere" / "b.pkl"  # another path, the same file: the same set
    moved.parent.mkdir()
    moved.write_bytes(path.read_bytes())
    assert stages.generate(cache, dataclasses.replace(profile, generator=str(moved)), moved, names).done
    other = _tiny_edm_pickle(tmp_path / "c.pkl", seed=1)  # other weights, or other class names: another set
    assert stages.generate(cache, profile, other, names).folder != first.folder
    assert stages.generate(cache, profile, path, ["a", "b", "c", "d"]).folder != first.folder


def test_an_edm_pickle_is_sampled_without_guidance_and_must_exist(tmp_path):
    pkl = _tiny_edm_pickle(tmp_path / "a.pkl")
    cache = StageCache(tmp_path / "run", lambda line: None)
    for bad in ({"guidance_scale": 1.5}, {"scheduler": "dpm"}):
        with pytest.raises(ValueError, match="Heun sampler without guidance"):
            stages.generate(cache, RecipeProfile(generator=str(pkl), num_groups=1,
                                                 mixing=dataclasses.replace(RECIPE_MIXING, **bad)), pkl, list("wxyz"))
    for other, why in (({"precision": "bfloat16"}, "sampled in float64 .* precision 'bfloat16' applies"),
                       ({"timestep_spacing": "trailing"}, "EDM's noise levels: timestep_spacing 'trailing' applies")):
        with pytest.raises(ValueError, match=why):
            stages.generate(cache, RecipeProfile(generator=str(pkl), num_groups=1,
                                                 mixing=dataclasses.replace(RECIPE_MIXING, **other)), pkl, list("wxyz"))
    missing = RecipeProfile(generator=str(tmp_path / "absent.pkl"))
    with pytest.raises(FileNotFoundError, match=f"absent.pkl not found: download it .*{re.escape(FULL_EDM_PICKLE_URL)}"
                                                ".*--generator"):
        stages.generator(cache, missing, None, lambda line: None)


def test_a_missing_open_clip_file_or_tag_cache_names_both_ways(tmp_path):
    both = (r"open_clip:ViT-B-32-quickgelu:/path/to/weights\.safetensors.*network access.*"
            "open_clip:ViT-B-32-quickgelu:openai")
    absent = RecipeProfile(encoder=f"open_clip:ViT-B-32-quickgelu:{tmp_path / 'clip.safetensors'}")
    with pytest.raises(FileNotFoundError, match="neither an existing file nor an open_clip tag.*" + both):
        stages.check_encoder(absent)
    # offline (the tests set HF_HUB_OFFLINE) with an empty cache, the tag's weights cannot be had
    with pytest.raises(RuntimeError, match="tag 'openai' are not in the cache and could not be downloaded.*" + both):
        stages.check_encoder(get_profile("full"))
    with pytest.raises(ValueError, match="give 'reference' .trained here. or a spec with every field: "
                                         "open_clip:<model_name>:<pretrained>"):
        stages.check_encoder(RecipeProfile(encoder="open_clip:ViT-B-32"))
    stages.check_encoder(RecipeProfile())  # the reference encoder is trained by the recipe: nothing to check


def test_the_open_clip_weights_are_read_once_per_run(tmp_path, monkeypatch):
    """check_encoder builds the open_clip encoder that the annotation stage then uses: one read of its weights."""
    import open_clip
    from safetensors.torch import save_file

    from timm_csm.data import ImageArrays

    config = tmp_path / "timm-csm-recipes-tiny-clip.json"
    config.write_text(json.dumps({"embed_dim": 16, "vision_cfg": {"image_size": 16, "layers": 1, "width": 16,
                                                                  "patch_size": 8, "head_width": 8},
                                  "text_cfg": {"context_length": 8, "vocab_size": 49408, "width": 16, "heads": 2,
                                               "layers": 1}}))
    open_clip.add_model_config(str(config))
    weights = tmp_path / "clip.safetensors"
    save_file(open_clip.create_model(config.stem).state_dict(), str(weights))
    built, create = [], open_clip.create_model

    def counting_create(*args, **kw):
        built.append(kw.get("pretrained"))
        return create(*args, **kw)

    monkeypatch.setattr(open_clip, "create_model", counting_create)
    names = ["w", "x", "y", "z"]
    profile = RecipeProfile(generator=str(_tiny_edm_pickle(tmp_path / "a.pkl")), num_groups=3,
                            mixing=dataclasses.replace(RECIPE_MIXING, num_lambdas=3, steps=2),
                            encoder=f"open_clip:{config.stem}:{weights}",
                            annotation=AnnotationConfig(s=4.0, accept_poor_generator=True))  # a random generator
    clip = stages.check_encoder(profile)
    assert built == [str(weights)]
    cache = StageCache(tmp_path / "run", lambda line: None)
    generated = stages.generate(cache, profile, Path(profile.generator), names)
    images = np.random.default_rng(0).integers(0, 256, size=(8, 3, 8, 8), dtype=np.uint8)
    annotated = stages.annotate(cache, profile, generated, None, ImageArrays(images, np.arange(8) % 4, names), clip)
    assert built == [str(weights)] and (annotated.folder / "annotation.json").exists()


def test_the_command_line_points_a_profile_at_other_files():
    args = build_parser().parse_args(["--profile", "full", "--generator", "my.pkl", "--encoder",
                                      "open_clip:ViT-B-32-quickgelu:w.safetensors", "--dataset", "data/c100"])
    assert profile_from_args(args) == dataclasses.replace(
        get_profile("full"), generator="my.pkl", encoder="open_clip:ViT-B-32-quickgelu:w.safetensors",
        dataset="data/c100")
    assert profile_from_args(build_parser().parse_args(["--profile", "smoke"])) == get_profile("smoke")
    rehearsal = profile_from_args(build_parser().parse_args(["--profile", "demo", "--rehearse"]))
    assert rehearsal == rehearsal_profile(get_profile("demo"))
    assert rehearsal.train_extra["decay_milestones"] == [1, 1] and rehearsal.epochs == 1
    shorter = profile_from_args(build_parser().parse_args(["--profile", "demo", "--epochs", "20"]))
    assert (shorter.epochs, shorter.train_extra["decay_milestones"]) == (20, [10, 15])  # 30, 45 of 60: still decays
    assert get_profile("demo").train_extra["decay_milestones"] == [30, 45]
    with pytest.raises(ValueError, match="changes only the sizes"):
        rehearsal_profile(get_profile("demo"), lr=1.0)


def test_report_says_what_the_generator_learned_from(tmp_path):
    import json

    from timm_csm.recipes.report import knowledge_line

    gen = tmp_path / "gen"
    gen.mkdir()
    (gen / "model_index.json").write_text(json.dumps({"metadata": {"num_train_images": 60000}}))
    line = knowledge_line(gen, {"ce": {"n_train": 2250}, "csm": {"n_train": 2250}})
    assert "learned from 60000 real images, the classifiers from 2250" in line and "not a fair comparison" in line
    (gen / "model_index.json").write_text(json.dumps({"metadata": {"num_train_images": 2250}}))
    assert "not a fair" not in knowledge_line(gen, {"csm": {"n_train": 2250}})
    assert "not recorded" in knowledge_line(tmp_path / "missing", {"csm": {"n_train": 2250}})


def test_the_recipes_run_with_the_papers_temperature_unless_told_otherwise():
    from timm_csm.recipes import paper_protocol
    from timm_csm.training import TrainConfig

    assert TrainConfig().ts_method == "nll"  # a training run's own default
    assert paper_protocol({"loss": "ce"}) == {"loss": "ce", "ts_method": "grid_ece"}
    assert paper_protocol({"loss": "ce", "ts_method": "nll"})["ts_method"] == "nll"
