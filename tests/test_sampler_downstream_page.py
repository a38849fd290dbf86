"""The sampler check's page is what its records say (it regenerates byte for byte from
benchmarks/sampler_downstream.json), and its decision is the rule its docstring fixes: the candidate passes only
with every seed, an ECE interval below the margin and an accuracy interval above its margin."""
from pathlib import Path

from benchmark_scripts import load_benchmark

ROOT = Path(__file__).resolve().parent.parent


def test_page_regenerates_from_the_records(tmp_path, monkeypatch):
    m = load_benchmark("sampler_downstream")
    monkeypatch.setattr(m, "PAGE", tmp_path / "page.md")
    m.write_page()
    assert (tmp_path / "page.md").read_text() == (ROOT / "benchmarks" / "sampler_downstream.md").read_text()


def _results(m, ece_shift: float, acc_shift: float, seeds):
    rows = {}
    for setting, shift in (("today", (0.0, 0.0)), ("candidate", (ece_shift, acc_shift))):
        rows[setting] = {"rows": {str(s): {"val_ece": 0.05 + shift[0] + 0.002 * (s % 3),
                                          "val_accuracy": 0.86 + shift[1] + 0.003 * (s % 2),
                                          "val_ece_after_ts": 0.04} for s in seeds}}
    return {f"seeds_{k}": v for k, v in rows.items()}


def test_the_decision_is_the_fixed_rule():
    m = load_benchmark("sampler_downstream")
    every = list(m.SEEDS)
    assert m.decision(_results(m, 0.0, 0.0, every))[1]
    # worse by more than the ECE margin, or less accurate by more than the accuracy margin: today's stays
    assert not m.decision(_results(m, (m.ECE_MARGIN + 0.5) / 100, 0.0, every))[1]
    assert not m.decision(_results(m, 0.0, -(m.ACCURACY_MARGIN + 0.5) / 100, every))[1]
    # fewer seeds than the rule names decide nothing, however good
    assert not m.decision(_results(m, -0.01, 0.01, every[:5]))[1]
    assert m.decision(_results(m, 0.0, 0.0, every[:1])) is None
