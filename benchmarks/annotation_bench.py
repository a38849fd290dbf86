"""Annotation throughput against the encoder's raw forward pass.

    OMP_NUM_THREADS=1 python benchmarks/annotation_bench.py [--images 4096] [--clip-images 64] [--repeats 7]

For each encoder, over the same images, in interleaved rounds (so that every measurement sees the same background
load), wall-clock and CPU time (all threads) of:

* raw forward: ``encoder.forward_features`` on batches already preprocessed and in memory (the model alone);
* encode: ``encoder.encode`` on uint8 batches (tensor preprocessing + forward);
* annotate: :func:`timm_csm.annotation.annotate` on a raw generated ``Dataset`` of PNG images (decoding,
  preprocessing, forward, projection, soft labels and building the output ``Dataset``); its main thread's CPU time
  is also taken alone (``time.thread_time``), the decoding runs in a background thread;
* PNG decoding alone and preprocessing alone (the parts annotate adds to the forward).

Throughputs are medians over rounds; ratios are medians of per-round ratios. The goal is annotate within 10% of the
raw forward. Encoders: the reference CNN at 28 px (random weights: speed does not depend on them) and open_clip
ViT-B-32 at 224 px (random weights, the paper's architecture), on Fashion-MNIST test images grouped by 8 as
generated groups are.
"""
from __future__ import annotations

import argparse
import io
import os
import platform
import time

import numpy as np
import torch


def _png(img: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(img[0] if img.shape[0] == 1 else img.transpose(1, 2, 0)).save(buf, format="PNG")
    return buf.getvalue()


def raw_dataset(images: np.ndarray, num_classes: int = 10):
    import datasets

    n = len(images) - len(images) % 8
    lambdas = np.linspace(0, 1, 8)
    groups = np.arange(n) // 8
    a = groups % num_classes
    b = (a + 1 + groups % (num_classes - 1)) % num_classes
    rows = {"image": [{"bytes": _png(im), "path": None} for im in images[:n]], "group_id": groups, "seed": groups,
            "class_a": a, "class_b": b, "lambda_gen": np.tile(lambdas, n // 8).astype(np.float32)}
    features = datasets.Features({"image": datasets.Image(), "group_id": datasets.Value("int64"),
                                  "seed": datasets.Value("int64"), "class_a": datasets.Value("int64"),
                                  "class_b": datasets.Value("int64"), "lambda_gen": datasets.Value("float32")})
    return datasets.Dataset.from_dict(rows, features=features), lambdas


def interleaved_rounds(fns, repeats: int):
    """Wall and CPU seconds of each function in each of ``repeats`` rounds; the functions take turns within a round
    so that they see the same background load. Returns arrays (repeats, len(fns)) for wall and CPU."""
    wall = np.zeros((repeats, len(fns)))
    cpu = np.zeros((repeats, len(fns)))
    for r in range(repeats):
        for i, fn in enumerate(fns):
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            wall[r, i] = time.perf_counter() - t0
            cpu[r, i] = time.process_time() - c0
    return wall, cpu


def bench(name, encoder, images, batch_size, repeats, class_names):
    from timm_csm.annotation import annotate, decode_images

    n = len(images) - len(images) % 8
    images = images[:n]
    batches = [encoder.preprocess(images[i: i + batch_size]) for i in range(0, n, batch_size)]

    def raw():
        with torch.inference_mode():
            for x in batches:
                encoder.forward_features(x)

    def encode():
        for i in range(0, n, batch_size):
            encoder.encode(images[i: i + batch_size])

    generated, lambdas = raw_dataset(images)
    protos = torch.randn(len(class_names), encoder.feature_dim, dtype=torch.float64)
    column = generated.with_format("arrow", columns=["image"])

    def preprocess():
        for i in range(0, n, batch_size):
            encoder.preprocess(images[i: i + batch_size])

    def decode():  # what annotate's background thread does
        for i in range(0, n, batch_size):
            decode_images(column[i: i + batch_size].column("image").to_pylist(), i)

    main_thread = []

    def run_annotate():
        t0 = time.thread_time()  # this thread only: the decoding thread is not counted
        annotate(generated, class_names, encoder, protos, 4.0, lambdas=lambdas, batch_size=batch_size,
                 progress=False)
        main_thread.append(time.thread_time() - t0)

    raw()  # warm-up (allocator, oneDNN primitives)
    out = {"encoder": name, "images": n, "batch": batch_size}
    for clock, t in zip(("wall", "cpu"), interleaved_rounds([raw, encode, run_annotate, decode, preprocess],
                                                                     repeats)):
        # throughput: median over rounds; ratio: median of the per-round ratios (robust to load changes)
        for i, k in enumerate(("raw", "encode", "annotate", "decode", "preprocess")):
            out[f"{k}_{clock}"] = n / float(np.median(t[:, i]))
        out[f"ratio_{clock}"] = float(np.median(t[:, 0] / t[:, 2]))
        out[f"ratio_range_{clock}"] = (float((t[:, 0] / t[:, 2]).min()), float((t[:, 0] / t[:, 2]).max()))
        if clock == "cpu":
            # annotate's main thread does everything but the decoding, which its background thread does; with a
            # core free for that thread the wall time is the larger of the two
            main = np.asarray(main_thread)
            out["ratio_overlapped"] = float(np.median(t[:, 0] / np.maximum(main, t[:, 3])))
            out["overhead_us"] = float(np.median(main - t[:, 0])) / n * 1e6
            out["decode_us"] = float(np.median(t[:, 3])) / n * 1e6
            out["forward_us"] = float(np.median(t[:, 0])) / n * 1e6
            out["preprocess_us"] = float(np.median(t[:, 4])) / n * 1e6
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=4096)
    p.add_argument("--clip-images", type=int, default=64)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--clip-repeats", type=int, default=3)
    p.add_argument("--skip-clip", action="store_true")
    args = p.parse_args(argv)

    import datasets

    import timm

    from timm_csm.annotation import OpenClipEncoder, TimmEncoder
    from timm_csm.data import load_fashion_mnist

    datasets.disable_progress_bars()
    test = load_fashion_mnist("test")
    torch.manual_seed(0)
    reference = timm.create_model("reference_cnn", pretrained_cfg_overlay=dict(mean=(0.286,), std=(0.353,)))
    results = [bench("reference CNN, 28 px", TimmEncoder(reference),
                     test.images[: args.images], 256, args.repeats, test.class_names)]
    if not args.skip_clip:
        clip = OpenClipEncoder("ViT-B-32")
        results.append(bench("open_clip ViT-B-32, 28 -> 224 px", clip, test.images[: args.clip_images], 32,
                             args.clip_repeats, test.class_names))
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"{platform.processor() or platform.machine()}, load average {os.getloadavg()[0]:.1f} at the end, "
          f"{args.repeats} rounds")
    print("| encoder | images | batch | clock | raw forward (img/s) | encode (img/s) | annotate (img/s) "
          "| annotate / raw (median, range) | PNG decode alone (img/s) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        for m in ("cpu", "wall"):
            lo, hi = r[f"ratio_range_{m}"]
            print(f"| {r['encoder']} | {r['images']} | {r['batch']} | {m} | {r[f'raw_{m}']:.1f} | "
                  f"{r[f'encode_{m}']:.1f} | {r[f'annotate_{m}']:.1f} | {r[f'ratio_{m}']:.1%} ({lo:.0%}-{hi:.0%}) | "
                  f"{r[f'decode_{m}']:.0f} |")
    print()
    print("CPU time per image (medians over rounds) and the ratio expected when the decoding thread has a core:")
    print("| encoder | raw forward (us) | preprocess alone (us) | PNG decode, background thread (us) "
          "| annotate main thread minus raw forward (us) | annotate / raw, decode overlapped |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['encoder']} | {r['forward_us']:.0f} | {r['preprocess_us']:.1f} | {r['decode_us']:.0f} | "
              f"{r['overhead_us']:.0f} | {r['ratio_overlapped']:.1%} |")
    return results


if __name__ == "__main__":
    main()
