"""A study's spec file (timm_csm.study.spec, .amendments): the TOML format and its one-line errors, amendment 4's
design as a spec, dated amendments appended to a spec, and whether a file is still the spec its first cell ran
under."""
import datetime
from pathlib import Path

import pytest

from benchmark_scripts import load_benchmark
from timm_csm.study import load_spec, parse_spec, spec_digest, spec_status
from timm_csm.study.amendments import AMENDED, CHANGED, SAME, SpecError, split_spec_text
from timm_csm.study.template import template_text

ROOT = Path(__file__).resolve().parents[1]
A4_SPEC = ROOT / "benchmarks" / "study_fmnist_a4.toml"
BASE = template_text("toy", "fashion_mnist", "resnet18", settings=("matched", "annotated"))

AMENDMENT = """
[[amendment]]
date = 2026-12-08
reason = "seeds 15-19 as a secondary extension"
[amendment.set.seeds]
decision = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]
"""


def test_the_a4_spec_states_amendment_4s_grids_seeds_and_backbone():
    table = load_benchmark("calibration_methods")
    spec = load_spec(A4_SPEC)
    assert spec.settings == table.A4_SETTINGS and spec.data.data_seed == 0
    assert (spec.data.train_size, spec.data.val_size) == (2500, 2000)
    assert spec.model.name == table.A4_BACKBONE["model"] and spec.model.recipe == table.RECIPES["matched"]
    options = dict(spec.model.options)
    assert options["epochs"] == table.A4_BACKBONE["epochs"]
    assert list(options["decay_milestones"]) == table.A4_BACKBONE["decay_milestones"]
    assert spec.seeds.tuning == table.A2_TUNING_SEEDS and spec.seeds.decision == table.A4_SEEDS
    assert [m.name for m in spec.methods] == [*table.A4_BASELINES, "kd"]
    for method in spec.methods:
        assert method.configurations() == table.grid_methods(method.name), method.name
    assert spec.method("kd").settings == ("annotated",)
    assert spec.search.method == "csm" and spec.search.steps == table.A4_CSM_STEPS
    # no method gets more than 4 configurations (PROTOCOL.md, amendment 4)
    assert max(len(m.configurations()) for m in spec.methods) == spec.search.size() == 4
    d = spec.decision
    assert (d.settings, d.metric, d.others, d.family_alpha, d.comparisons()) == (
        table.A4_SETTINGS, "ece_pre_ts", ("ce", "best_other"), 0.05, 4)
    assert spec.shift.severities == (1, 2, 3, 4, 5) and spec.shift.ood == ("mnist5k", "digits")


def test_the_a2_spec_states_amendment_2s_stages_1_and_2():
    table = load_benchmark("calibration_methods")
    spec = load_spec(A4_SPEC.with_name("study_fmnist_a2.toml"))
    assert spec.settings == table.A2_SETTINGS and spec.decision.settings == ("matched", "annotated")
    assert spec.model.name == table.base_recipe(name="matched")["model"] and spec.model.options == ()
    assert spec.seeds.tuning == table.A2_TUNING_SEEDS and spec.seeds.decision == table.A2_SEEDS
    assert {m.name: m.configurations() for m in spec.methods} == {
        base: table.grid_methods(base) for base in ("ce", "brier", "ls", "mbls", "mixup", "regmixup", "kd")}
    assert spec.method("kd").settings == ("annotated", "borrowed") and spec.search.steps == table.CSM_TUNING_STEPS
    assert spec.search.size() == 9 and spec.decision.comparisons() == 4 and spec.decision.family_alpha == 0.05


def test_init_writes_amendment_2s_design_and_it_reads_back():
    table = load_benchmark("calibration_methods")
    spec = parse_spec(BASE)
    assert spec.search.steps == table.CSM_TUNING_STEPS and spec.search.size() == 9
    assert {m.name: m.configurations() for m in spec.methods} == {
        base: table.grid_methods(base) for base in ("ce", "brier", "ls", "mbls", "mixup", "regmixup", "kd")}
    assert spec.seeds.decision == table.A2_SEEDS and spec.decision.planning_sd == 0.56


@pytest.mark.parametrize("old, new, error", [
    ("train_size = 2500", "train_size = 2500\ntrian_size = 3", "data.trian_size: unknown key"),
    ("train_size = 2500", 'train_size = "2500"', "data.train_size: expected int, got '2500'"),
    ("val_size = 2000", "val_size = 0", "data.val_size: expected a positive number of images"),
    ('grid = { smoothing = [0.02, 0.05, 0.1, 0.2] }', "grid = { margin = [3.0] }",
     "methods.ls.grid.margin: 'ls@margin=3': the ls loss of ls has no option 'margin'"),
    ('grid = { smoothing = [0.02, 0.05, 0.1, 0.2] }', "grid = { smoothing = [-0.1] }",
     "methods.ls.grid.smoothing: smoothing must be a positive number"),
    ('grid = { smoothing = [0.02, 0.05, 0.1, 0.2] }', "grid = { eps = [0.1] }", "methods.ls.grid.eps: ls has no axis"),
    ("tuning = [0, 1, 2]", "tuning = [0, 1, 20]", "seeds.tuning: seeds [20] are not decision seeds while [0, 1]"),
    ("tuning = [0, 1, 2]", "tuning = [0, 1, 1]", "seeds.tuning: a value appears twice"),
    ("[methods.brier]", "[methods.brierr]", "methods.brierr: unknown method"),
    ('settings = ["annotated"]', 'settings = ["matched"]', "methods.kd.settings: unknown 'matched'"),
    ('metric = "ece_pre_ts"', 'metric = "ece"', "decision.metric: 'ece' is no per-seed metric"),
    ('metric = "ece_pre_ts"', 'metric = "loss_pre_ts"', "decision.metric: 'loss_pre_ts' is no per-seed metric"),
    ('others = ["ce", "best_other"]', 'others = ["focal"]', "decision.others: unknown 'focal'"),
    ("family_alpha = 0.05", "family_alpha = 1.5", "decision.family_alpha: expected a number in (0, 1)"),
    ('recipe = "demo"', 'recipe = "dmeo"', "model.recipe: unknown profile 'dmeo'"),
    ('{ axis = "n_aug", values = [1, 2] }', '{ axis = "n_aug", values = [0] }', "search.steps[2].values: "),
    ('fit = ["temperature_scaling"]', 'fit = ["plat"]', "calibrators.fit: unknown 'plat'"),
])
def test_a_spec_that_does_not_validate_is_one_line_naming_the_field(old, new, error):
    assert BASE.count(old) == 1
    with pytest.raises(SpecError) as e:
        parse_spec(BASE.replace(old, new))
    assert str(e.value).startswith(error) and "\n" not in str(e.value)


def test_an_amendment_changes_the_fields_it_sets_and_keeps_the_history():
    spec = parse_spec(BASE + AMENDMENT)
    assert spec.seeds.decision == tuple(range(20)) and parse_spec(BASE).seeds.decision == tuple(range(15))
    (amendment,) = spec.amendments
    assert amendment.date == datetime.date(2026, 12, 8) and amendment.reason.startswith("seeds 15-19")
    assert spec.methods == parse_spec(BASE).methods  # what it does not set stays
    original, blocks = split_spec_text(BASE + AMENDMENT)
    assert original == BASE + "\n" and blocks == [AMENDMENT[1:]]
    # an amendment is validated as the spec is, and the error names it
    with pytest.raises(SpecError, match=r"^amendment 1 \(2026-12-08\): seeds.decision: a value appears twice"):
        parse_spec(BASE + AMENDMENT.replace("18, 19]", "18, 18]"))
    with pytest.raises(SpecError, match=r"^amendment 2.date: 2026-12-07 is before amendment 1's 2026-12-08"):
        parse_spec(BASE + AMENDMENT + AMENDMENT.replace("2026-12-08", "2026-12-07"))
    with pytest.raises(SpecError, match="amendment 1.reason: say why"):
        parse_spec(BASE + AMENDMENT.replace('"seeds 15-19 as a secondary extension"', '""'))
    # the original ends where the amendments begin: a section after them is not part of it
    with pytest.raises(SpecError, match=r"table \[shift\] comes after the first \[\[amendment\]\]"):
        parse_spec(BASE + AMENDMENT + "\n[shift]\nood = []\n")
    # an array on a line of its own inside an amendment is no table header
    nested = AMENDMENT + "[amendment.set.model.options]\ndecay_milestones = [\n[30, 45]\n]\n"
    assert split_spec_text(BASE + nested)[1] == [nested[1:]]


def test_the_first_cells_digest_allows_appended_amendments_and_refuses_any_other_change():
    first = spec_digest(BASE)
    assert spec_digest(BASE.rstrip() + "\n\n\n") == first and spec_digest(BASE + AMENDMENT) != first
    assert spec_status(first, BASE).kind == SAME
    amended = spec_status(first, BASE + AMENDMENT + AMENDMENT.replace("2026-12-08", "2026-12-09"))
    assert amended.kind == AMENDED and amended.appended == 2 and amended.allowed
    assert "2 amendment(s) appended (2026-12-08, 2026-12-09)" in amended.message
    # a later cell's digest (the spec with one amendment) accepts the file with that amendment and a further one
    assert spec_status(spec_digest(BASE + AMENDMENT), BASE + AMENDMENT + AMENDMENT).appended == 1
    edited = BASE.replace("family_alpha = 0.05", "family_alpha = 0.1")
    changed = spec_status(first, edited, BASE)
    assert changed.kind == CHANGED and not changed.allowed and "\n" not in changed.message
    assert "decision.family_alpha (was 0.05, now 0.1)" in changed.message and "dated [[amendment]]" in changed.message
    # an amendment edited after a cell ran under it is a change too, named as such
    later = spec_status(spec_digest(BASE + AMENDMENT), BASE + AMENDMENT.replace("19]", "21]"), BASE + AMENDMENT)
    assert later.kind == CHANGED and "amendment[1].set.seeds.decision (was [0, 1," in later.message
    assert "comments or layout" in spec_status(first, "# a note\n" + BASE, BASE).message
    assert spec_status(first, edited).message.startswith(f"spec changed after its first cell ({first[:12]})")


def test_the_format_documented_in_the_module_reads():
    import textwrap

    import timm_csm.study.spec as spec_module

    example = textwrap.dedent(spec_module.__doc__.split("::\n")[1].split("\nDated amendments")[0])
    spec = parse_spec(example)
    assert spec.name == "fmnist-resnet18" and spec.decision.secondary == ("ls",)
    assert spec.shift.ood == ("mnist5k", "digits") and len(spec.shift.corruptions) > 5
