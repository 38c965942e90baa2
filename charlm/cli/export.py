"""`charlm export`: a slim inference file (weights, configs, vocabulary), loadable everywhere."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from charlm.cli.loading import CELL, CHECKPOINT, TRUST_CODE, load_model
from charlm.cli.output import stdout
from charlm.errors import CharlmError


def export(
    checkpoint: Path = CHECKPOINT,
    output: Path = typer.Argument(..., help="File to write (for example model.pt)."),
    cell: Optional[str] = CELL,
    trust_code: bool = TRUST_CODE,
    force: bool = typer.Option(False, "--force", help="Replace OUTPUT if it exists."),
):
    """Write the model without optimizer, RNG or carried state: for `charlm.load`, eval, sample, score."""
    if output.is_dir():
        raise CharlmError(f"{output} is a directory: give a file name such as {output / 'model.pt'}")
    if not output.parent.is_dir():
        raise CharlmError(f"cannot write {output}: the directory {output.parent} does not exist")
    model = load_model(checkpoint, "cpu", cell, trust_code)
    source = model.checkpoint.path
    if output.resolve() == source.resolve():
        raise CharlmError(f"{output} is the checkpoint being exported: give another file name")
    if output.exists() and not force:
        raise CharlmError(f"{output} exists: pass --force to replace it, or give another file name")
    model.export(output)
    before, after = source.stat().st_size, output.stat().st_size
    stdout.print(f"exported        {output} ({after:,} bytes; {source} is {before:,} bytes, {after / before:.0%} of it)")
    stdout.print(f"model           {model.config.cell}, {model.config.layers}×{model.config.hidden_size}, "
                 f"{model.parameters_count:,} parameters, vocabulary {len(model.vocabulary)}")


def register(app: typer.Typer) -> None:
    app.command()(export)
