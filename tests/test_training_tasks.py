"""Training tasks: each task's step on a tiny model returns the documented keys and the loss computed directly from
the loss functions for the same batch; task selection and criterion options come from the loss registry."""
import numpy as np
import pytest
import torch
import torch.nn as nn

from timm_csm.data import CSMCompanionSampler, CSMGroups, SampleRef, create_transforms
from timm_csm.losses import CrossEntropyLoss, LossBase, LossSpec, create_loss, loss_spec, regmixup_objective
from timm_csm.losses import registry as loss_registry
from timm_csm.training import (ClassificationTask, CSMTask, MixupTask, RankMixupTask, RegMixupTask, TimmMixupTask,
                               create_criterion, parse_args, select_task)

K, B, SIZE = 3, 6, 8


def _model():
    torch.manual_seed(0)
    # batch norm: a task that runs two batches in one pass would change the statistics and the loss
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(4, K)).train()


def _data():
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, size=(20, 1, SIZE, SIZE), dtype=np.uint8), rng.integers(0, K, size=20)


def _batch(task, images, labels):
    train_tf, _ = create_transforms(SIZE, (0.5,), (0.25,), 1, crop_padding=1, hflip=0.5)
    collator = task.create_collator(images, labels, train_tf, seed=3)
    batch = collator([SampleRef(i, 0, 0, s, B) for s, i in enumerate(range(B))])
    assert set(task.batch_keys) <= set(batch), (task.batch_keys, sorted(batch))
    return batch


def _groups():
    rng = np.random.default_rng(1)
    lam = np.tile(np.linspace(0, 1, 4), 6)
    a = np.repeat([0, 0, 1, 0, 0, 1], 4)
    b = np.repeat([1, 2, 2, 1, 2, 2], 4)
    q = np.zeros((24, K), np.float32)
    q[np.arange(24), a] = 1 - lam
    q[np.arange(24), b] += lam
    images = rng.integers(0, 256, size=(24, 1, SIZE, SIZE), dtype=np.uint8)
    return CSMGroups.from_arrays(images, q, a, b, np.repeat(np.arange(6), 4), [str(i) for i in range(K)], lam)


def _check(out, expected, logits):
    assert set(out) == {"loss", "output", "terms"}
    torch.testing.assert_close(out["loss"], expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(out["output"], logits, rtol=0, atol=1e-6)
    assert out["loss"].requires_grad


def test_classification_task_is_the_loss_on_one_pass():
    images, labels = _data()
    model, loss = _model(), create_loss("focal")
    task = ClassificationTask(model, loss)
    batch = _batch(task, images, labels)
    out = task(batch)
    logits = model(batch["pixel_values"])
    _check(out, create_loss("focal")(logits, batch["labels"]), logits)
    assert out["terms"] is loss.terms


def test_per_sample_state_losses_get_the_index():
    images, labels = _data()
    model, loss = _model(), create_loss("aslp", num_samples=20, warmup_epochs=0)
    task = ClassificationTask(model, loss)
    batch = _batch(task, images, labels)
    out = task(batch)
    reference = create_loss("aslp", num_samples=20, warmup_epochs=0)
    logits = model(batch["pixel_values"])
    _check(out, reference(logits, batch["labels"], index=batch["index"]), logits)


def test_mixup_task_trains_on_mixed_images_and_soft_targets():
    images, labels = _data()
    model = _model()
    task = MixupTask(model, create_loss("ce"), K, alpha=1.0)
    batch = _batch(task, images, labels)
    assert batch["labels"].shape == (B, K)
    # the collator really mixed: soft targets (some rows below 1) summing to 1
    assert bool((batch["labels"].amax(1) < 1).any())
    torch.testing.assert_close(batch["labels"].sum(1), torch.ones(B))
    logits = model(batch["pixel_values"])
    _check(task(batch), CrossEntropyLoss()(logits, batch["labels"]), logits)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_regmixup_task_is_the_objective_over_one_concatenated_pass(reduction):
    images, labels = _data()
    model = _model()
    task = RegMixupTask(model, create_loss("ce"), K, alpha=20.0, weight=0.5, reduction=reduction)
    batch = _batch(task, images, labels)
    both = model(torch.cat([batch["pixel_values"], batch["mix_pixel_values"]]))
    expected = regmixup_objective(CrossEntropyLoss()(both[:B], batch["labels"]),
                                  CrossEntropyLoss()(both[B:], batch["mix_targets"]), 0.5, reduction)
    _check(task(batch), expected, both[:B])


@pytest.mark.parametrize("name,copies", [("mrl", 1), ("mndcg", 3)])
def test_rankmixup_task_runs_clean_and_mixed_copies_in_two_passes(name, copies):
    images, labels = _data()
    model = _model()
    args = parse_args(["--loss", name])
    task = RankMixupTask.from_config(args, model, create_loss(name), K)
    assert task.num_mixup == copies  # the registry's default number of copies
    batch = _batch(task, images, labels)
    assert batch["mix_pixel_values"].shape[0] == copies * B
    logits, mixed = model(batch["pixel_values"]), model(batch["mix_pixel_values"])
    _check(task(batch), create_loss(name)(logits, batch["labels"], mixed, batch["mix_targets"]), logits)


def test_csm_task_runs_real_and_generated_batches_in_two_passes():
    images, labels = _data()
    model = _model()
    task = CSMTask(model, create_loss("csm", weight=0.7), CSMCompanionSampler(_groups(), n_aug=1, num_classes=K))
    batch = _batch(task, images, labels)
    out = task(batch)
    logits, gen = model(batch["pixel_values"]), model(batch["mix_pixel_values"])
    _check(out, create_loss("csm", weight=0.7)(logits, batch["labels"], gen, batch["mix_targets"]), logits)
    assert set(out["terms"]) == {"ce", "gen"}
    joint = model(torch.cat([batch["pixel_values"], batch["mix_pixel_values"]]))  # one pass: other BN statistics
    one_pass = create_loss("csm", weight=0.7)(joint[:B], batch["labels"], joint[B:], batch["mix_targets"])
    assert abs(float(one_pass.detach()) - float(out["loss"].detach())) > 1e-4


def _calls(model):
    """A list that records the batch size of each call of ``model``."""
    sizes = []
    model.register_forward_hook(lambda module, inputs, output: sizes.append(len(inputs[0])))
    return sizes


def test_csm_concat_forward_is_one_call_with_the_two_passes_loss_without_batch_norm_statistics():
    images, labels = _data()
    model = _model().eval()  # batch norm on its running statistics: the two forms must give the same numbers
    companions = CSMCompanionSampler(_groups(), n_aug=1, num_classes=K)
    two_pass = CSMTask(model, create_loss("csm", weight=0.7), companions)
    concat = CSMTask.from_config(_args("--loss", "csm", "--csm-dataset", "x", "--csm-forward", "concat"), model,
                                 create_loss("csm", weight=0.7), K, companions)
    batch = _batch(two_pass, images, labels)
    calls = _calls(model)
    expected = two_pass(batch)
    assert calls == [B, 2 * B]
    calls.clear()
    out = concat(batch)
    assert calls == [3 * B]  # one forward over the real batch and its 2 * B companions
    _check(out, expected["loss"].detach(), expected["output"].detach())
    assert {k: float(v) for k, v in out["terms"].items()} == pytest.approx(
        {k: float(v) for k, v in expected["terms"].items()}, abs=1e-6)
    model.train()  # training-mode batch norm: one pass over both batches has other statistics, another loss
    assert abs(float(concat(batch)["loss"].detach()) - float(two_pass(batch)["loss"].detach())) > 1e-4
    with pytest.raises(ValueError, match="CSM forward 'joint'"):
        CSMTask(model, create_loss("csm"), companions, forward="joint")


def _args(*argv):
    return parse_args(list(argv))


@pytest.mark.parametrize("argv,task", [
    (["--loss", "ce"], ClassificationTask), (["--loss", "aslp"], ClassificationTask),
    (["--loss", "ce", "--mixup", "1"], MixupTask), (["--loss", "mbls", "--regmixup", "20"], RegMixupTask),
    (["--loss", "ce", "--cutmix", "1"], TimmMixupTask), (["--loss", "ce", "--mixup", ".8", "--cutmix", "1"], TimmMixupTask),
    (["--loss", "mndcg"], RankMixupTask), (["--loss", "csm_soft_ce", "--csm-dataset", "x"], CSMTask),
])
def test_select_task_reads_the_loss_spec(argv, task):
    args = _args(*argv)
    assert select_task(args, create_criterion(args, 10)[1]) is task


@pytest.mark.parametrize("argv,match", [
    (["--loss", "mrl", "--mixup", "1"], "builds its own batches; drop --mixup"),
    (["--loss", "ce", "--mixup", "1", "--regmixup", "2"], "--regmixup mixes its own copy"),
    (["--loss", "ce", "--cutmix", "1", "--regmixup", "2"], "--regmixup mixes its own copy"),
    (["--loss", "csm"], "needs --csm-dataset"),
    (["--loss", "focal", "--csm-dataset", "x"], "used by the csm losses only"),
    (["--loss", "focal", "--csm-forward", "concat"], "--csm-forward is used by the csm losses only"),
])
def test_select_task_refuses_conflicting_options(argv, match):
    args = _args(*argv)
    with pytest.raises(ValueError, match=match):
        select_task(args, create_criterion(args, 10)[1])


def test_create_criterion_options_from_the_registry():
    smoothed, spec = create_criterion(_args("--loss", "ce", "--smoothing", "0.1"), 10)
    assert type(smoothed).__name__ == "LabelSmoothingLoss" and spec is loss_spec("ls")
    assert create_criterion(_args("--loss", "ls", "--smoothing", "0.2"), 10)[0].smoothing == 0.2
    assert create_criterion(_args("--loss", "csm_soft_focal", "--csm-weight", "0.3"), 10)[0].weight == 0.3
    assert create_criterion(_args("--loss", "aslp"), 17)[0].num_samples == 17
    with pytest.raises(ValueError, match="--smoothing applies to --loss ce / ls"):
        create_criterion(_args("--loss", "focal", "--smoothing", "0.1"), 10)


def test_a_task_needs_a_loss_with_the_hooks():
    with pytest.raises(ValueError, match="LossBase criterion"):
        ClassificationTask(_model(), nn.CrossEntropyLoss())


class _RecordingCE(LossBase):
    """Cross-entropy that records the ``index`` it is given; its class declares a plain loss."""

    def forward(self, logits, target, index=None):
        self.seen = index
        return nn.functional.cross_entropy(logits, target)


class _IndexedCE(_RecordingCE):
    needs_index = True  # per-sample state: forward(logits, target, index=...)


def test_the_task_reads_the_spec_it_is_given_once():
    """The registry's spec travels with the criterion (create_criterion -> select_task -> the task), even where the
    class attributes of what the factory returns say otherwise; a criterion from outside the registry is read from
    its class attributes (LossSpec.of)."""
    images, labels = _data()
    name = "test_tasks_indexed_factory"
    with loss_registry.LOSSES.restored():
        loss_registry.register_loss(name, lambda num_samples: _RecordingCE(), spec=LossSpec("index"))
        args = _args("--loss", name)
        criterion, spec = create_criterion(args, 20)
        assert spec is loss_spec(name) and LossSpec.of(criterion).inputs == "plain"
        task = select_task(args, spec).from_config(args, _model(), criterion, K, spec=spec)
        assert type(task) is ClassificationTask and task.spec is spec
        batch = _batch(task, images, labels)
        task(batch)
        assert torch.equal(criterion.seen, batch["index"])  # the registry says index=: the task passes it

    outside = _IndexedCE()  # never registered
    task = ClassificationTask(_model(), outside)
    assert task.spec == LossSpec("index")
    batch = _batch(task, images, labels)
    task(batch)
    assert torch.equal(outside.seen, batch["index"])
    plain = ClassificationTask(_model(), _RecordingCE())
    plain(_batch(plain, images, labels))
    assert plain.criterion.seen is None
    ranked = RankMixupTask(_model(), create_loss("mndcg"), K)  # num_mixup from the class's spec: M-NDCG's 3
    assert ranked.num_mixup == 3 and RankMixupTask(_model(), create_loss("mndcg"), K, num_mixup=2).num_mixup == 2


def test_timm_cutmix_task_cuts_a_box_from_the_mirrored_image_and_mixes_the_targets_by_its_area():
    args = _args("--loss", "ce", "--cutmix", "1.0", "--smoothing", "0.1")
    criterion, spec = create_criterion(args, 20)
    assert type(criterion).__name__ == "CrossEntropyLoss"  # timm's Mixup smooths the targets itself
    task = TimmMixupTask.from_config(args, _model(), criterion, K, spec=spec)
    images, labels = _data()
    state = np.random.get_state()[1].copy()
    batch = _batch(task, images, labels)
    assert np.array_equal(np.random.get_state()[1], state)  # numpy's global generator is restored
    again = _batch(task, images, labels)
    torch.testing.assert_close(batch["pixel_values"], again["pixel_values"], rtol=0, atol=0)  # seeded per batch
    plain = ClassificationTask(_model(), CrossEntropyLoss())
    clean = _batch(plain, images, labels)["pixel_values"]
    x, mirrored = batch["pixel_values"], clean.flip(0)
    from_clean = (x == clean).flatten(1).float().mean(1)
    from_mirror = (x == mirrored).flatten(1).float().mean(1)
    assert torch.all(from_clean + from_mirror >= 1 - 1e-6)  # every pixel is its own or the mirror's (a box)
    lam = from_clean[0]  # one box per batch: the share of the image's own pixels is lambda
    y = batch["labels"]
    assert y.shape == (B, K) and torch.allclose(y.sum(1), torch.ones(B))
    own = labels[0]
    expected = lam * (0.9 + 0.1 / K) + (1 - lam) * (0.1 / K) + (1 - lam) * 0.9 * float(labels[B - 1] == own)
    assert abs(float(y[0, own]) - float(expected)) < 1e-5
    out = task(batch)
    assert out["loss"].requires_grad


def test_timm_mixup_needs_an_even_batch():
    args = _args("--loss", "ce", "--cutmix", "1.0")
    task = TimmMixupTask.from_config(args, _model(), create_criterion(args, 20)[0], K)
    images, labels = _data()
    train_tf, _ = create_transforms(SIZE, (0.5,), (0.25,), 1)
    with pytest.raises(ValueError, match="must be even"):
        task.create_collator(images, labels, train_tf, seed=3)([SampleRef(i, 0, 0, i, 5) for i in range(5)])
