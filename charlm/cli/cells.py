"""`charlm cells`: the registry as a table."""

from __future__ import annotations

import dataclasses

import typer

from charlm.cli.output import print_table


def cells():
    """List every registered cell: name, description, paper, parameters per layer, options."""
    from charlm.cells import CELLS

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
        "and t·e more (a projection) where the top layer's output width t is not e."
    )


def _default(field: dataclasses.Field):
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def register(app: typer.Typer) -> None:
    app.command()(cells)
