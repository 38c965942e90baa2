"""`charlm report`: the papers' tables and figures over a directory of runs (a sweep), or one run."""

from __future__ import annotations

from typing import List, Optional

import typer

from charlm.cli.output import print_table, stdout


def report(
    directories: List[str] = typer.Argument(
        ..., metavar="DIR", help="Run directories, or directories to search for runs (recursively)."
    ),
    out: Optional[str] = typer.Option(
        None,
        "--out",
        help="Directory to write the report to (default: DIR/report; required with several directories).",
        metavar="<path>",
    ),
    reference: Optional[str] = typer.Option(
        None,
        "--reference",
        help="Cell whose full-data test loss the statistical-efficiency table asks the others to match (default: gru).",
    ),
):
    """Write Markdown and CSV tables and PNG figures comparing runs: Table 1 (test loss at the best
    validation epoch per corpus and cell, per parameter budget), epochs to converge, learning curves,
    statistical efficiency, gradient norms per layer, static against dynamic evaluation."""
    from charlm.experiments.report.write import build_report

    result = build_report(directories, out=out, reference=reference)
    for table in result.tables:
        print_table(table.title, table.columns, table.rows, drop_order=table.drop_order, wrap=table.wrap)
    stdout.print(f"report: {result.out / 'index.md'} ({len(result.files)} files)")


def register(app: typer.Typer) -> None:
    app.command()(report)
