"""The main job's smoke profile end to end: every stage, the report, the installed dataset, cached re-runs."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_smoke_pipeline_end_to_end_and_cached_rerun(tmp_path):
    env = dict(os.environ, HF_HOME=str(tmp_path / "hf"), PYTHONPATH=str(ROOT))
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "timm_csm.commands.pipeline", "--profile", "smoke", "--output", str(out)]
    first = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    report = (out / "report.md").read_text()
    for row in ("| CE | before", "| CE | after", "| CSM | before", "| CSM | after"):
        assert row in report
    assert (out / "groups.png").stat().st_size > 1000
    assert "Generator quality: the reference classifier" in report
    stages = sorted(p.name.rsplit("-", 1)[0] for p in out.iterdir() if (p / "DONE.json").exists())
    assert stages == ["annotated", "encoder", "generated", "generator", "quality", "train-ce", "train-csm"]
    ce = json.loads(next(out.glob("train-ce-*/results.json")).read_text())
    assert 0.0 <= ce["test"]["pre_ts"]["ece"] <= 1.0 and ce["temperature"] is not None
    assert ce["ts_method"] == "grid_ece"  # the profiles keep the paper's temperature rule (training runs: NLL)

    # the generated dataset is installed under its bare name: loadable from any directory, offline
    probe = ("import datasets; d = datasets.load_dataset('csm-fmnist-aug'); t = d['train'];"
             "print(len(t), t.features['label'].names[0], len(t[0]['soft_label']))")
    other = tmp_path / "elsewhere"
    other.mkdir()
    loaded = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, cwd=other)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    n, first_class, k = loaded.stdout.split()[-3:]
    assert int(n) == 24 * 8 and first_class == "T-shirt/top" and int(k) == 10

    # a re-run skips every finished stage and rewrites the same table
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("done already") == 7
    assert (out / "report.md").read_text().split("## ")[0] == report.split("## ")[0]
