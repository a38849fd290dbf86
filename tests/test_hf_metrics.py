"""The `evaluate` modules: loading by path and by bare name (module cache), options, both input routes, combine."""
import hashlib
import json
import logging
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import evaluate  # imported once for the module (slow)
from timm_csm import hf_metrics
from timm_csm.hf_metrics import METRIC_NAMES, install_evaluate_modules, load_metric, metric_path
from timm_csm.metrics import (adaptive_ece, augrc, aurc, brier_score, classwise_ece, debiased_ce, eaurc, ece, mce,
                              nll, smooth_ece)

REFERENCE = {
    "ece": lambda p, y, **kw: ece(p, y, **kw),
    "aece": lambda p, y, **kw: adaptive_ece(p, y, **kw),
    "cece": lambda p, y, **kw: classwise_ece(p, y, **kw),
    "mce": lambda p, y, **kw: mce(p, y, **kw),
    "debiased_ce": lambda p, y, **kw: debiased_ce(p, y, **kw),
    "nll": lambda p, y, n_bins=15, **kw: nll(p, y, **kw),
    "brier": lambda p, y, n_bins=15, **kw: brier_score(p, y, **kw),
    "smece": lambda p, y, n_bins=15, **kw: smooth_ece(p, y, **kw),
    "aurc": lambda p, y, n_bins=15, **kw: aurc(p, y, **kw),
    "eaurc": lambda p, y, n_bins=15, **kw: eaurc(p, y, **kw),
    "augrc": lambda p, y, n_bins=15, **kw: augrc(p, y, **kw),
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


def test_the_modules_use_the_public_metrics_api_and_one_description(modules):
    import ast
    import inspect

    from timm_csm import metrics

    base = Path(hf_metrics.__file__).parent / "_base.py"
    for node in ast.walk(ast.parse(base.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("timm_csm.metrics"):
            assert node.module == "timm_csm.metrics", node.module
            assert {a.name for a in node.names} <= set(metrics.__all__)
    functions = {"ece": ece, "aece": adaptive_ece, "cece": classwise_ece, "mce": mce, "debiased_ce": debiased_ce,
                 "nll": nll,
                 "brier": brier_score, "smece": smooth_ece, "aurc": aurc, "eaurc": eaurc, "augrc": augrc}
    for name, module in modules.items():
        assert module.description.startswith(inspect.cleandoc(functions[name].__doc__))
        assert f'load_metric("{name}")' in module.description and "within 0.001" in module.description
        assert Path(metric_path(name)).read_text().count("\n") < 10  # the class evaluate loads, and its name


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
    for name in ("ece", "nll", "brier", "cece"):
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
    install_evaluate_modules(["ece", "aece", "cece", "mce", "nll", "brier", "smece"], cache_dir=tmp_path)
    assert written[0].read_bytes() == Path(metric_path(written[0].stem)).read_bytes()
    with pytest.raises(ValueError, match="unknown metric"):
        install_evaluate_modules(["f1"], cache_dir=tmp_path)


def test_a_classwise_module_cached_by_an_earlier_release_under_its_earlier_name_still_computes(tmp_path):
    import evaluate

    script = tmp_path / "cwece" / "cwece.py"  # the script an earlier release installed into evaluate's cache
    script.parent.mkdir()
    script.write_text("from timm_csm.hf_metrics import _base\n\n\nclass CWECE(_base.CalibrationMetric):\n"
                      "    metric_name = \"cwece\"\n")
    z, y = make_data(seed=4)
    assert evaluate.load(str(script)).compute(predictions=z, references=y) == {
        "cwece": pytest.approx(classwise_ece(z, y), abs=1e-12)}
    assert "cwece" not in METRIC_NAMES and "cece" in METRIC_NAMES


def test_the_renamed_classwise_module_loads_under_its_old_name_with_a_warning(tmp_path):
    """CHANGELOG.md: ``cwece`` is ``cece``; the old name gives the new module, saying so."""
    with pytest.warns(FutureWarning, match="the metric 'cwece' is named 'cece' now"):
        assert metric_path("cwece") == metric_path("cece")
    with pytest.warns(FutureWarning):
        (written, _) = install_evaluate_modules(["cwece"], cache_dir=tmp_path)
    assert written.name == "cece.py"
    assert "`cwece`" in (Path(__file__).resolve().parents[1] / "CHANGELOG.md").read_text()


def stale_copy(cache: Path, name: str, ahead_s: float) -> Path:
    """A cached copy of another version of module `name` (its value is -1), modified `ahead_s` seconds from now."""
    line = f'    metric_name = "{name}"\n'
    code = Path(metric_path(name)).read_text()
    assert line in code
    code = code.replace(line, line + "    value = lambda self, acc, opts: -1.0\n")
    folder = cache / "metrics" / f"evaluate-metric--{name}" / ("0" * 64)
    folder.mkdir(parents=True)
    (folder / "__init__.py").touch()
    script = folder / f"{name}.py"
    script.write_text(code)
    when = time.time() + ahead_s
    os.utime(script, (when, when))
    return script


@pytest.mark.parametrize("ahead_s", [0.0, 120.0])  # written in the same tick; refreshed by another installation
def test_install_makes_the_installed_copy_the_one_evaluate_imports(tmp_path, ahead_s):
    from evaluate.loading import CachedEvaluationModuleFactory

    stale_copy(tmp_path, "ece", ahead_s)
    install_evaluate_modules(["ece"], cache_dir=tmp_path)
    picked = CachedEvaluationModuleFactory("evaluate-metric--ece", dynamic_modules_path=str(tmp_path)).get_module()
    assert picked.hash == hashlib.sha256(Path(metric_path("ece")).read_bytes()).hexdigest()


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
    from timm_csm.commands.install_metrics import main

    assert main(["ece", "nll", "--cache-dir", str(tmp_path)]) == 0
    *printed, next_step = capsys.readouterr().out.splitlines()
    assert len(printed) == 4 and all(Path(p).is_file() for p in printed)
    assert next_step == "next: evaluate.load('ece'), offline too"
    assert main(["nope", "--cache-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err == ("timm-csm-install-metrics: error: unknown metric 'nope'; available: "
                                       f"{', '.join(METRIC_NAMES)}\n")


def test_bare_evaluate_load_in_a_new_process_after_one_import(tmp_path):
    """`import timm_csm` once in a fresh HF_HOME; later processes that never import timm_csm themselves load the
    modules by bare name, from another directory, offline."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_MODULES_CACHE", "HF_EVALUATE_CACHE")}
    env.update(HF_HOME=str(tmp_path / "hf"), HF_EVALUATE_OFFLINE="1", HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    stale_copy(tmp_path / "hf" / "modules" / "evaluate_modules", "ece", 60.0)  # an older release, refreshed later
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
               "namespaced": evaluate.load("timm-csm/brier").compute(predictions=z, references=y),
               "readme": evaluate.load("ece").compute(predictions=[[0.9, 0.1]], references=[0])}
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
    assert out["readme"]["ece"] == pytest.approx(0.1, abs=1e-6)


# --- how predictions are read, and input validation on every route ------------------------------------------------
def softmax_np(z):
    return torch.softmax(torch.from_numpy(z).double(), 1).numpy()


def test_readme_example_reads_probabilities_through_evaluate_load():
    module = evaluate.load("ece")  # the bare name: the copy `import timm_csm` installed into evaluate's cache
    assert module.compute(predictions=[[0.9, 0.1]], references=[0]) == {"ece": pytest.approx(0.1, abs=1e-6)}
    assert module.compute(predictions=np.array([[0.9, 0.1]]), references=np.array([0])) == {
        "ece": pytest.approx(0.1, abs=1e-12)}
    module.add(prediction=[0.9, 0.1], reference=0)  # one example at a time, through evaluate's Arrow cache
    module.add(prediction=[0.2, 0.8], reference=0)
    assert module.compute() == {"ece": pytest.approx((0.1 + 0.8) / 2, abs=1e-6)}
    # Python integers are numbers like any other (evaluate's float feature): one-hot rows are probabilities
    assert module.compute(predictions=[[1, 0], [0, 1]], references=[0, 0]) == {"ece": pytest.approx(0.5, abs=1e-6)}
    # an explicit input_type wins: the same numbers read as logits
    as_logits = evaluate.load("ece", input_type="logits").compute(predictions=[[0.9, 0.1]], references=[0])
    assert as_logits["ece"] == pytest.approx(1 - float(torch.softmax(torch.tensor([0.9, 0.1]), 0)[0]), abs=1e-6)


@pytest.mark.parametrize("name", METRIC_NAMES)
def test_probabilities_and_logits_give_one_value_on_every_route(name):
    from torchmetrics.functional.classification import multiclass_calibration_error

    rng = np.random.RandomState(7)  # over-confident: confidence about 0.8, accuracy about 0.1
    z, y = (5 * rng.randn(500, 10)).astype(np.float32), rng.randint(0, 10, 500)
    p = softmax_np(z)
    want = REFERENCE[name](z, y)
    assert REFERENCE[name](p, y, input_type="probs") == pytest.approx(want, abs=1e-6)  # float32 logits
    module = evaluate.load(name)
    for preds, input_type in ((z, "logits"), (p, "probs")):
        exact = REFERENCE[name](preds, y, input_type=input_type)
        assert module.compute(predictions=preds, references=y)[name] == pytest.approx(exact, abs=1e-12)
        assert module.compute(predictions=preds.tolist(), references=y.tolist())[name] == pytest.approx(
            want, abs=1e-5)
        for a in range(0, 500, 125):
            module.add_batch(predictions=preds[a:a + 125], references=y[a:a + 125])
        assert module.compute()[name] == pytest.approx(exact, abs=1e-12)
    if name == "ece":  # torchmetrics applies the softmax to logits only, like this rule
        tm = float(multiclass_calibration_error(torch.from_numpy(p), torch.from_numpy(y), 10, n_bins=15))
        assert want == pytest.approx(tm, abs=1e-5)
    # probabilities read as logits: what the explicit option gives, and far from the right value
    forced = evaluate.load(name, input_type="logits").compute(predictions=p, references=y)[name]
    assert forced == pytest.approx(REFERENCE[name](p, y), abs=1e-9)
    if name in ("ece", "aece", "smece"):
        assert want > 0.5 and forced < want - 0.3


def test_input_type_reading_rule():
    from timm_csm.metrics.inputs import infer_input_type, infer_task

    assert infer_input_type([[0.9, 0.1], [0.5, 0.5]]) == "probs"
    with pytest.raises(ValueError, match=r"do not all sum to 1 \(one sums to 1.1\).*input_type='logits'"):
        infer_input_type([[0.9, 0.1], [0.9, 0.2]])  # probabilities with a bad row, or logits in [0, 1]: not guessed
    with pytest.raises(ValueError, match="do not all sum to 1"):  # what a user of the module sees
        evaluate.load("ece").compute(predictions=[[0.5, 0.6], [0.2, 0.8]], references=[0, 1])
    assert evaluate.load("ece", input_type="logits").compute(predictions=[[0.5, 0.6], [0.2, 0.8]],
                                                             references=[0, 1])["ece"] > 0
    assert infer_input_type([[1.5, -0.5]]) == "logits"  # sums to 1, outside [0, 1]
    assert infer_input_type([[float("nan"), 1.0]]) == "logits"
    assert infer_input_type(np.log([[0.9, 0.1]])) == "logits"  # same softmax as the probabilities
    assert infer_input_type(torch.tensor([0.2, 0.7]), "binary") == "probs"
    assert infer_input_type(torch.tensor([0.2, 1.7]), "binary") == "logits"
    assert infer_input_type(np.zeros((0, 3))) == "logits"  # the emptiness is reported by the validation
    assert infer_task([0.2, 0.7]) == "binary" and infer_task([[0.2, 0.8]]) == "multiclass"


def test_array_batches_must_read_alike():
    module = load_metric("ece")
    module.add_batch(predictions=np.array([[0.9, 0.1]]), references=np.array([0]))
    with pytest.raises(ValueError, match="earlier batches as input_type='probs'"):
        module.add_batch(predictions=np.array([[2.0, -1.0]]), references=np.array([0]))
    module.compute()  # the first batch is still there
    module = load_metric("ece", input_type="logits")  # nothing to guess
    module.add_batch(predictions=np.array([[0.9, 0.1]]), references=np.array([0]))
    module.add_batch(predictions=np.array([[2.0, -1.0]]), references=np.array([0]))
    assert module.compute()["ece"] == pytest.approx(ece(np.array([[0.9, 0.1], [2.0, -1.0]]), [0, 0]), abs=1e-12)


BAD_INPUTS = [
    ("non-integral references", [[0.2, 0.8]] * 4, [1.7] * 4, "non-integer"),
    ("label out of range", [[0.2, 0.8]] * 2, [0, 2], "label out of range"),
    ("negative label", [[0.2, 0.8]] * 2, [0, -1], "label out of range"),
    ("NaN predictions", [[float("nan"), 0.8], [0.2, 0.8]], [1, 1], "NaN"),
    ("NaN references", [[0.2, 0.8]] * 2, [float("nan"), 1.0], "NaN"),
    ("empty", [], [], "empty input"),
    ("mismatched N", [[0.2, 0.8]] * 3, [0, 1], "mismatched N"),
    ("wrong reference shape", [[0.2, 0.8]] * 2, [[0, 1, 0]] * 2, "does not fit preds shape"),
    ("ragged predictions", [[0.2, 0.8], [1.0]], [0, 1], "ragged|could not be converted"),
    ("one class", [[1.0]] * 2, [0, 0], "at least 2 classes"),
    ("probs that do not sum to 1", [[0.2, 0.5]] * 2, [0, 1], "rows do not sum to 1"),
]


def _bad_calls(module, preds, refs, as_array):
    convert = (lambda x: np.asarray(x, dtype=np.float64 if np.asarray(x).dtype.kind == "f" else None)) \
        if as_array else (lambda x: x)
    yield lambda: module.compute(predictions=convert(preds), references=convert(refs))
    yield lambda: module.add_batch(predictions=convert(preds), references=convert(refs))


@pytest.mark.parametrize("case", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_raises_a_clear_error_on_every_route(case):
    _, preds, refs, message = case
    ragged = "ragged" in case[0]
    for name in METRIC_NAMES:
        module = evaluate.load(name, input_type="probs" if "sum to 1" in case[0] else "auto")
        for as_array in ((False,) if ragged else (False, True)):
            for call in _bad_calls(module, preds, refs, as_array):
                with pytest.raises(ValueError, match=message):
                    call()
                assert module.writer is None and module._fast is None  # nothing was stored
    if preds and not ragged and "mismatched" not in case[0]:  # one example at a time
        module = load_metric("ece", input_type="probs" if "sum to 1" in case[0] else "auto")
        with pytest.raises(ValueError, match=message):
            for p, r in zip(preds, refs):
                module.add(prediction=p, reference=r)


def test_list_route_keeps_soft_binary_references_and_refuses_mixed_kinds():
    brier = evaluate.load("brier")
    got = brier.compute(predictions=[0.3, 0.8], references=[0.2, 0.9])  # soft: not truncated to 0 / 0
    assert got == {"brier": pytest.approx(0.01, abs=1e-6)}
    brier.add_batch(predictions=[0.3, 0.8], references=[0, 1])
    with pytest.raises(ValueError, match="compute\\(\\) them first"):
        brier.add_batch(predictions=[0.3, 0.8], references=[0.2, 0.9])
    assert brier.compute() == {"brier": pytest.approx((0.09 + 0.04) / 2, abs=1e-6)}
    with pytest.raises(ValueError, match="dense predictions"):
        load_metric("ece").compute(predictions=np.full((2, 3, 2, 2), 2.0).tolist(), references=np.zeros((2, 2, 2)).tolist())


def test_brier_is_binary_for_binary_input_and_summed_over_classes_otherwise():
    # evaluate's documented brier_score example: 0.3375
    preds, refs = [0.1, 0.9, 0.8, 0.3], [0, 0, 1, 1]
    binary = evaluate.load("brier")
    assert binary.compute(predictions=preds, references=refs) == {"brier": pytest.approx(0.3375, abs=1e-6)}
    assert binary.compute(predictions=np.array(preds), references=np.array(refs)) == {
        "brier": pytest.approx(0.3375, abs=1e-12)}
    explicit = evaluate.load("brier", task="binary")
    assert explicit.compute(predictions=np.array(preds)[:, None], references=np.array(refs))["brier"] == \
        pytest.approx(0.3375, abs=1e-12)
    column = [[p] for p in preds]  # (N, 1) lists with the task given at compute time
    assert evaluate.load("brier").compute(predictions=column, references=refs, task="binary")["brier"] == \
        pytest.approx(0.3375, abs=1e-6)
    logits = np.log(np.array(preds) / (1 - np.array(preds)))
    assert evaluate.load("brier", input_type="logits").compute(predictions=logits, references=refs)["brier"] == \
        pytest.approx(0.3375, abs=1e-9)
    from sklearn.metrics import brier_score_loss
    assert 0.3375 == pytest.approx(brier_score_loss(refs, preds), abs=1e-12)
    # the same data as two-class rows is multiclass: the sum over both classes
    two = np.stack([1 - np.array(preds), np.array(preds)], 1)
    assert evaluate.load("brier").compute(predictions=two, references=refs) == {
        "brier": pytest.approx(0.675, abs=1e-12)}
    assert brier_score(two, refs, input_type="probs") == pytest.approx(0.675, abs=1e-12)
