"""The generation levers' page applies the rule it states: a setting's quality equals today's when each measure's mean
lies within today's mean +- 2 sd, or beyond it on the side the rule calls better (more recognised, fewer flagged); a
measure with no better side must lie inside. The matched generator's page says which measures of the demo's new
sampler lie outside, and on which side."""
import json

import numpy as np

from benchmark_scripts import load_benchmark

SEEDS = (0, 1, 2)
TODAY = {"recognition": [0.60, 0.62, 0.58], "flagged_share": [0.28, 0.30, 0.26], "soft_confidence": [0.88, 0.89, 0.87],
         "lambda_gap": [0.230, 0.235, 0.225]}


def _write_cells(output, key, values, soft):
    (output / "quality").mkdir(parents=True, exist_ok=True)
    (output / "sets").mkdir(parents=True, exist_ok=True)
    for i, seed in enumerate(SEEDS):
        cell = {m: v[i] for m, v in values.items()}
        (output / "quality" / f"{key}-s{seed}.json").write_text(json.dumps(cell))
        np.save(output / "sets" / f"{key}-s{seed}-soft.npy", soft)


def test_quality_rule_and_matched_page(tmp_path):
    levers = load_benchmark("generation_levers")
    page = load_benchmark("generation_levers_page")
    today, candidate = levers.TODAY, levers.SPACING[0]
    soft = np.array([[0.7, 0.3], [0.4, 0.6]])
    _write_cells(tmp_path, today.sampler_key, TODAY, soft)
    # more recognised and fewer flagged (the better sides: inside), abs(lambda-hat - lambda) far lower (no better
    # side: outside), labels moved by 0.1 in total variation
    better = dict(TODAY, recognition=[0.70, 0.72, 0.68], flagged_share=[0.10, 0.12, 0.08],
                  lambda_gap=[0.200, 0.205, 0.195])
    _write_cells(tmp_path, candidate.sampler_key, better, soft + [[-0.1, 0.1], [0.1, -0.1]])
    summary = page.quality_summary(tmp_path, [today.sampler_key, candidate.sampler_key], today.sampler_key, SEEDS)
    row = summary[candidate.sampler_key]
    assert row["recognition"]["inside"] and row["flagged_share"]["inside"] and row["soft_confidence"]["inside"]
    assert not row["lambda_gap"]["inside"] and not row["passes"]
    assert summary[today.sampler_key]["passes"]
    assert abs(row["tv_to_today"] - 0.1) < 1e-9
    # fewer recognised than today's band: outside, on the side the rule calls worse
    _write_cells(tmp_path, candidate.sampler_key, dict(TODAY, recognition=[0.40, 0.42, 0.38]), soft)
    worse = page.quality_summary(tmp_path, [candidate.sampler_key], today.sampler_key, SEEDS)[candidate.sampler_key]
    assert not worse["recognition"]["inside"]

    _write_cells(tmp_path, candidate.sampler_key, better, soft)
    timing = {"s_per_group": {lever.name: 0.2 if lever is today else 0.1 for lever in (today, candidate)},
              "rounds": 1, "groups": 2}
    (tmp_path / "timing.json").write_text(json.dumps(timing))
    report = tmp_path / "page.md"
    page.write_page([today, candidate], today, tmp_path, SEEDS, 90, report, tmp_path / "page.json", "cpu", "cmd",
                    generator="matched")
    text = report.read_text()
    assert text.startswith("# Generation levers on the matched generator")
    assert ("costs 0.50x today's CPU time per group on this generator too; its quality here is outside today's band "
            "on mean abs(lambda-hat - lambda) below") in text
    assert "## torch.compile" not in text
