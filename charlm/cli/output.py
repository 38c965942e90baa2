"""Printing results on stdout (diagnostics go to stderr elsewhere)."""

from __future__ import annotations

import os
import sys

from rich.console import Console
from rich.table import Table

# On a terminal rich takes its width; piped, COLUMNS if set, else 200 (wide enough for a full row).
stdout = Console(highlight=False, markup=False, soft_wrap=True,
                 width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else 200)


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


def print_table(title: str | None, columns: list[str], rows: list[list[str]], *, drop_order: tuple = (),
                wrap: tuple = ()) -> None:
    """A table on stdout. With ``drop_order`` (column names, the least needed first) columns are left
    out until the table fits the terminal, and every column but those in ``wrap`` is kept whole
    (a number is never broken across lines)."""
    keep = list(range(len(columns)))
    if drop_order:
        def width(indices):  # a column that may wrap counts at most 24 characters
            return 1 + sum(3 + min(max([len(columns[i]), *(len(row[i]) for row in rows)]),
                                   24 if columns[i] in wrap else 10**6) for i in indices)

        for name in drop_order:
            if width(keep) <= stdout.width:
                break
            if name in columns:
                keep.remove(columns.index(name))
    table = Table(title=title, show_lines=False)
    for index in keep:
        whole = bool(drop_order) and columns[index] not in wrap
        table.add_column(columns[index], overflow="fold", no_wrap=whole)
    for row in rows:
        table.add_row(*(row[index] for index in keep))
    stdout.print(table)


def print_plain(columns: list[str], rows: list[list[str]]) -> None:
    """Tab-separated values with a header line: for scripts and pipes."""
    clean = [[str(value).replace("\t", " ").replace("\n", " ") for value in row] for row in [columns, *rows]]
    sys.stdout.write("".join("\t".join(row) + "\n" for row in clean))
