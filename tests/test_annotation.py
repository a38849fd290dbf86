"""Calibrated re-annotation: encoders (open_clip, timm, reference), prototypes, lambda_hat, soft labels, annotate."""
import json
import math

import datasets
import numpy as np
import pytest
import torch

from csm_fixtures import (CLASS_NAMES, LAMBDAS, raw_generated, synthetic_arrays, tiny_timm_encoder, tiny_timm_model,
                          train_interrupted)
from timm_csm.annotation import (ClassPrototypes, ImagePreprocessor, OpenClipEncoder, ReferenceEncoder, annotate,
                                 compute_prototypes, dominant_class, encode_images,
                                 generation_class_labels, load_or_compute_prototypes, load_reference_encoder,
                                 pair_soft_labels, pairwise_true_lambda, projection_coefficient, rescale_soft_labels,
                                 scale_nll, select_scale, train_reference_encoder)
from timm_csm.data.csm_format import check_groups, csm_features

TINY_CLIP = {"embed_dim": 32,
             "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "patch_size": 8, "head_width": 16},
             "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1}}


@pytest.fixture(scope="module")
def clip_name(tmp_path_factory):
    import open_clip

    path = tmp_path_factory.mktemp("clip") / "timm-csm-tiny-clip.json"
    path.write_text(json.dumps(TINY_CLIP))
    open_clip.add_model_config(str(path))
    return "timm-csm-tiny-clip"


@pytest.fixture(scope="module")
def clip_encoder(clip_name):
    torch.manual_seed(0)
    return OpenClipEncoder(clip_name)


@pytest.fixture(scope="module")
def timm_pair(tmp_path_factory):
    return tiny_timm_encoder(tmp_path_factory.mktemp("timm"))


@pytest.fixture(scope="module")
def real():
    return synthetic_arrays()


# ---------------------------------------------------------------- preprocessing and encoders

def test_preprocess_matches_open_clip_pil_transform(clip_name):
    import open_clip
    from PIL import Image

    _, _, pil_transform = open_clip.create_model_and_transforms(clip_name)
    pre = ImagePreprocessor(size=32, mean=open_clip.OPENAI_DATASET_MEAN, std=open_clip.OPENAI_DATASET_STD)
    rng = np.random.default_rng(0)
    for shape in [(3, 28, 28), (1, 28, 28), (3, 40, 50), (3, 64, 64)]:
        x = rng.integers(0, 256, (3, *shape), dtype=np.uint8)
        ours = pre(x)
        ref = torch.stack([pil_transform(Image.fromarray(im[0] if im.shape[0] == 1 else im.transpose(1, 2, 0)))
                           for im in x])
        assert ours.shape == ref.shape == (3, 3, 32, 32)
        # within one grey level of PIL's two-pass uint8 resampling (rounding ties)
        level = 1.0 / (255 * min(open_clip.OPENAI_DATASET_STD))
        assert (ours - ref).abs().max() <= level * 1.01
        assert (ours - ref).abs().mean() < 0.01 * level  # ties are rare


def test_open_clip_encoder_raw_and_normalised_features(clip_name, clip_encoder):
    x = torch.randint(0, 256, (5, 3, 28, 28), dtype=torch.uint8)
    feats = clip_encoder.encode(x)
    with torch.no_grad():
        ref = clip_encoder.model.encode_image(clip_encoder.preprocess(x))
    torch.testing.assert_close(feats, ref, rtol=0, atol=0)
    assert feats.shape == (5, TINY_CLIP["embed_dim"]) and clip_encoder.feature_dim == TINY_CLIP["embed_dim"]
    assert not torch.allclose(feats.norm(dim=1), torch.ones(5))  # the paper's unnormalised features
    torch.manual_seed(0)
    normed = OpenClipEncoder(clip_name, normalize=True)
    torch.testing.assert_close(normed.encode(x), torch.nn.functional.normalize(feats, dim=-1))
    assert normed.identity != clip_encoder.identity


def test_open_clip_local_weights_file_and_local_dir(clip_name, clip_encoder, tmp_path):
    from safetensors.torch import save_file

    weights = tmp_path / "tiny.safetensors"
    save_file({k: v.contiguous() for k, v in clip_encoder.model.state_dict().items()}, str(weights))
    torch.manual_seed(123)  # a different random init, overwritten by the file
    from_file = OpenClipEncoder(clip_name, pretrained=str(weights))
    x = torch.randint(0, 256, (4, 1, 28, 28), dtype=torch.uint8)
    torch.testing.assert_close(from_file.encode(x), clip_encoder.encode(x), rtol=0, atol=0)
    folder = tmp_path / "clip-dir"
    folder.mkdir()
    (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": TINY_CLIP, "preprocess_cfg": {}}))
    save_file({k: v.contiguous() for k, v in clip_encoder.model.state_dict().items()},
              str(folder / "open_clip_model.safetensors"))
    from_dir = OpenClipEncoder(f"local-dir:{folder}")
    torch.testing.assert_close(from_dir.encode(x), clip_encoder.encode(x), rtol=0, atol=0)
    with pytest.raises(FileNotFoundError, match="weights file not found"):
        OpenClipEncoder(clip_name, pretrained=str(tmp_path / "missing.safetensors"))


def test_open_clip_tag_offline_names_the_tag_and_the_local_file_way():
    """The paper's encoder by tag (ViT-B-32 / openai): offline (the test environment) the download fails with an
    error naming the tag and the local-file alternative; a misspelt tag lists the model's tags."""
    with pytest.raises(RuntimeError, match=r"weights of tag 'openai' for ViT-B-32 \(HF_HUB_OFFLINE is set\)\. "
                                           r"Offline, a local weights file works"):
        OpenClipEncoder("ViT-B-32", pretrained="openai")
    with pytest.raises(ValueError, match="'opneai' is not an open_clip tag of ViT-B-32; its tags: openai, "):
        OpenClipEncoder("ViT-B-32", pretrained="opneai")


def test_open_clip_zero_shot_probs_variant1(clip_encoder):
    import open_clip

    x = torch.randint(0, 256, (6, 3, 32, 32), dtype=torch.uint8)
    feats = clip_encoder.encode(x)
    probs = clip_encoder.zero_shot_probs(feats, CLASS_NAMES)
    tok = open_clip.get_tokenizer("timm-csm-tiny-clip")
    with torch.no_grad():
        text = clip_encoder.model.encode_text(tok([f"a photo of a {c}." for c in CLASS_NAMES]), normalize=True)
        img = torch.nn.functional.normalize(feats, dim=-1)
        ref = (clip_encoder.model.logit_scale.exp() * img @ text.T).softmax(-1)
    torch.testing.assert_close(probs, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(probs.sum(1), torch.ones(6))


def test_timm_encoder_pooled_pre_logits_from_checkpoint(timm_pair, tmp_path):
    from safetensors.torch import save_file

    from timm_csm.annotation import TimmEncoder

    encoder, model = timm_pair
    assert encoder.num_classes == len(CLASS_NAMES)  # read from the checkpoint's classifier
    x = torch.randint(0, 256, (5, 1, 16, 16), dtype=torch.uint8)
    pixels = encoder.preprocess(x)
    assert pixels.shape == (5, 1, 32, 32)
    with torch.no_grad():
        ref = model.forward_head(model.forward_features(pixels), pre_logits=True)
        logits = model(pixels)
    torch.testing.assert_close(encoder.encode(x), ref, rtol=1e-5, atol=1e-5)  # channels-last kernels
    torch.testing.assert_close(encoder.logits_from_features(encoder.encode(x)), logits, rtol=1e-5, atol=1e-5)
    other = tiny_timm_model(seed=1)
    bad = tmp_path / "other.safetensors"
    sd = {k: v.contiguous() for k, v in other.state_dict().items() if not k.startswith("layer4")}
    save_file(sd, str(bad))
    with pytest.raises(ValueError, match=r"does not fit test_resnet: \d+ keys missing \(layer4\.") as info:
        TimmEncoder("test_resnet", checkpoint_path=bad, model_kwargs={"in_chans": 1})
    assert "\n" not in str(info.value) and len(str(info.value)) < 400


# ---------------------------------------------------------------- prototypes

def test_prototypes_equal_direct_mean_and_cache(timm_pair, real, tmp_path):
    encoder, _ = timm_pair
    protos = compute_prototypes(encoder, real, batch_size=7, progress=False)  # batches straddle classes
    feats = encoder.encode(real.images).double()
    for k in range(len(CLASS_NAMES)):
        direct = feats[torch.from_numpy(real.labels == k)].mean(0)
        torch.testing.assert_close(protos.means[k], direct, rtol=1e-6, atol=1e-7)
    assert protos.means.dtype == torch.float64
    assert protos.counts.tolist() == np.bincount(real.labels).tolist()
    assert protos.class_names == CLASS_NAMES and protos.encoder == encoder.identity

    cached = load_or_compute_prototypes(encoder, real, cache_dir=tmp_path, progress=False)
    files = list((tmp_path / "prototypes").glob("*.safetensors"))
    assert len(files) == 1
    again = load_or_compute_prototypes(encoder, real, cache_dir=tmp_path, progress=False)
    torch.testing.assert_close(again.means, cached.means, rtol=0, atol=0)
    loaded = ClassPrototypes.load(files[0])
    assert loaded.class_names == CLASS_NAMES and loaded.dataset == cached.dataset
    # other data -> another cache entry
    load_or_compute_prototypes(encoder, synthetic_arrays(seed=1), cache_dir=tmp_path, progress=False)
    assert len(list((tmp_path / "prototypes").glob("*.safetensors"))) == 2


def _counting(encoder, seen):
    """``encoder`` whose ``encode`` also records the bytes of every image it encodes."""
    encode = encoder.encode

    def counted(images):
        seen.extend(bytes(np.ascontiguousarray(im)) for im in np.asarray(images))
        return encode(images)

    encoder.encode = counted
    return encoder


def test_s_auto_encodes_each_real_image_once(tmp_path):
    """s="auto": one encoding pass over the real images gives the prototypes (all of them) and the choice of s (the
    held-out features, the class means of the rest); a cached prototype file leaves the one pass s needs. The
    results are those of the steps by hand on the pass's features."""
    from timm_csm.annotation import annotate_generated, holdout_rows

    seen = []
    encoder = _counting(tiny_timm_encoder(tmp_path)[0], seen)
    real = synthetic_arrays(n_per_class=30)
    labels = real.labels.copy()
    labels[::5] = (labels[::5] + 1) % len(CLASS_NAMES)  # real images on the wrong side: s inside the bounds
    real = type(real)(real.images, labels, real.class_names, real.source)
    generated = raw_generated(num_groups=4)
    plan = {"class_names": CLASS_NAMES, "lambdas": LAMBDAS}
    kw = dict(holdout_fraction=0.3, seed=1, batch_size=16, cache_dir=tmp_path / "c", progress=False,
              log=lambda m: None)
    result = annotate_generated(generated, plan, real, encoder, "auto", **kw)
    real_bytes = sorted(bytes(im) for im in real.images)
    assert sorted(b for b in seen if b in set(real_bytes)) == real_bytes  # each real image once
    assert len(seen) == len(real) + len(generated)

    feats = encode_images(encoder, real.images, batch_size=16)  # the pass, by hand
    held = np.zeros(len(real), dtype=bool)
    held[holdout_rows(len(real), 0.3, 1)] = True
    fit_sums = torch.zeros(len(CLASS_NAMES), feats.shape[1], dtype=torch.float64)
    fit_sums.index_add_(0, torch.from_numpy(real.labels[~held]), feats[torch.from_numpy(~held)].double())
    fit_means = fit_sums / torch.bincount(torch.from_numpy(real.labels[~held]), minlength=len(CLASS_NAMES))[:, None]
    s = select_scale(feats[torch.from_numpy(held)], real.labels[held], fit_means)
    assert 0.05 < s < 100 and result.s == s and result.s_selection["held_out_images"] == held.sum()
    protos = compute_prototypes(encoder, real, batch_size=16, progress=False)
    torch.testing.assert_close(result.prototypes.means, protos.means, rtol=0, atol=0)
    by_hand = annotate(generated, CLASS_NAMES, encoder, protos, s, lambdas=LAMBDAS, progress=False)
    assert np.array_equal(np.asarray(result.dataset["soft_label"]), np.asarray(by_hand["soft_label"]))

    seen.clear()  # the prototypes now come from the cache: the pass only serves s
    again = annotate_generated(generated, plan, real, encoder, "auto", **kw)
    assert len(seen) == len(real) + len(generated) and again.s == result.s
    assert np.array_equal(np.asarray(again.dataset["soft_label"]), np.asarray(result.dataset["soft_label"]))
    seen.clear()  # a number and the cache: no real image is encoded
    annotate_generated(generated, plan, real, encoder, 4.0, **kw)
    assert len(seen) == len(generated)


def test_prototypes_reject_empty_class(timm_pair, real):
    encoder, _ = timm_pair
    subset = real.subset(np.flatnonzero(real.labels != 2))
    with pytest.raises(ValueError, match="without any training image"):
        compute_prototypes(encoder, subset, progress=False)


# ---------------------------------------------------------------- lambda_hat and soft labels

def test_lambda_hat_of_prototypes_is_exactly_one_and_zero():
    torch.manual_seed(0)
    protos = torch.randn(4, 16, dtype=torch.float64) * 3
    a, b = torch.tensor([0, 2, 3]), torch.tensor([1, 0, 2])
    assert projection_coefficient(protos[a], protos, a, b).tolist() == [1.0, 1.0, 1.0]
    assert projection_coefficient(protos[b], protos, a, b).tolist() == [0.0, 0.0, 0.0]
    # any point lam * p_a + (1 - lam) * p_b plus a deviation orthogonal to p_a - p_b, not clipped outside [0, 1]
    lam = torch.tensor([0.25, -0.5, 1.75], dtype=torch.float64)
    d = protos[a] - protos[b]
    noise = torch.randn(3, 16, dtype=torch.float64)
    noise -= (noise * d).sum(1, keepdim=True) / (d * d).sum(1, keepdim=True) * d
    f = lam[:, None] * protos[a] + (1 - lam[:, None]) * protos[b] + noise
    torch.testing.assert_close(projection_coefficient(f, protos, a, b), lam, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="must differ"):
        projection_coefficient(f, protos, a, a)


def test_soft_labels_match_formula_and_spec_table():
    lam = torch.tensor([-0.25, 0.0, 3 / 7, 0.5, 1.0, 1.25], dtype=torch.float64)
    a, b = torch.tensor([0, 1, 2, 0, 3, 1]), torch.tensor([1, 0, 0, 2, 1, 3])
    for s, table in ((4.0, [0.047, 0.119, 0.429, 0.5, 0.881, 0.953]), (2.3, [0.151, 0.240, 0.459, 0.5, 0.760, 0.849])):
        q = pair_soft_labels(lam, a, b, 5, s)
        assert q.dtype == torch.float32 and q.shape == (6, 5)
        for i in range(6):
            expected = 1.0 / (1.0 + math.exp(-s * (lam[i].item() - 0.5)))
            assert q[i, a[i]].item() == pytest.approx(expected, abs=1e-7)
            assert q[i, b[i]].item() == pytest.approx(1 - expected, abs=1e-7)
            assert round(q[i, a[i]].item(), 3) == table[i]  # the spec's table of label values
            others = [k for k in range(5) if k not in (a[i], b[i])]
            assert q[i, others].abs().sum() == 0
        torch.testing.assert_close(q.sum(1), torch.ones(6))
    labels = dominant_class(pair_soft_labels(lam, a, b, 5, 4.0), a)
    assert labels.tolist() == [1, 0, 0, 0, 3, 1]  # q_a = 1/2 goes to class a
    with pytest.raises(ValueError, match="positive"):
        pair_soft_labels(lam, a, b, 5, 0.0)
    with pytest.raises(ValueError, match="NaN"):
        pair_soft_labels(torch.tensor([float("nan")]), [0], [1], 5, 4.0)


def test_generation_class_labels_variant2():
    q = generation_class_labels(torch.tensor([0.0, 3 / 7, 4 / 7, 1.0]), [0, 0, 2, 2], [1, 1, 3, 3], 4)
    assert q.argmax(1).tolist() == [1, 1, 2, 2]
    assert q.sum(1).tolist() == [1.0] * 4 and q.max(1).values.tolist() == [1.0] * 4


def test_select_scale_minimises_true_class_nll():
    from scipy.optimize import minimize_scalar

    torch.manual_seed(0)
    protos = torch.randn(4, 8, dtype=torch.float64)
    labels = torch.randint(0, 4, (300,))
    feats = protos[labels] + 0.9 * torch.randn(300, 8, dtype=torch.float64)
    lam = pairwise_true_lambda(feats, labels, protos)
    # reference: lambda_hat on each pair (y, b) computed with projection_coefficient
    y_rep = labels.repeat_interleave(3)
    others = torch.tensor([[b for b in range(4) if b != y] for y in labels.tolist()]).reshape(-1)
    direct = projection_coefficient(feats.repeat_interleave(3, 0), protos, y_rep, others)
    torch.testing.assert_close(lam.reshape(-1), direct, rtol=1e-9, atol=1e-9)
    s = select_scale(feats, labels, protos)
    ref = minimize_scalar(lambda v: scale_nll(v, lam.reshape(-1)), bounds=(0.05, 100), method="bounded",
                          options={"xatol": 1e-8}).x
    assert s == pytest.approx(ref, rel=1e-4)
    assert scale_nll(s, lam) <= min(scale_nll(s * 0.9, lam), scale_nll(s * 1.1, lam))
    # noisier features: more real images past the midpoint, smaller s (the CIFAR-100 < CIFAR-10 ordering)
    noisy = protos[labels] + 2.0 * torch.randn(300, 8, dtype=torch.float64)
    assert select_scale(noisy, labels, protos) < s
    # perfectly separated data: the likelihood keeps growing with s, the upper bound is returned
    assert select_scale(protos[labels], labels, protos, bounds=(0.1, 50.0)) == 50.0


# ---------------------------------------------------------------- annotate

def test_annotate_end_to_end_with_timm_encoder(timm_pair, real):
    encoder, _ = timm_pair
    protos = compute_prototypes(encoder, real, progress=False)
    raw = raw_generated(num_groups=5)
    out = annotate(raw, CLASS_NAMES, encoder, protos, 4.0, lambdas=LAMBDAS, batch_size=3, progress=False)
    assert out.features == csm_features(CLASS_NAMES) and out.column_names == list(csm_features(CLASS_NAMES))
    assert len(out) == 40
    cols = out.select_columns([c for c in out.column_names if c != "image"]).with_format("numpy")[:]
    images = np.stack([np.asarray(im)[None] for im in raw["image"]])
    feats = encoder.encode(images)
    a, b = torch.as_tensor(cols["class_a"]), torch.as_tensor(cols["class_b"])
    lam = projection_coefficient(feats, protos.means, a, b)
    torch.testing.assert_close(torch.as_tensor(cols["lambda_hat"]), lam.float(), rtol=1e-5, atol=1e-5)
    qa = torch.sigmoid(4.0 * (lam - 0.5)).float()
    soft = torch.as_tensor(cols["soft_label"])
    torch.testing.assert_close(soft[torch.arange(40), a], qa, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(soft.sum(1), torch.ones(40))
    assert (cols["label"] == soft.argmax(1).numpy()).all()
    # images pass through byte for byte, provenance columns unchanged
    src = raw.cast_column("image", datasets.Image(decode=False))
    dst = out.cast_column("image", datasets.Image(decode=False))
    assert [r["bytes"] for r in src["image"]] == [r["bytes"] for r in dst["image"]]
    assert cols["group_id"].tolist() == raw["group_id"] and cols["seed"].tolist() == raw["seed"]
    np.testing.assert_array_equal(cols["lambda_gen"], np.asarray(raw["lambda_gen"], np.float32))

    # s changes without re-encoding
    rescaled = rescale_soft_labels(out, 2.3)
    direct = annotate(raw, CLASS_NAMES, encoder, protos, 2.3, lambdas=LAMBDAS, progress=False)
    np.testing.assert_allclose(np.asarray(rescaled["soft_label"]), np.asarray(direct["soft_label"]), atol=1e-6)
    # variant 2 and the reference stand-in for variant 1
    gen = annotate(raw, CLASS_NAMES, encoder, protos, 4.0, label_mode="generation", progress=False)
    expected = np.where(np.asarray(raw["lambda_gen"]) >= 0.5, raw["class_a"], raw["class_b"])
    assert np.asarray(gen["label"]).tolist() == expected.tolist()
    np.testing.assert_allclose(np.asarray(gen["lambda_hat"]), np.asarray(out["lambda_hat"]), atol=1e-5)
    with pytest.raises(ValueError, match="zero-shot"):
        annotate(raw, CLASS_NAMES, encoder, protos, 4.0, label_mode="zero_shot", progress=False)


def test_annotate_zero_shot_with_open_clip(clip_encoder):
    rgb = synthetic_arrays()
    rgb.images = np.repeat(rgb.images, 3, axis=1)
    protos = compute_prototypes(clip_encoder, rgb, progress=False)
    raw = raw_generated(num_groups=3)
    out = annotate(raw, CLASS_NAMES, clip_encoder, protos, 4.0, label_mode="zero_shot", progress=False)
    images = np.stack([np.asarray(im)[None] for im in raw["image"]])
    probs = clip_encoder.zero_shot_probs(clip_encoder.encode(images), CLASS_NAMES)
    np.testing.assert_allclose(np.asarray(out["soft_label"]), probs.numpy(), atol=1e-5)
    assert np.asarray(out["label"]).tolist() == probs.argmax(1).tolist()


def test_annotate_errors_name_the_problem(timm_pair, real):
    encoder, _ = timm_pair
    protos = compute_prototypes(encoder, real, progress=False)

    def run(raw, names=CLASS_NAMES, **kw):
        return annotate(raw, names, encoder, protos, 4.0, lambdas=LAMBDAS, progress=False, **kw)

    with pytest.raises(ValueError, match=r"class_b out of range \[0, 3\).*group_id 1"):
        run(raw_generated(edit=lambda r: r["class_b"].__setitem__(9, 7)))
    with pytest.raises(ValueError, match="differ from the real dataset.*1: 'crosses' != 'cross'"):
        run(raw_generated(), names=["circle", "crosses", "stripes"])

    def corrupt(rows):
        rows["image"][13] = {"bytes": b"definitely not a png", "path": None}
    with pytest.raises(ValueError, match=r"row 13 \(group_id 1\): image does not decode"):
        run(raw_generated(edit=corrupt))

    def drop(rows):
        for key in rows:
            del rows[key][17]  # group 2 loses one member
    with pytest.raises(ValueError, match="1 of 4 groups.*fewer members.*drop_incomplete"):
        run(raw_generated(edit=drop))
    messages = []
    out = run(raw_generated(edit=drop), drop_incomplete=True, log=messages.append)
    assert len(out) == 24 and 2 not in set(out["group_id"])
    assert messages == ["dropped 1 incomplete group(s) (7 rows) of 4"] and out.info.description == messages[0]
    with pytest.raises(ValueError, match="off the grid"):
        run(raw_generated(edit=lambda r: r["lambda_gen"].__setitem__(3, 0.5)))


def test_check_groups_counts_repeats_and_missing():
    gid = [0] * 3 + [1] * 3 + [2] * 4 + [3] * 2
    lam = [0, 0.5, 1, 0, 0.5, 0.5, 0, 0.5, 1, 1, 0, 1]
    check = check_groups(gid, lam, [0, 0.5, 1])
    assert check.bad_group_ids.tolist() == [1, 2, 3] and check.num_groups == 4
    assert check.bad_rows.sum() == 9 and "1 have fewer members" in check.message
    with pytest.raises(ValueError, match="mix different seed"):
        check_groups([0, 0], [0, 1], [0, 1], seed=[1, 2])


# ---------------------------------------------------------------- reference encoder

def test_reference_encoder_trains_resumes_and_caches(tmp_path, monkeypatch):
    from timm_csm.annotation import reference

    data = synthetic_arrays(n_per_class=40)
    kw = dict(epochs=2, batch_size=16, seed=3, progress=False, log=lambda m: None)
    full = train_reference_encoder(data, tmp_path / "full", test=synthetic_arrays(seed=5), **kw)
    assert isinstance(full, ReferenceEncoder) and full.config["complete"] is True
    assert {p.name for p in (tmp_path / "full").iterdir()} == {"config.json", "model.safetensors"}
    assert full.test_accuracy is not None and 0.0 <= full.test_accuracy <= 1.0
    logits = full.classify(data.images[:10])
    assert logits.shape == (10, 3)
    feats = full.encode(data.images[:10])
    torch.testing.assert_close(full.zero_shot_probs(feats, CLASS_NAMES), logits.softmax(-1), rtol=1e-5, atol=1e-6)

    # interrupted in epoch 2 (8 steps per epoch): the rerun resumes from the epoch-1 checkpoint, same weights
    train_interrupted(monkeypatch, lambda: train_reference_encoder(data, tmp_path / "resumed", **kw), 10)
    assert (tmp_path / "resumed" / reference.CHECKPOINT).is_file()
    messages = []
    resumed = train_reference_encoder(data, tmp_path / "resumed", **{**kw, "log": messages.append})
    assert messages == ["reference encoder: resuming from epoch 1"]
    for (k, v), (_, w) in zip(full.model.state_dict().items(), resumed.model.state_dict().items()):
        torch.testing.assert_close(v, w, rtol=0, atol=0, msg=k)

    # a checkpoint of earlier versions (a torch.save pickle, never unpickled): named, removed, trained from the seed
    old = tmp_path / "old" / "checkpoint"
    old.mkdir(parents=True)
    (old / reference.PICKLED_STATE_FILE).write_bytes(b"old checkpoint")
    messages.clear()
    restarted = train_reference_encoder(data, tmp_path / "old", **{**kw, "log": messages.append})
    assert len(messages) == 1 and str(old / reference.PICKLED_STATE_FILE) in messages[0]
    assert "starts over" in messages[0]
    assert not old.exists()
    torch.testing.assert_close(restarted.encode(data.images[:10]), feats, rtol=0, atol=0)

    # same configuration: reused, not retrained; another configuration in the folder: refused
    messages.clear()
    again = train_reference_encoder(data, tmp_path / "full", **{**kw, "log": messages.append})
    assert messages == [f"reference encoder: reusing {tmp_path / 'full'}"] and again.identity == full.identity
    with pytest.raises(ValueError, match=r"different configuration \(differs in \['lr'\]\)"):
        train_reference_encoder(data, tmp_path / "full", lr=1e-2, **kw)
    loaded = load_reference_encoder(tmp_path / "full")
    torch.testing.assert_close(loaded.encode(data.images[:10]), feats, rtol=0, atol=0)
    assert loaded.identity == full.identity


def test_damaged_caches_are_named_and_rebuilt(timm_pair, real, tmp_path, monkeypatch):
    from timm_csm.annotation import reference

    encoder, _ = timm_pair
    first = load_or_compute_prototypes(encoder, real, cache_dir=tmp_path, progress=False)
    cache = next((tmp_path / "prototypes").glob("*.safetensors"))
    cache.write_bytes(cache.read_bytes()[:-40])  # truncated: a bare SafetensorError before
    lines = []
    again = load_or_compute_prototypes(encoder, real, cache_dir=tmp_path, progress=False, log=lines.append)
    assert len(lines) == 1 and str(cache) in lines[0] and "damaged (SafetensorError" in lines[0]
    torch.testing.assert_close(again.means, first.means, rtol=0, atol=0)
    torch.testing.assert_close(ClassPrototypes.load(cache).means, first.means, rtol=0, atol=0)  # rewritten

    # the reference encoder: truncated weights are trained again (same seed, same weights)
    data = synthetic_arrays(n_per_class=16)
    kw = dict(epochs=2, batch_size=16, seed=3, progress=False)
    full = train_reference_encoder(data, tmp_path / "ref", log=lambda m: None, **kw)
    weights = tmp_path / "ref" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    lines.clear()
    rebuilt = train_reference_encoder(data, tmp_path / "ref", log=lines.append, **kw)
    assert str(weights) in lines[0] and "damaged" in lines[0] and not any("reusing" in m for m in lines)
    for (k, v), (_, w) in zip(full.model.state_dict().items(), rebuilt.model.state_dict().items()):
        torch.testing.assert_close(v, w, rtol=0, atol=0, msg=k)

    # a truncated checkpoint of an interrupted run (3 steps per epoch: stopped in epoch 2): named, and it starts over
    train_interrupted(monkeypatch, lambda: train_reference_encoder(data, tmp_path / "cut", log=lambda m: None, **kw), 4)
    state = tmp_path / "cut" / reference.CHECKPOINT
    state.write_bytes(state.read_bytes()[:64])
    lines.clear()
    restarted = train_reference_encoder(data, tmp_path / "cut", log=lines.append, **kw)
    assert lines[0].startswith(f"{state} is a damaged reference encoder checkpoint") and "starts over" in lines[0]
    assert not any("resuming" in m for m in lines) and not state.exists()
    for (k, v), (_, w) in zip(full.model.state_dict().items(), restarted.model.state_dict().items()):
        torch.testing.assert_close(v, w, rtol=0, atol=0, msg=k)


def test_encode_images_streams_batches(timm_pair, real):
    encoder, _ = timm_pair
    whole = encode_images(encoder, real.images, batch_size=1000)
    seen = []
    assert encode_images(encoder, real.images, batch_size=5, reduce=lambda f, rows: seen.append((rows, f))) is None
    torch.testing.assert_close(torch.cat([f for _, f in seen]), whole, rtol=1e-5, atol=1e-6)
    assert [r.start for r, _ in seen] == list(range(0, len(real), 5))


def test_reference_augmentation_is_the_training_crop_and_flip():
    """The reference encoder's augmentation is the shared pad-crop + flip, applied to uint8 batches."""
    from timm_csm.data.transforms import pad_crop_flip, sample_crop_flip

    x = torch.randint(1, 256, (6, 1, 8, 8), dtype=torch.uint8)
    params = sample_crop_flip(6, 2, 0.5, torch.Generator().manual_seed(0))
    out = pad_crop_flip(x, params, 2)
    assert out.dtype == torch.uint8 and out.shape == x.shape
    padded = torch.nn.functional.pad(x, (2, 2, 2, 2))
    for i in range(6):
        dy, dx = params["offsets"][i].tolist()
        crop = padded[i][:, dy: dy + 8, dx: dx + 8]
        assert torch.equal(out[i], crop.flip(-1) if params["flips"][i] else crop)
