"""Annotate raw generated groups with projection coefficients and calibrated soft labels.

Input: the ``datasets.Dataset`` of :func:`timm_csm.generation.writer.load_generated` (columns ``image``,
``group_id``, ``seed``, ``class_a``, ``class_b``, ``lambda_gen``). Output: a ``Dataset`` with exactly the columns of
:func:`timm_csm.data.csm_format.csm_features`. The images are passed through as stored (no re-encoding); they are
decoded once, in a background thread that overlaps the encoder's forward pass.
"""
from __future__ import annotations

import io
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional, Sequence, Union

import numpy as np
import torch

from ..data.csm_format import (CSM_COLUMNS, RAW_COLUMNS, check_class_names, check_groups, check_soft_labels,
                               csm_features)
from ..data.lazy import column_arrays
from .checks import RECOGNISER
from .config import DEFAULTS, LABEL_MODES
from .encoders import DEFAULT_ZERO_SHOT_TEMPLATES, ImageEncoder
from .prototypes import ClassPrototypes
from .soft_labels import dominant_class, pair_soft_labels, projection_coefficient

__all__ = ["annotate", "rescale_soft_labels", "decode_images", "pure_member_recognition", "real_recognition",
           "nearest_prototype", "LABEL_MODES"]


def nearest_prototype(features: torch.Tensor, prototypes: torch.Tensor) -> torch.Tensor:
    """The index of each row's nearest class prototype (Euclidean, float64), in the encoder's feature space, where
    the soft labels are made."""
    return torch.cdist(features.to(torch.float64), prototypes.to(features.device, torch.float64)).argmin(1)


def _torchvision_decode():
    try:
        from torchvision.io import ImageReadMode, decode_image
    except Exception:  # torchvision missing or broken: PIL decodes everything
        return None
    return lambda data: decode_image(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.UNCHANGED)


_FAST_DECODE = _torchvision_decode()


def _decode_one(item, row: int, group_id: Optional[int] = None) -> np.ndarray:
    """uint8 (C, H, W), C in (1, 3). torchvision's decoder (about 2x faster than PIL on small PNGs) takes plain
    grey and RGB images; anything else (alpha, 16 bit, other formats, errors) goes through PIL."""
    from PIL import Image

    data = item.get("bytes") if isinstance(item, dict) else None
    if data is not None and _FAST_DECODE is not None:
        try:
            t = _FAST_DECODE(data)
            if t.dtype == torch.uint8 and t.ndim == 3 and t.shape[0] in (1, 3):
                return t.numpy()
        except RuntimeError:
            pass  # let PIL decode it or explain why it cannot
    try:
        if item is None:
            raise ValueError("missing image")
        if data is not None:
            img = Image.open(io.BytesIO(data))
        elif item.get("path"):
            img = Image.open(item["path"])
        else:
            raise ValueError("neither bytes nor path")
        img.load()
        if img.mode not in ("L", "RGB"):
            img = img.convert("RGB" if img.mode in ("RGBA", "P", "CMYK", "YCbCr", "LA") else "L")
    except Exception as e:  # PIL raises many types; report the row
        where = f"row {row}" + (f" (group_id {group_id})" if group_id is not None else "")
        raise ValueError(f"{where}: image does not decode ({type(e).__name__}: {e})") from e
    a = np.asarray(img)
    return a[None] if a.ndim == 2 else a.transpose(2, 0, 1)


def decode_images(items, first_row: int = 0, group_ids=None) -> np.ndarray:
    """uint8 (B, C, H, W) from ``datasets`` image cells ({"bytes", "path"}); all images must share one size."""
    arrays = [_decode_one(it, first_row + i, None if group_ids is None else int(group_ids[i]))
              for i, it in enumerate(items)]
    shapes = {a.shape for a in arrays}
    if len(shapes) > 1:
        raise ValueError(f"rows {first_row}..{first_row + len(arrays) - 1} hold images of different sizes "
                         f"{sorted(shapes)[:3]}; resize them to one size first")
    return np.stack(arrays)


def annotate(
    generated,
    class_names: Sequence[str],
    encoder: ImageEncoder,
    prototypes: Union[ClassPrototypes, torch.Tensor],
    s: float,
    *,
    lambdas: Optional[Sequence[float]] = None,
    label_mode: str = DEFAULTS.label_mode,
    batch_size: int = DEFAULTS.batch_size,
    drop_incomplete: bool = DEFAULTS.drop_incomplete,
    zero_shot_templates: Sequence[str] = DEFAULT_ZERO_SHOT_TEMPLATES,
    return_recognition: bool = False,
    progress: bool = True,
    log: Callable[[str], None] = print,
):
    """Encode every generated image and attach lambda_hat, the soft label and its dominant class.

    Args:
        generated: raw generated ``datasets.Dataset`` (columns ``image, group_id, seed, class_a, class_b,
            lambda_gen``; others are ignored).
        class_names: the K class names of the generation plan; they must equal the prototypes' (real dataset's).
        encoder: any :class:`~timm_csm.annotation.encoders.ImageEncoder`.
        prototypes: :class:`ClassPrototypes` of the real training set with the same encoder (or a (K, D) tensor).
        s: the sigmoid scale of the soft label (4.0 CIFAR-10 / Tiny-ImageNet, 2.3 CIFAR-100).
        lambdas: the lambda grid of the plan (``plan["lambdas"]``); default: the distinct values found.
        label_mode: ``"projection"`` (CSM: q_a = sigmoid(s (lambda_hat - 1/2)), q_b = 1 - q_a), ``"zero_shot"``
            (rebuttal variant 1: the encoder's all-class probabilities, CLIP text prompts for open_clip), or
            ``"generation"`` (rebuttal variant 2: one-hot of the dominant generation class). lambda_hat is stored
            in every mode.
        drop_incomplete: drop groups that do not hold one image per lambda (and log how many) instead of failing.
        return_recognition: also return how often the pure members are nearest their own class's prototype
            (:func:`pure_member_recognition`), from the same encoding pass.

    Returns:
        ``datasets.Dataset`` with the features of :func:`csm_features` (``dataset.info.description`` notes the
        number of dropped groups); with ``return_recognition``, ``(dataset, recognition)``.
    """
    if label_mode not in LABEL_MODES:
        raise ValueError(f"label_mode must be one of {tuple(LABEL_MODES)}, got {label_mode!r}")
    mode = LABEL_MODES.get_spec(label_mode)
    class_names = [str(c) for c in class_names]
    proto = _prototype_means(prototypes, class_names)
    cols = _raw_columns(generated, len(class_names))
    if lambdas is None:
        lambdas = np.unique(np.round(cols["lambda_gen"].astype(np.float64), 6))
    generated, cols, description = _complete_groups(generated, cols, lambdas, drop_incomplete, log)
    lambda_hat, probs, nearest = _encode(generated, cols, encoder, proto, class_names, mode.encoder_probs,
                                         zero_shot_templates, batch_size, progress)
    a_t, b_t = torch.from_numpy(cols["class_a"]), torch.from_numpy(cols["class_b"])
    k = len(class_names)
    soft = mode.soft_labels(lambda_hat, torch.from_numpy(cols["lambda_gen"].astype(np.float64)), probs, a_t, b_t, k,
                            s)
    check_soft_labels(soft.numpy(), k)
    label = dominant_class(soft, None if mode.encoder_probs else a_t)
    lam_hat32 = lambda_hat.float()
    if not bool(torch.isfinite(lam_hat32).all()):
        raise ValueError("the encoder produced non-finite features (lambda_hat is NaN or inf)")
    out = _assemble(generated, class_names, label.numpy(), soft.numpy(), cols["class_a"], cols["class_b"],
                    cols["lambda_gen"], lam_hat32.numpy(), cols["group_id"], cols["seed"])
    out.info.description = description
    if return_recognition:
        return out, pure_member_recognition(nearest, cols["lambda_gen"], cols["class_a"], cols["class_b"], k)
    return out


def _prototype_means(prototypes, class_names) -> torch.Tensor:
    """(K, D) prototype means, after checking the prototypes' class names against the generation's."""
    k = len(class_names)
    if isinstance(prototypes, ClassPrototypes):
        check_class_names(class_names, prototypes.class_names, "generated data", "the real dataset (prototypes)")
        proto = prototypes.means
    else:
        proto = torch.as_tensor(prototypes)
    if proto.ndim != 2 or proto.shape[0] != k:
        raise ValueError(f"prototypes must be (K={k}, D), got {tuple(proto.shape)}")
    return proto


def _raw_columns(generated, k: int) -> dict:
    """The raw columns (images aside) as arrays, class ids int64, after checking ids, pairs and lambda_gen."""
    missing = [c for c in RAW_COLUMNS if c not in generated.column_names]
    if missing:
        raise ValueError(f"generated dataset lacks column(s) {missing}; it has {generated.column_names}")
    cols = column_arrays(generated, ["group_id", "seed", "class_a", "class_b", "lambda_gen"])
    cols["class_a"], cols["class_b"] = cols["class_a"].astype(np.int64), cols["class_b"].astype(np.int64)
    if len(cols["class_a"]) == 0:
        raise ValueError("the generated dataset is empty")
    for name in ("class_a", "class_b"):
        col = cols[name]
        bad = np.flatnonzero((col < 0) | (col >= k))
        if len(bad):
            raise ValueError(f"{len(bad)} row(s) have {name} out of range [0, {k}) (first: row {bad[0]}, "
                             f"group_id {cols['group_id'][bad[0]]}, {name} = {col[bad[0]]})")
    same = np.flatnonzero(cols["class_a"] == cols["class_b"])
    if len(same):
        raise ValueError(f"{len(same)} row(s) mix a class with itself (first: row {same[0]}, "
                         f"group_id {cols['group_id'][same[0]]})")
    lam = cols["lambda_gen"]
    if not np.isfinite(lam).all() or (lam < 0).any() or (lam > 1).any():
        raise ValueError("lambda_gen must be finite and lie in [0, 1]")
    return cols


def _complete_groups(generated, cols: dict, lambdas, drop_incomplete: bool, log):
    """``(generated, cols, description)`` without the incomplete groups (``drop_incomplete``), else an error
    naming them."""
    check = check_groups(cols["group_id"], cols["lambda_gen"], lambdas, cols["seed"], cols["class_a"],
                         cols["class_b"])
    if check.ok:
        return generated, cols, ""
    if not drop_incomplete:
        raise ValueError(check.message + "; pass drop_incomplete=True (--drop-incomplete) to drop them")
    keep = np.flatnonzero(~check.bad_rows)
    description = (f"dropped {len(check.bad_group_ids)} incomplete group(s) ({int(check.bad_rows.sum())} rows) "
                   f"of {check.num_groups}")
    log(description)
    if len(keep) == 0:
        raise ValueError("no complete group left after dropping the incomplete ones")
    return generated.select(keep), {name: col[keep] for name, col in cols.items()}, description


def _encode(generated, cols: dict, encoder: ImageEncoder, proto: torch.Tensor, class_names, encoder_probs: bool,
            zero_shot_templates, batch_size: int, progress: bool):
    """lambda_hat (N,) float64, with ``encoder_probs`` the encoder's zero-shot class probabilities (N, K) (else
    None), and each
    image's nearest class prototype (N,); batch i + 1 is decoded in a thread while the encoder runs on batch i."""
    from tqdm.auto import tqdm

    n, k = len(cols["class_a"]), len(class_names)
    proto_dev = proto.to(encoder.device, torch.float64)
    classifier = None
    if encoder_probs:
        if not hasattr(encoder, "zero_shot_probs"):
            raise ValueError(f"{type(encoder).__name__} cannot give zero-shot labels (needs open_clip or a "
                             "reference classifier)")
        if hasattr(encoder, "text_classifier"):
            classifier = encoder.text_classifier(class_names, zero_shot_templates)
    images = generated.with_format("arrow", columns=["image"])
    lambda_hat = torch.empty(n, dtype=torch.float64)
    nearest = torch.empty(n, dtype=torch.int64)
    probs = torch.empty(n, k, dtype=torch.float32) if encoder_probs else None
    starts = list(range(0, n, batch_size))

    def load(start: int) -> np.ndarray:
        stop = min(n, start + batch_size)
        items = images[start:stop].column("image").to_pylist()
        return decode_images(items, start, cols["group_id"][start:stop])

    bar = tqdm(total=n, desc="annotate", unit="img", disable=not progress, dynamic_ncols=True)
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(load, starts[0])
        for j, start in enumerate(starts):
            batch = pending.result()
            if j + 1 < len(starts):
                pending = pool.submit(load, starts[j + 1])
            rows = slice(start, start + len(batch))
            feats = encoder.encode(batch)
            lambda_hat[rows] = projection_coefficient(feats, proto_dev, torch.from_numpy(cols["class_a"][rows]),
                                                      torch.from_numpy(cols["class_b"][rows])).cpu()
            nearest[rows] = nearest_prototype(feats, proto_dev).cpu()
            if probs is not None:
                kw = {"classifier": classifier} if classifier is not None else {}
                probs[rows] = encoder.zero_shot_probs(feats, class_names, **kw).float().cpu()
            bar.update(len(batch))
    bar.close()
    return lambda_hat, probs, nearest.numpy()


def pure_member_recognition(nearest, lambda_gen, class_a, class_b, num_classes: int) -> Optional[dict]:
    """How often the pure members of the groups (lambda_gen 1: class a, 0: class b) are nearest to the prototype of
    their own class among all ``num_classes`` (``nearest``: each row's nearest prototype, Euclidean, in the encoder's
    feature space, where the soft labels are made): ``{"accuracy", "chance": 1 / K, "num_images"}``; None when no
    group has a pure member."""
    lam = np.asarray(lambda_gen, dtype=np.float64)
    rows = np.flatnonzero((lam == 0.0) | (lam == 1.0))
    if len(rows) == 0:
        return None
    truth = np.where(lam[rows] == 1.0, np.asarray(class_a)[rows], np.asarray(class_b)[rows])
    accuracy = float((np.asarray(nearest)[rows] == truth).mean())
    return {"accuracy": accuracy, "chance": 1.0 / num_classes, "num_images": int(len(rows))}


def real_recognition(encoder: ImageEncoder, prototypes: ClassPrototypes, real,
                     batch_size: int = DEFAULTS.batch_size) -> dict:
    """How often real images (``real``: uint8 images, labels, class names) are nearest their own class's prototype
    (:func:`nearest_prototype`): the recogniser of :func:`pure_member_recognition` on real images, the yardstick of
    its pure-class recognition. ``{"accuracy", "chance", "num_images", "by"}``."""
    from .encoders import encode_images

    check_class_names(real.class_names, prototypes.class_names, "real images", "the prototypes")
    features = encode_images(encoder, real.images, batch_size=batch_size)
    accuracy = float((nearest_prototype(features, prototypes.means).numpy() == np.asarray(real.labels)).mean())
    return {"accuracy": accuracy, "chance": 1.0 / prototypes.num_classes, "num_images": len(real.labels),
            "by": RECOGNISER}


def _soft_label_array(soft: np.ndarray):
    import pyarrow as pa

    n, k = soft.shape
    offsets = pa.array(np.arange(0, n * k + 1, k, dtype=np.int32))
    return pa.ListArray.from_arrays(offsets, pa.array(np.ascontiguousarray(soft, dtype=np.float32).reshape(-1)))


def _assemble(generated, class_names, label, soft, a, b, lam_gen, lam_hat, group_id, seed):
    """The output table from Arrow arrays: the image column is reused as stored (no copy of the bytes), and the
    fingerprint is derived from the input's and the new columns' bytes (``from_dict`` would hash every image)."""
    import hashlib

    import datasets
    import pyarrow as pa
    from datasets.table import InMemoryTable

    features = csm_features(class_names)
    image = generated.with_format("arrow", columns=["image"])[:].column("image")
    arrays = {
        "image": image,
        "label": pa.array(np.asarray(label, dtype=np.int64)),
        "soft_label": _soft_label_array(soft),
        "class_a": pa.array(np.asarray(a, dtype=np.int64)),
        "class_b": pa.array(np.asarray(b, dtype=np.int64)),
        "lambda_gen": pa.array(np.asarray(lam_gen, dtype=np.float32)),
        "lambda_hat": pa.array(np.asarray(lam_hat, dtype=np.float32)),
        "group_id": pa.array(np.asarray(group_id, dtype=np.int64)),
        "seed": pa.array(np.asarray(seed, dtype=np.int64)),
    }
    schema = features.arrow_schema
    table = pa.Table.from_arrays([arrays[c] for c in CSM_COLUMNS], schema=schema)
    h = hashlib.sha256(str(getattr(generated, "_fingerprint", "")).encode())
    for c in CSM_COLUMNS[1:]:
        h.update(np.ascontiguousarray(arrays[c].to_numpy(zero_copy_only=False)
                                      if c != "soft_label" else soft).tobytes())
    return datasets.Dataset(InMemoryTable(table), info=datasets.DatasetInfo(features=features),
                            fingerprint=h.hexdigest()[:16])


def rescale_soft_labels(dataset, s: float):
    """The same annotated dataset with soft labels (and dominant classes) recomputed from the stored lambda_hat
    for a new scale ``s``: no re-encoding."""
    missing = [c for c in CSM_COLUMNS if c not in dataset.column_names]
    if missing:
        raise ValueError(f"not an annotated CSM dataset: missing column(s) {missing}")
    k = len(dataset.features["label"].names)

    def relabel(lambda_hat, class_a, class_b):
        lam = torch.as_tensor(np.asarray(lambda_hat, dtype=np.float64))
        a = torch.as_tensor(np.asarray(class_a, dtype=np.int64))
        b = torch.as_tensor(np.asarray(class_b, dtype=np.int64))
        soft = pair_soft_labels(lam, a, b, k, s)
        return {"soft_label": soft.numpy(), "label": dominant_class(soft, a).numpy()}

    # only the three input columns are read, so the images are never decoded
    return dataset.map(relabel, batched=True, batch_size=4096, features=dataset.features,
                       input_columns=["lambda_hat", "class_a", "class_b"], desc=f"soft labels (s={s})")
