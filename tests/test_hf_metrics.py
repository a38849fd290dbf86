"""The `evaluate` modules: loading by path and by bare name (module cache), options, both input routes, combine."""
import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import evaluate  # imported once for the module (slow)
from timm_csm import hf_metrics
from timm_csm.hf_metrics import METRIC_NAMES, install_evaluate_modules, load_metric, metric_path
from timm_csm.metrics import (adaptive_ece, brier_score, classwise_ece, ece, mce, nll, smooth_ece)

REFERENCE = {
    "ece": lambda p, y, **kw: ece(p, y, **kw),
    "aece": lambda p, y, **kw: adaptive_ece(p, y, **kw),
    "cwece": lambda p, y, **kw: classwise_ece(p, y, **kw),
    "mce": lambda p, y, **kw: mce(p, y, **kw),
    "nll": lambda p, y, n_bins=15, **kw: nll(p, y, **kw),
    "brier": lambda p, y, n_bins=15, **kw: brier_score(p, y, **kw),
    "smece": lambda p, y, n_bins=15, **kw: smooth_ece(p, y, **kw),
}


def make_data(n=400, c=6, seed=0):
    rng = np.random.RandomState(seed)
    z = (2 * rng.randn(n, c)).astype(np.float32)
    y = rng.randint(0, c, n)
    z[np.arange(n), y] += 2
    return z, y


@pytest.fixture(scope="module")
def modules():
    return {name: load_metric(name) for name in METRIC_NAMES}


def test_metric_paths_are_shipped_scripts():
    for name in METRIC_NAMES:
        path = Path(metric_path(name))
        assert path.is_file() and path.name == f"{name}.py" and path.parent.name == name
    with pytest.raises(ValueError, match="unknown metric"):
        metric_path("accuracy")


def test_every_module_matches_the_functional_core_on_both_routes(modules):
    z, y = make_data()
    for name, module in modules.items():
        assert module.name == name
        want = REFERENCE[name](z, y)
        fast = module.compute(predictions=z, references=y)  # arrays: no Arrow
        assert fast == {name: pytest.approx(want, abs=1e-12)}
        plain = module.compute(predictions=z.tolist(), references=y.tolist())  # lists: evaluate's Arrow cache
        assert plain == {name: pytest.approx(want, abs=1e-6)}


def test_options_at_load_time_and_at_compute_time():
    z, y = make_data(seed=1)
    p = torch.softmax(torch.from_numpy(z).double(), 1).numpy()
    module = load_metric("ece", n_bins=10, input_type="probs")
    assert module.compute(predictions=p, references=y)["ece"] == pytest.approx(
        ece(p, y, 10, input_type="probs"), abs=1e-12)
    assert module.compute(predictions=p.tolist(), references=y.tolist())["ece"] == pytest.approx(
        ece(p, y, 10, input_type="probs"), abs=1e-6)
    assert module.compute(predictions=p, references=y, n_bins=5)["ece"] == pytest.approx(
        ece(p, y, 5, input_type="probs"), abs=1e-12)
    with pytest.raises(ValueError, match="unknown option"):
        module.compute(predictions=p, references=y, bins=5)
    with pytest.raises(ValueError, match="input_type"):
        load_metric("nll", input_type="probabilities")


def test_soft_references_and_dense_arrays(modules):
    z, _ = make_data(seed=2)
    rng = np.random.RandomState(2)
    t = rng.dirichlet(np.ones(6), size=len(z)).astype(np.float32)
    for name in ("ece", "nll", "brier", "cwece"):
        want = REFERENCE[name](z, t)
        assert modules[name].compute(predictions=z, references=t)[name] == pytest.approx(want, abs=1e-12)
        assert modules[name].compute(predictions=z.tolist(), references=t.tolist())[name] == pytest.approx(
            want, abs=1e-6)
    logits = rng.randn(2, 3, 4, 4).astype(np.float32)
    target = rng.randint(0, 3, (2, 4, 4))
    target[0, 0] = 255
    dense = load_metric("ece", ignore_index=255)
    assert dense.compute(predictions=torch.from_numpy(logits), references=torch.from_numpy(target))["ece"] == \
        pytest.approx(ece(logits, target, ignore_index=255), abs=1e-12)


def test_add_batch_streams_arrays_without_arrow_and_lists_through_it(modules):
    z, y = make_data(n=600, seed=3)
    for name in ("ece", "aece", "smece", "nll"):
        module = modules[name]
        for a in range(0, 600, 150):
            module.add_batch(predictions=z[a:a + 150], references=y[a:a + 150])
        assert module.writer is None and len(module) == 0  # nothing went to the Arrow cache
        assert module.compute() == {name: pytest.approx(REFERENCE[name](z, y), abs=1e-12)}
        for a in range(0, 600, 200):
            module.add_batch(predictions=z[a:a + 200].tolist(), references=y[a:a + 200].tolist())
        assert module.compute() == {name: pytest.approx(REFERENCE[name](z, y), abs=1e-6)}
        with pytest.raises(ValueError, match="nothing to compute"):
            module.compute()
    # batches accumulated with the load-time options cannot be re-binned at compute time
    modules["ece"].add_batch(predictions=z, references=y)
    with pytest.raises(ValueError, match="differ from the options"):
        modules["ece"].compute(n_bins=10)


def test_combine_loaded_modules_and_errors(modules):
    z, y = make_data(seed=4)
    combined = evaluate.combine([modules["ece"], modules["nll"], modules["brier"]])
    got = combined.compute(predictions=z, references=y)
    assert got == {"ece": pytest.approx(ece(z, y), abs=1e-12), "nll": pytest.approx(nll(z, y), abs=1e-12),
                   "brier": pytest.approx(brier_score(z, y), abs=1e-12)}
    # n_bins passed at compute time reaches every module, and all of them accept it
    got10 = combined.compute(predictions=z, references=y, n_bins=10)
    assert got10["ece"] == pytest.approx(ece(z, y, 10), abs=1e-12) and got10["nll"] == got["nll"]
    with pytest.raises(ValueError, match="label out of range"):
        modules["ece"].compute(predictions=z, references=y + 6)
    with pytest.raises(ValueError, match="rows do not sum to 1"):
        load_metric("ece", input_type="probs").compute(predictions=np.abs(z), references=y)


def test_load_metric_logs_no_warning():
    records = []
    handler = logging.Handler(level=logging.WARNING)
    handler.emit = records.append
    logger = logging.getLogger("evaluate")
    logger.addHandler(handler)
    try:
        load_metric("mce")
    finally:
        logger.removeHandler(handler)
    assert [r.getMessage() for r in records] == []


def test_install_writes_the_cache_layout_atomically(tmp_path):
    written = install_evaluate_modules(cache_dir=tmp_path)
    assert len(written) == 2 * len(METRIC_NAMES)
    for name in METRIC_NAMES:
        code = Path(metric_path(name)).read_bytes()
        for prefix in ("evaluate-metric", "timm-csm"):
            hits = list((tmp_path / "metrics" / f"{prefix}--{name}").glob(f"*/{name}.py"))
            assert len(hits) == 1 and len(hits[0].parent.name) == 64 and hits[0].read_bytes() == code
            assert (hits[0].parent / "__init__.py").exists()
    # idempotent, refreshes modification times, leaves no temp files
    old = written[0].stat().st_mtime_ns
    os.utime(written[0], ns=(old - 10**9, old - 10**9))
    assert install_evaluate_modules(cache_dir=tmp_path) == written
    assert written[0].stat().st_mtime_ns > old - 10**9
    assert not list(tmp_path.rglob("*.tmp"))
    # a changed copy is replaced
    written[0].write_text("broken")
    install_evaluate_modules(["ece", "aece", "cwece", "mce", "nll", "brier", "smece"], cache_dir=tmp_path)
    assert written[0].read_bytes() == Path(metric_path(written[0].stem)).read_bytes()
    with pytest.raises(ValueError, match="unknown metric"):
        install_evaluate_modules(["f1"], cache_dir=tmp_path)


def test_cache_location_follows_evaluate_config(monkeypatch, tmp_path):
    monkeypatch.delenv("HF_MODULES_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert hf_metrics.evaluate_modules_cache() == tmp_path / "home" / "modules" / "evaluate_modules"
    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "mods"))
    assert hf_metrics.evaluate_modules_cache() == tmp_path / "mods" / "evaluate_modules"
    monkeypatch.delenv("HF_MODULES_CACHE")
    monkeypatch.delenv("HF_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hf_metrics.evaluate_modules_cache() == tmp_path / "xdg" / "huggingface" / "modules" / "evaluate_modules"


def test_install_cli(tmp_path, capsys):
    assert hf_metrics.main(["ece", "nll", "--cache-dir", str(tmp_path)]) == 0
    printed = capsys.readouterr().out.split()
    assert len(printed) == 4 and all(Path(p).is_file() for p in printed)
    assert hf_metrics.main(["nope", "--cache-dir", str(tmp_path)]) == 1


def test_bare_evaluate_load_in_a_new_process_after_one_import(tmp_path):
    """`import timm_csm` once in a fresh HF_HOME; later processes that never import timm_csm themselves load the
    modules by bare name, from another directory, offline."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_MODULES_CACHE", "HF_EVALUATE_CACHE")}
    env.update(HF_HOME=str(tmp_path / "hf"), HF_EVALUATE_OFFLINE="1", HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    subprocess.run([sys.executable, "-c", "import timm_csm"], env=env, check=True, timeout=300)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    z, y = make_data(seed=5)
    np.save(elsewhere / "z.npy", z)
    np.save(elsewhere / "y.npy", y)
    script = textwrap.dedent("""
        import json
        import numpy as np
        import evaluate
        z, y = np.load("z.npy"), np.load("y.npy")
        out = {"ece": evaluate.load("ece").compute(predictions=z, references=y),
               "ece10": evaluate.load("ece", n_bins=10).compute(predictions=z.tolist(), references=y.tolist()),
               "combined": evaluate.combine(["ece", "nll"]).compute(predictions=z, references=y),
               "namespaced": evaluate.load("timm-csm/brier").compute(predictions=z, references=y)}
        print(json.dumps(out))
    """)
    proc = subprocess.run([sys.executable, "-c", script], env=env, cwd=elsewhere, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["ece"]["ece"] == pytest.approx(ece(z, y), abs=1e-12)
    assert out["ece10"]["ece"] == pytest.approx(ece(z, y, 10), abs=1e-6)
    assert out["combined"] == {"ece": pytest.approx(ece(z, y), abs=1e-12), "nll": pytest.approx(nll(z, y), abs=1e-9)}
    assert out["namespaced"]["brier"] == pytest.approx(brier_score(z, y), abs=1e-9)
