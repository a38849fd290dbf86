"""Build hooks of the documentation site (``mkdocs.yml``), and the writer of the pages' generated tables.

* :func:`on_files` generates the API reference: one page per subpackage and top-level module of ``timm_csm``,
  rendered from the docstrings by mkdocstrings, found at build time, so that a new or renamed module is documented
  without a page to edit (and one whose docstrings fail to render fails the strict build).
* :func:`fill_generated` writes the tables a page marks: the flag tables of a command after
  ``<!-- the flags of timm-csm-train -->`` (:data:`FLAGS_MARKER`), from the command's argument parser itself (the
  ``build_parser`` of each console script's ``main``, :func:`timm_csm.cli.console_command`): one table per group of
  ``--help``, each option with its default and help; the registered corruptions after :data:`CORRUPTIONS_MARKER`,
  the registered calibrators after :data:`CALIBRATORS_MARKER` and the metric table after :data:`METRICS_MARKER`,
  from the registries themselves. Each table ends at :data:`END_MARKER`. The committed pages hold the tables, so
  that a clone reads them as the site shows them: ``python docs/build_hooks.py`` (``make docs-tables``) rewrites
  them, :func:`on_page_markdown` writes them afresh into the site, and ``tests/test_docs.py`` fails while a
  committed table differs from its source.
* :class:`DocstringRoles` is a griffe extension: the docstrings cross-reference with Sphinx roles
  (``:func:`~timm_csm.training.run```), which Markdown would print as they are; it writes them as inline code.
"""
from __future__ import annotations

import ast
import configparser
import html
import importlib
import re
from pathlib import Path

from griffe import Extension

PACKAGE = Path(__file__).resolve().parents[1] / "timm_csm"
FLAGS_MARKER = re.compile(r"<!-- the flags of (timm-csm-[a-z-]+) -->")
CORRUPTIONS_MARKER = "<!-- the registered corruptions -->"
CALIBRATORS_MARKER = "<!-- the registered calibrators -->"
METRICS_MARKER = "<!-- the metric table -->"
#: where a generated table ends (the start is its marker)
END_MARKER = "<!-- end of the generated table -->"
_ROLE = re.compile(r":(?:py:)?(?:func|class|mod|meth|attr|data|obj|exc|const):`(~?)([^`<]+?)\s*(?:<([^>]+)>)?`")


def _inline_code(match: re.Match) -> str:
    tilde, text, target = match.groups()
    if target:  # :role:`text <target>`
        return f"`{text}`"
    return f"`{text.rsplit('.', 1)[-1] if tilde else text}`"


class DocstringRoles(Extension):
    """Sphinx roles in docstrings as inline code: ``:func:`~a.b.f``` -> ``f``, ``:mod:`a.b``` -> ``a.b``."""

    def on_instance(self, *, obj, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _ROLE.sub(_inline_code, obj.docstring.value)


def api_modules() -> list[str]:
    """The documented modules: ``timm_csm``, each subpackage and each public top-level module, in name order."""
    names = [p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()]
    names += [p.stem for p in PACKAGE.glob("*.py") if not p.stem.startswith("_")]
    return ["timm_csm"] + [f"timm_csm.{name}" for name in sorted(names)]


def _source(module: str) -> ast.Module:
    parts = module.split(".")[1:]
    path = PACKAGE.joinpath(*parts, "__init__.py") if PACKAGE.joinpath(*parts).is_dir() else \
        PACKAGE.joinpath(*parts[:-1], f"{parts[-1]}.py")
    return ast.parse(path.read_text())


def _summary(tree: ast.Module) -> str:
    """The first paragraph of a module's docstring, on one line."""
    doc = ast.get_docstring(tree) or ""
    return _ROLE.sub(_inline_code, doc.split("\n\n")[0].replace("\n", " "))


def _lists_its_api(tree: ast.Module) -> bool:
    """Whether the module names its public API in a literal ``__all__`` (a package that re-exports it); the others
    (a plain module, or a package whose names are resolved lazily) are documented with their submodules."""
    return any(isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets)
               and isinstance(node.value, ast.List) for node in tree.body)


def on_files(files, config, **kwargs):
    from mkdocs.structure.files import File

    lines = ["# API reference", "", "Generated from the docstrings, one page per part of the package.", ""]
    for module in api_modules():
        tree = _source(module)
        submodules = module != "timm_csm" and not _lists_its_api(tree)
        content = f"# `{module}`\n\n::: {module}\n    options:\n      show_submodules: {str(submodules).lower()}\n"
        files.append(File.generated(config, f"api/{module}.md", content=content))
        lines.append(f"- [`{module}`]({module}.md): {_summary(tree)}")
    files.append(File.generated(config, "api/index.md", content="\n".join(lines) + "\n"))
    return files


def _cell(text: str) -> str:
    return html.escape(text, quote=False).replace("|", "\\|")


def console_scripts() -> dict:
    """``{command: "module:function"}`` of ``setup.cfg``'s console scripts."""
    cfg = configparser.ConfigParser()
    cfg.read(PACKAGE.parent / "setup.cfg")
    lines = cfg["options.entry_points"]["console_scripts"].strip().splitlines()
    return {name.strip(): target.strip() for name, target in (line.split("=") for line in lines)}


def command_parser(command: str):
    """The argument parser of the console script ``command``."""
    module, function = console_scripts()[command].split(":")
    return getattr(importlib.import_module(module), function).build_parser()


def flag_tables(command: str = "timm-csm-train") -> str:
    """The options of ``command`` as Markdown, one table per argument group, in ``--help``'s order."""
    import argparse

    parser, out = command_parser(command), []
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if a.dest != "help"]
        if not actions:
            continue
        out += [f"### {group.title[0].upper()}{group.title[1:]}", "", "| flag | default | what it does |",
                "|---|---|---|"]
        for action in actions:
            default = action.default
            # a 0 default is shown (0 == False): only "no value" and switches are left blank
            unset = default is None or default is False or default is argparse.SUPPRESS or default == ""
            required = action.required and action.nargs not in ("?", "*")  # argparse marks every positional
            shown = "required" if required else "" if unset or action.nargs == 0 else f"`{default}`"
            flags = ", ".join(f"`{o}`" for o in action.option_strings) or f"`{action.metavar or action.dest}`"
            text = (action.help or "").replace("%(default)s", str(default))  # BooleanOptionalAction's own
            out.append(f"| {flags} | {shown} | {_cell(text)} |")
        out.append("")
    return "\n".join(out)


def corruption_table() -> str:
    """The registered corruptions as Markdown: name, family, where it comes from, the five levels and what a
    level means."""
    from timm_csm.data.corruptions import corruption_spec, list_corruptions

    out = ["| corruption | family | from | levels of severities 1-5 | a level is |", "|---|---|---|---|---|"]
    for family in ("noise", "blur", "weather", "digital", "geometric"):
        for name in list_corruptions(family=family):
            spec = corruption_spec(name)
            levels = " / ".join(str(v).replace(" ", "") for v in spec.levels)
            out.append(f"| `{name}` | {family} | {_cell(spec.source)} | {_cell(levels)} | {_cell(spec.definition)} |")
    return "\n".join(out) + "\n"


def calibrator_table() -> str:
    """The registered calibrators as Markdown: name, what it fits, and the capabilities it was registered with."""
    from timm_csm.calibration import calibrator_spec, list_calibrators

    out = ["| name (`create_calibrator`) | what it fits | models | penalties | fewest samples (C classes) |",
           "|---|---|---|---|---|"]
    for name in list_calibrators():
        spec = calibrator_spec(name)
        shown = f"`{name}`" + (" (default)" if spec.default else "")
        penalties = ", ".join(f"`{k}`" for k in spec.penalties) or "-"
        fewest = "C" if spec.min_samples is None else f"{spec.min_samples(10)} for C = 10"
        out.append(f"| {shown} | {_cell(spec.summary)} | {'two classes' if spec.binary_only else 'any'} | "
                   f"{penalties} | {fewest} |")
    return "\n".join(out) + "\n"


def metric_table() -> str:
    """The metric table as Markdown: what each metric is, its one name (result key and ``evaluate`` module), its
    function, how reports show it and its direction."""
    from timm_csm.metrics import list_metrics, metric_spec

    out = ["| metric | name | function | `evaluate` module | report | better |", "|---|---|---|---|---|---|"]
    for name in list_metrics():
        spec = metric_spec(name)
        function = f"`{spec.function.__name__}`" if spec.function is not None else "-"
        shown = f"{spec.label} ({spec.unit})" if spec.unit else spec.label
        better = {True: "higher", False: "lower", None: "-"}[spec.higher_is_better]
        out.append(f"| {_cell(spec.description)} | `{name}` | {function} | {'yes' if spec.evaluate else '-'} | "
                   f"{_cell(shown)} | {better} |")
    return "\n".join(out) + "\n"


def _table(marker: str) -> str:
    """The table a marker stands for."""
    flags = FLAGS_MARKER.fullmatch(marker)
    if flags is not None:
        return flag_tables(flags.group(1))
    return {CORRUPTIONS_MARKER: corruption_table, METRICS_MARKER: metric_table,
            CALIBRATORS_MARKER: calibrator_table}[marker]()


_MARKED = re.compile("^(" + "|".join([FLAGS_MARKER.pattern] + [re.escape(m) for m in (
    CORRUPTIONS_MARKER, METRICS_MARKER, CALIBRATORS_MARKER)]) + r")\n(?:.*?^" + re.escape(END_MARKER) + r"\n)?",
    re.M | re.S)


def fill_generated(markdown: str) -> str:
    """``markdown`` with the table after each marker written afresh, up to its :data:`END_MARKER` (added where a
    marker has none yet): the same text when every table is current."""
    return _MARKED.sub(lambda m: f"{m.group(1)}\n\n{_table(m.group(1)).rstrip()}\n\n{END_MARKER}\n", markdown)


def on_page_markdown(markdown: str, page, **kwargs) -> str:
    return fill_generated(markdown)


def write_generated_tables(docs: Path = Path(__file__).resolve().parent) -> list:
    """Rewrite the generated tables of every page of ``docs``; returns the pages that changed."""
    changed = []
    for page in sorted(docs.rglob("*.md")):
        text = page.read_text()
        filled = fill_generated(text)
        if filled != text:
            page.write_text(filled)
            changed.append(page)
    return changed


if __name__ == "__main__":
    for page in write_generated_tables():
        print(f"rewrote the generated tables of {page.relative_to(PACKAGE.parent)}")
