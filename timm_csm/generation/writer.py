"""Sharded, resumable generation into Parquet, and reading the result back as a Hugging Face ``Dataset``.

Shard ``k`` holds groups ``[k * S, (k + 1) * S)`` of the global plan (S = groups per shard). Processes take the
shards ``k = rank, rank + world, ...``; each shard is written to a temporary name and renamed into place, so a shard
file exists only when complete. A restarted job skips the shards that exist, so after any kill (SIGKILL included)
it finishes with exactly the dataset an uninterrupted run writes: no duplicate and no missing group. A shard file
that exists but is damaged (truncated or overwritten by something else: its Parquet footer does not read, or it
holds another number of rows than its groups x lambdas) is named in the log and generated again.

A finished folder extends to more groups of the same plan (``extend_from``): the plan depends on nothing but the
number of groups beyond the generator, sampler and lambda grid, and its groups are a prefix of any larger plan's
(:func:`~timm_csm.generation.plan.plan_groups`), so the groups the earlier folder holds are copied from it, as stored,
and only the others are generated.
"""
from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Callable, Dict, Optional, Sequence

import numpy as np

from ..io import atomic_path, write_json_atomic
from .config import DEFAULTS
from .plan import plan_groups

__all__ = ["make_plan", "generate_to_folder", "load_generated", "shard_path", "shard_problem", "encode_png",
           "extension_source"]

PLAN_FILE = "plan.json"
#: what an extended folder records of the folder its first groups were copied from
EXTENDED_FILE = "extended_from.json"
#: the plan keys an extension may change: the number of groups, and what follows from it
_GROWING_KEYS = ("num_groups", "num_shards", "plan_hash")


def encode_png(image_chw: np.ndarray) -> bytes:
    from PIL import Image

    arr = image_chw[0] if image_chw.shape[0] == 1 else image_chw.transpose(1, 2, 0)
    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(arr)).save(buf, format="PNG")
    return buf.getvalue()


def make_plan(num_classes: int, num_groups: int, lambdas: Sequence[float], class_names: Sequence[str],
              groups_per_shard: int = DEFAULTS.groups_per_shard,
              seed_offset: int = DEFAULTS.seed_offset, generator: Optional[Dict] = None,
              anchors: Optional[Dict] = None) -> Dict:
    """Everything that determines the output; stored as ``plan.json`` and compared on restart.

    ``anchors`` (real-anchored mode only): the pool's provenance (``AnchorPool.describe()``) and ``strength``.
    """
    if len(class_names) != num_classes:
        raise ValueError(f"{len(class_names)} class names for {num_classes} classes")
    if groups_per_shard < 1:
        raise ValueError("groups_per_shard must be at least 1")
    plan = {
        "num_classes": int(num_classes),
        "num_groups": int(num_groups),
        "lambdas": [float(v) for v in lambdas],
        "class_names": list(class_names),
        "groups_per_shard": int(groups_per_shard),
        "seed_offset": int(seed_offset),
        "generator": generator or {},
    }
    if anchors is not None:
        plan["anchors"] = dict(anchors)
    plan["num_shards"] = max(1, -(-plan["num_groups"] // plan["groups_per_shard"]))
    plan["plan_hash"] = hashlib.sha256(json.dumps(plan, sort_keys=True).encode()).hexdigest()[:16]
    return plan


def shard_path(folder, index: int, num_shards: int) -> Path:
    return Path(folder) / "shards" / f"shard-{index:05d}-of-{num_shards:05d}.parquet"


def _shard_groups(plan: Dict, index: int) -> int:
    per = plan["groups_per_shard"]
    return min(per, plan["num_groups"] - index * per)


def shard_problem(path: Path, plan: Dict, index: int) -> Optional[str]:
    """Why the existing shard file ``path`` (shard ``index`` of ``plan``) is unusable, or None when its Parquet
    footer reads and holds one row per group member (groups x lambdas)."""
    import pyarrow.parquet as pq

    expected = _shard_groups(plan, index) * len(plan["lambdas"])
    try:
        rows = pq.ParquetFile(str(path)).metadata.num_rows
    except Exception as e:  # pyarrow raises ArrowInvalid / OSError for a truncated or foreign file
        return f"its Parquet footer does not read: {e}"
    return None if rows == expected else f"it holds {rows} rows, the plan {expected}"


def _check_or_write_plan(folder: Path, plan: Dict, is_main: bool) -> None:
    path = folder / PLAN_FILE
    if path.exists():
        old = json.loads(path.read_text())
        if old.get("plan_hash") != plan["plan_hash"]:
            diff = sorted(k for k in plan if old.get(k) != plan[k] and k != "plan_hash")
            raise ValueError(f"{folder} holds a different generation plan (differs in {diff}); "
                             "use a new output folder or the same settings")
    elif is_main:
        folder.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, plan)


def _features(class_names):
    import datasets

    return datasets.Features({
        "image": datasets.Image(),
        "group_id": datasets.Value("int64"),
        "seed": datasets.Value("int64"),
        "class_a": datasets.Value("int64"),
        "class_b": datasets.Value("int64"),
        "lambda_gen": datasets.Value("float32"),
        "generator": datasets.Value("string"),
        "generator_revision": datasets.Value("string"),
        "anchor_index": datasets.Value("int64"),  # row of the real anchor pool the group started from; -1: noise
        "anchor_strength": datasets.Value("float32"),  # SDEdit strength t of that start; 1: pure noise
    })


def _done_shards(folder: Path, plan: Dict, mine: Sequence[int], log: Callable[[str], None]) -> set:
    """The shards that exist and verify; each damaged one of ``mine`` is logged (it is generated again)."""
    done = set()
    for k in range(plan["num_shards"]):
        path = shard_path(folder, k, plan["num_shards"])
        if not path.exists():
            continue
        problem = shard_problem(path, plan, k)
        if problem is None:
            done.add(k)
        elif k in mine:
            log(f"shard {path} is damaged ({problem}): generating it again")
    return done


def extension_source(source, plan: Dict) -> Dict:
    """The plan of the finished generation folder ``source`` after checking that ``plan`` extends it: the same plan
    (generator, sampler, lambdas, shard size, seeds) with at least as many groups, every shard present and sound."""
    source = Path(source)
    if not (source / PLAN_FILE).exists():
        raise FileNotFoundError(f"{source} is not a generation folder (no {PLAN_FILE}): nothing to extend")
    old = json.loads((source / PLAN_FILE).read_text())
    differ = sorted(k for k in set(old) | set(plan) if k not in _GROWING_KEYS and old.get(k) != plan.get(k))
    if differ:
        raise ValueError(f"{source} holds another generation plan (differs in {differ}); an extension may change "
                         "the number of groups only")
    if old["num_groups"] > plan["num_groups"]:
        raise ValueError(f"{source} holds {old['num_groups']} groups, more than the {plan['num_groups']} asked for")
    for k in range(old["num_shards"]):
        path = shard_path(source, k, old["num_shards"])
        problem = "it is missing" if not path.exists() else shard_problem(path, old, k)
        if problem is not None:
            raise ValueError(f"{source} is not a finished generation (shard {path.name}: {problem}); finish it first")
    return old


def _carried_rows(source, old: Dict, index: int) -> Dict[str, list]:
    """The stored rows of shard ``index``'s groups that ``source`` (plan ``old``, same shard size) holds."""
    import pyarrow.parquet as pq

    if index >= old["num_shards"]:
        return {}
    table = pq.read_table(str(shard_path(source, index, old["num_shards"])))
    return {name: table.column(name).to_pylist() for name in table.column_names}


def generate_to_folder(pipeline, folder, plan: Dict, batch_groups: int = DEFAULTS.batch_groups, accelerator=None,
                       progress: bool = True, log: Callable[[str], None] = print, extend_from=None) -> Path:
    """Generate every missing or damaged shard of ``plan`` into ``folder`` with
    ``pipeline(groups, lambdas, output_type="pt", return_dict=False) -> (uint8 images, members)``.

    ``accelerator`` (optional) splits the shards across processes; only the main process shows a progress bar, over
    groups (the pipeline's bar over denoising steps is turned off with ``set_progress_bar_config(disable=True)``).
    Existing shards are verified first (:func:`shard_problem`); ``log`` names each damaged one.
    ``extend_from``: a finished folder of the same plan with fewer groups (:func:`extension_source`), whose groups
    are copied (their stored rows, images as encoded) instead of generated; recorded in ``extended_from.json``.
    A real-anchored pipeline (``SemanticMixingPipeline`` with anchors) also has ``anchor_index(group)`` and
    ``strength``, recorded in the ``anchor_index`` / ``anchor_strength`` columns (-1 / 1 for pure noise).
    """
    import datasets
    from tqdm.auto import tqdm

    folder = Path(folder)
    rank = accelerator.process_index if accelerator else 0
    world = accelerator.num_processes if accelerator else 1
    is_main = rank == 0
    old = extension_source(extend_from, plan) if extend_from is not None else None
    if is_main:
        _check_or_write_plan(folder, plan, True)
        if old is not None:
            write_json_atomic(folder / EXTENDED_FILE, {"folder": str(extend_from), "plan_hash": old["plan_hash"],
                                                       "groups": old["num_groups"]})
    if accelerator:
        accelerator.wait_for_everyone()
    _check_or_write_plan(folder, plan, False)
    (folder / "shards").mkdir(parents=True, exist_ok=True)

    n, per, k_total = plan["num_groups"], plan["groups_per_shard"], plan["num_shards"]
    gen_name = str(plan["generator"].get("name", ""))
    gen_rev = str(plan["generator"].get("revision", ""))
    done = _done_shards(folder, plan, range(rank, k_total, world), log)
    mine = [k for k in range(rank, k_total, world) if k not in done]
    done_groups = sum(_shard_groups(plan, k) for k in done)
    bar = tqdm(total=n, initial=done_groups, desc="generate groups", unit="group",
               disable=not (progress and is_main), dynamic_ncols=True)
    features = _features(plan["class_names"])
    # a plain callable (no anchors) starts every group from noise: anchor -1 at strength 1
    anchor_of = getattr(pipeline, "anchor_index", lambda group: -1)
    strength = float(getattr(pipeline, "strength", 1.0))
    if hasattr(pipeline, "set_progress_bar_config"):
        pipeline.set_progress_bar_config(disable=True)
    for k in mine:
        groups = plan_groups(plan["num_classes"], min(n, (k + 1) * per), plan["seed_offset"], start=k * per)
        rows = {name: [] for name in features}
        if old is not None:
            for name, values in _carried_rows(extend_from, old, k).items():
                rows[name].extend(values)
            carried = len(set(rows["group_id"]))
            groups = groups[carried:]
            bar.update(carried * world if world > 1 else carried)
        for i in range(0, len(groups), batch_groups):
            batch = groups[i: i + batch_groups]
            images, members = pipeline(batch, plan["lambdas"], output_type="pt", return_dict=False)
            for img, (g, lam) in zip(images.numpy(), members):
                rows["image"].append({"bytes": encode_png(img), "path": None})
                rows["group_id"].append(g.group_id)
                rows["seed"].append(g.seed)
                rows["class_a"].append(g.class_a)
                rows["class_b"].append(g.class_b)
                rows["lambda_gen"].append(lam)
                rows["generator"].append(gen_name)
                rows["generator_revision"].append(gen_rev)
                rows["anchor_index"].append(anchor_of(g))
                rows["anchor_strength"].append(strength)
            bar.update(len(batch) * world if world > 1 else len(batch))
        path = shard_path(folder, k, k_total)
        was_enabled = not datasets.utils.are_progress_bars_disabled()
        datasets.utils.disable_progress_bars()  # one bar per job, not one per shard
        try:
            with atomic_path(path) as tmp:
                datasets.Dataset.from_dict(rows, features=features).to_parquet(str(tmp))
        finally:
            if was_enabled:
                datasets.utils.enable_progress_bars()
    bar.close()
    if accelerator:
        accelerator.wait_for_everyone()
    return folder


def load_generated(folder):
    """``(Dataset, plan)`` of a finished generation folder; an unfinished one is an error naming the missing shards."""
    import datasets

    folder = Path(folder)
    if not (folder / PLAN_FILE).exists():
        raise FileNotFoundError(f"{folder} is not a generation folder (no {PLAN_FILE})")
    plan = json.loads((folder / PLAN_FILE).read_text())
    paths = [shard_path(folder, k, plan["num_shards"]) for k in range(plan["num_shards"])]
    missing = [p.name for p in paths if not p.exists()]
    if missing:
        raise FileNotFoundError(f"{folder} is unfinished: {len(missing)} shard(s) missing (first: {missing[0]}); "
                                "run the generation again to complete it")
    for k, p in enumerate(paths):
        problem = shard_problem(p, plan, k)
        if problem is not None:
            raise ValueError(f"shard {p} is damaged ({problem}); run the generation again to regenerate it")
    ds = datasets.Dataset.from_parquet([str(p) for p in paths], features=_features(plan["class_names"]),
                                       keep_in_memory=True)
    return ds, plan
