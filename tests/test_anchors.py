"""Real-anchored semantic mixing: SDEdit starts, the anchor draw, plan and provenance, the command line."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from timm_csm.generation import (SemanticMixingPipeline, create_scheduler, generate_to_folder, load_generated,
                                 make_plan, plan_groups)
from timm_csm.generation.anchors import AnchorPool
from timm_csm.generation.sampling import sample_with_scheduler

ROOT = Path(__file__).resolve().parents[1]
K = 4  # classes of the tiny_generator fixture (conftest.py)
LAMBDAS = [0.0, 0.5, 1.0]


def _pool(n_per_class: int = 5, seed: int = 0) -> AnchorPool:
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (K * n_per_class, 1, 28, 28), generator=g, dtype=torch.uint8)
    return AnchorPool(images, np.repeat(np.arange(K), n_per_class), {"dataset": "random", "split": "train"})


def _pipe(folder, scheduler="ddim", steps=10, anchors=None, strength=1.0):
    pipe = SemanticMixingPipeline.from_pretrained(folder, num_inference_steps=steps, guidance_scale=1.0,
                                                  anchors=anchors, strength=strength)
    pipe.scheduler = create_scheduler(scheduler, pipe.scheduler.config)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_strength_one_is_the_paper_mode_bit_for_bit(tiny_generator):
    groups = plan_groups(K, 3, seed_offset=7)
    plain, _ = _pipe(tiny_generator)(groups, LAMBDAS, return_dict=False)
    anchored_off, _ = _pipe(tiny_generator, anchors=_pool(), strength=1.0)(groups, LAMBDAS, return_dict=False)
    assert torch.equal(plain, anchored_off)


@pytest.mark.parametrize("scheduler", ["ddim", "dpm"])
def test_anchored_groups_start_from_their_anchor(tiny_generator, scheduler):
    pool = _pool()
    groups = plan_groups(K, 3, seed_offset=7)
    plain, _ = _pipe(tiny_generator, scheduler)(groups, LAMBDAS, return_dict=False)
    anchored = _pipe(tiny_generator, scheduler, anchors=pool, strength=0.6)(groups, LAMBDAS).images
    assert anchored.shape == plain.shape and not torch.equal(anchored, plain)
    # the last step alone (strength 1/N) barely moves the noised anchor: every member stays its group's anchor
    out = _pipe(tiny_generator, scheduler, steps=20, anchors=pool, strength=0.05)(groups, LAMBDAS)
    nearly, members = out.images, out.members
    expected = torch.stack([pool.images[pool.index_for(g)] for g, _ in members])
    near, far = ((x.float() - expected.float()).abs().mean() for x in (nearly, plain))  # in uint8 levels
    assert near < 12.0 and far > 30.0, (near, far)


def test_anchor_draw_is_per_group_deterministic_and_of_the_pair():
    pool = _pool(n_per_class=7)
    groups = plan_groups(K, 60, seed_offset=11)
    idx = [pool.index_for(g) for g in groups]
    assert idx == [pool.index_for(g) for g in reversed(groups)][::-1]  # no state carried between groups
    sides = [pool.labels[i] == g.class_a for i, g in zip(idx, groups)]
    assert all(pool.labels[i] in (g.class_a, g.class_b) for i, g in zip(idx, groups))
    assert 0.25 < np.mean(sides) < 0.75  # both classes of a pair anchor groups
    torch.testing.assert_close(pool.images_for(groups[:2]),
                               pool.images[[idx[0], idx[1]]].float() / 127.5 - 1.0)


def test_anchor_errors(tiny_generator):
    with pytest.raises(ValueError, match="needs an anchor pool"):
        _pipe(tiny_generator, strength=0.5)
    with pytest.raises(ValueError, match=r"strength must lie in \(0, 1\]"):
        _pipe(tiny_generator, anchors=_pool(), strength=0.0)
    small = AnchorPool(torch.zeros(4, 1, 8, 8, dtype=torch.uint8), np.arange(4))
    with pytest.raises(ValueError, match="anchor images are"):
        _pipe(tiny_generator, anchors=small, strength=0.5)
    with pytest.raises(ValueError, match="must be uint8"):
        AnchorPool(torch.zeros(4, 1, 8, 8), np.arange(4))
    with pytest.raises(ValueError, match="anchor labels"):
        AnchorPool(torch.zeros(4, 1, 8, 8, dtype=torch.uint8), np.arange(3))
    only_zero = AnchorPool(torch.zeros(2, 1, 28, 28, dtype=torch.uint8), np.zeros(2))
    groups = [g for g in plan_groups(K, 12) if 0 not in (g.class_a, g.class_b)]
    with pytest.raises(ValueError, match="no image of class"):
        only_zero.index_for(groups[0])
    from diffusers import DDIMScheduler

    with pytest.raises(ValueError, match="needs init_images"):
        sample_with_scheduler(None, DDIMScheduler(), torch.ones(1, K) / K, torch.zeros(1, 1, 8, 8), 4, strength=0.5)


def test_folder_records_anchor_and_strength_and_refuses_another_pool(tiny_generator, tmp_path):
    pool = _pool()
    pipe = _pipe(tiny_generator, steps=4, anchors=pool, strength=0.5)
    assert pipe.provenance["start"] == "real anchors, strength 0.5"

    def plan_for(p):
        return make_plan(K, 6, LAMBDAS, [f"c{i}" for i in range(K)], groups_per_shard=4,
                         generator=pipe.provenance, anchors={**p.describe(), "strength": 0.5})

    generate_to_folder(pipe, tmp_path / "gen", plan_for(pool), batch_groups=2, progress=False)
    ds, plan = load_generated(tmp_path / "gen")
    assert plan["anchors"]["fingerprint"] == pool.fingerprint() and plan["anchors"]["strength"] == 0.5
    groups = {g.group_id: g for g in plan_groups(K, 6)}
    assert ds["anchor_index"] == [pool.index_for(groups[gid]) for gid in ds["group_id"]]
    assert set(ds["anchor_strength"]) == {0.5}
    with pytest.raises(ValueError, match="different generation plan"):
        generate_to_folder(pipe, tmp_path / "gen", plan_for(_pool(seed=1)), progress=False)

    plain = _pipe(tiny_generator, steps=4)
    generate_to_folder(plain, tmp_path / "plain", make_plan(K, 2, LAMBDAS, [f"c{i}" for i in range(K)]),
                       progress=False)
    ds, plan = load_generated(tmp_path / "plain")
    assert "anchors" not in plan and set(ds["anchor_index"]) == {-1} and set(ds["anchor_strength"]) == {1.0}


def test_generate_script_needs_an_anchor_dataset_below_strength_one(tiny_generator, tmp_path):
    res = subprocess.run([sys.executable, str(ROOT / "hub_scripts/generate.py"), "--generator", str(tiny_generator),
                          "--num-groups", "2", "--output", str(tmp_path / "g"), "--strength", "0.5"],
                         capture_output=True, text=True)
    assert res.returncode == 2 and "needs --anchor-dataset" in res.stderr


def test_generate_script_anchors_on_the_classifier_training_split(tiny_generator, tmp_path):
    """The anchors of a real-anchored run are exactly train.py's training images for the same options."""
    from timm_csm.commands.generate import training_anchors
    from timm_csm.training import load_data, parse_args

    pool = training_anchors("digits", max_train_samples=300, val_fraction=0.2, seed=3)
    data = load_data(parse_args(["--dataset", "digits", "--max-train-samples", "300", "--val-fraction", "0.2",
                                 "--seed", "3"]))
    assert torch.equal(pool.images, torch.as_tensor(data.train.images)) and len(pool) == 240
    assert json.loads(json.dumps(pool.describe()))["seed"] == 3
