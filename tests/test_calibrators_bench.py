"""The calibrators benchmark at toy scale, as it runs where torch-uncertainty is not installed: every method's row,
the peers' gaps said in the table, and the known mis-calibration of its synthetic logits."""

import torch

from benchmark_scripts import load_benchmark


def test_the_table_without_torch_uncertainty(monkeypatch):
    bench = load_benchmark("calibrators_bench")
    monkeypatch.setattr(bench, "tu_installed", lambda: None)
    rows = bench.bench(["400x4"], repeats=1, seed=0)
    assert [r["method"] for r in rows] == [m[0] for m in bench.METHODS]
    assert all(r["torch-uncertainty"] in ("not installed", "no such method") for r in rows)
    by_name = {r["method"]: r for r in rows}
    assert by_name["matrix_scaling"]["netcal"] == "no such method"
    assert by_name["platt"]["size"] == "400 x 2"
    ts = by_name["temperature_scaling_nll"]
    assert ts["timm_csm"]["nll"] < ts["uncalibrated"]["nll"]  # over-confident by construction
    assert abs(ts["timm_csm"]["nll"] - ts["netcal"]["nll"]) < 1e-3  # one method, one optimum
    page = bench.markdown(rows, "OMP_NUM_THREADS=1 python benchmarks/calibrators_bench.py", 1)
    assert page.count("| not installed |") == sum(m[2] is not None for m in bench.METHODS)


def test_the_logits_are_over_confident_by_a_temperature_of_two():
    bench = load_benchmark("calibrators_bench")
    data = bench.synthetic_logits(20000, 5, seed=0)
    from timm_csm.calibration import create_calibrator

    ts = create_calibrator("temperature_scaling_nll").fit(*data["fit"])
    assert 1.8 < float(ts.temperature) < 2.2
    assert torch.equal(bench.synthetic_logits(20000, 5, seed=0)["held_out"][1], data["held_out"][1])
