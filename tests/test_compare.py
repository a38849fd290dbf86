"""timm-csm-compare: the benchmark's paired intervals reproduced from its committed cells, runs grouped into methods
and matched by the seed each recorded, Holm's decisions, the JSON / markdown it writes, and every refusal as one
line with nothing written."""
import json
import random
import re
from pathlib import Path

import pytest
import yaml

from test_intervals import committed_pairs
from timm_csm.commands.compare import main, metric_values
from timm_csm.metrics import holm, paired_t_interval
from timm_csm.training import TrainConfig, config_record

CELLS = Path(__file__).resolve().parents[1] / "benchmarks" / "cells"


def test_compare_reproduces_the_benchmarks_paired_intervals_from_its_cells(tmp_path, capsys):
    runs = [str(CELLS / f"{m}-s{s}") for m in ("csm-matched", "ce", "regmixup") for s in range(5)]
    random.Random(0).shuffle(runs[5:])  # the order of the folders does not matter: their recorded seeds do
    assert main(runs[:5] + runs[5:] + ["--json", str(tmp_path / "c.json"), "--markdown", str(tmp_path / "c.md")]) == 0
    printed = capsys.readouterr().out
    assert printed == (tmp_path / "c.md").read_text()
    result = json.loads((tmp_path / "c.json").read_text())
    assert result["seeds"] == [0, 1, 2, 3, 4] and (result["dataset"], result["images"]) == ("fashion_mnist", 10000)
    csm, ce, regmixup = "csm (csm_dataset=csm-fmnist-aug)", "ce", "ce (regmixup=20.0)"
    assert list(result["runs"]) == [csm, ce, regmixup]
    committed = committed_pairs("matched")
    for pair, label in zip(result["pairs"], ("CE", "RegMixup (alpha 20)")):
        shown = [printed_cell(pair["intervals"][k], d) for k, d in
                 (("ece_pre_ts", 2), ("ece_post_ts", 2), ("accuracy_pre_ts", 2), ("nll_pre_ts", 4))]
        assert shown == committed[label]
    p_values = [p["intervals"]["ece_pre_ts"]["p_value"] for p in result["pairs"]]
    assert [p["holm_p"] for p in result["pairs"]] == pytest.approx(holm(p_values)[0])
    assert [p["decision"] for p in result["pairs"]] == [f"{csm} lower", "no difference shown"]
    assert f"| {csm} minus {ce} | -3.54 [-3.86, -3.22] (n=5) |" in printed
    # the per-seed values read from the cells are the per-seed rows of benchmarks/calibration.json
    rows = {r["method"]: r["per_seed"] for r in json.loads((CELLS.parent / "calibration.json").read_text())
            if r["recipe"] == "matched"}
    for method, cell in (("csm", "csm-matched"), ("ce", "ce"), ("regmixup", "regmixup")):
        for row in rows[method]:
            values = metric_values(json.loads((CELLS / f"{cell}-s{row['seed']}" / "results.json").read_text()))
            assert (values["ece_pre_ts"], values["accuracy_post_ts"]) == pytest.approx(
                (row["ece_pre_ts"], row["acc_post_ts"]), rel=1e-12)


def printed_cell(interval, digits):
    from timm_csm.metrics import interval_text

    return interval_text((interval["n"], interval["mean"], interval["low"], interval["high"]), digits)


def write_run(folder: Path, seed: int, ece: float, dataset: str = "digits", n_test: int = 100, **options) -> str:
    """A finished run folder as timm-csm-train leaves it: args.yaml (its configuration) and results.json."""
    folder.mkdir(parents=True)
    record = dict(config_record(TrainConfig.from_dict(dict(options, dataset=dataset, seed=seed))),
                  run_id=f"run{seed}", output=str(folder.parent), experiment=folder.name)
    (folder / "args.yaml").write_text(yaml.safe_dump(record))
    scores = {"accuracy": 0.9, "ece": ece, "debiased_ce": ece / 2, "nll": 0.3 + ece}
    results = {"dataset": dataset, "n_test": n_test, "n_val": 20, "test": {"pre_ts": scores, "post_ts": scores}}
    (folder / "results.json").write_text(json.dumps(results))
    return str(folder)


ECE = {"ce": [0.050, 0.060, 0.055, 0.058], "mixup": [0.030, 0.036, 0.031, 0.035], "ls": [0.049, 0.061, 0.053, 0.058]}


def three_methods(root: Path):
    runs = []
    for seed in (3, 1, 0, 2):  # folders named in another order than their seeds
        runs.append(write_run(root / f"ce-{seed}x", seed, ECE["ce"][seed]))
        runs.append(write_run(root / f"mixup-{seed}x", seed, ECE["mixup"][seed], mixup=0.4))
        runs.append("smoothed=" + write_run(root / f"ls-{seed}x", seed, ECE["ls"][seed], smoothing=0.1))
    return runs


def test_compare_end_to_end_on_run_folders(tmp_path, capsys):
    runs = three_methods(tmp_path / "runs")
    assert main(runs + ["--all-pairs", "--json", str(tmp_path / "out" / "c.json")]) == 0
    printed = capsys.readouterr().out
    result = json.loads((tmp_path / "out" / "c.json").read_text())
    assert list(result["runs"]) == ["ce", "ce (mixup=0.4)", "smoothed"]
    assert result["runs"]["ce"]["3"].endswith("ce-3x") and result["seeds"] == [0, 1, 2, 3]
    assert [(p["a"], p["b"]) for p in result["pairs"]] == [("ce", "ce (mixup=0.4)"), ("ce", "smoothed"),
                                                          ("ce (mixup=0.4)", "smoothed")]
    expected = {("ce", "ce (mixup=0.4)"): ("ce", "mixup"), ("ce", "smoothed"): ("ce", "ls"),
                ("ce (mixup=0.4)", "smoothed"): ("mixup", "ls")}
    p_values = []
    for pair in result["pairs"]:
        a, b = expected[(pair["a"], pair["b"])]
        iv = paired_t_interval(dict(enumerate(ECE[a])), dict(enumerate(ECE[b])))
        got = pair["intervals"]["ece_pre_ts"]
        assert (got["mean"], got["low"], got["high"]) == pytest.approx((100 * iv.mean, 100 * iv.low, 100 * iv.high))
        assert pair["intervals"]["nll_pre_ts"]["mean"] == pytest.approx(iv.mean)  # NLL unscaled
        assert pair["intervals"]["debiased_ce_pre_ts"]["mean"] == pytest.approx(100 * iv.mean / 2)  # in points
        p_values.append(got["p_value"])
    adjusted, reject = holm(p_values)
    assert [p["holm_p"] for p in result["pairs"]] == pytest.approx(adjusted)
    assert reject == [True, False, True]
    assert [p["decision"] for p in result["pairs"]] == ["ce higher", "no difference shown", "ce (mixup=0.4) lower"]
    assert "Holm's correction over 3 pair(s)" in printed and "| ce minus smoothed |" in printed
    assert "| Debiased CE (points), before TS |" in printed


@pytest.mark.parametrize("case, match", [
    ("dataset", r"the runs score different data \(.*digits test \(100 images\); .*fashion_mnist test"),
    ("seeds", r"the methods have different seeds \(ce: \[0, 1, 2, 3\]; ce \(mixup=0.4\): \[0, 1, 2\]\)"),
    ("twice", r"ce: seed 1 twice"),
    ("one method", r"runs of one method only \(ce\)"),
    ("not a run", r"holds no results.json"), ("unreadable", r"ce-0: a file does not read \(JSONDecodeError"),
    ("primary", r"primary metric 'piece_pre_ts' is not reported by every run"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, case, match):
    root = tmp_path / "runs"
    runs = [write_run(root / f"ce-{s}", s, ECE["ce"][s]) for s in range(4)]
    mixup = [write_run(root / f"mixup-{s}", s, ECE["mixup"][s], mixup=0.4) for s in range(4)]
    extra = []
    if case == "dataset":
        mixup[0] = write_run(root / "mixup-other", 0, 0.03, dataset="fashion_mnist", mixup=0.4)
        mixup.pop(1)
        mixup.insert(1, write_run(root / "mixup-other-1", 1, 0.03, dataset="fashion_mnist", mixup=0.4))
    elif case == "seeds":
        mixup.pop()
    elif case == "twice":
        extra = [write_run(root / "ce-again", 1, 0.05)]
    elif case == "one method":
        mixup = []
    elif case == "not a run":
        (root / "empty").mkdir()
        extra = [str(root / "empty")]
    elif case == "unreadable":
        (root / "ce-0" / "results.json").write_text("{")
    elif case == "primary":
        extra = ["--primary", "piece_pre_ts"]
    out = tmp_path / "c.json"
    assert main(runs + mixup + extra + ["--json", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("timm-csm-compare: error: ")
    assert re.search(match, err), err
    assert not out.exists()
