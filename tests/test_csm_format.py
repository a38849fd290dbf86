"""The CSM dataset format module, the registered reference network (and folders in its earlier layout), and the one
annotation entry point."""
import json

import numpy as np
import pytest
import torch

from csm_fixtures import (CLASS_NAMES, LAMBDAS, annotated_by_hand, raw_generated, synthetic_arrays, tiny_timm_encoder,
                          train_interrupted)
from timm_csm.data.csm_format import CSM_COLUMNS, check_class_names, check_groups, check_soft_labels, csm_features
from timm_csm.metrics.inputs import ROW_SUM_ATOL


# ---------------------------------------------------------------- the format module

def test_features_columns_and_unique_names():
    import datasets

    f = csm_features(CLASS_NAMES)
    assert list(f) == list(CSM_COLUMNS)
    assert f["label"].names == CLASS_NAMES and f["class_b"].names == CLASS_NAMES
    assert f["soft_label"] == datasets.Sequence(datasets.Value("float32"))
    assert f["group_id"] == datasets.Value("int64") and f["lambda_hat"] == datasets.Value("float32")
    with pytest.raises(ValueError, match="class names must be unique"):
        csm_features(["a", "b", "a"])


def test_class_name_mismatch_is_named():
    check_class_names(["a", "b"], ["a", "b"])
    with pytest.raises(ValueError,
                       match=r"generation plan differ from the real dataset's at 1 position\(s\): 1: 'x' != 'b'"):
        check_class_names(["a", "x", "c"], ["a", "b", "c"], "generation plan", "the real dataset")
    with pytest.raises(ValueError, match=r"do not match the real dataset \(2 classes\): the CSM dataset has 3"):
        check_class_names(["a", "b", "c"], ["a", "b"], "CSM dataset", "the real dataset")


def test_duplicate_and_incomplete_groups_are_named():
    lam = [0.0, 0.5, 1.0]
    gid = [7, 7, 7, 8, 8, 9, 9, 9, 9]
    lams = lam + [0.0, 1.0] + [0.0, 0.5, 0.5, 1.0]
    check = check_groups(gid, lams, lam)
    assert not check.ok and check.bad_group_ids.tolist() == [8, 9] and check.num_groups == 3
    assert check.bad_rows.tolist() == [False] * 3 + [True] * 6
    assert "2 of 3 groups" in check.message and "1 have fewer members, 1 have repeated or extra" in check.message
    assert "group_id 8 (2 rows), 9 (4 rows)" in check.message
    with pytest.raises(ValueError, match=r"off the grid .*group_id 7, lambda_gen 0.300000"):
        check_groups([7, 7, 7], [0.0, 0.3, 1.0], lam)
    with pytest.raises(ValueError, match="mix different class_a values.*group_id 7"):
        check_groups([7, 7, 7], lam, lam, class_a=[0, 0, 1])


def test_soft_label_tolerance_edge():
    k = 4
    base = np.array([[0.25, 0.25, 0.25, 0.25]] * 3)
    inside, outside = base.copy(), base.copy()
    inside[1, 0] += ROW_SUM_ATOL / 2
    outside[2, 0] += 2 * ROW_SUM_ATOL
    check_soft_labels(inside, k)
    with pytest.raises(ValueError, match="length K=3"):  # one row of numbers, not (N, K): named, not a TypeError
        check_soft_labels(np.ones(3), 3)
    message = rf"1 soft_label row\(s\) do not sum to 1 within {ROW_SUM_ATOL:g} \(first: row 2"
    with pytest.raises(ValueError, match=message):
        check_soft_labels(outside, k)
    with pytest.raises(ValueError, match="length 4, expected K=3"):
        check_soft_labels(base, 3)
    with pytest.raises(ValueError, match="negative values"):
        check_soft_labels([[1.5, -0.5]])


def test_every_reader_and_writer_uses_the_one_tolerance():
    """A row off by 2 tol fails the hub's validation and training's reader alike; tol / 2 passes both."""
    from timm_csm.data import CSMGroups
    from timm_csm.hub import validate_csm_dataset

    ds = annotated_by_hand(num_groups=3)
    soft = np.asarray(ds["soft_label"], dtype=np.float64)
    for shift, ok in ((ROW_SUM_ATOL / 2, True), (2 * ROW_SUM_ATOL, False)):
        edited = soft.copy()
        edited[4, ds["class_a"][4]] += shift
        changed = ds.map(lambda row, i: {"soft_label": edited[i].astype(np.float32).tolist()}, with_indices=True,
                         features=ds.features)
        _read_all(ok, lambda: validate_csm_dataset(changed), lambda: CSMGroups.from_dataset(changed, CLASS_NAMES))


def _read_all(ok: bool, *readers) -> None:
    """Every reader passes (``ok``) or refuses the rows as not summing to 1."""
    for read in readers:
        if ok:
            read()
        else:
            with pytest.raises(ValueError, match="sum to 1"):
                read()


def test_the_losses_and_the_metrics_take_soft_labels_within_the_same_tolerance():
    import torch

    from timm_csm.losses import create_loss
    from timm_csm.metrics import calibration_metrics

    logits = torch.zeros(3, 4)
    for shift, ok in ((ROW_SUM_ATOL / 2, True), (2 * ROW_SUM_ATOL, False)):
        target = torch.full((3, 4), 0.25, dtype=torch.float64)
        target[1, 0] += shift
        _read_all(ok, lambda: create_loss("ce")(logits.double(), target), lambda: calibration_metrics(logits, target))


def test_hub_does_not_import_annotation_and_the_package_import_stays_light():
    import subprocess
    import sys

    code = ("import sys, timm_csm.hub; bad = [m for m in sys.modules if m.startswith('timm_csm.annotation')]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)
    # `import timm_csm` registers models and metrics only: none of the heavy optional libraries
    heavy = ("diffusers", "open_clip", "datasets", "matplotlib", "evaluate")
    code = (f"import sys, timm_csm; bad = [m for m in {heavy!r} if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------- the reference network

def test_reference_cnn_is_a_registered_timm_model():
    import timm

    import timm_csm  # noqa: F401

    model = timm.create_model("reference_cnn", num_classes=5, in_chans=3)
    x = torch.randn(2, 3, 28, 28)
    assert model(x).shape == (2, 5)
    assert model.forward_head(model.forward_features(x), pre_logits=True).shape == (2, 64)
    assert model.pretrained_cfg["input_size"] == (3, 28, 28) and model.pretrained_cfg["first_conv"] == "stages.0.0"
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [c.out_channels for c in convs] == [16, 32, 64, 64]


def _old_layout(state):
    """The state dict in the layout reference-encoder folders had before reference_cnn: one ``features``
    Sequential of conv-BN-ReLU blocks (index 0, 2, 4, 5) with max-pooling at 1 and 3, then ``fc``."""
    names = {"stages.0.0": "features.0.0", "stages.0.1": "features.0.1", "stages.1.1": "features.2.0",
             "stages.1.2": "features.2.1", "stages.2.1": "features.4.0", "stages.2.2": "features.4.1",
             "stages.2.4": "features.5.0", "stages.2.5": "features.5.1"}
    out = {}
    for key, value in state.items():
        module, _, leaf = key.rpartition(".")
        out[f"{names.get(module, module)}.{leaf}"] = value.clone(memory_format=torch.contiguous_format)
    assert sum(k.startswith("features.") for k in out) == 4 + 4 * 5
    return out


def test_a_reference_folder_in_the_earlier_layout_loads_with_the_same_features(tmp_path):
    from safetensors.torch import save_file

    from timm_csm.annotation import load_reference_encoder, train_reference_encoder

    data = synthetic_arrays(n_per_class=16)
    new = train_reference_encoder(data, tmp_path / "new", epochs=1, batch_size=16, progress=False, log=lambda m: None)
    old_dir = tmp_path / "old"
    old_dir.mkdir()
    (old_dir / "config.json").write_text((tmp_path / "new" / "config.json").read_text())
    save_file(_old_layout(new.model.state_dict()), str(old_dir / "model.safetensors"), {"format": "pt"})
    old = load_reference_encoder(old_dir)
    torch.testing.assert_close(old.encode(data.images), new.encode(data.images), rtol=0, atol=0)
    torch.testing.assert_close(old.classify(data.images), new.classify(data.images), rtol=0, atol=0)
    # the same configuration in an old folder is reused, not refused or retrained
    lines = []
    again = train_reference_encoder(data, old_dir, epochs=1, batch_size=16, progress=False, log=lines.append)
    assert lines == [f"reference encoder: reusing {old_dir}"] and again.weights_path == old_dir / "model.safetensors"


@pytest.mark.parametrize("earlier", [None, "schema", "layout"])
def test_an_interrupted_run_resumes_and_one_of_the_earlier_schema_is_trained_again(tmp_path, monkeypatch, earlier):
    """Earlier layer names of the reference network in a checkpoint resume. A checkpoint of the earlier schema (its
    schedule under ``sched``, its epoch the number of epochs done), also in the checkpoint folder of the previous
    layout, which always held that schema, does not fit: named in the log, removed, trained again from the seed."""
    from csm_fixtures import as_earlier_checkpoint

    from timm_csm.annotation import reference, train_reference_encoder
    from timm_csm.io import load_state, save_state
    from timm_csm.trainer import STATE_KEYS

    data = synthetic_arrays(n_per_class=16)
    kw = dict(epochs=2, batch_size=16, seed=1, progress=False, log=lambda m: None)
    full = train_reference_encoder(data, tmp_path / "full", **kw)
    # 3 steps per epoch: stopped in epoch 2, after the epoch-1 checkpoint
    train_interrupted(monkeypatch, lambda: train_reference_encoder(data, tmp_path / "cut", **kw), 4)
    path = tmp_path / "cut" / reference.CHECKPOINT
    state = load_state(path)
    assert state["epoch"] == 0 and set(state) == set(STATE_KEYS) - {"ema", "rng", "step"}  # the one schema
    state["model"] = _old_layout(state["model"])
    if earlier:
        state.update(sched=state.pop("scheduler"), epoch=1)
    save_state(path, state)
    if earlier == "layout":
        as_earlier_checkpoint(path, tmp_path / "cut" / reference.EARLIER_CHECKPOINT)
        path = tmp_path / "cut" / reference.EARLIER_CHECKPOINT
    lines = []
    resumed = train_reference_encoder(data, tmp_path / "cut", **{**kw, "log": lines.append})
    if earlier:
        assert len(lines) == 1 and lines[0].startswith(f"{path} is a damaged reference encoder checkpoint: it does "
                                                       "not fit (KeyError: 'scheduler'); it is removed and training "
                                                       "starts over from the seed")
    else:
        assert lines == ["reference encoder: resuming from epoch 1"]
    assert sorted(p.name for p in (tmp_path / "cut").iterdir()) == ["config.json", "model.safetensors"]
    for (k, v), (_, w) in zip(full.model.state_dict().items(), resumed.model.state_dict().items()):
        torch.testing.assert_close(v, w, rtol=0, atol=0, msg=k)


# ---------------------------------------------------------------- the one annotation entry point

def _plan(num_groups: int):
    return {"class_names": CLASS_NAMES, "lambdas": LAMBDAS, "num_groups": num_groups}


def test_annotate_generated_chooses_s_on_held_out_images(tmp_path):
    """s = "auto": the steps by hand (prototypes over all real images for the labels; s fitted on the held-out
    split with the prototypes of the rest) give the same soft labels; the encoder builder sees the rest only."""
    from timm_csm.annotation import (annotate, annotate_generated, compute_prototypes, encode_images, holdout_split,
                                     select_scale)

    encoder, _ = tiny_timm_encoder(tmp_path)
    real = synthetic_arrays(n_per_class=12)
    generated = raw_generated(num_groups=4)
    seen = []

    def build(fit):
        seen.append(len(fit))
        return encoder

    result = annotate_generated(generated, _plan(4), real, build, "auto", holdout_fraction=0.25, seed=3,
                                cache_dir=tmp_path / "c", progress=False, log=lambda m: None)
    fit, held_out = holdout_split(real, 0.25, 3)
    assert seen == [len(fit)] == [27] and len(held_out) == 9
    assert not set(map(bytes, held_out.images)) & set(map(bytes, fit.images))
    s = select_scale(encode_images(encoder, held_out.images), held_out.labels,
                     compute_prototypes(encoder, fit, progress=False).means)
    assert result.s == s and result.s_selection["held_out_images"] == 9 and result.s_selection["seed"] == 3
    by_hand = annotate(generated, CLASS_NAMES, encoder, compute_prototypes(encoder, real, progress=False), s,
                       lambdas=LAMBDAS, progress=False)
    assert np.array_equal(np.asarray(result.dataset["soft_label"]), np.asarray(by_hand["soft_label"]))
    prov = result.provenance()
    assert prov["s"] == round(s, 6) and "flagged_group_ids" not in prov["annotation_checks"]
    json.dumps(prov)


def test_annotate_generated_with_a_number_and_its_errors(tmp_path):
    from timm_csm.annotation import annotate_generated

    encoder, _ = tiny_timm_encoder(tmp_path)
    real = synthetic_arrays(n_per_class=12)
    generated = raw_generated(num_groups=4)
    seen = []
    kw = dict(cache_dir=tmp_path / "c", progress=False, log=lambda m: None)
    result = annotate_generated(generated, _plan(4), real, lambda fit: seen.append(len(fit)) or encoder, 4.0, **kw)
    assert seen == [len(real)] and result.s == 4.0 and result.s_selection is None
    annotate_generated(generated, _plan(4), real, lambda fit: seen.append(len(fit)) or encoder, 4.0, holdout=True,
                       **kw)
    assert seen[-1] == len(real) - 4  # the encoder of the "auto" run: a tenth of 36 images held out
    with pytest.raises(ValueError, match="cannot run with holdout=False"):
        annotate_generated(generated, _plan(4), real, encoder, "auto", holdout=False, **kw)
    with pytest.raises(ValueError, match="'auto', got 'fit'"):
        annotate_generated(generated, _plan(4), real, encoder, "fit", **kw)
    with pytest.raises(ValueError, match=r"generation plan differ.*0: 'x' != 'circle'"):
        annotate_generated(generated, {**_plan(4), "class_names": ["x"] + CLASS_NAMES[1:]}, real, encoder, 4.0, **kw)


def test_csm_rows_are_built_in_the_published_features_with_their_dominant_class():
    from timm_csm.data import csm_dataset_from_columns

    row = {"image": [np.zeros((4, 4), np.uint8)] * 2, "soft_label": [[0.2, 0.8, 0.0], [0.5, 0.5, 0.0]],
           "class_a": [0, 0], "class_b": [1, 1], "lambda_gen": [0.0, 0.5], "lambda_hat": [0.1, 0.5],
           "group_id": [3, 3], "seed": [7, 7]}
    ds = csm_dataset_from_columns(row, ["a", "b", "c"])
    assert ds.features == csm_features(["a", "b", "c"]) and ds["label"] == [1, 0]  # ties: the first maximum
    with pytest.raises(ValueError, match=r"missing \['seed'\], unknown \['extra'\]"):
        csm_dataset_from_columns(dict({k: v for k, v in row.items() if k != "seed"}, extra=[1, 2]), ["a", "b", "c"])
