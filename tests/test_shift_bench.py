"""benchmarks/shift_bench.py at toy size: its shares add up and its page names the command."""
from benchmark_scripts import load_benchmark


def test_the_shift_benchmark_at_toy_size():
    bench = load_benchmark("shift_bench")
    r = bench.measure(n=48, model_name="small_cnn", batch_size=16, corruptions="fog,rotate", log=lambda m: None)
    assert r["cells"] == 10 and r["n"] == 48 and set(r["corrupt_us_per_image"]) == {"fog", "rotate"}
    assert 0 < r["share_forward"] < 1 and 0 < r["share_corrupt"] < 1 and r["share_forward"] + r["share_corrupt"] < 1
    page = bench.markdown(r, "python benchmarks/shift_bench.py --n 48")
    assert "Command: `python benchmarks/shift_bench.py --n 48`" in page and "toy size (48 of" in page
