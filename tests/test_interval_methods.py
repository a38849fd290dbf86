"""Interval methods, each metric's default interval, and the "no interval, reason" path."""
import pytest
import torch

from timm_csm.metrics import bootstrap_metrics
from timm_csm.metrics.interval_methods import (DEFAULT_INTERVALS, NO_INTERVAL, basic, bias_corrected,
                                               default_interval, interval_of, list_interval_methods,
                                               no_interval_line, percentile, register_interval_method, symmetric,
                                               upper)
from timm_csm.metrics.intervals import bootstrap_with_estimates, intervals_from_distribution
from timm_csm.metrics.table import list_metrics


def _symmetric(center: float = 0.3) -> torch.Tensor:
    """An odd number of values symmetric about ``center`` (its median and mean)."""
    half = torch.linspace(0.001, 0.05, 500, dtype=torch.float64)
    return torch.cat([center - half, torch.tensor([center], dtype=torch.float64), center + half])


def test_percentile_equals_basic_for_a_symmetric_distribution():
    values = _symmetric()
    low, high = percentile(values, None, 0.95)
    assert low < 0.3 < high
    assert basic(values, 0.3, 0.95) == pytest.approx((low, high), abs=1e-12)


def test_basic_reflects_a_shifted_distribution_about_the_estimate():
    values = _symmetric(0.5)  # resampled values 0.2 above the estimate 0.3: the bias the reflection removes
    low, high = basic(values, 0.3, 0.9)
    p_low, p_high = percentile(values, None, 0.9)
    assert (low, high) == pytest.approx((0.6 - p_high, 0.6 - p_low))
    assert high < 0.3


def test_bias_corrected_equals_percentile_at_the_median_and_moves_with_the_bias():
    values = _symmetric()
    assert bias_corrected(values, 0.3, 0.95) == pytest.approx(percentile(values, None, 0.95), abs=1e-12)
    low, high = bias_corrected(values, 0.29, 0.95)  # estimate below the median: the interval moves down
    p_low, p_high = percentile(values, None, 0.95)
    assert low < p_low and high < p_high


def test_symmetric_is_the_hull_of_percentile_and_basic_and_upper_is_one_sided():
    values = _symmetric(0.5)
    p_low, p_high = percentile(values, None, 0.95)
    b_low, b_high = basic(values, 0.3, 0.95)
    assert symmetric(values, 0.3, 0.95) == pytest.approx((min(p_low, b_low), max(p_high, b_high)))
    assert upper(values, None, 0.95) == pytest.approx((0.0, float(torch.quantile(values, 0.95))))
    assert upper(values - 1.0, None, 0.95)[0] == pytest.approx(p_low - 1.0)  # a metric that can be negative


def test_the_reported_interval_is_cut_at_zero_and_holds_its_estimate():
    values = _symmetric(0.05)  # resampled values from 0.0 to 0.1, the estimate 0.02
    assert basic(values, 0.02, 0.95)[0] < 0 and interval_of("ece", values, 0.02, 0.95, "basic")["low"] == 0.0
    shifted = _symmetric(0.3)  # every resampled value above the estimate 0.2
    assert interval_of("ece", shifted, 0.2, 0.95, "percentile") == {"low": 0.2, "high": percentile(
        shifted, None, 0.95)[1], "method": "percentile"}
    assert interval_of("ece", shifted, 0.2, 0.95, "percentile", hold_estimate=False)["low"] > 0.2


def test_the_registry_and_the_default_table():
    assert list_interval_methods()[:3] == ["percentile", "basic", "bc"]
    with pytest.raises(ValueError, match="already registered"):
        register_interval_method("basic", basic)
    with pytest.raises(ValueError, match="unknown interval method 'bca'"):
        interval_of("ece", _symmetric(), 0.3, 0.95, "bca")
    assert default_interval("ece") == (DEFAULT_INTERVALS["ece"], "")
    assert default_interval("a_metric_registered_later") == ("percentile", "")
    assert set(DEFAULT_INTERVALS.values()) <= set(list_interval_methods()) | {None}
    for name, method in DEFAULT_INTERVALS.items():
        assert (method is None) == (name in NO_INTERVAL)
    assert set(list_metrics("calibration")) <= set(DEFAULT_INTERVALS)


def test_no_interval_reason_reaches_the_reports_line(monkeypatch):
    name, why = "mce", "no method covered its true value"
    monkeypatch.setitem(DEFAULT_INTERVALS, name, None)
    monkeypatch.setitem(NO_INTERVAL, name, why)
    shown = interval_of(name, _symmetric(), 0.3, 0.95)
    assert shown == {"low": None, "high": None, "method": None, "reason": why}
    line = no_interval_line({"test": {"pre_ts": {name: shown, "nll": interval_of("nll", _symmetric(), 0.3, 0.95,
                                                                                 "percentile")}}}, {name: "Label"})
    assert line == f"Label has no interval: {why}."
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(300, 5, dtype=torch.float64, generator=g)
    intervals = bootstrap_metrics(logits, torch.randint(0, 5, (300,), generator=g), resamples=20)
    assert intervals[name] == shown and intervals["nll"]["low"] is not None
    assert no_interval_line({"nll": interval_of("nll", _symmetric(), 0.3, 0.95, "percentile")}) == ""
    bound = interval_of("ece", _symmetric(), 0.3, 0.95, "upper")
    assert no_interval_line({"ece": bound}, {"ece": "ECE"}).startswith("ECE: one-sided upper bounds [0, high]")


def test_a_method_reading_the_estimate_refuses_without_it():
    with pytest.raises(ValueError, match="needs its finite estimate"):
        intervals_from_distribution({"ece": _symmetric()}, 0.95, methods={"ece": "basic"})


def test_each_default_holds_its_estimate_on_a_calibrated_synthetic_case():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2000, 10, dtype=torch.float64, generator=g) * 3
    labels = torch.multinomial(torch.softmax(logits, 1), 1, generator=g).view(-1)
    distribution, estimates = bootstrap_with_estimates(logits, labels, resamples=200)
    intervals = bootstrap_metrics(logits, labels, resamples=200)
    assert intervals == intervals_from_distribution(distribution, 0.95, estimates)
    for name, iv in intervals.items():
        method, reason = default_interval(name)
        assert iv["method"] == method
        if method is None:
            assert iv["low"] is None and iv["reason"] == reason
        else:
            assert iv["low"] <= estimates[name] <= iv["high"], name
    # the percentile interval of the binned classwise ECE lies wholly above its estimate here: the default must not
    low, _ = percentile(distribution["cece"], None, 0.95)
    assert low > estimates["cece"]


def test_the_defaults_are_the_ones_the_committed_coverage_study_chose():
    """DEFAULT_INTERVALS is what benchmarks/intervals_coverage.py's rule picks on its committed cells."""
    from pathlib import Path

    from benchmark_scripts import load_benchmark

    study = load_benchmark("intervals_coverage")
    cells = study.read_cells(Path(__file__).resolve().parents[1] / "benchmarks" / "intervals_coverage.jsonl")
    chosen = study.chosen_defaults(list(cells.values()))
    assert chosen, "the committed coverage study has no cells"
    assert {k: DEFAULT_INTERVALS.get(k) or "none" for k in chosen} == chosen


def test_a_reflected_interval_of_a_rate_stays_within_0_and_1():
    values = torch.linspace(0.90, 1.0, 401, dtype=torch.float64)  # resampled near the bound: the reflection exceeds 1
    iv = interval_of("fpr95", values, 0.99, 0.95, method="symmetric")
    assert iv["high"] == 1.0 and 0.0 <= iv["low"] <= 0.99
    assert interval_of("nll", values, 0.99, 0.95, method="symmetric")["high"] > 1.0  # NLL has no such bound
