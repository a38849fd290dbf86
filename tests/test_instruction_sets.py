"""The instruction-set check's page is what its committed logs say: it regenerates byte for byte from them, and its
kernel table groups runs by identical outputs."""
from benchmark_scripts import load_benchmark


def test_page_regenerates_from_the_committed_logs():
    m = load_benchmark("instruction_sets")
    lines = m.page_lines(m.read_json(m.CELLS / m.CELL / "cell.json"), m.read_json(m.LOG))
    lines += m.ops_lines(m.read_json(m.OPS_LOG)) + m.FINDINGS
    assert "\n".join(lines) + "\n" == m.PAGE.read_text()


def test_kernel_table_letters_group_identical_outputs_and_pins_are_named():
    m = load_benchmark("instruction_sets")
    runs = [{"cpu": "x", "cpu_capability": "AVX2", "pins": dict(m.AVX2), "digests": {"k": "1", "j": "5"}},
            {"cpu": "x", "cpu_capability": "AVX512", "pins": {}, "digests": {"k": "2", "j": "5"}},
            {"cpu": "x", "cpu_capability": "AVX2", "pins": dict(m.COMPATIBLE), "digests": {"k": "1", "j": "6"}}]
    rows = [line for line in m.ops_lines(runs) if line.startswith("| k |") or line.startswith("| j |")]
    assert rows == ["| k | a | b | a |", "| j | a | a | b |"]
    assert [m._pins(r) for r in runs] == ["AVX2", "none", "AVX2, but MKL_CBWR=COMPATIBLE"]
