"""Small hand-built data for the annotation and hub tests: real-like class images (in memory or as a PNG image
folder), raw generated groups, an annotated CSM dataset, and a tiny timm encoder loaded from a local checkpoint."""
import io
import math

import numpy as np
import torch

from timm_csm.data import ImageArrays

CLASS_NAMES = ["circle", "cross", "stripes"]
LAMBDAS = [float(v) for v in np.linspace(0, 1, 8)]
SIZE = 16


def class_patterns(size: int = SIZE) -> np.ndarray:
    """(3, size, size) float patterns in [0, 255], one per class."""
    yy, xx = np.mgrid[:size, :size]
    c = (size - 1) / 2
    circle = ((yy - c) ** 2 + (xx - c) ** 2 < (size / 3) ** 2) * 220.0
    cross = ((np.abs(yy - c) < 2) | (np.abs(xx - c) < 2)) * 220.0
    stripes = ((xx // 2) % 2) * 220.0
    return np.stack([circle, cross, stripes]).astype(np.float64)


def synthetic_arrays(n_per_class: int = 12, seed: int = 0, source: str = "shapes") -> ImageArrays:
    rng = np.random.default_rng(seed)
    pats = class_patterns()
    images, labels = [], []
    for k, p in enumerate(pats):
        for _ in range(n_per_class):
            images.append(np.clip(p + rng.normal(0, 20, p.shape), 0, 255).round().astype(np.uint8)[None])
            labels.append(k)
    order = rng.permutation(len(labels))
    return ImageArrays(np.stack(images)[order], np.asarray(labels, np.int64)[order], list(CLASS_NAMES), source)


def png_bytes(image_chw: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image_chw[0]).save(buf, format="PNG")
    return buf.getvalue()


def write_image_folder(root, splits=("val", "test"), n_per_class: int = 30, seed: int = 0, noise: float = 60.0):
    """An image folder of grey PNGs of the three class patterns: ``<split>/<class>/<i>.png`` for each of
    ``splits``, or timm's flat ``<class>/<i>.png`` for a split None; returns ``root``."""
    rng = np.random.default_rng(seed)
    patterns = class_patterns()
    for split in splits:
        for k, name in enumerate(CLASS_NAMES):
            folder = root / split / name if split else root / name
            folder.mkdir(parents=True)
            for i in range(n_per_class):
                noisy = np.clip(patterns[k] + rng.normal(0, noise, patterns[k].shape), 0, 255).astype(np.uint8)
                (folder / f"{i}.png").write_bytes(png_bytes(noisy[None]))
    return root


def raw_generated_rows(num_groups: int = 4, seed: int = 0):
    """Rows of the raw generated format: each group mixes two class patterns (pixel space) over the lambda grid."""
    rng = np.random.default_rng(seed)
    pats = class_patterns()
    pairs = [(0, 1), (0, 2), (1, 2)]
    rows = {k: [] for k in ("image", "group_id", "seed", "class_a", "class_b", "lambda_gen", "generator",
                            "generator_revision")}
    for g in range(num_groups):
        a, b = pairs[g % len(pairs)]
        noise = rng.normal(0, 10, pats[0].shape)
        for lam in LAMBDAS:
            img = np.clip(lam * pats[a] + (1 - lam) * pats[b] + noise, 0, 255).round().astype(np.uint8)[None]
            rows["image"].append({"bytes": png_bytes(img), "path": None})
            rows["group_id"].append(g)
            rows["seed"].append(1000 + g)
            rows["class_a"].append(a)
            rows["class_b"].append(b)
            rows["lambda_gen"].append(lam)
            rows["generator"].append("hand-made")
            rows["generator_revision"].append("0")
    return rows


def raw_features():
    import datasets

    return datasets.Features({
        "image": datasets.Image(), "group_id": datasets.Value("int64"), "seed": datasets.Value("int64"),
        "class_a": datasets.Value("int64"), "class_b": datasets.Value("int64"),
        "lambda_gen": datasets.Value("float32"), "generator": datasets.Value("string"),
        "generator_revision": datasets.Value("string"),
    })


def raw_generated(num_groups: int = 4, seed: int = 0, edit=None):
    import datasets

    rows = raw_generated_rows(num_groups, seed)
    if edit is not None:
        edit(rows)
    return datasets.Dataset.from_dict(rows, features=raw_features())


def annotated_by_hand(num_groups: int = 5, s: float = 4.0, seed: int = 0):
    """An annotated CSM dataset built directly from the formula (no encoder)."""
    from timm_csm.data import csm_dataset_from_columns

    rng = np.random.default_rng(seed)
    rows = raw_generated_rows(num_groups, seed)
    n = len(rows["group_id"])
    lam_hat = (np.asarray(rows["lambda_gen"]) + rng.normal(0, 0.1, n)).astype(np.float32)
    soft = np.zeros((n, len(CLASS_NAMES)), np.float32)
    label = []
    for i in range(n):
        qa = 1.0 / (1.0 + math.exp(-s * (float(lam_hat[i]) - 0.5)))
        soft[i, rows["class_a"][i]] = qa
        soft[i, rows["class_b"][i]] = 1.0 - qa
        label.append(rows["class_a"][i] if qa >= 0.5 else rows["class_b"][i])
    data = {"image": rows["image"], "label": label, "soft_label": soft.tolist(), "class_a": rows["class_a"],
            "class_b": rows["class_b"], "lambda_gen": rows["lambda_gen"], "lambda_hat": lam_hat.tolist(),
            "group_id": rows["group_id"], "seed": rows["seed"]}
    return csm_dataset_from_columns(data, CLASS_NAMES)


def tiny_timm_model(seed: int = 0):
    import timm

    torch.manual_seed(seed)
    return timm.create_model("test_resnet", pretrained=False, in_chans=1, num_classes=len(CLASS_NAMES)).eval()


def tiny_timm_encoder(tmp_path, seed: int = 0):
    """timm's ``test_resnet`` (0.37 M parameters) saved to a local safetensors checkpoint and loaded back."""
    from safetensors.torch import save_file

    from timm_csm.annotation import TimmEncoder

    model = tiny_timm_model(seed)
    path = tmp_path / f"test_resnet-{seed}.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return TimmEncoder("test_resnet", checkpoint_path=path, input_size=(1, 32, 32), model_kwargs={"in_chans": 1}), model


def train_interrupted(monkeypatch, train, stop_at: int) -> None:
    """Run ``train()`` with cross-entropy raising KeyboardInterrupt at its call number ``stop_at`` (a killed
    reference-encoder training), then restore it."""
    import pytest
    import torch.nn.functional as F

    calls, real_ce = {"n": 0}, F.cross_entropy

    def flaky(*a, **k):
        calls["n"] += 1
        if calls["n"] == stop_at:
            raise KeyboardInterrupt
        return real_ce(*a, **k)
    monkeypatch.setattr(F, "cross_entropy", flaky)
    try:
        with pytest.raises(KeyboardInterrupt):
            train()
    finally:
        monkeypatch.setattr(F, "cross_entropy", real_ce)


def save_tiny_generator(folder, class_names, metadata, sample_size: int = 28, in_channels: int = 1):
    """Save a generator folder: the smoke profile's UNet at ``sample_size`` x ``sample_size`` x ``in_channels`` for
    ``class_names``, random non-trivial weights (seed 0), a DDIM scheduler."""
    import dataclasses

    from diffusers import DDIMScheduler

    from timm_csm.generation import GENERATOR_PROFILES, SemanticMixingPipeline, create_class_unet

    torch.manual_seed(0)
    cfg = dataclasses.replace(GENERATOR_PROFILES["smoke"], sample_size=sample_size, in_channels=in_channels)
    unet = create_class_unet(cfg, len(class_names)).eval()
    for p in unet.parameters():  # diffusers zero-inits some output layers
        p.data.normal_(0, 0.05)
    sched = DDIMScheduler(num_train_timesteps=1000, beta_schedule="squaredcos_cap_v2")
    SemanticMixingPipeline(unet, sched, list(class_names), metadata=metadata).save_pretrained(folder)
    return folder



def as_earlier_checkpoint(last, folder, split_model=False):
    """Rewrite the checkpoint ``last`` (``last.safetensors``) in the layout of the version before: the folder
    ``folder`` holding the state in ``state.safetensors`` and the progress (its plain values) in ``state.json``;
    ``split_model``: the generator's layout before that, the UNet in ``model.safetensors`` and the rest in
    ``training_state.safetensors``."""
    import json

    from safetensors.torch import save_file

    from timm_csm.io import load_state, save_state

    state = load_state(last)
    progress = {k: state.pop(k) for k in [k for k, v in state.items() if not isinstance(v, (dict, torch.Tensor))]}
    folder.mkdir(parents=True)
    if split_model:
        save_file({k: v.contiguous() for k, v in state.pop("model").items()}, folder / "model.safetensors")
        save_state(folder / "training_state.safetensors", state)
    else:
        save_state(folder / "state.safetensors", state)
    (folder / "state.json").write_text(json.dumps(progress))
    last.unlink()
