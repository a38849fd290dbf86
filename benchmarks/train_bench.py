"""Training-step cost of CSM against cross-entropy, and the share of companion sampling in batch assembly.

A CSM step sees (2 + n_aug) times the images of a CE step: the real batch, then per sample the best-matching
group member and n_aug interior members, in a second forward pass. Goal: CSM step time within 10% of
(2 + n_aug) x the CE step at the same real batch size and model. Companion sampling (group draw, endpoint and
interior choice: ``CSMCompanionSampler.draw_uniforms`` + ``select``) should take under 5% of the time the
collator needs to assemble a CSM batch from in-memory images.

    nice -n 10 env OMP_NUM_THREADS=1 .venv/bin/python benchmarks/train_bench.py [--quick]
"""
import argparse
import statistics
import sys
import time

import numpy as np
import torch

import timm
import timm_csm  # noqa: F401
from timm_csm.data import (CSMCollator, CSMCompanionSampler, CSMGroups, ImageCollator, SampleRef, create_transforms,
                           load_fashion_mnist)
from timm_csm.losses import create_loss
from timm_csm.training import ClassificationTask, CSMTask


def synthetic_groups(num_classes, img_shape, n_lambdas=8, seeds=4, seed=0):
    """In-memory groups over every class pair (the layout of the published dataset)."""
    rng = np.random.default_rng(seed)
    pairs = [(a, b) for a in range(num_classes) for b in range(a + 1, num_classes)]
    n = len(pairs) * seeds * n_lambdas
    images = rng.integers(0, 256, size=(n, *img_shape), dtype=np.uint8)
    q = np.zeros((n, num_classes), np.float32)
    a_col, b_col, gid = np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, np.int64)
    lam = np.tile(np.linspace(0, 1, n_lambdas), len(pairs) * seeds)
    for g, (a, b) in enumerate(pairs * seeds):
        rows = slice(g * n_lambdas, (g + 1) * n_lambdas)
        qa = 1 / (1 + np.exp(-4 * (lam[rows] - 0.5)))
        q[rows, a], q[rows, b] = qa, 1 - qa
        a_col[rows], b_col[rows], gid[rows] = a, b, g
    return CSMGroups.from_arrays(images, q, a_col, b_col, gid, [str(i) for i in range(num_classes)], lam)


def median_times(fns, repeats, warmup=2):
    """Median seconds per call of each function, timed in interleaved rounds so that load drift (the machine is
    shared) hits all of them alike."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    return {name: statistics.median(v) for name, v in times.items()}


def refs(batch, step, n):
    idx = torch.randperm(n, generator=torch.Generator().manual_seed(step))[:batch].tolist()
    return [SampleRef(i, 0, step, s, batch) for s, i in enumerate(idx)]


def bench_model(name, images, labels, groups, batch, n_aug, repeats, in_chans):
    k = groups.num_classes
    size = images.shape[-1]
    train_tf, _ = create_transforms(size, (0.5,) * in_chans, (0.25,) * in_chans, in_chans)
    sampler = CSMCompanionSampler(groups, n_aug=n_aug)
    ce_col = ImageCollator(images, labels, train_tf, seed=0)
    csm_col = CSMCollator(images, labels, train_tf, sampler, seed=0)

    # batch assembly, and companion sampling inside it
    step = iter(range(10 ** 6))
    y = torch.as_tensor(labels[:batch])
    g = torch.Generator().manual_seed(0)
    t = median_times({
        "ce_collate": lambda: ce_col(refs(batch, next(step), len(images))),
        "csm_collate": lambda: csm_col(refs(batch, next(step), len(images))),
        "sampling": lambda: sampler.select(y, *sampler.draw_uniforms(batch, g)),
    }, repeats * 10)

    # training steps on prebuilt batches
    model = timm.create_model(name, num_classes=k, in_chans=in_chans)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    ce_task, csm_task = ClassificationTask(model, create_loss("ce")), CSMTask(model, create_loss("csm"), sampler)
    ce_batch = ce_col(refs(batch, 0, len(images)))
    csm_batch = csm_col(refs(batch, 0, len(images)))
    big = (2 + n_aug) * batch
    big_batch = ImageCollator(images, labels, train_tf, seed=0)(refs(big, 1, len(images)))

    def ce_step(b=ce_batch):
        loss = ce_task(b)["loss"]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 2.0)
        opt.step()

    def csm_step():
        loss = csm_task(csm_batch)["loss"]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 2.0)
        opt.step()

    model.train()
    t.update(median_times({"ce": ce_step, "csm": csm_step, "ce_big": lambda: ce_step(big_batch)}, repeats))
    return dict(model=name, size=f"{in_chans}x{size}x{size}", batch=batch, n_aug=n_aug, t_ce=t["ce"],
                t_csm=t["csm"], t_ce_big=t["ce_big"], ratio=t["csm"] / ((2 + n_aug) * t["ce"]),
                t_ce_collate=t["ce_collate"], t_csm_collate=t["csm_collate"], t_sampling=t["sampling"],
                share=t["sampling"] / t["csm_collate"])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer repeats, small model only")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    repeats = 3 if args.quick else 7
    fm = load_fashion_mnist("train").subset(np.arange(10000))
    rows = []
    g28 = synthetic_groups(10, (1, 28, 28))
    rows.append(bench_model("small_cnn", fm.images, fm.labels, g28, 128, 1, repeats, 1))
    rows.append(bench_model("small_cnn", fm.images, fm.labels, g28, 128, 3, repeats, 1))
    if not args.quick:
        rng = np.random.default_rng(0)
        cifar_like = rng.integers(0, 256, size=(5000, 3, 32, 32), dtype=np.uint8)
        cifar_labels = rng.integers(0, 10, size=5000)
        g32 = synthetic_groups(10, (3, 32, 32))
        rows.append(bench_model("resnet18_cifar", cifar_like, cifar_labels, g32, 64, 1, 3, 3))
    print("| model | input | real batch | n_aug | CE step (s) | CSM step (s) | CSM / ((2+n_aug) x CE) "
          "| CE step at (2+n_aug) x batch (s) | CE batch assembly (ms) | CSM batch assembly (ms) "
          "| companion sampling (ms) | sampling share |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['size']} | {r['batch']} | {r['n_aug']} | {r['t_ce']:.3f} | {r['t_csm']:.3f} | "
              f"{r['ratio']:.2f} | {r['t_ce_big']:.3f} | {1e3 * r['t_ce_collate']:.1f} | "
              f"{1e3 * r['t_csm_collate']:.1f} | {1e3 * r['t_sampling']:.3f} | {100 * r['share']:.2f}% |")
    return rows


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
