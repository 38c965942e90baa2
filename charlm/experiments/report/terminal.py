"""The tables `charlm report` prints on the terminal (its files hold the full tables): a row a run or
a cell, the figures whole (bpc and losses to 4 decimals, as every command prints them), the free text
in columns that may wrap, and the columns to leave out first where the terminal is narrow."""

from __future__ import annotations

import dataclasses
import math

from charlm.experiments.report.compare import Group
from charlm.experiments.report.markdown import plus_minus
from charlm.experiments.report.reading import RunRecord


@dataclasses.dataclass(frozen=True)
class TerminalTable:
    """A table for ``charlm.cli.output.print_table``: the first column names a row."""

    title: str
    columns: list[str]
    rows: list[list[str]]
    wrap: tuple[str, ...] = ()  # free text, wrapped in the room left
    drop_order: tuple[str, ...] = ()  # left out in this order while the table is too wide


def figure(value, decimals: int = 4) -> str:
    """A bpc or a loss as the terminal shows it: ``4.4688``; ``-`` where there is none."""
    return "-" if value is None or not math.isfinite(value) else f"{value:.{decimals}f}"


def count(value) -> str:
    return "-" if value is None else f"{value:,}"


def table1_table(budget: str, cells: list[str], rows: list[tuple[str, list[Group | None]]], best) -> TerminalTable:
    """Table 1 of one budget, a row per corpus and cell (the Markdown file has a column per cell):
    the mean ± standard deviation of the test loss in nats and bpc, and notes (the best cell of its
    row, the number of seeds, a status other than finished). ``best`` gives a row's best group."""
    lines = []
    for label, groups in rows:
        for cell, group in zip(cells, groups):
            if group is None:
                continue
            notes = ["best"] if group is best(groups) else []
            notes += [f"{len(group.runs)} runs"] if len(group.runs) > 1 else []
            notes += [] if group.status == "finished" else [group.status]
            lines.append([label, cell, plus_minus(group.loss), plus_minus(group.bpc), "; ".join(notes) or "-"])
    return TerminalTable(
        f"Table 1, {budget} parameters: test loss at the best validation epoch (mean ± std over seeds)",
        ["corpus", "cell", "nats", "bpc", "notes"],
        lines,
        wrap=("notes",),
    )


def runs_table(records: list[RunRecord]) -> TerminalTable:
    """The runs themselves, where no run trained on all of the training data (no Table 1)."""
    return TerminalTable(
        "Runs (no run trained on all of the training data: no Table 1)",
        ["run", "cell", "fraction", "seed", "status", "valid bpc", "test bpc"],
        [
            [
                record.name,
                record.cell,
                f"{record.fraction:g}",
                count(record.seed),
                record.status,
                figure(record.best and record.best.valid_bpc),
                figure(record.test_bpc),
            ]
            for record in records
        ],
        drop_order=("valid bpc",),
    )


def summary_table(name: str, rows: list[list]) -> TerminalTable:
    """One run's settings and scores (``setting``, value): the scores to 4 decimals, seconds to 1."""
    shown = []
    for setting, value in rows:
        if isinstance(value, float) and setting != "fraction":
            value = figure(value, 1 if "seconds" in setting else 4)
        elif isinstance(value, float):
            value = f"{value:g}"
        elif isinstance(value, int) and not isinstance(value, bool):
            value = count(value)
        shown.append([setting, "-" if value is None else str(value)])
    return TerminalTable(f"run {name}", ["setting", "value"], shown)
