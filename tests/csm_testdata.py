"""Hand-built generated datasets in the published CSM format (columns of the annotation stage), for tests."""
import itertools

import numpy as np


def soft_label_row(num_classes, a, b, lam, sharpness=4.0):
    """q_a = sigmoid(s (lam - 1/2)), q_b = 1 - q_a: the calibrated-annotation form of the method."""
    q = np.zeros(num_classes, np.float32)
    qa = 1.0 / (1.0 + np.exp(-sharpness * (lam - 0.5)))
    if a == b:
        q[a] = 1.0
    else:
        q[a], q[b] = qa, 1.0 - qa
    return q


def make_csm_dataset(class_names, prototypes=None, img_shape=(1, 8, 8), n_lambdas=8, seeds_per_pair=1,
                     pairs=None, shuffle_seed=0):
    """A ``datasets.Dataset`` with columns image, label, soft_label, class_a, class_b, lambda_gen, lambda_hat,
    group_id, seed. Group (seed, a, b) has ``n_lambdas`` images lam in linspace(0, 1); the image is
    lam * prototype_a + (1 - lam) * prototype_b (random prototypes when none are given). Rows are shuffled so that
    nothing relies on the stored order."""
    from PIL import Image

    from timm_csm.data import csm_dataset_from_columns

    k = len(class_names)
    rng = np.random.default_rng(shuffle_seed)
    if prototypes is None:
        prototypes = rng.integers(0, 256, size=(k, *img_shape)).astype(np.float32)
    pairs = list(itertools.combinations(range(k), 2)) if pairs is None else list(pairs)
    cols = {c: [] for c in ("image", "soft_label", "class_a", "class_b", "lambda_gen", "lambda_hat", "group_id",
                            "seed")}
    gid = 0
    for seed in range(seeds_per_pair):
        for a, b in pairs:
            for lam in np.linspace(0.0, 1.0, n_lambdas):
                img = lam * prototypes[a] + (1 - lam) * prototypes[b]
                img = np.clip(np.round(img + rng.normal(0, 4, img.shape)), 0, 255).astype(np.uint8)
                pil = Image.fromarray(img[0] if img.shape[0] == 1 else img.transpose(1, 2, 0))
                q = soft_label_row(k, a, b, lam)
                cols["image"].append(pil)
                cols["soft_label"].append(q.tolist())
                cols["class_a"].append(a)
                cols["class_b"].append(b)
                cols["lambda_gen"].append(float(lam))
                cols["lambda_hat"].append(float(lam))
                cols["group_id"].append(gid)
                cols["seed"].append(seed)
            gid += 1
    order = rng.permutation(len(cols["image"]))
    return csm_dataset_from_columns({c: [v[i] for i in order] for c, v in cols.items()}, class_names)


def write_parquet_folder(ds, folder):
    """Write ``ds`` as the train split of a plain dataset folder (data/train-00000-of-00001.parquet)."""
    import os

    os.makedirs(os.path.join(folder, "data"), exist_ok=True)
    ds.to_parquet(os.path.join(folder, "data", "train-00000-of-00001.parquet"))
    return str(folder)


def save_csm_folder(ds, folder):
    """Publish ``ds`` as the package does (validated, Hub layout with README and parquet shards)."""
    from timm_csm.hub import save_csm_dataset

    return str(save_csm_dataset(ds, folder))


DIGIT_NAMES = [str(i) for i in range(10)]


def save_digits_csm_folder(folder):
    """A CSM dataset for scikit-learn's digits whose group members blend the class-mean images of their pair."""
    from timm_csm.data import load_digits

    digits = load_digits("train")
    protos = np.stack([digits.images[digits.labels == c].mean(0) for c in range(10)])
    return save_csm_folder(make_csm_dataset(DIGIT_NAMES, prototypes=protos, img_shape=(1, 8, 8)), folder)
