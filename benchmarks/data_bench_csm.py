"""The data benchmark's part 3: a CSM training step with companions read lazily from the generated set's Arrow
dataset against the same set decoded into memory (``csm``); see ``data_bench.py``."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from data_bench_folders import BATCH, SEED

LAMBDAS = np.linspace(0.0, 1.0, 8)


def synthetic_csm_set(folder: Path, seeds_per_pair: int, seed: int = SEED) -> Path:
    """A generated set in the published format (written once): per class pair (a, b) and seed, a group of 8 images
    lam * x_a + (1 - lam) * x_b of two real Fashion-MNIST training images of classes a and b (28 px, PNG), soft
    label q_a = sigmoid(4 (lam - 1/2)), q_b = 1 - q_a."""
    import itertools

    from PIL import Image

    from timm_csm.data import FASHION_MNIST_CLASSES, csm_dataset_from_columns, load_fashion_mnist
    from timm_csm.hub import save_csm_dataset

    if (folder / "README.md").is_file():
        return folder
    real = load_fashion_mnist("train")
    rng = np.random.default_rng(seed)
    by_class = [np.flatnonzero(real.labels == c) for c in range(10)]
    cols = {c: [] for c in ("image", "soft_label", "class_a", "class_b", "lambda_gen", "lambda_hat", "group_id",
                            "seed")}
    pairs = list(itertools.combinations(range(10), 2))
    for g, (s, (a, b)) in enumerate(itertools.product(range(seeds_per_pair), pairs)):
        xa, xb = (real.images[rng.choice(by_class[c]), 0].astype(np.float32) for c in (a, b))
        for lam in LAMBDAS:
            q = np.zeros(10, np.float32)
            q[a] = 1.0 / (1.0 + np.exp(-4.0 * (lam - 0.5)))
            q[b] = 1.0 - q[a]
            cols["image"].append(Image.fromarray(np.round(lam * xa + (1 - lam) * xb).astype(np.uint8)))
            cols["soft_label"].append(q.tolist())
            cols["lambda_gen"].append(float(lam))
            cols["lambda_hat"].append(float(lam))
            for key, v in (("class_a", a), ("class_b", b), ("group_id", g), ("seed", s)):
                cols[key].append(v)
    ds = csm_dataset_from_columns(cols, FASHION_MNIST_CLASSES)
    return save_csm_dataset(ds, folder, provenance={"generator": "synthetic blends of real images (benchmark)"})


def csm_groups_both(folder: Path):
    """(lazy, in-memory, build seconds of each): the set's groups read from its Arrow dataset as ``train.py`` does
    (``CSMGroups.from_dataset``, images decoded in ``L`` at 28 px when drawn), and decoded into a tensor first
    (``CSMGroups.from_arrays``)."""
    from timm_csm.data import FASHION_MNIST_CLASSES, CSMGroups
    from timm_csm.hub import load_csm_dataset

    ds = load_csm_dataset(folder)["train"]
    t = time.perf_counter()
    lazy = CSMGroups.from_dataset(ds, class_names=FASHION_MNIST_CLASSES)
    lazy.images = lazy.images.with_output("L", (28, 28))
    t_lazy = time.perf_counter() - t
    t = time.perf_counter()
    rows = np.arange(len(lazy.images))
    images = torch.cat([lazy.images[rows[i:i + 4096]] for i in range(0, len(rows), 4096)])
    cols = ds.select_columns(["soft_label", "class_a", "class_b", "group_id", "lambda_gen"]).with_format("numpy")[:]
    memory = CSMGroups.from_arrays(images, cols["soft_label"], cols["class_a"], cols["class_b"], cols["group_id"],
                                   FASHION_MNIST_CLASSES, cols["lambda_gen"])
    t_memory = time.perf_counter() - t
    if not torch.equal(lazy.members, memory.members):
        raise AssertionError("the two routes group the generated set differently")
    return lazy, memory, t_lazy, t_memory


def csm_loader(task, real, workers: int):
    """The CSM training loader as ``train.py`` builds it (``train_loader``: the task's collator over global
    batches), on the in-memory real images."""
    from accelerate import Accelerator

    from timm_csm.data import create_transforms
    from timm_csm.training import TrainConfig
    from timm_csm.training.loop import train_loader

    train_tf, _ = create_transforms(28, (0.286,), (0.353,), 1)
    config = TrainConfig(seed=SEED, batch_size=BATCH, workers=workers, pin_mem=False)
    return train_loader(task, real, train_tf, config, Accelerator(cpu=True))[0]


def seconds_per_step(loader, task, opt, steps: int) -> float:
    """Seconds per training step (batch from ``loader``, forward, backward, SGD update) over ``steps`` steps after
    the first of a fresh iterator."""
    it = iter(loader)
    t = None
    for i in range(steps + 1):
        if i == 1:
            t = time.perf_counter()
        loss = task(next(it))["loss"]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    seconds = (time.perf_counter() - t) / steps
    del it
    return seconds


def csm_routes(lazy, memory, n_aug: int):
    """{route: (task, optimizer)}: one CSM task per companion route, sharing one model and optimizer."""
    import timm

    from timm_csm.data import CSMCompanionSampler
    from timm_csm.losses import create_loss
    from timm_csm.training import CSMTask

    model = timm.create_model("small_cnn", num_classes=10, in_chans=1).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return {name: (CSMTask(model, create_loss("csm"), CSMCompanionSampler(groups, n_aug=n_aug)), opt)
            for name, groups in (("in memory", memory), ("lazy", lazy))}


def csm_rows(folder: Path, n_augs, steps: int, rounds: int = 3):
    """Per ``n_aug`` and worker count: seconds per CSM step of each route, best of ``rounds`` interleaved rounds;
    the first batches of the two routes are checked equal."""
    from timm_csm.data import load_fashion_mnist

    real = load_fashion_mnist("train")
    lazy, memory, t_lazy, t_memory = csm_groups_both(folder)
    rows = []
    for n_aug in n_augs:
        routes = csm_routes(lazy, memory, n_aug)
        for workers in (0, 1):
            loaders = {name: csm_loader(task, real, workers) for name, (task, _) in routes.items()}
            first = [next(iter(loader)) for loader in loaders.values()]
            if any(not torch.equal(first[0][k], first[1][k]) for k in first[0]):
                raise AssertionError("the lazy and in-memory routes give different batches at the same seed")
            best = {name: float("inf") for name in loaders}
            for _ in range(rounds):
                for name, loader in loaders.items():
                    best[name] = min(best[name], seconds_per_step(loader, *routes[name], steps))
            rows.append(dict(n_aug=n_aug, workers=workers, **best))
    return rows, dict(images=len(lazy.images), groups=lazy.num_groups, t_lazy=t_lazy, t_memory=t_memory)


def csm_table(rows, setup, steps: int) -> str:
    lines = ["| n_aug | generated images per step | workers | step, in memory (ms) | step, lazy (ms) "
             "| lazy / in memory |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['n_aug']} | {BATCH * (1 + r['n_aug'])} | {r['workers']} | {1e3 * r['in memory']:.0f} | "
                     f"{1e3 * r['lazy']:.0f} | {r['lazy'] / r['in memory']:.3f} |")
    lines.append(f"\ngenerated set: {setup['images']} images in {setup['groups']} groups of {len(LAMBDAS)}; set-up "
                 f"{setup['t_lazy']:.2f} s lazily (CSMGroups.from_dataset), {setup['t_memory']:.2f} s decoding it into "
                 "memory (CSMGroups.from_arrays). Step: a batch from the training loader (real batch "
                 f"{BATCH} of in-memory Fashion-MNIST, pad-crop transform), CSMTask forward and backward, SGD update; "
                 f"best of 3 interleaved rounds of {steps} steps after the first batch of a fresh iterator")
    return "\n".join(lines)
