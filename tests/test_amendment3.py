"""Amendment 3's shift cells (benchmarks/amendment3.py, its cells and its page): the compact record and the
Holm-corrected decisions, on constructed per-seed records."""
import json

import numpy as np

from benchmark_scripts import load_benchmark
from timm_csm.recipes.cells import CELL_META

load_benchmark("calibration_bench")
load_benchmark("amendment2")
a3_cells = load_benchmark("amendment3_cells")
a3_page = load_benchmark("amendment3_page")

PHASES = ("uncalibrated", "temperature_scaling")


def _metrics(ece, acc=0.8):
    return {"accuracy": acc, "ece": ece, "aece": ece, "nll": 0.5, "brier": 0.3, "aurc": 0.1}


def _run_results(ece_by_severity, auroc, source="mnist5k"):
    """A ``results.json`` of ``train.py --eval-only --eval-shift --ood`` reduced to what :func:`compact` reads."""
    corruptions = ["fog", "contrast"]
    table = {c: {str(k): {p: dict(_metrics(e + 0.01 * i), conformal={}) for p in PHASES}
                 for k, e in ece_by_severity.items()} for i, c in enumerate(corruptions)}
    summary = {str(k): {p: {"mean": _metrics(e + 0.005), "worst": {"corruption": "contrast", "ece": e + 0.01,
                                                                   "accuracy": 0.7}} for p in PHASES}
               for k, e in ece_by_severity.items()}
    ood = {"source": source, "split": "test", "n_in": 2000, "n_out": 1000,
           "methods": {p: {score: {"auroc": auroc, "aupr_in": 0.9, "aupr_out": 0.5, "fpr95": 0.6} for score in
                           ("msp", "max_logit", "energy", "entropy")} for p in PHASES}}
    return {"temperature": 1.3, "shift": {"n": 2000, "seed": 7, "corruptions": corruptions, "clean": {p: _metrics(0.02)
                                                                                          for p in PHASES},
                                          "table": table, "summary": summary}, "ood": ood}


def test_the_compact_record_keeps_what_the_page_reads():
    out = a3_cells.compact(_run_results({1: 0.05, 5: 0.3}, 0.7), _run_results({}, 0.9, source="digits"))
    assert out["severity"]["5"]["uncalibrated"]["mean"]["ece"] == 0.305
    assert out["severity"]["1"]["temperature_scaling"]["worst"]["corruption"] == "contrast"
    assert out["table"]["contrast"]["5"]["uncalibrated"] == [0.8, 0.31]
    assert set(out["ood"]) == {"mnist5k", "digits"} and out["ood"]["digits"]["methods"]["uncalibrated"]["msp"][
        "auroc"] == 0.9
    assert a3_page.shift_ece(5)(out) == 0.305 and a3_page.ood_auroc("digits")(out) == 0.9
    assert a3_page.shift_ece(1, statistic="worst")(out) == 0.06 and a3_page.ood_auroc(key="fpr95")(out) == 0.6
    assert out["corruption_seed"] == 7  # the seed the corruptions were drawn with: --eval-only's, the checkpoint's


def test_the_corruption_seed_is_the_recorded_one_or_else_the_cells_training_seed(tmp_path):
    for name, record in (("recorded", {"corruption_seed": 7}), ("derived", {})):
        (tmp_path / name).mkdir()
        (tmp_path / name / a3_cells.SHIFT_FILE).write_text(json.dumps(record))
        (tmp_path / name / CELL_META).write_text(json.dumps({"seed": 3}))
    assert a3_page.corruption_seed(tmp_path / "recorded") == (7, "recorded")
    assert a3_page.corruption_seed(tmp_path / "derived") == (3, "derived")


def _write_cells(root, method, seeds, ece_shift, auroc, rng):
    cells = {}
    for s in seeds:
        d = root / f"{method}-s{s}"
        d.mkdir(parents=True)
        eces = {k: ece_shift + 0.02 * k + rng.normal(0, 0.003) for k in a3_page.SEVERITIES}
        record = a3_cells.compact(_run_results(eces, auroc + rng.normal(0, 0.01)),
                            _run_results({}, 0.9, source="digits"))
        (d / a3_cells.SHIFT_FILE).write_text(json.dumps(record))
        cells[s] = d
    return cells


def test_shift_and_ood_decisions_need_15_seeds_and_reject_under_holm(tmp_path):
    rng = np.random.default_rng(0)
    choices = {s: {"csm": "csm", "best_other": {"pre_ts": "mixup@mixup=0.1", "post_ts": "regmixup"},
                   "chosen": {"regmixup": "regmixup"}} for s in ("matched", "annotated")}
    assert a3_cells.decision_rows(choices["matched"]) == ["ce", "regmixup", "mixup@mixup=0.1", "csm"]
    found = {}
    for setting in choices:  # CSM 2 points lower under every severity and 0.05 higher AUROC than both others
        root = tmp_path / setting
        found[setting] = {"csm": _write_cells(root, "csm", range(15), 0.03, 0.75, rng),
                          "ce": _write_cells(root, "ce", range(15), 0.05, 0.70, rng),
                          "mixup@mixup=0.1": _write_cells(root, "mixup", range(15), 0.05, 0.70, rng)}
    tests = a3_page.primary_tests(found, choices)
    assert len(tests) == 2 * 2 * 5 + 2 * 2
    # the secondary comparisons in words: CSM 2 points below both others under every severity, before and after TS
    summary = a3_page.secondary_summary("matched", found["matched"], choices["matched"])
    assert summary[0] == ("- `matched`, the CSM row minus CE, mean ECE under shift: before TS below 0 at severities "
                          "1, 2, 3, 4 and 5; after TS below 0 at severities 1, 2, 3, 4 and 5.")
    assert summary[-1].endswith("after TS (RegMixup (alpha 20)) at no severity.")  # its after-TS row has no cells
    table = a3_page.secondary_tables("matched", found["matched"], choices["matched"])
    assert sum(line.startswith("| CE | ") for line in table) == len(a3_page.SHIFT_SECONDARY) + 2 * 2 * 2
    assert "| RegMixup (alpha 20) | mean ECE before TS | pending |" in "\n".join(table)
    ce_ece = next(line for line in table if line.startswith("| CE | mean ECE before TS |"))
    assert ce_ece.count("(n=15) sd ") == len(a3_page.SEVERITIES)
    assert all(t["better"] is True and t["holm_p"] < 0.05 for t in tests)
    shift = [t for t in tests if t["what"].startswith("severity")]
    assert all(-0.024 < t["interval"].mean < -0.016 for t in shift)
    assert a3_page.verdict_lines(tests)[0] == ('- `matched`: "CSM calibrates better under shift" holds at every '
                                               'severity. "CSM detects OOD images better" holds.')
    # one severity's comparison not rejected: that severity does not hold, the others still do
    next(t for t in tests if t["what"] == "severity 3" and t["setting"] == "annotated")["better"] = False
    assert "holds at severities 1, 2, 4 and 5; does not hold at severity 3." in a3_page.verdict_lines(tests)[1]
    # a seed short in one row: its whole family is pending, the other family still decides
    del found["annotated"]["ce"][14]
    tests = a3_page.primary_tests(found, choices)
    assert all(t["better"] is None for t in tests if t["what"].startswith("severity"))
    assert all(t["better"] is None for t in tests if not t["what"].startswith("severity"))  # OOD uses ce too
    assert a3_page.verdict_lines(tests)[1] == "- `annotated`: pending."
    # no CSM row yet: every comparison is pending, with no interval
    choices["matched"]["csm"] = None
    assert all(t["interval"] is None for t in a3_page.primary_tests(found, choices) if t["setting"] == "matched")
