"""benchmarks/shift_bench.py at toy size: its shares add up and its page names the command."""
from benchmark_scripts import load_benchmark


def test_the_shift_benchmark_at_toy_size():
    bench = load_benchmark("shift_bench")
    r = bench.measure(n=48, model_name="small_cnn", batch_size=16, corruptions="fog,rotate", log=lambda m: None)
    assert r["cells"] == 10 and r["n"] == 48 and set(r["corrupt_us_per_image"]) == {"fog", "rotate"}
    assert 0 < r["share_forward"] < 1 and 0 < r["share_corrupt"] < 1 and r["share_forward"] + r["share_corrupt"] < 1
    page = bench.markdown(r, "python benchmarks/shift_bench.py --n 48")
    assert "Command: `python benchmarks/shift_bench.py --n 48`" in page and "toy size (48 of" in page


def test_the_corruption_cost_at_toy_size():
    bench = load_benchmark("shift_bench")
    r = bench.corruption_cost(n=4, batch_size=4, corruptions="gaussian_noise,stripe", inputs=((28, 1), (40, 3)),
                              log=lambda m: None)
    assert set(r["inputs"]) == {"28x28x1", "40x40x3"}
    assert bench.cost_images(4, 40, 3).shape == (4, 3, 40, 40)
    for cell in r["inputs"].values():
        assert set(cell["us_per_image"]) == {"gaussian_noise", "stripe"}
        assert all(len(v) == 5 and min(v) > 0 for v in cell["us_per_image"].values())
        assert cell["all_cells_ms_per_image"] == sum(sum(v) for v in cell["us_per_image"].values()) / 1000
        assert cell["forward_ms_per_image"] > 0 and cell["model"] == bench.COST_MODELS[cell["channels"]]
    page = bench.cost_markdown(r, "python benchmarks/shift_bench.py --cost --cost-n 4")
    assert "Command: `python benchmarks/shift_bench.py --cost --cost-n 4`" in page and "| 28 px grey | 40 px RGB |" in page
