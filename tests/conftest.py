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


@pytest.fixture(scope="module")
def tiny_generator(tmp_path_factory):
    """A saved generator folder: the smoke profile's UNet for 4 classes, random non-trivial weights."""
    from diffusers import DDIMScheduler

    from timm_csm.generation import GENERATOR_PROFILES, SemanticMixingPipeline, create_class_unet

    num_classes = 4
    torch.manual_seed(0)
    unet = create_class_unet(GENERATOR_PROFILES["smoke"], num_classes).eval()
    for p in unet.parameters():  # diffusers zero-inits some output layers
        p.data.normal_(0, 0.05)
    folder = tmp_path_factory.mktemp("gen")
    sched = DDIMScheduler(num_train_timesteps=1000, beta_schedule="squaredcos_cap_v2")
    names = [f"c{i}" for i in range(num_classes)]
    SemanticMixingPipeline(unet, sched, names, metadata={"name": "tiny"}).save_pretrained(folder)
    return folder
