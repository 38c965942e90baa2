"""The README and the pages of docs/ stay short, linked and complete.

`mkdocs build --strict` (in .ci/run) checks the site as a whole: every page in the nav, every link
and anchor. These tests check what can be checked without mkdocs installed: the README's length and
Quickstart, that every relative link in the README and in docs/ leads to a file, that mkdocs.yml's nav
names every page, and that the generated references (docs/hooks.py) cover every command, option and
cell.
"""

from __future__ import annotations

import importlib.util
import os
import re

import pytest

from helpers import REPO

DOCS = REPO / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_is_at_most_250_lines():
    assert len((REPO / "README.md").read_text(encoding="utf-8").splitlines()) <= 250


def test_the_readme_quickstart_is_what_ci_runs():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert "python3 -m pip install torch==2.13.0 -e . && charlm demo\n" in readme
    assert "python3 -m pip install torch==2.13.0 -e '.[test]' && python3 -m pytest -q\n" in readme
    assert "python3 -m pip install --quiet torch==2.13.0 -e '.[test]'\npython3 -m pytest -q\n" in ci


def _without_code(text: str) -> str:
    return re.sub(r"```.*?```", "", text, flags=re.S)


@pytest.mark.parametrize("page", [REPO / "README.md", *PAGES], ids=lambda path: str(path.relative_to(REPO)))
def test_every_relative_link_leads_to_a_file(page):
    broken = []
    for target in LINK.findall(_without_code(page.read_text(encoding="utf-8"))):
        path = target.split("#")[0]
        if not path or re.match(r"^[a-z]+:", path):
            continue
        if not (page.parent / path).exists():
            broken.append(target)
    assert broken == []


def test_the_nav_names_every_page_and_only_pages_that_exist():
    config = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    nav = config[config.index("\nnav:") :]
    named = re.findall(r":\s*([\w./-]+\.md)\s*$", nav, re.M)
    assert sorted(named) == sorted(str(page.relative_to(DOCS)) for page in PAGES)


def test_the_home_page_is_the_readme_with_its_links_made_relative_to_the_site():
    home = hooks().home_page()
    assert home.startswith("# charlm\n") and "](docs/" not in home
    assert "](getting-started.md" in home


def test_a_page_that_links_the_readme_links_the_home_page_on_the_site():
    module = hooks()
    assert module.readme_links_to_home("[a](../README.md#x)", "cells.md") == "[a](index.md#x)"
    assert module.readme_links_to_home("[a](../../README.md)", "papers/lru.md") == "[a](../index.md)"


def test_the_command_line_reference_has_every_command_and_option():
    import click
    import typer.main

    from charlm.cli.app import app

    reference = hooks().cli_reference()
    sections = dict(re.findall(r"^## (charlm(?: [\w-]+)?)\n(.*?)(?=^## |\Z)", reference, re.S | re.M))
    root = typer.main.get_command(app)
    context = click.Context(root, info_name="charlm")
    commands = {"charlm": root} | {
        f"charlm {name}": root.get_command(context, name) for name in root.list_commands(context)
    }
    assert sorted(sections) == sorted(commands)
    module = hooks()
    for title, command in commands.items():
        for parameter in command.params:
            if parameter.param_type_name == "argument":
                names = [module.argument_name(parameter).replace("|", "\\|")]
            else:
                names = [*parameter.opts, *parameter.secondary_opts]
            for name in names:
                assert name in sections[title], f"{title}: {name} missing from the command-line reference"


def test_the_cell_reference_has_every_registered_cell():
    from charlm.cells import CELLS

    reference = hooks().cells_reference()
    for name in CELLS.names():
        cell = CELLS.get(name)
        assert f"## `{name}`" in reference and f"::: {cell.__module__}.{cell.__qualname__}\n" in reference


PLANS_START = "<!-- plans table: generated from the shipped plans by tests/test_docs.py -->\n"
PLANS_END = "<!-- end of plans table -->"


def plans_table() -> str:
    """Every shipped plan (charlm/experiments/plans/*.toml): its name, its description, its profiles."""
    from charlm.experiments.plan import tomllib

    rows = ["| plan | what it reruns | `--profile` |", "| --- | --- | --- |"]
    for path in sorted((REPO / "charlm" / "experiments" / "plans").glob("*.toml"), key=lambda path: path.stem):
        plan = tomllib.loads(path.read_text(encoding="utf-8"))
        description = plan["description"].replace("|", "\\|")
        rows.append(
            f"| `{path.stem}` | {description} | {', '.join(f'`{name}`' for name in plan.get('profiles', {}))} |"
        )
    return "\n".join(rows) + "\n"


def test_the_plans_table_of_the_sweeps_page_is_current():
    """Issue 42: the table had gone stale (no `eras`, no `parallel-cells`). Rewrite it with
    CHARLM_WRITE_DOCS=1 python3 -m pytest tests/test_docs.py -k plans -n 0."""
    from charlm.experiments.plan import shipped_plans

    page = DOCS / "sweeps.md"
    text = page.read_text(encoding="utf-8")
    start, end = text.index(PLANS_START) + len(PLANS_START), text.index(PLANS_END)
    table = plans_table()
    assert [line.split("`")[1] for line in table.splitlines()[2:]] == sorted(shipped_plans())
    if os.environ.get("CHARLM_WRITE_DOCS") == "1":
        page.write_text(text[:start] + table + text[end:], encoding="utf-8")
    elif text[start:end] != table:
        pytest.fail("the plans table of docs/sweeps.md is stale: rerun with CHARLM_WRITE_DOCS=1")
