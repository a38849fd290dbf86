"""Offline, single-threaded, isolated test environment. Set before any Hugging Face import."""
import os
import tempfile

os.environ.setdefault("HF_HOME", tempfile.mkdtemp(prefix="timm-csm-hf-"))
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
