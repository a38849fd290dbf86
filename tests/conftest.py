"""Offline, single-threaded, isolated test environment. Set before any Hugging Face import."""
import os
import tempfile

os.environ.setdefault("HF_HOME", tempfile.mkdtemp(prefix="timm-csm-hf-"))
if "PYTEST_XDIST_WORKER" in os.environ:  # parallel workers: a cache each, none writing into another's
    os.environ["HF_HOME"] = os.path.join(os.environ["HF_HOME"], os.environ["PYTEST_XDIST_WORKER"])
for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HF_EVALUATE_OFFLINE"):
    os.environ[var] = "1"
os.environ["OMP_NUM_THREADS"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture
def rng():
    return torch.Generator().manual_seed(0)


@pytest.fixture(scope="module")
def tiny_generator(tmp_path_factory):
    """A saved generator folder: the smoke profile's UNet for 4 classes, random non-trivial weights."""
    from csm_fixtures import save_tiny_generator

    return save_tiny_generator(tmp_path_factory.mktemp("gen"), [f"c{i}" for i in range(4)], {"name": "tiny"})
