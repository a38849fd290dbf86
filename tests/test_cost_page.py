"""The cost page is what its records say: it regenerates byte for byte from benchmarks/cost.json, amendment 2's build
record and its cells; a run folder without every demo stage is refused in one line."""
from pathlib import Path

import pytest

from benchmark_scripts import load_benchmark

ROOT = Path(__file__).resolve().parent.parent


def test_page_regenerates_from_the_records(tmp_path, monkeypatch):
    m = load_benchmark("cost")
    page = tmp_path / "cost.md"
    monkeypatch.setattr(m, "PAGE", page)
    m.main(["--report"])
    assert page.read_text() == (ROOT / "benchmarks" / "cost.md").read_text()


def test_a_run_without_every_stage_is_refused(tmp_path):
    m = load_benchmark("cost")
    (tmp_path / "train-ce-0123456789").mkdir()
    (tmp_path / "train-ce-0123456789" / "DONE.json").write_text('{"seconds": 1.0, "cpu_seconds": 2.0}')
    with pytest.raises(SystemExit, match="no finished stage generated, encoder"):
        m.demo_run(tmp_path)
