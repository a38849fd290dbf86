"""The calibrators benchmark at toy scale, as it runs where no peer library is installed: every method's row, the
peers' gaps said in the table, the pass multiples and the known mis-calibration of its synthetic logits."""

import torch

from benchmark_scripts import load_benchmark


def test_the_table_without_peers():
    bench = load_benchmark("calibrators_bench")
    versions = {"timm_csm": "0", **{lib: None for lib in bench.LIBRARIES[1:]}}
    rows = bench.bench(["400x4"], repeats=1, seed=0, versions=versions)
    assert [r["method"] for r in rows] == list(bench.METHODS)
    by_name = {r["method"]: r for r in rows}
    assert by_name["matrix_scaling"]["netcal"] == "no such method"
    assert by_name["platt"]["size"] == "400 x 2"
    for row in rows:
        assert all(row[lib] in ("not installed", "no such method") for lib in bench.LIBRARIES[1:])
        assert row["pass_s"] > 0 and row["timm_csm"]["fit_s"] > 0
    ts = by_name["temperature_scaling_nll"]
    assert ts["timm_csm"]["nll"] < ts["uncalibrated"]["nll"]  # over-confident by construction
    assert ts["timm_csm"]["iterations"] <= 10  # Newton on one parameter
    page = bench.markdown(rows, "OMP_NUM_THREADS=1 python benchmarks/calibrators_bench.py", 1, versions)
    assert page.count("| not installed |") == sum(len(peers) for peers in bench.METHODS.values())
    assert "a peer faster than timm_csm: none" in page


def test_the_logits_are_over_confident_by_a_temperature_of_two():
    bench = load_benchmark("calibrators_bench")
    data = bench.synthetic_logits(20000, 5, seed=0)
    from timm_csm.calibration import create_calibrator

    ts = create_calibrator("temperature_scaling_nll").fit(*data["fit"])
    assert 1.8 < float(ts.temperature) < 2.2
    assert torch.equal(bench.synthetic_logits(20000, 5, seed=0)["held_out"][1], data["held_out"][1])
