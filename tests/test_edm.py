"""EDM network pickles: the restricted reader, the re-implemented networks, and generation through the script.

The pickles are written here in NVlabs' format (``torch_utils/persistence.py``): every network module is a call of
``torch_utils.persistence._reconstruct_persistent_obj`` on ``dict(type='class', version=6, module_src=...,
class_name=..., state=<the module's __dict__ with _init_args / _init_kwargs>)``, containers and tensors pickled as
torch pickles them.
"""
import builtins
import contextlib
import hashlib
import io
import math
import os
import pickle
import sys
import types

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from torch import nn

from timm_csm.generation import EDMSemanticMixingPipeline, load_generated, plan_groups
from timm_csm.generation.edm import (EDMPrecond, UnsafePickleError, VEPrecond, VPPrecond, load_edm_network,
                                     read_edm_pickle)
from timm_csm.generation.edm.labels import CIFAR10_CLASSES

PERSISTENCE = "torch_utils.persistence"
SONG = dict(img_resolution=8, img_channels=3, model_type="SongUNet", model_channels=4, channel_mult=[1, 2],
            channel_mult_emb=2, num_blocks=1, attn_resolutions=[4], dropout=0.1)
DDPMPP = dict(SONG, embedding_type="positional", encoder_type="standard", decoder_type="standard",
              channel_mult_noise=1, resample_filter=[1, 1], augment_dim=9)
NCSNPP = dict(SONG, embedding_type="fourier", encoder_type="residual", decoder_type="standard",
              channel_mult_noise=2, resample_filter=[1, 3, 3, 1])
SKIP = dict(SONG, encoder_type="skip", decoder_type="skip", resample_filter=[1, 3, 3, 1])
ADM = dict(img_resolution=8, img_channels=1, model_type="DhariwalUNet", model_channels=4, channel_mult=[1, 2],
           channel_mult_emb=2, num_blocks=1, attn_resolutions=[4])


@contextlib.contextmanager
def _persistence_name():
    """``torch_utils.persistence._reconstruct_persistent_obj`` exists only while a pickle is written, so that the
    file names it as NVlabs' files do; nothing of that name can be imported when the files are read."""
    pkg, mod = types.ModuleType("torch_utils"), types.ModuleType(PERSISTENCE)

    def _reconstruct_persistent_obj(meta):
        raise AssertionError("the reader must never call the pickled reconstructor")

    _reconstruct_persistent_obj.__module__ = PERSISTENCE
    _reconstruct_persistent_obj.__qualname__ = "_reconstruct_persistent_obj"
    mod._reconstruct_persistent_obj, pkg.persistence = _reconstruct_persistent_obj, mod
    sys.modules["torch_utils"], sys.modules[PERSISTENCE] = pkg, mod
    try:
        yield _reconstruct_persistent_obj
    finally:
        del sys.modules["torch_utils"], sys.modules[PERSISTENCE]


class _PersistencePickler(pickle.Pickler):
    """Writes each network module as NVlabs' persistent-object record. Recorded constructor arguments: the real
    ones for the top module, the plain attributes for the others; floats as NumPy scalars, as EDM's np.sqrt(0.5)."""

    def __init__(self, f, reconstruct, module_src: str, top: nn.Module, init_kwargs: dict):
        super().__init__(f, protocol=4)
        self.reconstruct, self.module_src, self.top, self.init_kwargs = reconstruct, module_src, top, init_kwargs

    def reducer_override(self, obj):
        if not isinstance(obj, nn.Module) or isinstance(obj, nn.ModuleDict):
            return NotImplemented
        state = {k: np.float64(v) if isinstance(v, float) else v for k, v in obj.__dict__.items()}
        plain = {k: v for k, v in state.items() if not k.startswith("_") and k != "training"}
        state.update(_init_args=(), _init_kwargs=dict(self.init_kwargs) if obj is self.top else plain)
        meta = dict(type="class", version=6, module_src=self.module_src, class_name=type(obj).__name__, state=state)
        return self.reconstruct, (meta,)


MODULE_SRC = "import torch\nfrom torch_utils import persistence\n\n@persistence.persistent_class\nclass Net: pass\n"


def write_edm_pickle(path, net, init_kwargs, module_src=MODULE_SRC, extra=None):
    """``dict(ema=net, loss_fn=..., augment_pipe=None, dataset_kwargs=...)`` as EDM's training loop saves it."""
    data = dict(ema=net, loss_fn=None, augment_pipe=None, dataset_kwargs=dict(path="cifar10-32x32.zip"))
    data.update(extra or {})
    with _persistence_name() as reconstruct, open(path, "wb") as f:
        _PersistencePickler(f, reconstruct, module_src, net, init_kwargs).dump(data)
    return path


def _random_net(cls, kwargs, seed=0):
    torch.manual_seed(seed)
    net = cls(**kwargs)
    for p in net.parameters():  # non-trivial weights everywhere
        p.data.normal_(0, 0.3)
    return net.eval().requires_grad_(False)


def _inputs(channels, k, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(5, channels, 8, 8, generator=g, dtype=torch.float64) * 2
    w = torch.softmax(torch.randn(5, k, generator=g), 1)
    return x, w


@pytest.mark.parametrize("cls,kwargs", [(EDMPrecond, DDPMPP), (VPPrecond, NCSNPP), (VEPrecond, SKIP),
                                        (EDMPrecond, ADM)], ids=["edm-ddpmpp", "vp-ncsnpp", "ve-skip", "edm-adm"])
def test_edm_format_pickle_loads_strictly_into_the_same_network(cls, kwargs, tmp_path):
    kwargs = dict(kwargs, label_dim=4)
    net = _random_net(cls, kwargs)
    assert sum(p.numel() for p in net.parameters()) < 20000
    path = write_edm_pickle(tmp_path / "net.pkl", net, kwargs)
    loaded = load_edm_network(path)
    assert type(loaded) is cls and loaded.init_kwargs == kwargs and not loaded.training
    want, got = net.state_dict(), loaded.state_dict()
    assert list(got) == list(want) and all(torch.equal(got[k], want[k]) for k in want)
    x, w = _inputs(kwargs["img_channels"], 4)
    for sigma in (torch.tensor(0.02, dtype=torch.float64), torch.tensor([0.1, 1.0, 3.0, 20.0, 80.0])):
        out = loaded(x, sigma, w)
        assert out.shape == x.shape and out.dtype == torch.float32 and torch.isfinite(out).all()
        assert torch.equal(out, net(x, sigma, w))
    assert not loaded(x, sigma, w).equal(loaded(x, sigma, torch.eye(4)[[0, 1, 2, 3, 0]]))  # labels matter


def test_record_content_is_data_only(tmp_path):
    kwargs = dict(DDPMPP, label_dim=4)
    content, _ = read_edm_pickle(write_edm_pickle(tmp_path / "n.pkl", _random_net(EDMPrecond, kwargs), kwargs))
    record = content["ema"]
    assert record.class_name == "EDMPrecond" and record.module_src == MODULE_SRC and record.version == 6
    assert content["dataset_kwargs"] == {"path": "cifar10-32x32.zip"}
    enc = record.state["_modules"]["model"].state["_modules"]["enc"]
    assert enc.class_name == "ModuleDict"
    block = enc.state["_modules"]["4x4_block0"]
    assert block.class_name == "UNetBlock" and block.state["skip_scale"] == pytest.approx(math.sqrt(0.5))
    assert type(block.state["skip_scale"]) is float  # the NumPy scalar came back as a plain number


def _evil_source(marker) -> str:
    return f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n{MODULE_SRC}"


def test_embedded_module_source_is_never_run(tmp_path):
    marker, proof = tmp_path / "ran-on-load", tmp_path / "ran-when-executed"
    exec(_evil_source(proof).split("import torch")[0], {})  # the embedded code is live: executing it writes a file
    assert proof.exists()
    kwargs = dict(DDPMPP, label_dim=4)
    path = write_edm_pickle(tmp_path / "n.pkl", _random_net(EDMPrecond, kwargs), kwargs, _evil_source(marker))
    net = load_edm_network(path)
    assert not marker.exists() and isinstance(net, EDMPrecond)
    assert PERSISTENCE not in sys.modules and "torch_utils" not in sys.modules


class _RunsACommand:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_global_outside_the_format_is_refused_and_never_called(tmp_path):
    proof = tmp_path / "plain-pickle-ran-it"
    pickle.loads(pickle.dumps(_RunsACommand(proof)))  # the object is live under the plain unpickler
    assert proof.exists()
    marker = tmp_path / "ran-on-load"
    kwargs = dict(DDPMPP, label_dim=4)
    net = _random_net(EDMPrecond, kwargs)
    path = write_edm_pickle(tmp_path / "n.pkl", net, kwargs, extra={"loss_fn": _RunsACommand(marker)})
    with pytest.raises(UnsafePickleError, match=rf"n\.pkl: the pickle refers to {os.system.__module__}\.system, "
                                                r"which is not part of an EDM network pickle"):
        load_edm_network(path)
    assert not marker.exists()


class _IdPickler(pickle.Pickler):
    def persistent_id(self, obj):  # torch.save's way of storing tensors outside the pickle stream
        return "storage-0" if isinstance(obj, bytes) else None


def test_other_files_and_records_are_refused_clearly(tmp_path):
    zipped = tmp_path / "state.pkl"
    torch.save({"w": torch.ones(2)}, zipped)
    with pytest.raises(ValueError, match="zip archive"):
        load_edm_network(zipped)
    persistent = tmp_path / "pid.pkl"
    buf = io.BytesIO()
    _IdPickler(buf, protocol=4).dump({"ema": b"x"})
    persistent.write_bytes(buf.getvalue())
    with pytest.raises(UnsafePickleError, match="persistent id 'storage-0'"):
        load_edm_network(persistent)
    kwargs = dict(DDPMPP, label_dim=4)
    net = _random_net(EDMPrecond, kwargs)
    with pytest.raises(ValueError, match=r"no network record under 'net'.*'dataset_kwargs', 'ema'"):
        load_edm_network(write_edm_pickle(tmp_path / "a.pkl", net, kwargs), key="net")
    with pytest.raises(ValueError, match="do not fit EDMPrecond"):  # the recorded arguments describe another net
        load_edm_network(write_edm_pickle(tmp_path / "b.pkl", net, dict(kwargs, model_channels=8)))
    with pytest.raises(ValueError, match="recorded arguments of EDMPrecond .* do not fit"):
        load_edm_network(write_edm_pickle(tmp_path / "c.pkl", net, dict(kwargs, channel_mult_extra=2)))
    with pytest.raises(ValueError, match="class_labels must hold 4 class weights"):
        net(torch.zeros(1, 3, 8, 8), torch.tensor(1.0), torch.ones(1, 5))


@pytest.mark.parametrize("kwargs", [DDPMPP, NCSNPP, SKIP, ADM], ids=["ddpmpp", "ncsnpp", "skip", "adm"])
def test_networks_keep_the_image_shape_and_take_soft_labels(kwargs):
    for cls in (EDMPrecond, VPPrecond, VEPrecond):
        net = _random_net(cls, dict(kwargs, label_dim=3))
        x, w = _inputs(kwargs["img_channels"], 3)
        assert net(x, torch.full((5,), 2.0), w).shape == x.shape
        assert net.model(x.float(), torch.zeros(5), w).shape == x.shape  # the U-Net alone: F_theta


def _vp_sigma(t, beta_d=19.9, beta_min=0.1):
    return math.sqrt(math.exp(0.5 * beta_d * t * t + beta_min * t) - 1)


def _paper_scalings(name, sigma, sigma_data=0.5, m=1000):
    """Karras et al. 2022, Table 1: (c_skip, c_out, c_in, c_noise) of each preconditioning."""
    if name == "EDMPrecond":
        s2, d2 = sigma ** 2, sigma_data ** 2
        return d2 / (s2 + d2), sigma * sigma_data / math.sqrt(d2 + s2), 1 / math.sqrt(s2 + d2), math.log(sigma) / 4
    if name == "VEPrecond":
        return 1.0, sigma, 1.0, math.log(sigma / 2)
    return 1.0, -sigma, 1 / math.sqrt(sigma ** 2 + 1), None  # VP: c_noise = (M - 1) sigma^-1(sigma), checked below


@pytest.mark.parametrize("cls", [EDMPrecond, VPPrecond, VEPrecond])
def test_preconditioning_follows_the_paper(cls):
    net = _random_net(cls, dict(DDPMPP, label_dim=4))
    x, w = _inputs(3, 4)
    for sigma in (0.002, 0.05, 0.7, 5.0, 80.0):
        got = [float(c.reshape(-1)[0]) for c in net.scalings(torch.tensor([sigma], dtype=torch.float64))]
        for g, e in zip(got, _paper_scalings(cls.__name__, sigma)):
            if e is not None:
                assert g == pytest.approx(e, rel=1e-12)
        if cls is VPPrecond:  # sigma^-1 inverts sigma(t) = sqrt(exp(beta_d t^2 / 2 + beta_min t) - 1)
            assert _vp_sigma(got[3] / 999) == pytest.approx(sigma, rel=1e-9)
        # D(x) = c_skip x + c_out F(c_in x; c_noise), F the inner U-Net, in float32 as EDM
        c_skip, c_out, c_in, c_noise = net.scalings(torch.tensor(sigma).reshape(-1, 1, 1, 1))
        inner = net.model(c_in * x.float(), c_noise.flatten(), class_labels=w)
        want = c_skip * x.float() + c_out * inner
        torch.testing.assert_close(net(x, torch.tensor(sigma, dtype=torch.float64), w), want, rtol=1e-6, atol=1e-6)
    ranges = {EDMPrecond: (0.0, math.inf), VEPrecond: (0.02, 100.0), VPPrecond: (_vp_sigma(1e-5), _vp_sigma(1.0))}
    assert (net.sigma_min, net.sigma_max) == pytest.approx(ranges[cls], rel=1e-6)


def test_pipeline_samples_the_network_with_the_papers_defaults(tmp_path):
    kwargs = dict(NCSNPP, label_dim=4)
    ve = write_edm_pickle(tmp_path / "ve.pkl", _random_net(VEPrecond, kwargs), kwargs)
    pipe = EDMSemanticMixingPipeline.from_edm_pickle(ve, num_inference_steps=3, class_names=list("abcd"))
    assert (pipe.sigma_min, pipe.sigma_max) == (0.02, 80.0)  # EDM's range clamped to the VE network's
    assert pipe.provenance["recipe"]["network"] == "VEPrecond" and pipe.provenance["guidance_scale"] == 1.0
    edm = write_edm_pickle(tmp_path / "edm.pkl", _random_net(EDMPrecond, kwargs), kwargs)
    pipe = EDMSemanticMixingPipeline.from_edm_pickle(edm, num_inference_steps=3, class_names=list("abcd"))
    assert (pipe.sigma_min, pipe.sigma_max) == (0.002, 80.0)
    images, members = pipe(plan_groups(4, 2), [0.0, 0.5, 1.0], return_dict=False)
    assert images.shape == (6, 3, 8, 8) and images.dtype == torch.uint8 and len(members) == 6
    assert not images[0].equal(images[2])  # the two endpoints of a group differ
    again = pipe(plan_groups(4, 2), [0.0, 0.5, 1.0]).images
    assert again.equal(images)  # deterministic per group
    with pytest.raises(ValueError, match="4 classes and no default names"):
        EDMSemanticMixingPipeline.from_edm_pickle(ve)
    k100 = dict(ADM, label_dim=100)
    c100 = EDMSemanticMixingPipeline.from_edm_pickle(write_edm_pickle(tmp_path / "c.pkl", _random_net(EDMPrecond, k100),
                                                                      k100))
    assert c100.num_inference_steps == 25 and len(c100.class_names) == 100 and c100.class_names[26] == "crab"
    uncond = dict(ADM, label_dim=0)
    with pytest.raises(ValueError, match="unconditional network"):
        EDMSemanticMixingPipeline.from_edm_pickle(write_edm_pickle(tmp_path / "u.pkl", _random_net(EDMPrecond, uncond),
                                                                   uncond))


def test_a_pickle_is_read_once_and_hashed_as_it_is_read(tmp_path, monkeypatch):
    """Loading an EDM pickle opens it once; the digest taken while reading is the file's (file_digest's)."""
    from timm_csm.generation.models import file_digest

    kwargs = dict(DDPMPP, label_dim=4)
    path = write_edm_pickle(tmp_path / "edm.pkl", _random_net(EDMPrecond, kwargs), kwargs)
    sha256 = hashlib.sha256(path.read_bytes()).hexdigest()
    assert file_digest(path) == sha256[:12]
    opened, real_open = [], builtins.open

    def counting_open(file, *args, **kw):
        if isinstance(file, (str, os.PathLike)) and os.path.abspath(file) == str(path):
            opened.append(args[0] if args else kw.get("mode", "r"))
        return real_open(file, *args, **kw)

    monkeypatch.setattr(builtins, "open", counting_open)
    pipe = EDMSemanticMixingPipeline.from_edm_pickle(path, num_inference_steps=3, class_names=list("abcd"))
    assert opened == ["rb"] and pipe.provenance["revision"] == sha256[:12]
    assert load_edm_network(path).file_sha256 == sha256 and read_edm_pickle(path)[1] == sha256
    assert opened == ["rb"] * 3


def _generate_script():
    from timm_csm.commands import generate

    return generate


def test_generate_script_takes_an_edm_pickle_and_resumes(tmp_path):
    generate = _generate_script()
    kwargs = dict(DDPMPP, label_dim=10)
    path = write_edm_pickle(tmp_path / "edm-cifar10-32x32-cond-vp.pkl", _random_net(EDMPrecond, kwargs), kwargs)
    out = tmp_path / "gen"
    argv = ["--generator", str(path), "--num-groups", "3", "--output", str(out), "--num-lambdas", "3",
            "--groups-per-shard", "2", "--batch-groups", "2"]
    assert generate.main(argv) == 0
    ds, plan = load_generated(out)
    assert plan["class_names"] == list(CIFAR10_CLASSES) and plan["generator"]["steps"] == 20
    assert plan["generator"]["name"] == "edm-cifar10-32x32-cond-vp" and len(plan["generator"]["revision"]) == 12
    assert len(ds) == 9 and set(ds["anchor_index"]) == {-1} and set(ds["generator"]) == {plan["generator"]["name"]}
    pipe = EDMSemanticMixingPipeline.from_edm_pickle(path)
    first = pipe(plan_groups(10, 1), plan["lambdas"]).images
    assert np.array_equal(np.asarray(ds[0]["image"]).transpose(2, 0, 1), first[0].numpy())
    shard = sorted((out / "shards").glob("*.parquet"))[-1]
    before = pq.read_table(shard)
    shard.unlink()
    assert generate.main(argv) == 0  # the missing shard is generated again, identical
    assert pq.read_table(shard).equals(before)
    with pytest.raises(SystemExit):
        generate.parse_args(argv + ["--strength", "0.5", "--anchor-dataset", "digits"])
