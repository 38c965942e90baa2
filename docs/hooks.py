"""The parts of the documentation site that are generated, as mkdocs hooks (mkdocs.yml: `hooks:`).

- The home page (docs/index.md) is README.md, its links into docs/ made relative to the site.
- docs/reference/cli.md gets every command and option of the typer app, `charlm.cli.app`: the same
  objects `charlm COMMAND --help` prints, so no option is written by hand.
- docs/reference/cells.md gets a mkdocstrings block for every registered cell, so a new cell's
  docstring appears without editing the page.

Each generated part replaces a marker comment in its page and the note after it, which says on
GitHub where the text comes from. A page may link to the README as `../README.md` (`../../README.md` one folder down):
on the site such a link goes to the home page.

    python3 docs/hooks.py            # prints the command-line reference
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README_MARKER = "<!-- generated: README.md -->"
CLI_MARKER = "<!-- generated: the command-line reference -->"
CELLS_MARKER = "<!-- generated: every registered cell -->"


# --- the home page ------------------------------------------------------------------------------


def home_page() -> str:
    """README.md as the site's index.md: `docs/X` links and images become `X`."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    return re.sub(r"(\]\()docs/", r"\1", text)


def readme_links_to_home(markdown: str, src_uri: str) -> str:
    """`../README.md` (one `../` per folder, plus one) becomes the home page, index.md."""
    depth = src_uri.count("/")
    return markdown.replace("](" + "../" * (depth + 1) + "README.md", "](" + "../" * depth + "index.md")


# --- the command-line reference -----------------------------------------------------------------


def cli_reference() -> str:
    """Markdown for the charlm command and each of its subcommands: usage, help, arguments, options."""
    import click
    import typer.main

    from charlm.cli.app import app

    root = typer.main.get_command(app)
    root_context = click.Context(root, info_name="charlm")
    names = [name for name in root.list_commands(root_context) if not root.get_command(root_context, name).hidden]
    out = [
        "Every command, as `charlm COMMAND --help` shows it, generated from the command-line application",
        "itself (`charlm.cli.app`). Options given to `charlm` itself come before the command",
        "(`charlm --threads 1 train ...`).",
        "",
    ]
    out += ["| command | what it does |", "| --- | --- |"]
    for name in names:
        command = root.get_command(root_context, name)
        out.append(f"| [`charlm {name}`](#charlm-{name}) | {_cell(_first_sentence(command.help))} |")
    out.append("")
    out += _command_section("charlm", root, root_context)
    for name in names:
        command = root.get_command(root_context, name)
        context = click.Context(command, info_name=name, parent=root_context)
        out += _command_section(f"charlm {name}", command, context)
    return "\n".join(out) + "\n"


def _command_section(title: str, command, context) -> list[str]:
    usage = re.sub(r"\{([^{}]+)\}", lambda m: m.group(1).upper(), command.get_usage(context).removeprefix("Usage: "))
    out = [f"## {title}", "", "```text", usage, "```", ""]
    out += [paragraph + "\n" for paragraph in _paragraphs(command.help)]
    shown = [p for p in command.params if not getattr(p, "hidden", False)]
    arguments = [p for p in shown if p.param_type_name == "argument"]
    options = [p for p in shown if p.param_type_name != "argument"]
    if arguments:
        out += ["**Arguments**", "", "| argument | value | description |", "| --- | --- | --- |"]
        for parameter in arguments:
            _, value, text = _help_record(parameter, context)
            out.append(f"| {_name(argument_name(parameter))} | {value} | {_cell(text)} |")
        out.append("")
    panels: dict[str, list] = {}
    for parameter in options:
        panel = getattr(parameter, "rich_help_panel", None)
        panels.setdefault(panel if isinstance(panel, str) else "Options", []).append(parameter)
    for panel, parameters in panels.items():
        out += [
            f"**{panel}**" if panel != "Options" or len(panels) > 1 else "**Options**",
            "",
            "| option | value | description |",
            "| --- | --- | --- |",
        ]
        for parameter in parameters:
            shown, value, text = _help_record(parameter, context)
            out.append(f"| {_name(shown)} | {value} | {_cell(text)} |")
        out.append("")
    return out


def argument_name(parameter) -> str:
    """An argument as the usage line shows it: its metavar, else its name in capitals."""
    name = parameter.metavar or parameter.name.upper()
    return name + ("..." if parameter.nargs == -1 and not name.endswith("...") else "")


def _name(name: str) -> str:
    """A parameter's name for a table cell: as code, unless it holds a pipe (a column break)."""
    return _cell(name) if "|" in name else f"`{name}`"


def _help_record(parameter, context) -> tuple[str, str, str]:
    """The parameter's names, its value's type (empty for a flag) and its help, as --help has them."""
    record = parameter.get_help_record(context)
    names, text = record if record else (parameter.name, "")
    value = ""
    match = re.match(r"^(.*?)\s+<(.+)>$", names)
    if match:
        names, value = match.group(1), match.group(2)
        value = {"int range": "int", "float range": "float"}.get(value, value)
        value = re.sub(r"^list\[(\w+)\]$", lambda m: m.group(1).lower() + " …", value)
        value = "one of " + value.replace("|", ", ") if "|" in value else f"`{value}`"
    text = re.sub(r"\s*\[(?:default: [^\]]*;\s*)?-?[\d.e+]*<=?x(?:<=?[\d.e+]+)?\]", "", text)  # typer's ranges
    text = re.sub(r"\s*\[x<=?[\d.e+]+\]", "", text)
    text = re.sub(r"\s*\[default: [^\]]*\]", "", text) if "(default:" in text else text
    text = text.replace("\\[", "[")  # rich's escape of a literal bracket
    return names, value, text.strip()


def _paragraphs(text: str | None) -> list[str]:
    return [" ".join(block.split()) for block in re.split(r"\n\s*\n", (text or "").strip()) if block.strip()]


def _first_sentence(text: str | None) -> str:
    paragraphs = _paragraphs(text)
    return paragraphs[0] if paragraphs else ""


def _cell(text: str) -> str:
    """Text for a Markdown table cell: one line, no column breaks, no stray HTML."""
    text = " ".join(text.split()).replace("|", "\\|").replace("*", "\\*")
    return re.sub(r"<(?=[A-Za-z/])", "&lt;", text)


# --- the cells' reference -----------------------------------------------------------------------


def cells_reference() -> str:
    """A section per registered cell: its name, its paper and its class's docstring (mkdocstrings)."""
    from charlm.cells import CELLS

    out = []
    for name in CELLS.names():
        cell = CELLS.get(name)
        out += [
            f"## `{name}`",
            "",
            f"{cell.description} ({cell.paper}). Parameters per layer: {cell.formula}.",
            "",
            f"::: {cell.__module__}.{cell.__qualname__}",
            "    options:",
            "      members: false",
            "      show_root_heading: true",
            "      heading_level: 3",
            "",
        ]
    return "\n".join(out) + "\n"


# --- the hooks ----------------------------------------------------------------------------------

GENERATORS = {README_MARKER: home_page, CLI_MARKER: cli_reference, CELLS_MARKER: cells_reference}


def on_page_markdown(markdown: str, page, config, files) -> str:
    for marker, generate in GENERATORS.items():
        if marker in markdown:  # what follows the marker is the note shown on GitHub in its place
            markdown = markdown[: markdown.index(marker)] + generate()
    return readme_links_to_home(markdown, page.file.src_uri)


if __name__ == "__main__":
    print(cli_reference(), end="")
