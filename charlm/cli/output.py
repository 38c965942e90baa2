"""Printing results on stdout (diagnostics go to stderr elsewhere)."""

from __future__ import annotations

import os
import sys

from rich.cells import cell_len
from rich.console import Console
from rich.segment import Segment, Segments
from rich.table import Table

# On a terminal rich takes its width; piped, COLUMNS if set, else 200 (wide enough for a full row).
stdout = Console(
    highlight=False, markup=False, soft_wrap=True, width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else 200
)


def epochs_text(summary: dict) -> str:
    """``4``, or ``4 complete; stopped inside epoch 5 when the time budget ran out``."""
    if not summary.get("partial_epoch"):
        if summary.get("stopped_by") == "patience":
            waited = summary["epochs"] - summary["best_epoch"]
            return (
                f"{summary['epochs']}; stopped early: no better validation bpc for {waited} "
                f"epoch{'s' if waited != 1 else ''}"
            )
        return str(summary["epochs"])
    budget = "token" if summary.get("stopped_by") == "tokens" else "time"
    stopped = f"stopped inside epoch {summary['epochs'] + 1} when the {budget} budget ran out"
    return f"{summary['epochs']} complete; {stopped}"


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


# A column that may wrap counts ROOMY characters at most when the columns to keep are chosen (the room
# it is then sure of); if the columns kept need more, it is narrowed, to NARROWEST at the least.
ROOMY, NARROWEST = 24, 10


def print_table(
    title: str | None, columns: list[str], rows: list[list[str]], *, drop_order: tuple = (), wrap: tuple = ()
) -> None:
    """A table on stdout that fits the terminal's width (``stdout.width``: COLUMNS when piped) without
    breaking a figure or a name. The rule, for every table charlm prints:

    - every column is kept whole on one line (a number, a run's name is never broken across lines),
      except those named in ``wrap``: free text (a description) that wraps in the room left;
    - while the table is too wide, the columns named in ``drop_order`` are left out in that order (the
      least needed first), a ``wrap`` column counting ``ROOMY`` characters at most; the columns not
      named there (those that identify a row) always stay;
    - where the columns kept are still too wide (their free text narrowed to ``NARROWEST``), the first
      column (a row's name, a run directory) goes on a line of its own above each row's other cells,
      and the columns are chosen again without it: the name is whole on one line, however long;
    - the ``wrap`` columns then share the room left, the widest narrowed first, to no fewer than
      ``NARROWEST`` characters: where even that does not fit, the table is wider than the terminal
      (the terminal folds its lines) rather than cut."""
    cells = [[column, *(row[index] for row in rows)] for index, column in enumerate(columns)]
    longest = [max(map(cell_len, column)) for column in cells]
    wraps = [column in wrap for column in columns]

    def needed(indices, room=ROOMY):  # borders and padding: 3 a column, 1 at the end
        return 1 + sum(3 + (min(longest[i], room) if wraps[i] else longest[i]) for i in indices)

    def chosen(indices):
        keep = list(indices)
        for name in drop_order:
            if needed(keep) <= stdout.width:
                break
            if name in columns and columns.index(name) in keep:
                keep.remove(columns.index(name))
        return keep

    keep = chosen(range(len(columns)))
    names_above = bool(rows) and len(columns) > 1 and not wraps[0] and needed(keep, NARROWEST) > stdout.width
    if names_above:
        without_names = chosen(range(1, len(columns)))
        names_above = needed(without_names, NARROWEST) <= stdout.width
        keep = without_names if names_above else keep
    widths = {i: longest[i] for i in keep}
    room = stdout.width - needed(i for i in keep if not wraps[i]) - 3 * sum(wraps[i] for i in keep)
    while sum(widths[i] for i in keep if wraps[i]) > room:
        narrower = [i for i in keep if wraps[i] and widths[i] > min(longest[i], NARROWEST)]
        if not narrower:
            break
        widths[max(narrower, key=widths.get)] -= 1
    table = Table(show_lines=names_above, width=1 + sum(3 + width for width in widths.values()))
    for index in keep:
        table.add_column(columns[index], width=widths[index], no_wrap=not wraps[index], overflow="fold")
    for row in rows:
        table.add_row(*(row[index] for index in keep))
    if title:
        stdout.print(title, soft_wrap=False)  # wrapped at the terminal's width
    if names_above:
        stdout.print(Segments(_names_above_rows(table, columns[0], [row[0] for row in rows])))
    else:
        stdout.print(table)


def _names_above_rows(table: Table, heading: str, names: list[str]) -> list[Segment]:
    """``table`` (drawn with a line between rows) with ``heading`` on a line above its headings and
    each of ``names`` on a line above its row, in place of the lines between rows. Those lines are
    the ones without a space inside the borders (whatever the box characters: ASCII on a terminal
    that lacks the others)."""
    lines = stdout.render_lines(table, stdout.options.update(width=table.width), pad=False)
    between = [number for number, line in enumerate(lines[1:-1], 1) if " " not in "".join(s.text for s in line)]
    heads, rows = (Segment(line[0].text[:1], line[0].style) for line in (lines[1], lines[between[0] + 1]))
    segments = [*lines[0], Segment.line(), heads, Segment(" "), Segment(heading, stdout.get_style(table.header_style))]
    names = iter(names)
    for number, line in enumerate(lines[1:], 1):
        if number in between[1:]:  # the line between two rows: the next row's name instead
            line = [rows, Segment(" " + next(names))]
        segments += [Segment.line(), *line]
        if number == between[0]:  # the end of the headings: the first row's name
            segments += [Segment.line(), rows, Segment(" " + next(names))]
    return [*segments, Segment.line()]


def print_plain(columns: list[str], rows: list[list[str]]) -> None:
    """Tab-separated values with a header line: for scripts and pipes."""
    clean = [[str(value).replace("\t", " ").replace("\n", " ") for value in row] for row in [columns, *rows]]
    sys.stdout.write("".join("\t".join(row) + "\n" for row in clean))
