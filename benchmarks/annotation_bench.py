"""Annotation throughput against the encoder's raw forward pass.

    OMP_NUM_THREADS=1 python benchmarks/annotation_bench.py [--images 4096] [--clip-images 64] [--repeats 5]

For each encoder, three timings over the same images (best of ``--repeats`` interleaved rounds), both as wall-clock time and as the
process's CPU time (all threads; on a machine shared with other jobs the CPU time is the stable measure of work,
and it counts the image-decoding thread in full, a worst case for one core):

* raw forward: ``encoder.forward_features`` on batches already preprocessed and in memory (the model alone);
* encode: ``encoder.encode`` on uint8 batches (tensor preprocessing + forward);
* annotate: :func:`timm_csm.annotation.annotate` on a raw generated ``Dataset`` of PNG images (decoding,
  preprocessing, forward, projection, soft labels and building the output ``Dataset``).

The goal is annotate within 10% of the raw forward throughput. Encoders: the reference CNN at 28 px (random
weights: speed does not depend on them) and open_clip ViT-B-32 at 224 px (random weights, the paper's
architecture), on Fashion-MNIST test images, grouped by 8 as generated groups are.
"""
from __future__ import annotations

import argparse
import io
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


def interleaved_best(fns, repeats: int):
    """Per function, (best wall seconds, best CPU seconds) over ``repeats`` rounds; the functions take turns within
    each round so that all of them see the same background load."""
    wall = [[] for _ in fns]
    cpu = [[] for _ in fns]
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            wall[i].append(time.perf_counter() - t0)
            cpu[i].append(time.process_time() - c0)
    return [(min(w), min(c)) for w, c in zip(wall, cpu)]


def bench(name, encoder, images, batch_size, repeats, class_names):
    from timm_csm.annotation import annotate

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

    def run_annotate():
        annotate(generated, class_names, encoder, protos, 4.0, lambdas=lambdas, batch_size=batch_size,
                 progress=False)

    raw()  # warm-up (allocator, oneDNN primitives)
    t_raw, t_enc, t_ann = interleaved_best([raw, encode, run_annotate], repeats)
    return {"encoder": name, "images": n, "batch": batch_size,
            **{f"{k}_{m}": n / t[i] for k, t in (("raw", t_raw), ("encode", t_enc), ("annotate", t_ann))
               for i, m in enumerate(("wall", "cpu"))}}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=4096)
    p.add_argument("--clip-images", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--skip-clip", action="store_true")
    args = p.parse_args(argv)

    import datasets

    from timm_csm.annotation import OpenClipEncoder, ReferenceCNN, TimmEncoder
    from timm_csm.data import load_fashion_mnist

    datasets.disable_progress_bars()
    test = load_fashion_mnist("test")
    torch.manual_seed(0)
    results = [bench("reference CNN, 28 px", TimmEncoder(ReferenceCNN(mean=(0.286,), std=(0.353,))),
                     test.images[: args.images], 256, args.repeats, test.class_names)]
    if not args.skip_clip:
        clip = OpenClipEncoder("ViT-B-32")
        results.append(bench("open_clip ViT-B-32, 28 -> 224 px", clip, test.images[: args.clip_images], 32,
                             max(2, args.repeats // 2), test.class_names))
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, {platform.processor() or platform.machine()}")
    print("| encoder | images | batch | clock | raw forward (img/s) | encode (img/s) | annotate (img/s) "
          "| annotate / raw |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        for m in ("cpu", "wall"):
            print(f"| {r['encoder']} | {r['images']} | {r['batch']} | {m} | {r[f'raw_{m}']:.1f} | "
                  f"{r[f'encode_{m}']:.1f} | {r[f'annotate_{m}']:.1f} | {r[f'annotate_{m}'] / r[f'raw_{m}']:.1%} |")
    return results


if __name__ == "__main__":
    main()
