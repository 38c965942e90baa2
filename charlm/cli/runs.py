"""`charlm runs`: a table of the runs under a directory (or JSON for scripts)."""

from __future__ import annotations

import enum
import json
import math
from pathlib import Path

import typer

from charlm.cli.output import print_plain, print_table, stdout

# The columns left out first when the terminal is narrow; run, cell, the scores and the status stay.
DROP_ORDER = ("dynamic bpc", "corpus", "best", "params", "tokens", "time", "fraction", "epochs", "size")

COLUMNS = {  # sort key → field of Run.summary()
    "run": "run", "corpus": "corpus", "cell": "cell", "params": "parameters", "epochs": "epochs",
    "best-epoch": "best_epoch", "valid": "best_valid_bpc", "test": "test_bpc", "time": "train_seconds", "status": "status",
}
SortColumn = enum.Enum("SortColumn", [(name, name) for name in COLUMNS], type=str)


def runs(
    directory: Path = typer.Argument(Path("runs"), help="Directory to search for run directories (recursively)."),
    sort: SortColumn = typer.Option("run", "--sort", help="Column to sort by."),
    reverse: bool = typer.Option(False, "--reverse", help="Sort in descending order."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON list (with each run's provenance) instead of a table."),
    plain: bool = typer.Option(False, "--plain", help="Print tab-separated values with a header line (every column), for scripts."),
):
    """List runs: corpus, cell, size, epochs, best validation and test bpc, dynamic figures, time, status."""
    from charlm.runs.directory import find_runs

    rows = [run.summary() for run in find_runs(directory)]
    key = COLUMNS[sort.value]
    rows.sort(key=lambda row: _sort_key(row.get(key)), reverse=reverse)
    rows = [row for row in rows if row.get(key) is not None] + [row for row in rows if row.get(key) is None]  # blanks last
    if as_json:
        stdout.print_json(json.dumps(rows, default=str))
        return
    table = []
    for row in rows:
        size = "-" if row["hidden"] is None else f"{row['layers']}×{row['hidden']}"
        dynamic = ", ".join(f"{name} {value:.4f}" for name, value in row["dynamic"].items() if value is not None)
        if row.get("task_accuracy") is not None:  # a `charlm task` run
            dynamic = f"accuracy {row['task_accuracy']:.2%} after {row['task_samples']:,} samples"
        fraction = row.get("train_fraction")
        table.append([row["run"], row["corpus"] or "-", row["cell"] or "-", size, _number(row["parameters"]),
                      "-" if fraction is None else f"{fraction:g}", _number(row.get("tokens_seen")),
                      str(row["epochs"]), _number(row["best_epoch"]), _bpc(row["best_valid_bpc"]), _bpc(row["test_bpc"]),
                      dynamic or "-", _duration(row["train_seconds"]), row["status"]])
    columns = ["run", "corpus", "cell", "size", "params", "fraction", "tokens", "epochs", "best", "valid bpc", "test bpc",
               "dynamic bpc", "time", "status"]
    if plain:
        print_plain(columns, table)
        return
    print_table(f"{len(rows)} run(s) in {directory}", columns, table, drop_order=DROP_ORDER, wrap=("run", "dynamic bpc"))


def _sort_key(value):
    if value is None:
        return (1, 0, "")
    if isinstance(value, (int, float)):
        return (0, value, "")
    return (0, 0, str(value))


def _number(value) -> str:
    return "-" if value is None else f"{value:,}"


def _bpc(value) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.4f}"


def _duration(seconds: float) -> str:
    minutes, seconds = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"


def register(app: typer.Typer) -> None:
    app.command()(runs)
