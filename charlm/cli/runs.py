"""`charlm runs`: a table of the runs under a directory (or JSON for scripts); `--prune` frees the
disk they need neither to resume nor to use their best model (``charlm.runs.retention``)."""

from __future__ import annotations

import enum
import json
import math
from typing import List, Optional

import typer

from charlm.cli.options import option_for
from charlm.cli.output import print_plain, print_table, stdout
from charlm.errors import CharlmError
from charlm.config_tools import PruneConfig
from charlm.settings import validate
from charlm.logs import get_logger

# The columns left out first when the terminal is narrow (but not the one sorted by); run, corpus
# (runs on different corpora are not comparable), cell, the scores and the status stay.
DROP_ORDER = ("disk", "dynamic bpc", "best", "params", "tokens", "time", "fraction", "epochs", "size")

COLUMNS = {  # sort key → field of Run.summary()
    "run": "run",
    "corpus": "corpus",
    "cell": "cell",
    "params": "parameters",
    "epochs": "epochs",
    "best-epoch": "best_epoch",
    "valid": "best_valid_bpc",
    "test": "test_bpc",
    "time": "train_seconds",
    "status": "status",
    "disk": "disk_bytes",
}
SortColumn = enum.Enum("SortColumn", [(name, name) for name in COLUMNS], type=str)


def runs(
    directories: Optional[List[str]] = typer.Argument(
        None,
        metavar="DIR",
        help="Directories to search for run directories (recursively), or run directories. (default: runs)",
    ),
    sort: SortColumn = typer.Option("run", "--sort", help="Column to sort by."),
    reverse: bool = typer.Option(False, "--reverse", help="Sort in descending order."),
    as_json: bool = typer.Option(
        False, "--json", help="Print a JSON list (with each run's provenance) instead of a table."
    ),
    plain: bool = typer.Option(
        False, "--plain", help="Print tab-separated values with a header line (every column), for scripts."
    ),
    prune: bool = typer.Option(
        False,
        "--prune",
        help="Instead of listing: free what the runs need neither to resume nor to use their best model (previous.pt "
        "when last.pt loads, the optimizer state of a best.pt written by an older charlm, epoch checkpoints "
        "beyond --keep, leftovers of cut-short writes); last.pt and best.pt stay, a run being trained is skipped.",
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="With --prune: print what would be freed, remove nothing."),
    keep: Optional[int] = option_for(PruneConfig, "keep"),
):
    """List runs: corpus, cell, size, epochs, best validation and test bpc, dynamic figures, time, disk, status."""
    from charlm.runs.directory import find_runs  # not at every start-up (slow to import)

    if not prune and (dry_run or keep is not None):
        raise CharlmError(f"{'--dry-run' if dry_run else '--keep'} goes with --prune")
    if prune and (as_json or plain):
        raise CharlmError(
            f"{'--json' if as_json else '--plain'} lists runs; --prune prints what it frees: give one, not both"
        )
    validate(PruneConfig(keep=keep))  # its declared bounds
    directories = directories or ["runs"]
    found, seen = [], set()
    for directory in directories:
        for run in find_runs(directory):
            if run.path.resolve() not in seen:
                seen.add(run.path.resolve())
                found.append(run)
    if prune:
        _prune(found, keep, dry_run)
        return
    directory = ", ".join(map(str, directories))
    rows = [run.summary() for run in found]
    key = COLUMNS[sort.value]
    rows.sort(key=lambda row: _sort_key(row.get(key)), reverse=reverse)
    rows = [row for row in rows if row.get(key) is not None] + [
        row for row in rows if row.get(key) is None
    ]  # blanks last
    for row in rows:  # listed (status damaged) with the others; why, on stderr (and in --json's "damage")
        if row.get("damage"):
            get_logger().warning(f"warning: {row['run']} is damaged, its figures are not shown: {row['damage']}")
    if as_json:  # NaN and infinity (the score of a run that diverged) are not JSON: null, as a missing figure is
        stdout.print_json(json.dumps(_finite_or_none(rows), default=str))
        return
    table = []
    for row in rows:
        if row.get("damage"):
            table.append([row["run"], *["-"] * 12, human_bytes(row["disk_bytes"]), row["status"]])
            continue
        size = "-" if row["hidden"] is None else f"{row['layers']}×{row['hidden']}"
        dynamic = ", ".join(f"{name} {value:.4f}" for name, value in row["dynamic"].items() if value is not None)
        if row.get("task_accuracy") is not None:  # a `charlm task` run
            dynamic = f"accuracy {row['task_accuracy']:.2%} after {row['task_samples']:,} samples"
        fraction = row.get("train_fraction")
        table.append(
            [
                row["run"],
                row["corpus"] or "-",
                row["cell"] or "-",
                size,
                _number(row["parameters"]),
                "-" if fraction is None else f"{fraction:g}",
                _number(row.get("tokens_seen")),
                str(row["epochs"]),
                _number(row["best_epoch"]),
                _bpc(row["best_valid_bpc"]),
                _bpc(row["test_bpc"]),
                dynamic or "-",
                _duration(row["train_seconds"]),
                human_bytes(row["disk_bytes"]),
                row["status"],
            ]
        )
    columns = [
        "run",
        "corpus",
        "cell",
        "size",
        "params",
        "fraction",
        "tokens",
        "epochs",
        "best",
        "valid bpc",
        "test bpc",
        "dynamic bpc",
        "time",
        "disk",
        "status",
    ]
    if plain:
        print_plain(columns, table)
        return
    shown = {"best-epoch": "best", "valid": "valid bpc", "test": "test bpc"}.get(sort.value, sort.value)  # its column
    print_table(
        f"{len(rows)} run(s) in {directory}",
        columns,
        table,
        drop_order=tuple(name for name in DROP_ORDER if name != shown),
        wrap=("dynamic bpc",),
    )


def _prune(found, keep: int | None, dry_run: bool) -> None:
    """Prune each run; one line per file freed (or kept, and why), per run skipped, and the total."""
    from charlm.runs.retention import prune

    total, touched, skipped = 0, 0, 0
    for run in found:
        result = prune(run, keep=keep, dry_run=dry_run)
        if result.in_use:
            skipped += 1
            stdout.print(f"skipped {result.run}: a training holds it ({result.in_use}); nothing touched")
            continue
        for item in result.freed:
            if item.after:
                stdout.print(
                    f"{'would rewrite' if dry_run else 'rewrote'} {item.path} without {item.why}: "
                    f"{human_bytes(item.before)} → {human_bytes(item.after)}"
                )
            else:
                stdout.print(
                    f"{'would remove' if dry_run else 'removed'} {item.path} ({human_bytes(item.bytes)}; {item.why})"
                )
        for note in result.kept:
            stdout.print(f"{result.run}: {note}")
        total += result.bytes
        touched += bool(result.freed)
    stdout.print(
        f"{'would free' if dry_run else 'freed'} {human_bytes(total)} ({total:,} bytes) in {touched} of "
        f"{len(found)} run(s)" + (f"; {skipped} skipped: being trained" if skipped else "")
    )


def human_bytes(size: int) -> str:
    """``512B``, ``12.3K``, ``12.3M``, ``1.2G``: powers of 1024, as ``du -h`` and ``ls -h`` count."""
    value = float(size)
    for unit in ("B", "K", "M", "G", "T"):
        if value < 1024 or unit == "T":
            return f"{size}B" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024


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


def _finite_or_none(value):
    """``value`` (a run's summary, read from its files) with every NaN or infinite number as None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite_or_none(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_none(item) for item in value]
    return value


def _duration(seconds: float) -> str:
    minutes, seconds = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"


def register(app: typer.Typer) -> None:
    app.command()(runs)
