"""Transforms, the CSM companion sampler and collator, Mixup / RegMixup / RankMixup collators, batch sharding."""
import math

import numpy as np
import pytest
import torch
import torchvision.transforms.v2.functional as TF

from csm_testdata import make_csm_dataset, soft_label_row
from timm_csm.data import (BatchTransform, CSMCollator, CSMCompanionSampler, CSMGroups, GlobalBatchSampler,
                           ImageCollator, IndexDataset, MixupCollator, RankMixupCollator, RegMixupCollator, SampleRef,
                           channel_stats, convert_channels)

NAMES4 = ["a", "b", "c", "d"]


# ---- transforms ------------------------------------------------------------------------------------------------
def _images(n=6, c=3, h=8, w=8, seed=0):
    return torch.randint(0, 256, (n, c, h, w), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)


def test_crop_flip_match_torchvision():
    x = _images()
    tf = BatchTransform(8, mean=(0.1, 0.2, 0.3), std=(0.5, 0.6, 0.7), crop_padding=2, hflip=0.5)
    params = tf.sample_params(len(x), torch.Generator().manual_seed(3))
    assert params["flips"].any() and not params["flips"].all()
    out = tf.apply(x, params)
    for i in range(len(x)):
        ref = TF.pad(x[i].float() / 255, [2, 2, 2, 2], fill=0)
        top, left = params["offsets"][i].tolist()
        ref = TF.crop(ref, top, left, 8, 8)
        if params["flips"][i]:
            ref = TF.horizontal_flip(ref)
        ref = TF.normalize(ref, [0.1, 0.2, 0.3], [0.5, 0.6, 0.7])
        torch.testing.assert_close(out[i], ref, atol=1e-5, rtol=1e-5)


def test_offsets_cover_padding_range_and_flip_rate():
    tf = BatchTransform(32, crop_padding=4, hflip=0.5)
    p = tf.sample_params(4000, torch.Generator().manual_seed(0))
    assert p["offsets"].min() == 0 and p["offsets"].max() == 8
    assert abs(p["flips"].float().mean().item() - 0.5) < 0.03


def test_resize_channels_and_normalisation():
    grey = torch.full((2, 1, 4, 4), 51, dtype=torch.uint8)
    tf = BatchTransform(8, mean=(0.2,), std=(0.5,), in_chans=3)
    out = tf(grey)
    assert out.shape == (2, 3, 8, 8)
    assert torch.allclose(out, torch.zeros_like(out), atol=1e-6)  # (51/255 - 0.2) / 0.5 = 0
    rgb = torch.tensor([255, 0, 0], dtype=torch.uint8).view(1, 3, 1, 1).expand(1, 3, 2, 2)
    assert convert_channels(rgb, 1).flatten().tolist() == [76] * 4  # round(0.299 * 255)
    with pytest.raises(ValueError, match="uint8"):
        tf(grey.float())


def test_channel_stats_matches_numpy():
    x = _images(20, 3, 5, 7)
    mean, std = channel_stats(x)
    ref = x.numpy().astype(np.float64) / 255
    assert np.allclose(mean, ref.mean((0, 2, 3)), atol=1e-6)
    assert np.allclose(std, ref.std((0, 2, 3)), atol=1e-6)


# ---- CSM groups and companions ---------------------------------------------------------------------------------
def _groups(n_lambdas=8, seeds=2, pairs=None, names=NAMES4):
    ds = make_csm_dataset(names, n_lambdas=n_lambdas, seeds_per_pair=seeds, pairs=pairs)
    return CSMGroups.from_dataset(ds, class_names=names), ds


def test_groups_from_published_columns_sorted_most_a_like_first():
    groups, ds = _groups()
    assert groups.num_groups == 6 * 2 and groups.group_size == 8
    assert len(groups.images) == len(ds)  # read lazily: rows decode on request
    decoded = groups.images[torch.arange(len(ds))]
    assert decoded.shape == (len(ds), 1, 8, 8) and decoded.dtype == torch.uint8
    assert np.array_equal(decoded[3, 0].numpy(), np.asarray(ds[3]["image"]))
    q = groups.soft_labels
    for g in range(groups.num_groups):
        rows = groups.members[g]
        a, b = int(groups.class_a[g]), int(groups.class_b[g])
        qa = q[rows, a]
        assert torch.all(qa[:-1] >= qa[1:])  # descending in q_a
        in_group = torch.tensor(ds["group_id"]) == int(groups.group_ids[g])
        assert qa[0] == q[in_group, a].max() and q[rows[-1], b] == q[in_group, b].max()
        lam = torch.tensor(ds["lambda_gen"])[rows]
        assert torch.all(lam[:-1] > lam[1:])  # the generation weight of a decreases along the group
        expected = torch.tensor(soft_label_row(4, a, b, 1.0))
        torch.testing.assert_close(q[rows[0]], expected)


def test_endpoint_is_the_member_most_like_y_and_interiors_distinct():
    groups, _ = _groups()
    sampler = CSMCompanionSampler(groups, n_aug=3)
    labels = torch.arange(4).repeat(500)
    rows = sampler.sample(labels, torch.Generator().manual_seed(0))
    assert rows.shape == (2000, 4)
    q = groups.soft_labels
    row_to_group = torch.empty(len(q), dtype=torch.long)
    row_to_pos = torch.empty(len(q), dtype=torch.long)
    for g in range(groups.num_groups):
        row_to_group[groups.members[g]] = g
        row_to_pos[groups.members[g]] = torch.arange(8)
    g = row_to_group[rows]
    assert torch.all(g == g[:, :1])  # all from one group
    a, b = groups.class_a[g[:, 0]], groups.class_b[g[:, 0]]
    assert torch.all((a == labels) | (b == labels))  # the group contains y
    # the endpoint has the largest q_y in its group
    group_qy = q[groups.members[g[:, 0]], labels[:, None]]
    assert torch.all(q[rows[:, 0], labels] == group_qy.max(1).values)
    pos = row_to_pos[rows[:, 1:]]
    assert pos.min() >= 1 and pos.max() <= 6  # interior only
    assert all(len(set(r)) == 3 for r in pos.tolist())


def test_draws_are_uniform_over_groups_and_interior():
    groups, _ = _groups(seeds=3)
    sampler = CSMCompanionSampler(groups, n_aug=1)
    labels = torch.zeros(30000, dtype=torch.long)
    rows = sampler.sample(labels, torch.Generator().manual_seed(1))
    row_to_group = torch.empty(len(groups.soft_labels), dtype=torch.long)
    row_to_pos = torch.empty_like(row_to_group)
    for g in range(groups.num_groups):
        row_to_group[groups.members[g]] = g
        row_to_pos[groups.members[g]] = torch.arange(8)
    eligible = sampler.groups_of_class(0)
    assert len(eligible) == 9  # class 0 pairs with 3 classes, 3 seeds each
    counts = torch.bincount(row_to_group[rows[:, 0]], minlength=groups.num_groups)[eligible].double()
    expected = 30000 / 9
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 30  # 8 degrees of freedom: P(chi2 > 30) < 1e-3
    pos_counts = torch.bincount(row_to_pos[rows[:, 1]], minlength=8)[1:7].double()
    assert float(((pos_counts - 5000) ** 2 / 5000).sum()) < 25


def test_sampler_errors_at_construction():
    groups, _ = _groups(pairs=[(0, 1), (1, 2)])  # class 3 has no group
    with pytest.raises(ValueError, match="no generated group.*3 \\('d'\\)"):
        CSMCompanionSampler(groups)
    groups, _ = _groups(n_lambdas=5)
    with pytest.raises(ValueError, match="n_aug=4 is larger than the 3 interior members"):
        CSMCompanionSampler(groups, n_aug=4)
    CSMCompanionSampler(groups, n_aug=3)


def test_dataset_validation_errors():
    import datasets

    ds = make_csm_dataset(NAMES4, n_lambdas=4)
    with pytest.raises(ValueError, match="differ from the real dataset's at 1 position.*'b' != 'B'"):
        CSMGroups.from_dataset(ds, class_names=["a", "B", "c", "d"])
    with pytest.raises(ValueError, match="has 4 classes, the real dataset 3"):
        CSMGroups.from_dataset(ds, class_names=["a", "b", "c"])
    with pytest.raises(ValueError, match="lacks column.*soft_label"):
        CSMGroups.from_dataset(ds.remove_columns("soft_label"))
    ragged = ds.cast_column("soft_label", datasets.Sequence(datasets.Value("float32")))
    ragged = ragged.map(lambda row, i: {"soft_label": row["soft_label"][:2] if i == 0 else row["soft_label"]},
                        with_indices=True)
    with pytest.raises(ValueError, match=r"soft_label rows must all have 4 values, found lengths \[2, 4\]"):
        CSMGroups.from_dataset(ragged)
    images = np.arange(16, dtype=np.uint8).reshape(4, 1, 2, 2)  # distinct members
    q = np.tile(np.array([[0.7, 0.2, 0.0, 0.0]], np.float32), (4, 1))
    with pytest.raises(ValueError, match="sum to 1"):
        CSMGroups.from_arrays(images, q, [0] * 4, [1] * 4, [0] * 4, NAMES4)
    q = np.tile(np.array([[0.8, 0.2, 0.0, 0.0]], np.float32), (4, 1))
    with pytest.raises(ValueError, match="mixes different class pairs"):
        CSMGroups.from_arrays(images, q, [0, 0, 0, 2], [1] * 4, [0] * 4, NAMES4)


def test_incomplete_groups_are_left_out():
    images = np.zeros((7, 1, 2, 2), np.uint8)
    q = np.array([soft_label_row(2, 0, 1, lam) for lam in (0, .5, 1, 0, .5, 1, .5)])
    with pytest.warns(UserWarning, match="1 of 3 groups"):
        groups = CSMGroups.from_arrays(images, q, [0] * 7, [1] * 7, [0, 0, 0, 1, 1, 1, 2], ["x", "y"])
    assert groups.group_ids.tolist() == [0, 1] and groups.group_size == 3


def test_duplicated_rows_or_groups_are_errors_naming_the_group():
    import datasets

    ds = make_csm_dataset(NAMES4, n_lambdas=4)
    group3 = ds.filter(lambda r: r["group_id"] == 3)
    # one group's rows appended again: before, the other groups were left out as "incomplete" with a warning
    with pytest.raises(ValueError, match="group 3 holds the same lambda_gen [0-9.]+ 2 times.*4 duplicate row"):
        CSMGroups.from_dataset(datasets.concatenate_datasets([ds, group3]))
    with pytest.raises(ValueError, match="holds the same lambda_gen .* 2 times.*24 duplicate row"):
        CSMGroups.from_dataset(datasets.concatenate_datasets([ds, ds]))  # every row twice: no warning before
    other = make_csm_dataset(NAMES4, n_lambdas=4, pairs=[(2, 3)], shuffle_seed=1)  # group_id 0 again, another pair
    with pytest.raises(ValueError, match="group 0 holds the same lambda_gen.*two groups share group_id 0"):
        CSMGroups.from_dataset(datasets.concatenate_datasets([ds, other]))
    # without lambda_gen: identical rows, or more members than the common group size
    images = np.arange(9, dtype=np.uint8).reshape(9, 1, 1, 1)
    q = np.array([soft_label_row(2, 0, 1, lam) for lam in (0, .5, 1) * 3])
    gid = [0, 0, 0, 1, 1, 1, 2, 2, 2]
    dup = np.concatenate([images, images[4:5]]), np.concatenate([q, q[4:5]]), gid + [1]
    with pytest.raises(ValueError, match="group 1 holds the same image and soft label 2 times"):
        CSMGroups.from_arrays(dup[0], dup[1], [0] * 10, [1] * 10, dup[2], ["x", "y"])
    with pytest.raises(ValueError, match="group 2 has 6 members where most groups have 3"):
        CSMGroups.from_arrays(np.arange(12, dtype=np.uint8).reshape(12, 1, 1, 1), np.concatenate([q, q[:3]]),
                              [0] * 12, [1] * 12, gid + [2, 2, 2], ["x", "y"])


# ---- collators ------------------------------------------------------------------------------------------------
def _real(n=40, k=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 1, 8, 8), generator=g, dtype=torch.uint8), torch.arange(n) % k


def _refs(indices, epoch=0, step=0, offset=0, global_size=None):
    gs = global_size or len(indices) + offset
    return [SampleRef(int(i), epoch, step, offset + s, gs) for s, i in enumerate(indices)]


def test_csm_collator_outputs_and_same_transform():
    groups, _ = _groups()
    images, labels = _real()
    sampler = CSMCompanionSampler(groups, n_aug=2)
    plain = BatchTransform(8, (0.5,), (0.25,))
    out = CSMCollator(images, labels, plain, sampler, seed=0)(_refs(range(5)))
    assert out["pixel_values"].shape == (5, 1, 8, 8)
    assert out["mix_pixel_values"].shape == (15, 1, 8, 8) and out["mix_targets"].shape == (15, 4)
    torch.testing.assert_close(out["pixel_values"], plain.apply(images[:5]))
    # recover the chosen rows from the soft labels and check images and labels belong together
    q = out["mix_targets"].view(5, 3, 4)
    y = out["labels"]
    assert torch.all(q[:, 0].gather(1, y[:, None]).squeeze(1) > 0.85)  # endpoint: q_y = sigmoid(2) = 0.88
    torch.testing.assert_close(out["mix_targets"].sum(1), torch.ones(15))
    for r in range(15):
        match = (groups.soft_labels == out["mix_targets"][r]).all(1) & \
            (plain.apply(groups.images[torch.arange(len(groups.images))]) == out["mix_pixel_values"][r]).flatten(1).all(1)
        assert match.any()


def test_collation_is_deterministic_and_independent_of_the_split():
    groups, _ = _groups()
    images, labels = _real()
    tf = BatchTransform(8, (0.5,), (0.25,), crop_padding=2, hflip=0.5)
    collator = CSMCollator(images, labels, tf, CSMCompanionSampler(groups, n_aug=1), seed=7)
    idx = [3, 17, 22, 5, 9, 31]
    whole = collator(_refs(idx))
    again = collator(_refs(idx))
    first, second = collator(_refs(idx[:3], global_size=6)), collator(_refs(idx[3:], offset=3, global_size=6))
    for key in ("pixel_values", "mix_pixel_values", "mix_targets", "labels"):
        torch.testing.assert_close(whole[key], again[key])
        torch.testing.assert_close(whole[key], torch.cat([first[key], second[key]]))
    other_epoch = collator(_refs(idx, epoch=1))
    assert not torch.equal(whole["pixel_values"], other_epoch["pixel_values"])


def test_dataloader_workers_do_not_change_batches():
    groups, _ = _groups()
    images, labels = _real()
    tf = BatchTransform(8, (0.5,), (0.25,), crop_padding=2, hflip=0.5)
    collator = CSMCollator(images, labels, tf, CSMCompanionSampler(groups), seed=3)
    sampler = GlobalBatchSampler(len(images), 8, seed=3)
    loaders = [torch.utils.data.DataLoader(IndexDataset(len(images)), batch_sampler=sampler, collate_fn=collator,
                                           num_workers=w) for w in (0, 2)]
    for b0, b2 in zip(*loaders):
        for key in b0:
            torch.testing.assert_close(b0[key], b2[key])


def test_global_batch_sampler_shards_cover_the_single_process_batches():
    single = GlobalBatchSampler(50, 8, seed=1)
    shards = [GlobalBatchSampler(50, 4, num_replicas=2, rank=r, seed=1) for r in range(2)]
    assert len(single) == len(shards[0]) == 6  # 50 // 8, last partial batch dropped
    for s, a, b in zip(single, *shards):
        assert [r.index for r in s] == [r.index for r in a] + [r.index for r in b]
        assert [r.slot for r in a + b] == [r.slot for r in s] == list(range(8))
    e0 = [r.index for batch in single for r in batch]
    single.set_epoch(1)
    e1 = [r.index for batch in single for r in batch]
    assert e0 != e1 and len(set(e0)) == 48
    keep = [GlobalBatchSampler(10, 2, num_replicas=2, rank=r, drop_last=False, shuffle=False) for r in range(2)]
    batches = [list(k) for k in keep]
    assert len(batches[0]) == len(batches[1]) == 3
    assert [r.index for r in batches[0][-1]] == [8] and [r.index for r in batches[1][-1]] == [9]
    with pytest.raises(ValueError, match="cannot fill one global batch"):
        GlobalBatchSampler(5, 4, num_replicas=2)


def _constant_images(n):
    # image i is constant 2*i + 1, so mixed pixels reveal the mixing partner
    return torch.tensor([2 * i + 1 for i in range(n)], dtype=torch.uint8).view(n, 1, 1, 1).expand(n, 1, 2, 2)


def _identity_tf():
    return BatchTransform(2, mean=(0.0,), std=(1.0 / 255.0,))


@pytest.mark.parametrize("batch_size", [1, 5, 8])
@pytest.mark.parametrize("mode", ["batch", "elem"])
def test_mixup_targets_match_the_mixed_images(batch_size, mode):
    n, k = 12, 3
    images, labels = _constant_images(n), torch.arange(n) % k
    out = MixupCollator(images, labels, _identity_tf(), k, alpha=0.4, mode=mode, seed=0)(list(range(batch_size)))
    x, t, lam = out["pixel_values"][:, 0, 0, 0], out["labels"], out["lam"]
    assert t.shape == (batch_size, k) and lam.shape == (batch_size,)
    torch.testing.assert_close(t.sum(1), torch.ones(batch_size))
    own = 2 * torch.arange(batch_size).float() + 1
    for i in range(batch_size):
        if abs(1 - lam[i]) < 1e-4:
            continue
        partner_value = (x[i] - lam[i] * own[i]) / (1 - lam[i])
        j = int(torch.round((partner_value - 1) / 2))
        assert abs(float(partner_value) - (2 * j + 1)) < 1e-2 and 0 <= j < batch_size
        expected = lam[i] * torch.nn.functional.one_hot(labels[i], k) + (1 - lam[i]) * \
            torch.nn.functional.one_hot(labels[j], k)
        torch.testing.assert_close(t[i], expected.float(), atol=1e-5, rtol=0)
    if mode == "batch":
        assert torch.all(lam == lam[0])


def test_beta_lambda_distribution():
    images, labels = _constant_images(4), torch.arange(4) % 2
    col = RegMixupCollator(images, labels, _identity_tf(), 2, alpha=20.0, seed=0)
    lams = torch.stack([col(list(range(4)))["lam"][0] for _ in range(400)])
    # Beta(20, 20): mean 1/2, std sqrt(1 / (4 * 41)) = 0.078
    assert abs(lams.mean().item() - 0.5) < 0.02 and abs(lams.std().item() - math.sqrt(1 / 164)) < 0.015


def test_regmixup_and_rankmixup_batches():
    n, k = 9, 3
    images, labels = _constant_images(n), torch.arange(n) % k
    out = RegMixupCollator(images, labels, _identity_tf(), k, seed=1)(list(range(n)))
    torch.testing.assert_close(out["pixel_values"], _identity_tf().apply(images))  # the clean batch is untouched
    assert out["mix_pixel_values"].shape == (n, 1, 2, 2) and out["mix_targets"].shape == (n, k)
    assert torch.equal(out["labels"], labels)
    out = RankMixupCollator(images, labels, _identity_tf(), k, alpha=2.0, num_mixup=3, seed=1)(list(range(n)))
    assert out["mix_pixel_values"].shape == (3 * n, 1, 2, 2) and out["mix_targets"].shape == (3 * n, k)
    assert out["lam"].shape == (3,)
    own = 2 * torch.arange(n).float() + 1
    for q in range(3):  # copy-major: rows q*n .. (q+1)*n - 1 use lam_q
        lam = out["lam"][q]
        block = out["mix_pixel_values"][q * n:(q + 1) * n, 0, 0, 0]
        partner = (block - lam * own) / (1 - lam)
        assert torch.allclose(partner, torch.round((partner - 1) / 2) * 2 + 1, atol=1e-2)
        top = out["mix_targets"][q * n:(q + 1) * n].max(1).values  # max(lam, 1 - lam), or 1 for a same-class mix
        assert torch.all(((top - torch.maximum(lam, 1 - lam)).abs() < 1e-5) | ((top - 1).abs() < 1e-5))
        torch.testing.assert_close(out["mix_targets"][q * n:(q + 1) * n].sum(1), torch.ones(n))


def test_plain_collator_and_errors():
    images, labels = _real(10)
    out = ImageCollator(images, labels, BatchTransform(8), seed=0)([0, 3])
    assert out["index"].tolist() == [0, 3] and out["labels"].tolist() == [0, 3]
    with pytest.raises(ValueError, match="labels must have shape"):
        ImageCollator(images, labels[:3], BatchTransform(8))
    with pytest.raises(ValueError, match="alpha"):
        MixupCollator(images, labels, BatchTransform(8), 4, alpha=0)
    with pytest.raises(IndexError):
        IndexDataset(3)[5]


def test_regmixup_objective_matches_the_released_training_step():
    from timm_csm.losses import create_loss, regmixup_objective

    n, k = 6, 3
    images, labels = _constant_images(n), torch.tensor([0, 1, 2, 0, 1, 1])
    out = RegMixupCollator(images, labels, _identity_tf(), k, alpha=20.0, seed=4)(list(range(n)))
    lam = float(out["lam"][0])
    own = 2 * torch.arange(n).double() + 1
    partner = (out["mix_pixel_values"][:, 0, 0, 0].double() - lam * own) / (1 - lam)
    perm = torch.round((partner - 1) / 2).long()
    assert sorted(perm.tolist()) == list(range(n))
    head = torch.nn.Linear(4, k).double()
    torch.nn.init.normal_(head.weight, generator=torch.Generator().manual_seed(0))
    logits = head(torch.cat([out["pixel_values"], out["mix_pixel_values"]]).double().flatten(1) / 10)
    # the released step: one batch [x; x~], mixup criterion with targets [y; y] and [y; y_perm], mean over 2n rows
    released = 0.0
    targets_a, targets_b = torch.cat([labels, labels]).tolist(), torch.cat([labels, labels[perm]]).tolist()
    for row, (ya, yb) in enumerate(zip(targets_a, targets_b)):
        log_p = torch.log_softmax(logits[row], 0)
        released -= (lam * log_p[ya] + (1 - lam) * log_p[yb]).item() / (2 * n)
    ce = create_loss("ce")
    clean, mixed = ce(logits[:n], out["labels"]), ce(logits[n:], out["mix_targets"])
    assert regmixup_objective(clean, mixed).item() == pytest.approx(released, abs=1e-12)
    assert regmixup_objective(clean, mixed, reduction="sum").item() == pytest.approx(2 * released, abs=1e-12)
    assert regmixup_objective(clean, mixed, 0.5).item() == pytest.approx((clean + 0.5 * mixed).item() / 2)
    with pytest.raises(ValueError, match="reduction must be one of"):
        regmixup_objective(clean, mixed, reduction="batch")
