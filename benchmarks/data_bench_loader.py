"""The data benchmark's part 2: images per second of the training loader as ``train.py`` builds it against timm's
``create_loader`` on the same folder (``loader``); see ``data_bench.py``."""
from __future__ import annotations

import time
from pathlib import Path

from data_bench_folders import BATCH, SIDE, training_args


def training_data(folder: Path):
    """(args, splits) of a ``train.py`` run on ``folder`` with timm's transform."""
    from timm_csm.training import load_data

    args = training_args(folder, "timm")
    return args, load_data(args)


def our_loader(args, data, transform: str, workers: int):
    """The training loader exactly as ``train.py`` builds it with ``--transform transform --workers workers``, and
    the run's data settings."""
    import copy

    import timm
    from accelerate import Accelerator

    from timm_csm.losses import create_loss
    from timm_csm.training import ClassificationTask, build_transforms, input_channels
    from timm_csm.training.loop import train_loader

    args = copy.copy(args)
    args.transform, args.workers = transform, workers
    in_chans = input_channels(args, data)
    model = timm.create_model("small_cnn", num_classes=len(data.class_names), in_chans=in_chans)
    train_tf, _, info = build_transforms(args, data, in_chans, model.pretrained_cfg)
    loader, _ = train_loader(ClassificationTask(model, create_loss("ce")), data.train, train_tf, args,
                             Accelerator(cpu=True))
    return loader, dict(info, train_interpolation=args.train_interpolation or info["interpolation"])


def timm_loader(folder: Path, info: dict, workers: int):
    """``timm.data.create_loader`` over ``ImageDataset(folder/train)`` with the run's transform settings (the train
    interpolation as timm's train.py passes it)."""
    from timm.data import ImageDataset, create_loader

    dataset = ImageDataset(str(folder / "train"), input_img_mode="L")
    return create_loader(dataset, input_size=(1, SIDE, SIDE), batch_size=BATCH, is_training=True,
                         use_prefetcher=False, num_workers=workers, mean=tuple(info["mean"]), std=tuple(info["std"]),
                         interpolation=info["train_interpolation"], crop_pct=info["crop_pct"], persistent_workers=False)


def images_per_second(loader, batches: int) -> float:
    """Images per second over ``batches`` batches after the first (a fresh iterator: worker start-up and the
    first batch are left out)."""
    it = iter(loader)
    next(it)
    n, t = 0, time.perf_counter()
    for _ in range(batches):
        batch = next(it)
        n += len(batch["pixel_values"] if isinstance(batch, dict) else batch[0])
    rate = n / (time.perf_counter() - t)
    del it
    return rate


def loader_rows(folder: Path, batches: int, rounds: int = 3):
    args, data = training_data(folder)
    ours = {w: our_loader(args, data, "timm", w) for w in (0, 1)}
    padcrop = {w: our_loader(args, data, "cifar", w)[0] for w in (0, 1)}  # after: it resizes the split's output
    rows = []
    for workers in (0, 1):
        loader, info = ours[workers]
        reference = timm_loader(folder, info, workers)
        if repr(loader.collate_fn.transform.transform) != repr(reference.dataset.transform):
            raise AssertionError(f"different transforms:\n{loader.collate_fn.transform.transform}\n"
                                 f"{reference.dataset.transform}")
        loaders = {"timm create_loader": reference, "ours, timm transform": loader,
                   "ours, pad-crop (batched)": padcrop[workers]}
        best = {name: 0.0 for name in loaders}
        for _ in range(rounds):  # interleaved, so that load changes on the shared machine hit every loader alike
            for name, each in loaders.items():
                best[name] = max(best[name], images_per_second(each, batches))
        rows.append((workers, best))
    return rows


def loader_table(rows, batches: int) -> str:
    lines = ["| workers | timm `create_loader` (img/s) | ours, timm transform (img/s) | ours / timm "
             "| ours, pad-crop batched (img/s) |", "|---|---|---|---|---|"]
    verdicts = []
    for workers, best in rows:
        t, o, p = best["timm create_loader"], best["ours, timm transform"], best["ours, pad-crop (batched)"]
        lines.append(f"| {workers} | {t:.0f} | {o:.0f} | {o / t:.2f}x | {p:.0f} |")
        verdicts.append(f"workers {workers}: {'met' if o >= 0.9 * t else 'not met'}")
    lines.append(f"\nbest of 3 interleaved rounds of {batches} batches of {BATCH} (after the first batch of a fresh "
                 f"iterator); goal ours / timm >= 0.9x: {', '.join(verdicts)}")
    return "\n".join(lines)
