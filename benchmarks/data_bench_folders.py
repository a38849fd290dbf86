"""The data benchmark's image folders: real Fashion-MNIST written as 64 x 64 grey PNGs (``train/<class>/<i>.png``
and a small ``test/``), once under ``--root`` and reused, and the ``train.py`` configuration every part runs on them.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_EVALUATE_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
SIDE = 64
BATCH = 128
SEED = 0


def class_dirs():
    from timm_csm.data import FASHION_MNIST_CLASSES

    return [f"{k}-{name.replace('/', '-')}" for k, name in enumerate(FASHION_MNIST_CLASSES)]  # sorted = label order


def variant_images(images: np.ndarray, rows: np.ndarray, seed: int) -> np.ndarray:
    """uint8 (len(rows), SIDE, SIDE): image ``rows % N`` of ``images`` (N, 1, 28, 28) resized to SIDE px; each
    repetition past the first (``rows >= N``) flipped left-right with probability 1/2 and shifted by up to 4 px
    (zero fill), seeded by (seed, row)."""
    import torch.nn.functional as F

    n = len(images)
    x = torch.from_numpy(images[rows % n]).float()
    x = F.interpolate(x, size=(SIDE, SIDE), mode="bilinear", align_corners=False).round().clamp(0, 255)
    padded = F.pad(x, (4, 4, 4, 4))
    for j, row in enumerate(rows):
        if row < n:
            continue
        rng = np.random.default_rng([seed, int(row)])
        dy, dx = rng.integers(0, 9, size=2)
        img = padded[j, :, dy:dy + SIDE, dx:dx + SIDE]
        x[j] = img.flip(-1) if rng.random() < 0.5 else img
    return x[:, 0].to(torch.uint8).numpy()


def write_split(folder: Path, split: str, arrays, n: int, seed: int) -> None:
    """``folder/split/<class>/<i>.png`` for i < n; files already there are kept (an interrupted run resumes)."""
    from PIL import Image

    names = class_dirs()
    for d in names:
        (folder / split / d).mkdir(parents=True, exist_ok=True)
    for start in range(0, n, 2000):
        rows = np.arange(start, min(n, start + 2000))
        paths = [folder / split / names[arrays.labels[r % len(arrays.labels)]] / f"{r}.png" for r in rows]
        todo = [j for j, p in enumerate(paths) if not p.exists()]
        if not todo:
            continue
        images = variant_images(arrays.images, rows[todo], seed)
        for img, j in zip(images, todo):
            tmp = paths[j].with_suffix(".tmp")
            Image.fromarray(img).save(tmp, format="PNG")
            os.replace(tmp, paths[j])


def image_folder(root: Path, n_train: int, n_test: int, seed: int = SEED) -> Path:
    """The folder of ``n_train`` training and ``n_test`` test images, written unless complete already."""
    from timm_csm.data import load_fashion_mnist

    folder = root / f"fmnist{SIDE}-{n_train}"
    spec = {"n_train": n_train, "n_test": n_test, "side": SIDE, "seed": seed, "source": "fashion_mnist"}
    marker = root / f"{folder.name}.complete.json"  # beside it: a data file inside makes it a datasets data folder
    if marker.is_file() and json.loads(marker.read_text()) == spec:
        return folder
    t = time.time()
    write_split(folder, "train", load_fashion_mnist("train"), n_train, seed)
    write_split(folder, "test", load_fashion_mnist("test"), n_test, seed)
    marker.write_text(json.dumps(spec))
    print(f"wrote {folder} in {time.time() - t:.0f} s", flush=True)
    return folder


def training_args(folder: Path, transform: str):
    """The configuration of a ``train.py`` run on ``folder`` (small_cnn, 64 px, 1 channel, batch 128)."""
    from timm_csm.training import apply_input_size, parse_args

    args = parse_args(["--dataset", str(folder), "--model", "small_cnn", "--img-size", str(SIDE), "--in-chans", "1",
                       "-b", str(BATCH), "--transform", transform, "--seed", str(SEED)])
    apply_input_size(args)
    return args
