"""The documentation: the site builds with warnings as errors (a broken link or anchor, a docstring that fails to
render), its API reference covers every part of the package, its flag tables are the parser's, and every relative
link of the README leads to a file."""
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
    for page in ("index", "quickstart", "method", "training", "data", "metrics", "shift", "gpu", "architecture",
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


def test_the_training_page_lists_every_flag_of_the_parser_with_its_default(site):
    from timm_csm.training import build_parser

    text = (site / "training.html").read_text()
    for action in build_parser()._actions:
        for flag in action.option_strings if action.dest != "help" else ():
            assert f"<code>{flag}</code>" in text, flag
    assert re.search(r"<code>--epochs</code></td>\s*<td><code>200</code></td>", text)


def test_the_shift_page_tabulates_every_registered_corruption(site):
    from timm_csm.data.corruptions import corruption_spec, list_corruptions

    text = (site / "shift.html").read_text()
    for name in list_corruptions():
        assert f"<code>{name}</code>" in text and corruption_spec(name).family in text, name


def test_docstring_roles_become_inline_code():
    text = "see :func:`~timm_csm.train.run`, :mod:`timm_csm.metrics` and :class:`the task <timm.task.Task>`"
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
