"""The GPU scripts run where a GPU is lent for minutes only, so they are run here at toy sizes on the CPU: a script
that breaks there wastes the loan. ``gpu_levers.py`` measures what it says: the reference row is the reference,
every precision moves the images a little, float16 (10 mantissa bits) less than bfloat16 (7)."""
import json

import pytest

from benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def levers(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_levers")
    result = load_benchmark("gpu_levers").main(["--toy", "--device", "cpu", "--output", str(out)])
    return result, out


def test_gpu_levers_rows_and_distances(levers):
    result, out = levers
    assert json.loads((out / "gpu_levers.json").read_text())["toy"] is True
    assert len(result["record"]["commit"]) >= 7 and result["record"]["torch_threads"] >= 1  # the code that ran it
    assert "TOY SIZES" in (out / "gpu_levers.md").read_text()
    rows = {(r["setting"], r["batch_groups"]): r for r in result["demo_generator"]["rows"]}
    assert len(rows) == 7
    reference = result["demo_generator"]["rows"][0]
    assert reference["precision"] == "float32" and reference["tf32"] is False
    assert reference["mean_abs_levels"] == reference["max_levels"] == 0
    assert rows[("float32", 32)]["max_levels"] == 0  # TF32 does not apply on a CPU
    bf16, fp16 = rows[("bfloat16", 32)], rows[("float16", 32)]
    assert 0 < fp16["mean_abs_levels"] < bf16["mean_abs_levels"] < 8
    assert all(r["s_per_group"] > 0 for r in rows.values())
    full = result["full_generators"]["rows"]
    assert {(r["route"].split()[0], r["precision"]) for r in full} == {
        (route, p) for route in ("diffusers", "EDM") for p in ("float32", "bfloat16", "float16")}
    steps = {(r["model"], r["step"], r["precision"]) for r in result["training"]}
    assert len(steps) == 12 and ("small_cnn", "CSM, concatenated", "bfloat16") in steps


def test_gpu_bench_counts_the_full_profiles_flops(tmp_path):
    result = load_benchmark("gpu_bench").main(["--flops-only", "--output", str(tmp_path)])
    flops = result["flops"]
    assert flops["projection"]["generated_images"] == 19800 * 8  # the full profile's groups x lambdas
    assert [r["nfe_per_image"] for r in flops["generation"]] == [25, 49]  # DDIM 25; Heun 2 x 25 - 1
    assert all(r["gflop_per_image"] > 0 for r in flops["generation"] + flops["training"] if "gflop_per_image" in r)
    assert (tmp_path / "gpu_bench.md").read_text().startswith("FLOPs at the full profile's sizes")
