"""Semantic mixing generation: conditioning, plan, samplers, pipelines, resumable sharded writing."""
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from PIL import Image

from gloo_launch import launch_two_processes

from timm_csm.generation import (
    EDMSemanticMixingPipeline, GENERATOR_PROFILES, SemanticMixingPipeline, class_pair,
    enable_soft_class_conditioning, enable_soft_dit_conditioning, generate_to_folder, lambda_grid, load_generated,
    make_plan, mix_prompt_embeddings, mix_weights, plan_groups,
)
from timm_csm.generation.pipeline import expand_groups
from timm_csm.generation.sampling import edm_heun_sample, edm_sigmas, to_uint8

ROOT = Path(__file__).resolve().parents[1]
K = 4  # classes of the tiny_generator fixture (conftest.py)


def test_class_pairs_are_lexicographic_and_wrap():
    pairs = [class_pair(i, 4) for i in range(8)]
    assert pairs == [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3), (0, 1), (0, 2)]
    groups = plan_groups(4, 8, seed_offset=100, start=5)
    assert [(g.group_id, g.seed, g.class_a, g.class_b) for g in groups] == [(5, 105, 2, 3), (6, 106, 0, 1),
                                                                          (7, 107, 0, 2)]
    with pytest.raises(ValueError, match="at least 2 classes"):
        class_pair(0, 1)


def test_mix_weights_and_errors():
    w = mix_weights([0, 2], [1, 3], [0.25, 1.0], 4)
    assert torch.equal(w, torch.tensor([[0.25, 0.75, 0, 0], [0, 0, 1.0, 0]]))
    with pytest.raises(ValueError, match=r"lambda must lie in \[0, 1\]"):
        mix_weights([0], [1], [1.5], 4)
    with pytest.raises(ValueError, match="class_b out of range"):
        mix_weights([0], [4], [0.5], 4)
    with pytest.raises(ValueError, match=r"must lie in \[0, 1\]"):
        lambda_grid(lambdas=[0.0, 1.2])
    assert lambda_grid(8)[1] == pytest.approx(1 / 7)


def test_lambda_one_equals_pure_class_a(tiny_generator):
    unet = SemanticMixingPipeline.from_pretrained(tiny_generator).unet
    x, t = torch.randn(3, 1, 28, 28), torch.tensor([10, 500, 900])
    with torch.no_grad():
        hard = unet(x, t, class_labels=torch.tensor([2, 0, 3])).sample
        soft = unet(x, t, class_labels=mix_weights([2, 0, 3], [1, 1, 0], [1.0, 1.0, 1.0], K)).sample
        mixed = unet(x, t, class_labels=mix_weights([2, 0, 3], [1, 1, 0], [0.5, 0.5, 0.5], K)).sample
    torch.testing.assert_close(soft, hard, rtol=1e-5, atol=1e-5)
    assert (mixed - hard).abs().max() > 1e-4  # the condition matters


def test_soft_embedding_survives_save_load(tiny_generator, tmp_path):
    from diffusers import UNet2DModel

    pipe = SemanticMixingPipeline.from_pretrained(tiny_generator)
    unet = pipe.unet
    plain = UNet2DModel.from_pretrained(tiny_generator / "unet")
    assert type(plain.class_embedding) is torch.nn.Embedding  # from_pretrained rebuilds a plain table ...
    assert torch.equal(plain.class_embedding.weight, unet.class_embedding.weight)  # ... with the same weights
    pipe.save_pretrained(tmp_path)
    loaded = SemanticMixingPipeline.from_pretrained(tmp_path)
    again = loaded.unet
    w = mix_weights([0], [3], [0.3], K)
    x, t = torch.randn(1, 1, 28, 28), torch.tensor([100])
    with torch.no_grad():
        torch.testing.assert_close(again(x, t, class_labels=w).sample, unet(x, t, class_labels=w).sample)
    assert loaded.class_names == pipe.class_names == [f"c{i}" for i in range(K)]


def test_unconditional_generator_is_refused():
    from diffusers import UNet2DModel

    unet = UNet2DModel(sample_size=8, in_channels=1, out_channels=1, block_out_channels=(8, 8),
                       down_block_types=("DownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "UpBlock2D"),
                       norm_num_groups=4, layers_per_block=1)
    with pytest.raises(ValueError, match="cannot be class-conditioned"):
        enable_soft_class_conditioning(unet)


def test_group_members_share_noise_and_batching_does_not_matter(tiny_generator):
    pipe = SemanticMixingPipeline.from_pretrained(tiny_generator, num_inference_steps=4)
    groups = plan_groups(K, 5)
    lams = lambda_grid(3)
    together, members = pipe(groups, lams, return_dict=False)
    one_by_one = torch.cat([pipe([g], lams).images for g in groups])
    assert together.shape == (15, 1, 28, 28) and together.dtype == torch.uint8
    assert [(m[0].group_id, m[1]) for m in members[:4]] == [(0, 0.0), (0, 0.5), (0, 1.0), (1, 0.0)]
    assert (together.int() - one_by_one.int()).abs().max() <= 1  # float batching noise at most one grey level
    # lambda = 1 of group (a, b) is pure class a; lambda = 0 pure class b: both ends differ from each other
    assert not torch.equal(together[0], together[2])


def test_guidance_needs_null_row_and_runs(tiny_generator):
    pipe = SemanticMixingPipeline.from_pretrained(tiny_generator, num_inference_steps=3, guidance_scale=2.0)
    images = pipe(plan_groups(K, 1), [0.0, 1.0]).images
    assert images.shape == (2, 1, 28, 28)
    assert not torch.equal(images, pipe(plan_groups(K, 1), [0.0, 1.0], guidance_scale=1.0).images)


def test_dit_soft_conditioning():
    from diffusers import DDIMScheduler, DiTTransformer2DModel

    torch.manual_seed(0)
    dit = DiTTransformer2DModel(num_attention_heads=2, attention_head_dim=8, in_channels=1, out_channels=2,
                                num_layers=2, sample_size=8, patch_size=2, num_embeds_ada_norm=K).eval()
    for p in dit.parameters():
        p.data.normal_(0, 0.05)
    enable_soft_dit_conditioning(dit)
    x, t = torch.randn(2, 1, 8, 8), torch.tensor([10, 700])
    with torch.no_grad():
        hard = dit(x, t, class_labels=torch.tensor([1, 3])).sample
        soft = dit(x, t, class_labels=mix_weights([1, 3], [0, 0], [1.0, 1.0], K)).sample
        null = dit(x, t, class_labels=torch.tensor([K, K])).sample
        null_soft = dit(x, t, class_labels=torch.nn.functional.one_hot(torch.tensor([K, K]), K + 1).float()).sample
    torch.testing.assert_close(soft, hard)
    torch.testing.assert_close(null_soft, null)
    pipe = SemanticMixingPipeline(dit, DDIMScheduler(), [f"c{i}" for i in range(K)], num_inference_steps=3,
                                  guidance_scale=1.5)
    images = pipe(plan_groups(K, 2), [0.0, 1.0]).images
    assert images.shape == (4, 1, 8, 8)


def test_mix_prompt_embeddings():
    a, b = torch.ones(1, 3, 4), torch.zeros(1, 3, 4)
    out = mix_prompt_embeddings(a, b, [0.25, 1.0])
    assert out.shape == (2, 3, 4) and out[0].eq(0.25).all() and out[1].eq(1).all()


def test_edm_heun_recovers_a_point_mass():
    sig = edm_sigmas(5)
    assert sig[0].item() == pytest.approx(80.0) and sig[-2].item() == pytest.approx(0.002) and sig[-1] == 0
    target = torch.full((1, 1, 2, 2), 0.3, dtype=torch.float64)
    calls = []

    def denoiser(x, sigma, w):  # data = a single point: the ideal denoiser returns it at every noise level
        calls.append(float(sigma))
        return target.expand_as(x)

    x = edm_heun_sample(denoiser, torch.ones(1, 2), torch.randn(1, 1, 2, 2), num_steps=5)
    torch.testing.assert_close(x, target)
    assert len(calls) == 2 * 5 - 1  # NFE = 2N - 1
    pipe = EDMSemanticMixingPipeline(lambda x, s, w: torch.zeros_like(x), 3, (1, 2, 2), num_inference_steps=3)
    images = pipe(plan_groups(3, 1), [0.0, 1.0]).images
    assert images.eq(128).all()  # x0 = 0 maps to grey 128, as EDM's uint8 conversion


def _heun_algorithm_1(denoiser, w, noise, num_steps, sigma_min=0.002, sigma_max=80.0, rho=7.0):
    """Karras et al. (2022), Algorithm 1 with S_churn = 0, written out as the EDM reference code computes it."""
    t = edm_sigmas(num_steps, sigma_min, sigma_max, rho)
    x = noise.to(torch.float64) * t[0]
    for i, (t_cur, t_next) in enumerate(zip(t[:-1], t[1:])):
        d = (x - denoiser(x, t_cur, w).to(torch.float64)) / t_cur
        x_next = x + (t_next - t_cur) * d
        if i < num_steps - 1:
            d_next = (x_next - denoiser(x_next, t_next, w).to(torch.float64)) / t_next
            x_next = x + (t_next - t_cur) * (0.5 * d + 0.5 * d_next)
        x = x_next
    return x


def test_the_edm_heun_scheduler_is_algorithm_1_to_the_bit():
    from timm_csm.generation.scheduling_edm import EDMHeunScheduler

    weights = torch.randn(4, 4, generator=torch.Generator().manual_seed(0))
    levels = []

    def denoiser(x, sigma, w):  # a float32 network, as the EDM pickles run
        levels.append(float(sigma))
        return torch.tanh(x.float() @ weights) * torch.sigmoid(sigma.float()) + w.sum()

    noise = torch.randn(3, 1, 4, 4, generator=torch.Generator().manual_seed(1))
    for steps, (lo, hi) in ((2, (0.002, 80.0)), (20, (0.002, 80.0)), (25, (0.01, 40.0))):
        expected = _heun_algorithm_1(denoiser, torch.ones(2), noise, steps, lo, hi)
        reference_levels, levels[:] = list(levels), []
        assert torch.equal(edm_heun_sample(denoiser, torch.ones(2), noise, steps, lo, hi), expected)
        assert levels == reference_levels and len(levels) == 2 * steps - 1
        levels.clear()
    scheduler = EDMHeunScheduler(sigma_min=0.002, sigma_max=80.0)
    scheduler.set_timesteps(3)
    assert scheduler.timesteps.tolist() == [scheduler.sigmas[0].item()] + [scheduler.sigmas[1].item()] * 2 + [
        scheduler.sigmas[2].item()] * 2
    assert EDMHeunScheduler.from_config(scheduler.config).config.sigma_max == 80.0  # a diffusers scheduler config
    # the EDM route: one diffusion pipeline of the denoiser and this scheduler
    from diffusers import DiffusionPipeline

    pipe = EDMSemanticMixingPipeline(denoiser, 2, (1, 4, 4), num_inference_steps=4, sigma_min=0.01, sigma_max=40.0)
    assert isinstance(pipe, DiffusionPipeline) and isinstance(pipe.scheduler, EDMHeunScheduler)
    pipe.set_progress_bar_config(disable=True)
    images = pipe(plan_groups(2, 3), [0.0, 1.0], output_type="pt").images
    w, noise, _ = expand_groups(plan_groups(2, 3), [0.0, 1.0], 2, (1, 4, 4))
    assert torch.equal(images, to_uint8(_heun_algorithm_1(denoiser, w, noise, 4, 0.01, 40.0).float()))


def _generate_cmd(gen, out, extra=()):
    return [sys.executable, str(ROOT / "hub_scripts" / "generate.py"), "--generator", str(gen), "--num-groups", "12",
            "--output", str(out), "--steps", "3", "--num-lambdas", "3", "--groups-per-shard", "2",
            "--batch-groups", "2", *extra]


def _rows(folder):
    ds, plan = load_generated(folder)
    ds = ds.cast_column("image", datasets.Image(decode=False))
    return sorted((r["group_id"], r["lambda_gen"], r["seed"], r["class_a"], r["class_b"], r["image"]["bytes"])
                  for r in ds), plan


def test_generate_resumes_after_sigkill_with_identical_output(tiny_generator, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    subprocess.run(_generate_cmd(tiny_generator, tmp_path / "full"), check=True, env=env, capture_output=True)
    killed = tmp_path / "killed"
    proc = subprocess.Popen(_generate_cmd(tiny_generator, killed), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and len(list((killed / "shards").glob("*.parquet"))) < 2:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    n_done = len(list((killed / "shards").glob("*.parquet")))
    assert 2 <= n_done < 6, "the kill should land mid-job"
    with pytest.raises(FileNotFoundError, match="unfinished"):
        load_generated(killed)
    subprocess.run(_generate_cmd(tiny_generator, killed), check=True, env=env, capture_output=True)
    full, plan = _rows(tmp_path / "full")
    resumed, _ = _rows(killed)
    assert len(full) == 12 * 3 and len({(r[0], r[1]) for r in full}) == 36  # no duplicate, no missing member
    assert resumed == full
    # a different plan in the same folder is refused
    res = subprocess.run(_generate_cmd(tiny_generator, killed, ["--seed-offset", "7"]), env=env,
                         capture_output=True, text=True)
    assert res.returncode != 0 and "different generation plan" in res.stderr


def _pixel_mixing(groups, lambdas, output_type="pt", return_dict=False):
    """A stand-in generator: each member is a constant image whose grey level encodes (group, lambda)."""
    assert output_type == "pt" and not return_dict  # what the writer asks for
    images, members = [], []
    for g in groups:
        for lam in lambdas:
            images.append(np.full((1, 4, 4), (7 * g.group_id + round(10 * lam)) % 256, np.uint8))
            members.append((g, lam))
    return torch.from_numpy(np.stack(images)), members


def test_damaged_shards_are_named_and_generated_again(tmp_path):
    import pyarrow.parquet as pq

    from timm_csm.generation.writer import shard_path

    plan = make_plan(K, 6, [0.0, 0.5, 1.0], [f"c{i}" for i in range(K)], groups_per_shard=2)
    folder = generate_to_folder(_pixel_mixing, tmp_path / "gen", plan, progress=False, log=lambda line: None)
    expected, _ = _rows(folder)
    truncated, short = shard_path(folder, 1, 3), shard_path(folder, 2, 3)
    truncated.write_bytes(truncated.read_bytes()[:-100])  # no Parquet footer
    pq.write_table(pq.read_table(short).slice(0, 4), short)  # a readable file with 4 of its 6 rows
    with pytest.raises(ValueError, match=f"shard .*{truncated.name} is damaged .*footer"):
        load_generated(folder)
    lines = []
    generate_to_folder(_pixel_mixing, folder, plan, progress=False, log=lines.append)
    assert len(lines) == 2  # before: both counted as done (6/6, rc 0)
    assert truncated.name in lines[0] and "footer" in lines[0]
    assert short.name in lines[1] and "4 rows, the plan 6" in lines[1]
    assert _rows(folder)[0] == expected
    lines.clear()
    generate_to_folder(_pixel_mixing, folder, plan, progress=False, log=lines.append)
    assert lines == []  # verified shards are kept


def test_extending_a_folder_copies_its_groups_and_generates_only_the_rest(tiny_generator, tmp_path):
    from timm_csm.generation import MixingConfig
    from timm_csm.recipes.steps import generate_groups

    def generate(out, num_groups, **kw):
        mixing = MixingConfig(num_lambdas=3, steps=3, groups_per_shard=2, batch_groups=2)
        return generate_groups(tiny_generator, out, num_groups, mixing, progress=False, log=lambda line: None, **kw)

    small = generate(tmp_path / "x1", 3)  # 3 groups: the last shard holds one of its two groups
    extended = generate(tmp_path / "x2", 6, extend_from=small)
    fresh = generate(tmp_path / "fresh", 6)
    rows_small, plan_small = _rows(small)
    rows_ext, plan_ext = _rows(extended)
    rows_fresh, plan_fresh = _rows(fresh)
    assert plan_ext == plan_fresh and plan_ext["num_groups"] == 6 and plan_small["num_groups"] == 3
    # the first groups are the 1x set's rows, images byte for byte; the others follow the plan
    assert rows_ext[:9] == rows_small
    assert [r[:5] for r in rows_ext] == [r[:5] for r in rows_fresh]
    assert {(r[0], r[2], r[3], r[4]) for r in rows_ext} == {
        (g.group_id, g.seed, g.class_a, g.class_b) for g in plan_groups(K, 6)}
    # groups 4 and 5 (a shard of their own) are generated as a fresh run generates them
    assert rows_ext[12:] == rows_fresh[12:]
    assert json.loads((extended / "extended_from.json").read_text()) == {
        "folder": str(small), "plan_hash": plan_small["plan_hash"], "groups": 3}
    # only the number of groups may differ, and only upwards
    with pytest.raises(ValueError, match=r"another generation plan \(differs in \['lambdas'\]\)"):
        generate_groups(tiny_generator, tmp_path / "bad", 6, MixingConfig(num_lambdas=4, steps=3, groups_per_shard=2),
                        progress=False, extend_from=small)
    with pytest.raises(ValueError, match="holds 6 groups, more than the 3 asked for"):
        generate(tmp_path / "smaller", 3, extend_from=extended)
    assert not (tmp_path / "bad").exists() and not (tmp_path / "smaller").exists()


def _pixels(encoded: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(encoded)), int)


def test_two_processes_write_the_same_dataset(tiny_generator, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    subprocess.run(_generate_cmd(tiny_generator, tmp_path / "one"), check=True, env=env, capture_output=True)
    launch_two_processes(*_generate_cmd(tiny_generator, tmp_path / "two")[1:])
    one, _ = _rows(tmp_path / "one")
    two, _ = _rows(tmp_path / "two")
    assert [r[:5] for r in one] == [r[:5] for r in two]
    diffs = [np.abs(_pixels(a[5]) - _pixels(b[5])).max() for a, b in zip(one, two)]
    assert max(diffs) <= 1


@pytest.mark.parametrize("files", [["training_state.pt"], ["training_state.pt", "model.safetensors", "state.json"]])
def test_generator_resume_refuses_a_pickled_checkpoint_of_earlier_versions(tmp_path, files):
    """A checkpoint folder written before the safetensors state files (its state a torch.save pickle): a clear
    error naming the file and what to do, never a restart from scratch that replaces it."""
    from timm_csm.generation.training import load_checkpoint_ema, train_generator

    ckpt = tmp_path / "gen" / "checkpoint"
    ckpt.mkdir(parents=True)
    for name in files:
        (ckpt / name).write_bytes(b"{}" if name == "state.json" else b"old checkpoint")
    images = np.zeros((4, 1, 28, 28), dtype=np.uint8)
    cfg = GENERATOR_PROFILES["smoke"]
    match = re.escape(str(ckpt / "training_state.pt")) + " is a generator checkpoint in the pickled format"
    with pytest.raises(ValueError, match=match + ".*a fresh output folder, or delete"):
        train_generator(images, np.arange(4) % 3, ["a", "b", "c"], tmp_path / "gen", cfg, progress=False,
                        log=lambda m: None)
    with pytest.raises(ValueError, match=match):
        load_checkpoint_ema(tmp_path / "gen", 3, cfg)
    assert sorted(p.name for p in ckpt.iterdir()) == sorted(files)
    assert (ckpt / "training_state.pt").read_bytes() == b"old checkpoint"
    assert sorted(p.name for p in (tmp_path / "gen").iterdir()) == ["checkpoint"]


@pytest.mark.parametrize("layout", ["today's", "folder", "split model"])
def test_a_generator_checkpoint_of_the_earlier_schema_is_an_error_naming_it(tmp_path, layout):
    """Its schedule under ``lr_sched`` and its history under ``losses``, in today's file or in the checkpoint folder
    of the previous layouts (a state file and state.json; before it, the UNet in a file of its own), which always
    held that schema: it does not fit, an error naming it; nothing is removed or overwritten."""
    import dataclasses

    from csm_fixtures import as_earlier_checkpoint

    from timm_csm.generation.training import train_generator
    from timm_csm.io import CHECKPOINT_LAST, load_state, save_state

    images = np.zeros((4, 1, 28, 28), dtype=np.uint8)
    cfg = dataclasses.replace(GENERATOR_PROFILES["smoke"], steps=2, checkpoint_every=1)
    args = (images, np.arange(4) % 3, ["a", "b", "c"], tmp_path / "gen")
    train_generator(*args, dataclasses.replace(cfg, steps=1), progress=False, log=lambda m: None)
    path = tmp_path / "gen" / CHECKPOINT_LAST
    state = load_state(path)
    state.update(lr_sched=state.pop("scheduler"), losses=state.pop("history"))
    save_state(path, state)
    if layout != "today's":
        as_earlier_checkpoint(path, tmp_path / "gen" / "checkpoint", split_model=layout == "split model")
        path = tmp_path / "gen" / "checkpoint"
    kept = sorted(p.name for p in path.parent.rglob("*"))
    match = re.escape(f"{path} is a damaged generator checkpoint: it does not fit (KeyError: 'scheduler')")
    with pytest.raises(ValueError, match=match + ".*delete"):
        train_generator(*args, cfg, progress=False, log=lambda m: None)
    assert sorted(p.name for p in path.parent.rglob("*")) == kept


def test_a_damaged_generator_checkpoint_is_an_error_naming_it(tmp_path):
    """Not a cache: a truncated checkpoint stops the run with its name, and stays as it was."""
    import dataclasses

    from timm_csm.generation.training import train_generator
    from timm_csm.io import CHECKPOINT_LAST

    images = np.zeros((4, 1, 28, 28), dtype=np.uint8)
    cfg = dataclasses.replace(GENERATOR_PROFILES["smoke"], steps=2, checkpoint_every=1)
    args = (images, np.arange(4) % 3, ["a", "b", "c"], tmp_path / "gen")
    train_generator(*args, dataclasses.replace(cfg, steps=1), progress=False, log=lambda m: None)
    state = tmp_path / "gen" / CHECKPOINT_LAST
    state.write_bytes(state.read_bytes()[:64])
    with pytest.raises(ValueError, match=re.escape(str(state)) + " is a damaged generator checkpoint.*delete"):
        train_generator(*args, cfg, progress=False, log=lambda m: None)
    assert state.stat().st_size == 64


def test_generator_training_resumes_exactly(tmp_path):
    """A run stopped at step 2 and resumed ends with the weights of a straight run."""
    import dataclasses

    from timm_csm.generation.training import load_checkpoint_ema, train_generator
    from timm_csm.io import CHECKPOINT_LAST, load_state
    from timm_csm.trainer import STATE_KEYS

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (32, 1, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 3, 32)
    cfg = dataclasses.replace(GENERATOR_PROFILES["smoke"], steps=4, checkpoint_every=2)
    straight, _ = train_generator(images, labels, ["a", "b", "c"], tmp_path / "a", cfg, progress=False,
                                  log=lambda m: None)
    train_generator(images, labels, ["a", "b", "c"], tmp_path / "b", dataclasses.replace(cfg, steps=2),
                    progress=False, log=lambda m: None)
    state = load_state(tmp_path / "b" / CHECKPOINT_LAST)  # the one schema, and the generator's training time
    assert state["step"] == 2 and set(state) - set(STATE_KEYS) == {"train_seconds"}
    assert set(STATE_KEYS) - set(state) == {"epoch", "rng"}
    ema_unet, step = load_checkpoint_ema(tmp_path / "b", 3, cfg)  # a look at the generator while it trains
    assert step == 2 and torch.equal(next(ema_unet.parameters()), state["ema"]["shadow_params"][0])
    lines = []
    resumed, _ = train_generator(images, labels, ["a", "b", "c"], tmp_path / "b", cfg, progress=False,
                                 log=lines.append)
    assert lines[1:] == ["resuming generator training from step 2"]  # after the line of the schedule
    assert lines[0].startswith("generator: 32 images of 3 classes at 1x28x28; UNet [16, 16, 32]; 4 steps of 8 images, "
                               "AdamW lr 0.001 (linear warm-up over 1 steps), EMA decay 0.999, seed 0; checkpoint "
                               "every 2 steps (")
    assert load_state(tmp_path / "b" / CHECKPOINT_LAST)["step"] == 4
    for (n, p), (_, q) in zip(straight.state_dict().items(), resumed.state_dict().items()):
        torch.testing.assert_close(p, q, msg=n)
    index = json.loads((tmp_path / "b" / "model_index.json").read_text())
    assert index["_class_name"] == "SemanticMixingPipeline" and index["class_names"] == ["a", "b", "c"]
    assert len(index["metadata"]["losses"]) >= 1 and index["metadata"]["recipe"]["steps"] == 4
    assert torch.equal(SemanticMixingPipeline.from_pretrained(tmp_path / "b").unet.class_embedding.weight,
                       resumed.class_embedding.weight)
    with pytest.raises(ValueError, match="expects"):
        train_generator(images[:, :, :14, :14], labels, ["a", "b", "c"], tmp_path / "c", cfg, progress=False)
