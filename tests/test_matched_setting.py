"""The benchmark's generated sets (benchmarks/matched_setting.py): which images, generator and encoder each uses."""
import json
from pathlib import Path

import pytest

from benchmark_scripts import load_benchmark

setting = load_benchmark("matched_setting")


def _stages(name, root=Path("out")):
    return {stage: (folder, cmd) for stage, folder, cmd in setting.stage_commands(name, root / name, python="py")}


def _flag(cmd, flag):
    return cmd[cmd.index(flag) + 1]


def test_matched_generator_and_encoder_learn_from_the_classifiers_images_only():
    stages = _stages("matched")
    assert list(stages) == ["generator", "generate", "annotate", "quality"]
    assert _flag(stages["generator"][1], "--dataset") == str(Path("out/matched/real"))
    assert _flag(stages["generator"][1], "--steps") == "4000"
    assert _flag(stages["annotate"][1], "--dataset") == str(Path("out/matched/real"))
    assert _flag(stages["annotate"][1], "--reference-dir") == str(Path("out/matched/reference"))
    assert _flag(stages["annotate"][1], "--reference-epochs") == "60"


def test_borrowed_uses_the_shipped_generator_and_the_full_training_split():
    stages = _stages("borrowed")
    assert "generator" not in stages
    assert _flag(stages["generate"][1], "--generator") == setting.SHIPPED
    assert _flag(stages["annotate"][1], "--dataset") == "fashion_mnist"
    assert _flag(stages["annotate"][1], "--reference-epochs") == "4"


def test_the_generator_steps_variant_shares_the_matched_images_and_encoder():
    stages = _stages("matched-gen2000")
    assert _flag(stages["generator"][1], "--steps") == "2000"
    assert _flag(stages["generator"][1], "--output") == str(Path("out/matched-gen2000/generator"))
    assert _flag(stages["generator"][1], "--dataset") == str(Path("out/matched/real"))
    assert _flag(stages["annotate"][1], "--reference-dir") == str(Path("out/matched/reference"))
    assert _flag(stages["generate"][1], "--output") == str(Path("out/matched-gen2000/generated"))
    # everything but the generator's steps and folders is the matched setting's
    matched = _stages("matched")
    for stage in ("generate", "annotate", "quality"):
        strip = lambda cmd: [a.replace("matched-gen2000", "matched") for a in cmd]  # noqa: E731
        assert strip(stages[stage][1]) == matched[stage][1]


def test_the_generator_steps_variant_needs_the_matched_setting_first(tmp_path):
    with pytest.raises(SystemExit, match="build --setting matched first"):
        setting.run_setting("matched-gen2000", tmp_path)


def test_annotated_is_the_matched_images_with_the_borrowed_annotator(tmp_path):
    stages = _stages("annotated")
    assert list(stages) == ["annotate"]  # no generator and no generation of its own
    annotate = stages["annotate"][1]
    assert _flag(annotate, "--generated") == str(Path("out/matched/generated"))
    borrowed = _stages("borrowed")["annotate"][1]
    for flag in ("--dataset", "--reference-dir", "--reference-epochs", "--s"):
        assert _flag(annotate, flag) == _flag(borrowed, flag)
    with pytest.raises(SystemExit, match="build --setting matched first"):
        setting.run_setting("annotated", tmp_path)


def test_volume_sets_extend_the_matched_plan_and_keep_its_annotator(tmp_path):
    matched = _stages("matched")
    for name, volume, smaller in (("matched-x2", 2, "matched"), ("matched-x4", 4, "matched-x2")):
        stages = _stages(name)
        assert list(stages) == ["generate", "annotate"]  # the matched generator: no training, no quality of its own
        generate = stages["generate"][1]
        assert _flag(generate, "--generator") == str(Path("out/matched/generator"))
        assert _flag(generate, "--extend-from") == str(Path(f"out/{smaller}/generated"))
        assert _flag(generate, "--num-groups") == str(6750 * volume)
        # the plan is the matched one but for the number of groups
        strip = lambda cmd, *flags: [a for i, a in enumerate(cmd) if a not in flags and cmd[i - 1] not in flags]  # noqa: E731
        assert strip(generate, "--num-groups", "--extend-from", "--output") == strip(
            matched["generate"][1], "--num-groups", "--extend-from", "--output")
        annotate = stages["annotate"][1]
        assert _flag(annotate, "--generated") == str(Path(f"out/{name}/generated"))
        for flag in ("--dataset", "--reference-dir", "--reference-epochs", "--s"):
            assert _flag(annotate, flag) == _flag(matched["annotate"][1], flag)
    borrowed = _stages("borrowed")["annotate"][1]
    for name in ("annotated-x2", "annotated-x4"):
        annotate = _stages(name)["annotate"][1]
        assert _flag(annotate, "--generated") == str(Path(f"out/matched-{name[-2:]}/generated"))
        for flag in ("--dataset", "--reference-dir", "--reference-epochs", "--s"):
            assert _flag(annotate, flag) == _flag(borrowed, flag)
    with pytest.raises(SystemExit, match="build --setting matched-x2 first"):
        setting.run_setting("matched-x4", tmp_path)
    with pytest.raises(SystemExit, match="build --setting matched-x2 first"):
        setting.run_setting("annotated-x2", tmp_path)
    assert not any(tmp_path.iterdir())  # a refused build leaves nothing behind


def test_the_benchmarks_volume_sets_are_built_here():
    bench = load_benchmark("calibration_bench")
    for name in ("matched", "annotated"):
        for volume in bench.VOLUMES[1:]:
            folder = Path(bench.volume_dataset(name, volume))
            assert folder.parts[-3] in setting.SETTINGS
            annotate = _stages(folder.parts[-3], bench.SETTINGS_ROOT)["annotate"][1]
            assert folder == Path(_flag(annotate, "--output")) / _flag(annotate, "--name")


def test_a_stage_folder_is_done_for_its_own_command_only(tmp_path):
    """The benchmark's stages run through the study's stage runner: keyed by the command less its interpreter."""
    import sys

    from timm_csm.study.settings import run_stage

    cmd = [sys.executable, "-c", "print('ran')"]
    done = run_stage("print", tmp_path / "stage", cmd, log=lambda line: None)
    assert done["command"] == cmd[1:] and done["seconds"] >= 0 and done["cpu_seconds"] >= 0
    assert json.loads((tmp_path / "stage" / "DONE.json").read_text()) == done
    lines = []
    assert run_stage("print", tmp_path / "stage", ["python3", *cmd[1:]], log=lines.append) == done  # any interpreter
    assert lines == [f"[print] done: {tmp_path / 'stage'}"]
    with pytest.raises(ValueError, match=r"differ in \['command'\]"):
        run_stage("print", tmp_path / "stage", cmd[:-1] + ["print('other')"])


def test_the_page_states_how_many_validation_images_the_borrowed_encoder_saw():
    """amendment2.py's disclosure is the count of the images themselves, per data seed."""
    a2 = load_benchmark("amendment2")
    overlap = setting.borrowed_encoder_overlap(a2.DATA_SEEDS)
    assert {d: counts["val"] for d, counts in overlap.items()} == a2.BORROWED_ENCODER_SAW_VAL
    a4 = load_benchmark("amendment4").SPEC  # amendment 4 reads amendment 2's data seed and annotator
    assert a4.report.saw_validation(a4.data.data_seed) == overlap[a4.data.data_seed]["val"]


def test_the_matched_stage_commands_are_those_the_committed_sets_were_built_with():
    """The stage commands come from the study's setting builder (timm_csm.study.settings); for ``matched`` they are
    the commands that built the benchmark's set, as its build record holds them."""
    recorded = json.loads((Path(__file__).resolve().parents[1] / "benchmarks" / "settings_a2.json").read_text())
    built = recorded["settings"]["matched"]
    stages = _stages("matched", Path("runs/settings"))
    for stage, key in (("generator", "generator"), ("generate", "generated"), ("annotate", "csm"),
                       ("quality", "quality")):
        assert stages[stage][1][1:] == built[key]["command"]


def test_the_build_record_names_each_finished_stage_by_what_it_made(tmp_path):
    import hashlib
    import shutil

    import torch
    from safetensors.torch import save_file

    generator = tmp_path / "matched" / "generator"
    shutil.copytree(Path(setting.SHIPPED), generator)
    (generator / "DONE.json").write_text(json.dumps({"command": ["train_generator.py"], "seconds": 1.5}))
    (tmp_path / "matched" / "reference").mkdir()  # trained inside the annotate stage: no marker of its own
    save_file({"w": torch.ones(3)}, str(tmp_path / "matched" / "reference" / "model.safetensors"))
    (tmp_path / "matched" / "generated").mkdir()  # unfinished: no marker
    record = setting.build_record(tmp_path, ["matched", "annotated"])
    stages = record["settings"]["matched"]
    assert sorted(stages) == ["generator", "reference"] and record["settings"]["annotated"] == {}
    weights = generator / "unet" / "diffusion_pytorch_model.safetensors"
    assert stages["generator"] == {"command": ["train_generator.py"], "seconds": 1.5,
                                   "sha256": hashlib.sha256(weights.read_bytes()).hexdigest()}
    reference = (tmp_path / "matched" / "reference" / "model.safetensors").read_bytes()
    assert stages["reference"] == {"sha256": hashlib.sha256(reference).hexdigest()}


def test_the_kept_matched_generator_is_the_one_the_build_record_names():
    import hashlib

    record = json.loads(Path("benchmarks/settings_a4.json").read_text())["settings"]["matched"]["generator"]
    kept = Path("benchmarks/generator_matched")
    weights = kept / setting.PRODUCTS["generator"]
    assert hashlib.sha256(weights.read_bytes()).hexdigest() == record["sha256"]
    assert json.loads((kept / "DONE.json").read_text())["command"] == record["command"]
    assert record["command"] == _stages("matched", Path("runs/settings"))["generator"][1][1:]
