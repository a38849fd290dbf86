"""Publishing: exact features, Hub layout and card, install + bare-name load_dataset, push_to_hub against a local
fake of the Hub client, and the annotate / publish scripts."""
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import numpy as np
import pytest

from csm_fixtures import CLASS_NAMES, LAMBDAS, annotated_by_hand
from timm_csm.hub import (PushError, build_csm_dataset, csm_dataset_name, csm_features, data_files, install_dataset,
                          is_installed, load_csm_dataset, push_csm_dataset, save_csm_dataset, validate_csm_dataset)

ROOT_DIR = Path(__file__).resolve().parents[1]
PROVENANCE = {"dataset": "fashion_mnist", "dataset_revision": "fashion_mnist-0123456789abcdef",
              "generator": {"name": "generator-test", "revision": "abc123"}, "sampler": "ddim (eta 0)",
              "sampler_steps": 50, "lambdas": LAMBDAS, "s": 4.0,
              "encoder": {"kind": "reference", "model_name": "reference_cnn", "weights": "r/model.safetensors",
                          "test_accuracy": 0.9189}}


def rows_of(ds):
    """Every column of every row, images as PNG bytes (no decoding differences hide)."""
    import datasets

    raw = ds.cast_column("image", datasets.Image(decode=False))
    out = raw.with_format(None)[:]
    out["image"] = [hashlib.sha256(im["bytes"]).hexdigest() for im in out["image"]]
    return out


def tree_digest(folder: Path):
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def annotated():
    return annotated_by_hand(num_groups=5)


@pytest.fixture(scope="module")
def saved(annotated, tmp_path_factory):
    return save_csm_dataset(annotated, tmp_path_factory.mktemp("out") / "csm-shapes-aug", PROVENANCE,
                            class_names=CLASS_NAMES, lambdas=LAMBDAS)


def test_names_and_exact_features():
    import datasets

    assert csm_dataset_name("fashion_mnist") == "csm-fmnist-aug"
    assert csm_dataset_name("cifar100") == "csm-cifar100-aug"
    assert csm_dataset_name("uoft-cs/cifar10") == "csm-cifar10-aug"
    f = csm_features(CLASS_NAMES)
    assert list(f) == ["image", "label", "soft_label", "class_a", "class_b", "lambda_gen", "lambda_hat", "group_id",
                       "seed"]
    assert f["image"] == datasets.Image() and f["soft_label"] == datasets.Sequence(datasets.Value("float32"))
    assert f["label"].names == f["class_a"].names == f["class_b"].names == CLASS_NAMES
    assert f["lambda_gen"] == f["lambda_hat"] == datasets.Value("float32")
    assert f["group_id"] == f["seed"] == datasets.Value("int64")


def test_hub_layout_card_and_round_trip(saved, annotated):
    import datasets
    import yaml

    assert sorted(p.name for p in saved.iterdir()) == ["README.md", "data"]
    (version,) = [p.name for p in (saved / "data").iterdir()]  # data/<version>/: see test_replacing_a_saved_...
    assert [p.name for p in (saved / "data" / version).iterdir()] == ["train-00000-of-00001.parquet"]
    text = (saved / "README.md").read_text()
    _, front, body = text.split("---\n", 2)
    meta = yaml.safe_load(front)
    assert meta["configs"] == [{"config_name": "default",
                                "data_files": [{"split": "train", "path": f"data/{version}/train-*"}]}]
    info = meta["dataset_info"]
    assert [f["name"] for f in info["features"]] == list(csm_features(CLASS_NAMES))
    assert info["splits"] == [{"name": "train", "num_bytes": info["dataset_size"], "num_examples": 40}]
    assert info["download_size"] == (saved / "data" / version / "train-00000-of-00001.parquet").stat().st_size
    assert meta["license"] == "mit" and meta["task_categories"] == ["image-classification"]
    # provenance: real dataset and revision, generator, sampler and steps, lambda grid, encoder, s, counts, licences
    for needle in ("fashion_mnist-0123456789abcdef", "generator-test", "ddim (eta 0)", "| sampler steps | `50` |",
                   "0.14285714285714285", "reference: reference_cnn", "test accuracy 0.9189", "| scale s | `4.0` |",
                   "MIT licence", "40 images in 5 groups"):
        assert needle in body, needle
    counts = np.bincount(np.asarray(annotated["label"]), minlength=3)
    for name, n in zip(CLASS_NAMES, counts):
        assert f"| {name} | {n} |" in body

    loaded = datasets.load_dataset(str(saved))
    assert list(loaded) == ["train"] and loaded["train"].features == csm_features(CLASS_NAMES)
    assert rows_of(loaded["train"]) == rows_of(annotated)
    assert rows_of(load_csm_dataset(saved, split="train")) == rows_of(annotated)


def test_install_then_bare_name_load_dataset_from_another_directory(saved, annotated, tmp_path):
    hf_home = tmp_path / "hf-home"
    install_dataset(saved, cache_dir=hf_home / "datasets")
    assert is_installed("csm-shapes-aug", hf_home / "datasets")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code = ("import json, hashlib, datasets\n"
            "ds = datasets.load_dataset('csm-shapes-aug')['train']\n"
            "raw = ds.cast_column('image', datasets.Image(decode=False)).with_format(None)[:]\n"
            "raw['image'] = [hashlib.sha256(im['bytes']).hexdigest() for im in raw['image']]\n"
            "print(json.dumps({'features': str(ds.features), 'rows': raw}))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TIMM_CSM"))}
    env.update(HF_HOME=str(hf_home), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    # the subprocess never imports timm_csm: plain datasets resolves the bare name
    result = subprocess.run([sys.executable, "-c", code], cwd=elsewhere, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    got = json.loads(result.stdout.strip().splitlines()[-1])
    assert got["features"] == str(csm_features(CLASS_NAMES))
    expected = json.loads(json.dumps(rows_of(annotated)))
    assert got["rows"] == expected
    # load_csm_dataset resolves the installed name without the Hub, and explains what is missing otherwise
    assert rows_of(load_csm_dataset("csm-shapes-aug", split="train", cache_dir=hf_home / "datasets")) == expected
    with pytest.raises(FileNotFoundError, match="timm-csm-generate, then timm-csm-annotate --install"):
        load_csm_dataset("csm-nothing-aug", cache_dir=hf_home / "datasets")
    with pytest.raises(FileNotFoundError, match=r"csm-cifar100-aug.*timm-csm-pipeline --profile full"):
        load_csm_dataset("csm-cifar100-aug", cache_dir=hf_home / "datasets")


def test_reinstall_of_changed_data_wins(saved, tmp_path):
    other = save_csm_dataset(annotated_by_hand(num_groups=3, seed=1), tmp_path / "v2" / "csm-shapes-aug",
                             {"dataset": "fashion_mnist"})
    cache = tmp_path / "cache"
    install_dataset(saved, cache_dir=cache)
    install_dataset(other, cache_dir=cache)
    assert len(load_csm_dataset("csm-shapes-aug", split="train", cache_dir=cache)) == 24
    install_dataset(saved, cache_dir=cache)  # already prepared: made the newest again
    assert len(load_csm_dataset("csm-shapes-aug", split="train", cache_dir=cache)) == 40
    # a folder with another base name installs under an explicit name
    install_dataset(other, name="csm-renamed-aug", cache_dir=cache)
    assert len(load_csm_dataset("csm-renamed-aug", split="train", cache_dir=cache)) == 24


def _visible_rows(folder: Path):
    """Rows of the copy a reader finds in ``folder`` now (the card's shards, all readable, as many rows as the card
    says), or None when it finds no complete copy."""
    import pyarrow.parquet as pq
    import yaml

    try:
        meta = yaml.safe_load((folder / "README.md").read_text().split("---\n", 2)[1])
        expected = sum(s["num_examples"] for s in meta["dataset_info"]["splits"])
        files = [p for paths in data_files(folder).values() for p in paths]
        rows = sum(pq.ParquetFile(p).metadata.num_rows for p in files)
    except Exception:  # absent or half-written: what a reader would trip over
        return None
    return rows if files and rows == expected else None


def _watch_renames(monkeypatch, folder: Path, seen: list):
    """Check the folder before and after every rename, replace and removal (each delayed, as a slow disk would)."""
    import pathlib
    import shutil
    import time

    def watched(fn):
        def call(*args, **kwargs):
            seen.append(_visible_rows(folder))
            time.sleep(0.01)
            out = fn(*args, **kwargs)
            seen.append(_visible_rows(folder))
            return out
        return call
    for owner, name in ((os, "replace"), (os, "rename"), (shutil, "rmtree"), (pathlib.Path, "unlink")):
        monkeypatch.setattr(owner, name, watched(getattr(owner, name)))


def test_replacing_a_saved_dataset_keeps_a_complete_copy_visible(annotated, tmp_path, monkeypatch):
    folder = tmp_path / "csm-shapes-aug"
    smaller = annotated_by_hand(num_groups=3, seed=1)
    seen = []
    with monkeypatch.context() as m:
        _watch_renames(m, folder, seen)
        save_csm_dataset(annotated, folder, PROVENANCE, class_names=CLASS_NAMES)  # new: appears whole
        assert seen and set(seen) <= {None, 40} and seen[-1] == 40
        seen.clear()
        save_csm_dataset(smaller, folder, PROVENANCE, class_names=CLASS_NAMES)
    assert seen and None not in seen and set(seen) == {40, 24}  # before: absent between the two renames
    assert len(load_csm_dataset(folder, split="train")) == 24
    versions = {p.name for p in (folder / "data").iterdir()}
    (current,) = {p.parent.name for p in data_files(folder)["train"]}
    assert len(versions) == 2  # the previous version stays for readers still on it
    save_csm_dataset(annotated, folder, PROVENANCE, class_names=CLASS_NAMES)
    kept = {p.name for p in (folder / "data").iterdir()}
    assert current in kept and not (versions - {current}) & kept and len(kept) == 2  # older ones go
    assert len(load_csm_dataset(folder, split="train")) == 40

    # a folder in the flat layout of earlier versions (data/train-*.parquet) is replaced the same way
    legacy = tmp_path / "legacy" / "csm-shapes-aug"
    save_csm_dataset(smaller, legacy, PROVENANCE, class_names=CLASS_NAMES)
    (version,) = [p.name for p in (legacy / "data").iterdir()]
    for shard in (legacy / "data" / version).iterdir():
        shard.rename(legacy / "data" / shard.name)
    (legacy / "data" / version).rmdir()
    card = legacy / "README.md"
    card.write_text(card.read_text().replace(f"data/{version}/train-*", "data/train-*"))
    assert _visible_rows(legacy) == 24
    seen.clear()
    with monkeypatch.context() as m:
        _watch_renames(m, legacy, seen)
        save_csm_dataset(annotated, legacy, PROVENANCE, class_names=CLASS_NAMES)
    assert seen and None not in seen and set(seen) == {24, 40}
    assert len(load_csm_dataset(legacy, split="train")) == 40


def test_a_folder_changed_in_place_is_read_again(annotated, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from timm_csm.data import CSMGroups

    cache = tmp_path / "cache"
    folder = save_csm_dataset(annotated, tmp_path / "csm-shapes-aug", PROVENANCE, class_names=CLASS_NAMES)
    first = load_csm_dataset(folder, split="train", cache_dir=cache)
    CSMGroups.from_dataset(first, class_names=CLASS_NAMES)
    (shard,) = data_files(folder)["train"]
    table = pq.read_table(shard)
    soft = table.column("soft_label").to_pylist()
    soft[5] = [0.5, 0.2, 0.2]  # the same number of rows, a label that no longer sums to 1
    column = table.schema.get_field_index("soft_label")
    field = table.schema.field(column)
    pq.write_table(table.set_column(column, field, pa.array(soft, field.type)), shard)
    changed = load_csm_dataset(folder, split="train", cache_dir=cache)
    assert changed.cache_files[0]["filename"] == first.cache_files[0]["filename"]  # one entry, prepared again
    assert changed["soft_label"][5] == pytest.approx([0.5, 0.2, 0.2])  # before: the stale copy
    with pytest.raises(ValueError, match="sum to 1"):
        CSMGroups.from_dataset(changed, class_names=CLASS_NAMES)
    # installed copies follow the folder too
    install_dataset(folder, cache_dir=cache)
    assert load_csm_dataset("csm-shapes-aug", split="train", cache_dir=cache)["soft_label"][5] == pytest.approx(
        [0.5, 0.2, 0.2])
    shard.write_bytes(shard.read_bytes()[:-200])  # truncated: no Parquet footer
    with pytest.raises(ValueError, match=f"dataset at {folder} does not load.*write it again"):
        load_csm_dataset(folder, split="train", cache_dir=cache)


class FakeHub:
    """The parts of the Hub client that push_to_hub and push_csm_dataset call, backed by a local folder."""

    SHA = "0" * 40

    def __init__(self, root: Path, fail_on_commit: bool = False):
        self.root, self.fail_on_commit, self.staged, self.commits = root, fail_on_commit, {}, []

    def repo_dir(self, repo_id: str) -> Path:
        return self.root / "datasets" / f"{repo_id}@{self.SHA}"

    def api(self, *args, **kwargs):
        hub = self

        class FakeHfApi:
            def repo_info(self, repo_id, **k):
                return SimpleNamespace(id=repo_id, sha=hub.SHA)

            def create_repo(self, repo_id, **k):
                hub.repo_dir(repo_id).mkdir(parents=True, exist_ok=True)
                return SimpleNamespace(repo_id=repo_id)

            def create_branch(self, *a, **k):
                pass

            def preupload_lfs_files(self, repo_id, additions, **k):  # the temporary parquet is deleted afterwards
                for op in additions:
                    hub.staged[op.path_in_repo] = Path(op.path_or_fileobj).read_bytes()

            def upload_file(self, path_or_fileobj, path_in_repo, repo_id, **k):
                from huggingface_hub import CommitOperationAdd

                return self.create_commit(repo_id, [CommitOperationAdd(path_in_repo, path_or_fileobj)])

            def create_commit(self, repo_id, operations, **k):
                from huggingface_hub import CommitOperationAdd, CommitOperationDelete

                if hub.fail_on_commit:
                    raise ConnectionError("the Hub is unreachable")
                repo = hub.repo_dir(repo_id)
                for op in operations:
                    target = repo / op.path_in_repo
                    if isinstance(op, CommitOperationDelete):
                        target.unlink(missing_ok=True)
                    elif isinstance(op, CommitOperationAdd):
                        data = hub.staged.pop(op.path_in_repo, None)
                        if data is None:
                            src = op.path_or_fileobj
                            data = src if isinstance(src, bytes) else Path(src).read_bytes()
                        target.parent.mkdir(parents=True, exist_ok=True)
                        target.write_bytes(data)
                hub.commits.append([op.path_in_repo for op in operations])
                return SimpleNamespace(commit_url=f"fake://{repo_id}", oid=hub.SHA)

        return FakeHfApi()

    def filesystem(self, *args, **kwargs):
        from fsspec.implementations.dirfs import DirFileSystem
        from fsspec.implementations.local import LocalFileSystem

        return DirFileSystem(path=str(self.root), fs=LocalFileSystem())

    def patch(self):
        return [mock.patch("datasets.dataset_dict.HfApi", self.api),
                mock.patch("datasets.arrow_dataset.HfApi", self.api),
                mock.patch("datasets.dataset_dict.HfFileSystem", self.filesystem),
                mock.patch("timm_csm.hub.push.HfApi", self.api)]


def _with(patches, fn):
    for p in patches:
        p.start()
    try:
        return fn()
    finally:
        for p in reversed(patches):
            p.stop()


def test_fake_push_loads_back_identically(saved, annotated, tmp_path):
    import datasets
    import yaml

    hub = FakeHub(tmp_path / "hub")
    before = tree_digest(saved)
    _with(hub.patch(), lambda: push_csm_dataset(saved, "timm-csm/csm-shapes-aug", max_shard_size="5KB"))
    repo = hub.repo_dir("timm-csm/csm-shapes-aug")
    shards = sorted(p.name for p in (repo / "data").iterdir())
    assert len(shards) > 1 and all(n.startswith("train-") and n.endswith(".parquet") for n in shards)
    pushed = datasets.load_dataset(str(repo))
    assert pushed["train"].features == csm_features(CLASS_NAMES)
    assert rows_of(pushed["train"]) == rows_of(annotated)
    # the card keeps its provenance text; push_to_hub rewrote the YAML for the pushed shards
    text = (repo / "README.md").read_text()
    assert "## Provenance" in text and "generator-test" in text
    meta = yaml.safe_load(text.split("---\n", 2)[1])
    assert meta["dataset_info"]["splits"][0]["num_examples"] == 40 and meta["license"] == "mit"
    assert hub.commits[0] == ["README.md"]
    assert tree_digest(saved) == before


def test_failed_push_leaves_local_copy_untouched(saved, tmp_path):
    hub = FakeHub(tmp_path / "hub", fail_on_commit=True)
    before = tree_digest(saved)
    with pytest.raises(PushError, match="unreachable.*local copy at .* is unchanged"):
        _with(hub.patch(), lambda: push_csm_dataset(saved, "timm-csm/csm-shapes-aug"))
    assert tree_digest(saved) == before
    with pytest.raises(ValueError, match="namespace/name"):
        push_csm_dataset(saved, "csm-shapes-aug")


def test_validation_errors_name_the_problem(annotated, tmp_path):
    import datasets

    build_csm_dataset(annotated, CLASS_NAMES, LAMBDAS)
    with pytest.raises(ValueError, match="differ from the real dataset's at 1 position.*2: 'stripes' != 'dots'"):
        build_csm_dataset(annotated, ["circle", "cross", "dots"])
    with pytest.raises(ValueError, match="do not match the real dataset \\(4 classes\\)"):
        build_csm_dataset(annotated, CLASS_NAMES + ["extra"])

    def broken(fn):
        return datasets.Dataset.from_dict(fn(annotated.with_format(None)[:]), features=annotated.features)

    def unnormalised(d):
        d["soft_label"][5] = [0.5, 0.2, 0.2]
        return d
    with pytest.raises(ValueError, match="1 soft_label row.*do not sum to 1.*row 5"):
        validate_csm_dataset(broken(unnormalised))

    def wrong_label(d):
        d["label"][3] = 2 if d["label"][3] != 2 else 0
        return d
    with pytest.raises(ValueError, match="not the dominant class.*row 3"):
        validate_csm_dataset(broken(wrong_label))
    incomplete = annotated.select([i for i in range(len(annotated)) if i != 12])
    with pytest.raises(ValueError, match="1 of 5 groups do not hold one image per lambda"):
        save_csm_dataset(incomplete, tmp_path / "csm-bad-aug", lambdas=LAMBDAS)
    assert not (tmp_path / "csm-bad-aug").exists()
    with pytest.raises(ValueError, match="columns must be exactly"):
        validate_csm_dataset(annotated.remove_columns(["lambda_hat"]))


def test_annotate_and_publish_scripts(tmp_path, monkeypatch, capsys):
    """The scripts end to end on the digits data: raw generated folder -> annotated, installed, pushed; each exits 0
    and ends naming the next step."""
    import torch

    from timm_csm.commands import annotate as annotate_script
    from timm_csm.commands import publish as publish_script
    from timm_csm.data import load_digits
    from timm_csm.generation.writer import generate_to_folder, make_plan

    digits = load_digits("train")
    means = np.stack([digits.images[digits.labels == k].mean(0) for k in range(10)])

    def mixing_pipeline(groups, lambdas, output_type="pt", return_dict=False):  # class means mixed: a stand-in
        images, members = [], []
        for g in groups:
            noise = np.random.default_rng(g.seed).normal(0, 8, means[0].shape)
            for lam in lambdas:
                img = lam * means[g.class_a] + (1 - lam) * means[g.class_b] + noise
                images.append(np.clip(img, 0, 255).round().astype(np.uint8))
                members.append((g, lam))
        return torch.from_numpy(np.stack(images)), members

    plan = make_plan(10, 12, LAMBDAS, digits.class_names, groups_per_shard=5,
                     generator={"name": "mix-means", "revision": "1", "sampler": "none", "steps": 0,
                                "dataset": "digits"})
    generate_to_folder(mixing_pipeline, tmp_path / "gen", plan, progress=False)

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))
    import datasets
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-datasets")
    status = annotate_script.main(["--generated", str(tmp_path / "gen"), "--output", str(tmp_path / "hub"),
                                   "--reference-epochs", "1", "--batch-size", "64", "--install",
                                   "--cache-dir", str(tmp_path / "protos")])
    assert status == 0  # what the console script hands to sys.exit: it returned the folder, exit status 1
    *_, installed, next_step = capsys.readouterr().out.splitlines()
    assert installed.startswith("installed: datasets.load_dataset('csm-digits-aug')")
    assert next_step == "next: timm-csm-train --dataset digits --loss csm --csm-dataset csm-digits-aug"
    folder = tmp_path / "hub" / "csm-digits-aug"
    assert (tmp_path / "runs" / "reference-digits-holdout" / "model.safetensors").exists()
    text = (folder / "README.md").read_text()
    assert "maximum likelihood of the true class" in text and "mix-means" in text and "CC BY 4.0" in text
    ds = load_csm_dataset("csm-digits-aug", split="train")
    assert len(ds) == 96 and ds.features == csm_features(digits.class_names)
    soft = np.asarray(ds["soft_label"])
    np.testing.assert_allclose(soft.sum(1), 1.0, atol=1e-6)

    hub = FakeHub(tmp_path / "fake-hub")
    assert _with(hub.patch(),
                 lambda: publish_script.main(["--repo-id", "org/csm-digits-aug", "--root", str(tmp_path / "hub")])) == 0
    assert capsys.readouterr().out.splitlines()[-1] == ("next: datasets.load_dataset('org/csm-digits-aug') anywhere, "
                                                        "or timm-csm-train --csm-dataset org/csm-digits-aug")
    pushed = datasets.load_dataset(str(hub.repo_dir("org/csm-digits-aug")), split="train")
    assert rows_of(pushed) == rows_of(ds)
