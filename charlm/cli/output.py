"""Printing results on stdout (diagnostics go to stderr elsewhere)."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.table import Table

stdout = Console(highlight=False, markup=False, soft_wrap=True, width=None if sys.stdout.isatty() else 200)


def epochs_text(summary: dict) -> str:
    """``4``, or ``4 complete; stopped inside epoch 5 when the time budget ran out``."""
    if not summary.get("partial_epoch"):
        if summary.get("stopped_by") == "patience":
            waited = summary["epochs"] - summary["best_epoch"]
            return (f"{summary['epochs']}; stopped early: no better validation bpc for {waited} "
                    f"epoch{'s' if waited != 1 else ''}")
        return str(summary["epochs"])
    return f"{summary['epochs']} complete; stopped inside epoch {summary['epochs'] + 1} when the time budget ran out"


def best_epoch_text(summary: dict) -> str:
    """``4``, or ``5 (the partial epoch, evaluated where it stopped)``."""
    best = summary["best_epoch"]
    if summary.get("partial_epoch") and best == summary["epochs"] + 1:
        return f"{best} (the partial epoch, evaluated where it stopped)"
    return str(best)


def print_summary(summary: dict) -> None:
    test = summary.get("test_bpc_at_best")
    lines = [
        ("run", summary["run_dir"]),
        ("parameters", f"{summary['parameters']:,} (hidden {summary['hidden_size']})"),
        ("epochs", epochs_text(summary)),
        ("best epoch", best_epoch_text(summary)),
        ("best valid bpc", f"{summary['best_valid_bpc']:.4f}"),
        ("test bpc", "-" if test is None else f"{test:.4f} (best-validation checkpoint)"),
    ]
    wall = summary.get("wall_seconds")
    if wall:
        lines.append(("wall time", "  ".join(f"{part} {seconds:,.1f} s" for part, seconds in wall.items())))
    for key, value in lines:
        stdout.print(f"{key:<15} {value}")


def print_table(title: str | None, columns: list[str], rows: list[list[str]]) -> None:
    table = Table(title=title, show_lines=False)
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*row)
    stdout.print(table)
