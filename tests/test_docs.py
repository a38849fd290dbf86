"""The documentation: the site builds with warnings as errors (a broken link or anchor, a docstring that fails to
render), its API reference covers every part of the package, every command's flag tables are its parser's, every
relative link of the README leads to a file, and what the pages say of the package is what it does (its commands,
the extras they need, the CSM columns, the smoke profile's generator, the snippets outside a clone)."""
import importlib
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs"))
import build_hooks  # noqa: E402  the site's own hooks


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                            env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-5000:]
    assert "WARNING" not in result.stderr, result.stderr[-5000:]
    return out


def test_the_site_builds_strictly_with_every_page_of_the_nav(site):
    for page in ("index", "quickstart", "method", "training", "commands", "data", "metrics", "shift", "gpu", "architecture",
                 "benchmarks/index", "api/index"):
        assert (site / f"{page}.html").stat().st_size > 1000, page


def test_the_api_reference_has_a_page_for_every_part_of_the_package(site):
    parts = {p.name for p in (ROOT / "timm_csm").iterdir() if (p / "__init__.py").is_file()}
    assert {"metrics", "calibration", "losses", "training", "commands"} <= parts
    index = (site / "api" / "index.html").read_text()
    for part in parts:
        page = site / "api" / f"timm_csm.{part}.html"
        assert page.is_file() and f"timm_csm.{part}.html" in index, part
    calibration = (site / "api" / "timm_csm.calibration.html").read_text()
    assert "TemperatureScaling" in calibration and ":func:`" not in calibration


def test_the_shift_page_tabulates_every_registered_corruption(site):
    from timm_csm.data.corruptions import corruption_spec, list_corruptions

    text = (site / "shift.html").read_text()
    for name in list_corruptions():
        assert f"<code>{name}</code>" in text and corruption_spec(name).family in text, name


def test_the_metrics_page_tabulates_every_metric_and_every_registered_calibrator(site):
    from timm_csm.calibration import list_calibrators
    from timm_csm.metrics import list_metrics, metric_spec

    text = (site / "metrics.html").read_text()
    for name in list_calibrators() + list_metrics():
        assert f"<code>{name}</code>" in text, name
    for name in list_metrics():
        assert metric_spec(name).heading in text, name
    assert "<code>reg_lambda</code>" in text and "(default)" in text


def test_docstring_roles_become_inline_code():
    text = "see :func:`~timm_csm.training.run`, :mod:`timm_csm.metrics` and :class:`the task <timm.task.Task>`"
    assert build_hooks._ROLE.sub(build_hooks._inline_code, text) == \
        "see `run`, `timm_csm.metrics` and `the task`"


def test_the_committed_screenshot_is_the_home_page_at_1280_px():
    png = (ROOT / "docs" / "site_home.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", png[16:24]) == (1280, 900)


def test_every_relative_link_of_the_readme_leads_to_a_file():
    text = (ROOT / "README.md").read_text()
    links = [link for link in re.findall(r"\]\(([^)#\s]+)", text) if not link.startswith(("http:", "https:"))]
    assert len(links) >= 10
    for link in links:
        assert (ROOT / link).exists(), link


CODE_BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.M | re.S)
DOCUMENTED = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _main_of(command: str):
    module, function = build_hooks.console_scripts()[command].split(":")
    return getattr(importlib.import_module(module), function)


def test_every_flag_of_every_command_is_on_the_site(site):
    for command in build_hooks.console_scripts():
        page = (site / ("training.html" if command == "timm-csm-train" else "commands.html")).read_text()
        for action in build_hooks.command_parser(command)._actions:
            for flag in action.option_strings if action.dest != "help" else ():
                assert f"<code>{flag}</code>" in page, (command, flag)
    training, commands = (site / "training.html").read_text(), (site / "commands.html").read_text()
    assert re.search(r"<code>--epochs</code></td>\s*<td><code>200</code></td>", training)
    assert re.search(r"<code>--calibrators</code></td>\s*<td><code>temperature_scaling</code></td>", commands)
    assert re.search(r"<code>names</code></td>\s*<td></td>", commands)  # install-metrics' positional argument
    assert re.search(r"<code>--seed-offset</code></td>\s*<td><code>0</code></td>", commands)
    assert re.search(r"<code>--num-groups</code></td>\s*<td>required</td>", commands)


def test_the_committed_pages_hold_their_generated_tables():
    """A clone reads the flag and registry tables as the site shows them: each marked table is committed, current,
    and closed by its end marker (make docs-tables rewrites them)."""
    pages = sorted((ROOT / "docs").rglob("*.md"))
    marked = [page for page in pages if build_hooks.END_MARKER in page.read_text()]
    assert {p.name for p in marked} >= {"commands.md", "training.md", "metrics.md", "shift.md"}
    for page in pages:
        text = page.read_text()
        assert build_hooks.fill_generated(text) == text, f"{page.name}: a table is out of date: make docs-tables"
    commands = (ROOT / "docs" / "commands.md").read_text()
    calibrate = commands[commands.index("<!-- the flags of timm-csm-calibrate -->"):]
    assert "| `--test-split` |  | the split the report scores" in calibrate[:calibrate.index(build_hooks.END_MARKER)]
    # a marker left without its table, or a table edited by hand, is not current
    assert build_hooks.fill_generated("<!-- the metric table -->\n") != "<!-- the metric table -->\n"
    assert build_hooks.fill_generated(commands.replace("| `--test-split` |", "| `--test-split` | x", 1)) == commands


def test_every_command_is_in_the_command_tables_the_commands_page_and_the_api_reference():
    import timm_csm.commands

    tables = [(ROOT / "README.md").read_text(), (ROOT / "docs" / "index.md").read_text()]
    commands_page = (ROOT / "docs" / "commands.md").read_text()
    for command in build_hooks.console_scripts():
        for text in tables:
            assert f"| `{command}` |" in text, command
        assert f"``{command}``" in timm_csm.commands.__doc__, command  # the API reference's commands page
        assert f"| [`{command}`](#{command}) |" in commands_page, command
        assert command == "timm-csm-train" or f"<!-- the flags of {command} -->" in commands_page, command


def test_the_commands_page_names_the_extras_each_command_always_needs():
    from timm_csm.extras import OPTIONAL_DEPENDENCIES

    rows = {line.split("`")[1]: line for line in (ROOT / "docs" / "commands.md").read_text().splitlines()
            if line.startswith("| [`timm-csm-")}
    assert any(_main_of(command).requires for command in rows)
    for command, row in rows.items():
        needed = {OPTIONAL_DEPENDENCIES[module].extra for module in _main_of(command).requires}
        assert all(f"`[{extra}]`" in row.split(" | ")[1] for extra in needed), (command, needed)


def test_the_data_page_names_the_columns_of_a_csm_dataset():
    from timm_csm.data.csm_format import CSM_COLUMNS

    text = " ".join((ROOT / "docs" / "data.md").read_text().split())
    sentence = re.search(r"`csm-<name>-aug`: columns (.*?), saved in the Hub layout", text).group(1)
    assert re.findall(r"`(\w+)`", sentence) == list(CSM_COLUMNS)


def test_the_readme_says_which_generator_the_smoke_profile_uses():
    from timm_csm.generation import GENERATOR_PROFILES
    from timm_csm.recipes import get_profile

    text = " ".join((ROOT / "README.md").read_text().split())
    step = text[text.index("**1. Build a CSM dataset"):text.index("```bash", text.index("**1. Build a CSM dataset"))]
    generator = get_profile("smoke").generator
    assert ("minute): the shipped generator" in step) == (generator == "shipped")
    trained = "a tiny generator trained for a few steps" in step
    assert trained == (generator != "shipped") and (not trained or GENERATOR_PROFILES[generator].steps <= 10)


def test_the_readme_names_the_loader_whose_error_names_the_missing_datasets_command():
    from timm_csm import load_csm_dataset

    text = " ".join((ROOT / "README.md").read_text().split())
    claim = re.search(r"`timm_csm\.load_csm_dataset\(name\)`[^.]*names the command that builds a missing one "
                      r"\(`csm-cifar100-aug`: `([^`]+)`\)", text)
    with pytest.raises(FileNotFoundError) as missing:
        load_csm_dataset("csm-cifar100-aug")
    assert claim and claim.group(1) in str(missing.value)


def test_no_documented_command_or_snippet_uses_a_path_that_exists_only_in_a_clone():
    for page in DOCUMENTED:
        assert "timm_csm/assets" not in page.read_text(), page.name


def test_the_shipped_generator_snippets_run_outside_a_clone(tmp_path):
    """The documented ``SemanticMixingPipeline.from_pretrained`` blocks, run from a directory that is not the
    repository (they once named the generator by a path relative to a clone)."""
    blocks = [body for page in DOCUMENTED for lang, body in CODE_BLOCK.findall(page.read_text())
              if lang == "python" and "from_pretrained(" in body]
    assert blocks
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for i, body in enumerate(blocks):
        (tmp_path / f"block_{i}.py").write_text(body)
        result = subprocess.run([sys.executable, f"block_{i}.py"], cwd=tmp_path, env=env, capture_output=True,
                                text=True, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        assert result.stdout.split()[0] == "8"  # the images of 2 groups x 4 lambdas


def test_every_mean_and_interval_in_the_readmes_results_is_on_a_benchmark_page():
    """The README's numbers are copied from the pages that the benchmark commands write, never typed: each mean ±
    sd and each interval of its Results section appears, as written, on one of them."""
    results = (ROOT / "README.md").read_text().split("## Results")[1].split("\n## ")[0]
    pages = " ".join((ROOT / "benchmarks" / name).read_text()
                     for name in ("calibration.md", "calibration_a2.md", "shift_a3.md"))
    numbers = re.findall(r"[-+]?\d+\.\d+ ± \d+\.\d+|[-+]?\d+\.\d+ \[[-+]?\d+\.\d+, [-+]?\d+\.\d+\]", results)
    assert len(numbers) >= 6  # the decision's table at least
    assert [n for n in numbers if n not in pages] == []


def test_the_superseded_calibration_pages_name_their_successor_and_claim_nothing():
    """Each earlier calibration page opens with a banner naming the page that supersedes it, and keeps no wording
    that reads as a verdict its 3 untested seeds cannot give."""
    for name in ("calibration_earlier.md", "calibration_demo.md", "calibration_augmented.md"):
        text = (ROOT / "benchmarks" / name).read_text()
        banner = text.split("\n\n")[1]
        assert banner.startswith("> ") and "Superseded by [calibration_a2.md](calibration_a2.md)" in banner, name
        flat = " ".join(text.split())
        for phrase in ("meets the paper's claim", "as well calibrated", "level with"):
            assert phrase not in flat, (name, phrase)


def test_the_annotated_setting_is_never_called_the_papers():
    """`annotated` is an annotator trained on 54,000 labelled Fashion-MNIST images; the paper's generator, annotator
    and backbones differ from ours in every setting."""
    for path in (ROOT / "README.md", ROOT / "docs" / "index.md", ROOT / "docs" / "method.md"):
        flat = " ".join(path.read_text().split())
        assert "the paper's setting" not in flat and "the paper's CLIP" not in flat, path
