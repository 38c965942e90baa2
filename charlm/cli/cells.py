"""`charlm cells`: the registry as a table; `charlm cells CELL`: one cell's options, each with its range."""

from __future__ import annotations

import dataclasses
import typing
from typing import Optional

import typer

from charlm.cli.completion import complete_cells
from charlm.cli.output import print_table, stdout
from charlm.settings import bound_text


def cells(
    name: Optional[str] = typer.Argument(
        None,
        metavar="CELL",
        help="A cell (or module:Class): list its options (--cell-opt key=value), each with its type, default and "
        "range or choices.",
        autocompletion=complete_cells,
        show_default=False,
    ),
):
    """List every registered cell: name, description, paper, parameters per layer, options; with a CELL,
    its options, each with its type, default and the range or the choices it takes."""
    from charlm.cells import CELLS

    if name is not None:
        _print_options(CELLS.get(name))
        return
    rows = []
    for cell in CELLS:
        options = ", ".join(f"{field.name}={_default(field)}" for field in dataclasses.fields(cell.Config)) or "-"
        rows.append([cell.name, cell.description, cell.paper, cell.formula, options])
    print_table(
        "Registered cells (d: input size, n: hidden size; per layer)",
        ["name", "description", "paper", "params", "options"],
        rows,
        drop_order=("paper", "params"),
        wrap=("description", "paper", "params", "options"),
    )
    typer.echo(
        "--wiring block adds per layer n + kn + n + n + 3nm (two RMSNorm gains, a causal\n"
        "convolution of width k, a gated MLP of width m = expansion·n), and n for the\n"
        "final RMSNorm.\n"
        "--tie-weights shares the embedding table (V·e) with the softmax: V·e fewer,\n"
        "and t·e more (a projection) where the top layer's output width t is not e.\n"
        "`charlm cells CELL` lists a cell's options with their ranges."
    )


def _print_options(cell) -> None:
    """The options of ``cell`` as declared by its ``Config`` (``charlm.settings.setting``): what is
    checked when ``--cell-opt`` gives one (``charlm.cells.registry.parse_cell_options``)."""
    fields = dataclasses.fields(cell.Config)
    if not fields:
        stdout.print(f"{cell.name}: no options", soft_wrap=False)
        return
    hints = typing.get_type_hints(cell.Config)
    rows = [
        [field.name, _kind(hints[field.name]), _plain(_default(field)), _allowed(field), _help(field)]
        for field in fields
    ]
    print_table(
        f"Options of {cell.name} (--cell-opt key=value)",
        ["option", "type", "default", "allowed", "what"],
        rows,
        drop_order=("type",),
        wrap=("allowed", "what"),
    )


def _kind(hint) -> str:
    """``int``, ``float``, ``bool``, ``text``; ``int or none`` where the option may be unset."""
    kinds = [kind for kind in (typing.get_args(hint) or (hint,)) if kind is not type(None)]
    words = ["text" if kind is str else getattr(kind, "__name__", str(kind)) for kind in kinds]
    return " or ".join(words + (["none"] if len(kinds) < len(typing.get_args(hint) or (hint,)) else []))


def _allowed(field: dataclasses.Field) -> str:
    """The choices or the range the option declares: ``one of: auto, loop``, ``at least 1``; ``-`` if none."""
    if field.metadata.get("choices"):
        return "one of: " + ", ".join(map(_plain, field.metadata["choices"]))
    return (bound_text(field.metadata) if field.metadata else "") or "-"


def _help(field: dataclasses.Field) -> str:
    return field.metadata.get("help", "")


def _plain(value) -> str:
    return "none" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _default(field: dataclasses.Field):
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def register(app: typer.Typer) -> None:
    app.command()(cells)
