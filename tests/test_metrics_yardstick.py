"""The metrics benchmark's plain-NumPy yardstick computes the quantities timm_csm's full set does (its adaptive ECE
by runs of equal size, a different rule), so that timing it beside the full set compares like with like; and the
page's findings quote it."""
import pytest
import torch

from benchmark_scripts import load_benchmark


@pytest.mark.parametrize("classes", [10, 100])
def test_plain_set_equals_the_full_set(classes):
    from timm_csm import metrics as tm

    logits, labels = load_benchmark("metrics_bench").make_logits(2000, classes)
    plain = load_benchmark("metrics_plain").plain_metric_set(logits.numpy(), labels.numpy())
    full = tm.calibration_metrics(logits, labels, 15)
    for name, value in plain.items():
        assert value == pytest.approx(float(full[name]), abs=1e-6 if name != "aece" else 2e-3), name


def test_findings_quote_the_yardstick_and_keep_it_out_of_the_peers():
    page = load_benchmark("metrics_page")
    rows = [dict(metric="all", method="timm_csm", size="1e4x10", value=0.01, cpu_s=2.0, pass_s=0.5),
            dict(metric="all", method="plain_numpy", size="1e4x10", value=0.01, cpu_s=1.0, pass_s=0.5)]
    text = page.findings(rows)
    assert "the yardstick (the same 11 metrics in plain NumPy, with none of timm_csm's checks): 1e4x10 2.00 passes" \
        in text
    assert "the full set misses 3 passes at 1e4x10 (4.00)" in text
    assert "a peer faster than timm_csm: none." in text  # the faster yardstick is no peer
    assert "yardstick" in page.table(rows)
