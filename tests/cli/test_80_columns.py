"""Issue 42: every command that prints a table, at 80 columns (``COLUMNS=80``): no line wider, no
figure or name broken. Each table is read back against the rows the command gave
``charlm.cli.output.print_table``: a column that is not free text shows each of its values whole, on
one line (a run's name on a line of its own above its figures where it cannot share one); a column
of free text wraps between words, never inside one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from charlm.cli import bench, cells, check, evaluate, output, prepare, report, runs, score, sweep
from helpers import assert_fits, cli, prepare_tiny_corpus, table_lines, terminal_of

# Every module of the command line that prints a table (checked below), and so is run here.
PRINTING = (bench, cells, check, evaluate, prepare, report, runs, score, sweep)

PLAN = """
name = "seeds-and-fractions"
description = "two cells, two fractions of the data, two seeds"

[base]
corpus = "tiny"
hidden_size = 12
batch_size = 4
bptt = 16
epochs = 1
eval_batch_size = 8

[axes]
cell = ["gru", "lstm"]
train_fraction = [0.5, 1.0]
seed = [1, 2]

[[eval]]
split = "test"
dynamic = "sgd"
"""


@pytest.fixture(scope="module")
def places(tmp_path_factory):
    """A directory with a prepared corpus (data/), a sweep with seeds and a fraction of the data
    (sweep/, made by plan.toml: run names of 35 characters and more), two task runs (tasks/) and a
    text to score."""
    root = tmp_path_factory.mktemp("columns")
    prepare_tiny_corpus(root / "data", "tiny", characters=12_000)
    (root / "plan.toml").write_text(PLAN, encoding="utf-8")
    (root / "text.txt").write_text("The quick brown fox jumps over the lazy dog. " * 4, encoding="utf-8")
    cli("sweep", root / "plan.toml", "--dir", root / "sweep", "--data-dir", root / "data", check_code=0)
    for seed in (1, 2):
        task = ("task", "parity", "--bits", "3", "--hidden", "8", "--max-samples", "200", "--eval-every", "100")
        cli(*task, "--eval-samples", "10", "--seed", seed, "--run-dir", root / "tasks" / f"parity-{seed}", check_code=0)
    return root


FULL, PART = "sweep/cell-gru_train_fraction-1.0_seed-1", "sweep/cell-lstm_train_fraction-0.5_seed-2"
SEARCH = ("--dyn-search", "--search-prefix", "100")
TINY_BENCH = ("--params", "10k", "--batch-size", "2", "--bptt", "3", "--steps", "1", "--repeat", "1")
COMMANDS = {  # run in the directory of ``places``
    "runs": ("runs", "sweep"),
    "report of a sweep (Table 1)": ("report", "sweep", "--out", "out/sweep"),
    "report without full-data runs": ("report", PART, "sweep/cell-gru_train_fraction-0.5_seed-1", "--out", "out/part"),
    "report of one run": ("report", FULL, "--out", "out/one"),
    "report of task runs": ("report", "tasks", "--out", "out/tasks"),
    "sweep --dry-run": ("sweep", "plan.toml", "--dir", "sweep", "--data-dir", "data", "--dry-run"),
    "sweep --dry-run with estimates": ("sweep", "plan.toml", "--dir", "fresh", "--data-dir", "data", "--dry-run"),
    "sweep --list": ("sweep", "--list"),
    "cells": ("cells",),
    "cells CELL (its options)": ("cells", "mamba"),
    "corpora": ("corpora", "--data-dir", "data"),
    "eval --dyn-search": ("eval", FULL, "--data-dir", "data", "--dynamic", "sgd", *SEARCH),
    "score --dynamic": ("score", FULL, "text.txt", "--dynamic", "sgd"),
    "bench": ("bench", "--cells", "mgu", *TINY_BENCH, "--sample-length", "3", "--device", "cpu"),
    "check": ("check", "--device", "cpu", "--cells", "gru"),
}


@pytest.mark.parametrize("arguments", COMMANDS.values(), ids=COMMANDS.keys())
def test_every_table_fits_80_columns_with_its_figures_and_names_whole(arguments, places, monkeypatch):
    given = []

    def print_table(title, columns, rows, *, drop_order=(), wrap=()):
        given.append((columns, rows, wrap))
        output.print_table(title, columns, rows, drop_order=drop_order, wrap=wrap)

    for module in PRINTING:
        monkeypatch.setattr(module, "print_table", print_table)
    monkeypatch.chdir(places)
    terminal_of(monkeypatch, 80)
    result = cli(*arguments, check_code=0)
    assert_fits(result.stdout)
    printed = printed_tables(result.stdout)
    assert given and len(printed) == len(given)
    for (columns, rows, wrap), (headings, lines) in zip(given, printed):
        for position, index in enumerate(kept(headings, columns)):
            heading, values = columns[index], [row[index] for row in rows]
            cells = [line[position] for line in lines]
            if heading in wrap:  # free text: broken between words only
                assert {word for cell in cells for word in cell.split()} <= {w for v in values for w in v.split()}
            else:  # a figure, a name: whole, on one line
                assert [cell for cell in cells if cell] == [value for value in values if value], heading
    if arguments[0] == "runs":  # the run directories' names, too long to share a line with their figures
        assert "│ sweep/cell-lstm_train_fraction-0.5_seed-2\n" in result.stdout
    if "fresh" in arguments:  # runs to train: each one's time, and the total
        assert "estimate" in printed[0][0] and re.search(
            r"^about .+ for 8 run\(s\) on cpu .*measured now$", result.stdout, re.M
        )
    if arguments[0] == "report":  # bpc to 4 decimals, as every other command prints it
        assert not re.search(r"\d\.\d{5}", result.stdout)


def test_every_module_that_prints_a_table_is_run_above():
    directory = Path(output.__file__).parent
    printing = {path.stem for path in directory.glob("*.py") if "print_table(" in path.read_text(encoding="utf-8")}
    assert printing - {"output"} == {module.__name__.rsplit(".", 1)[1] for module in PRINTING}


def test_task_help_leaves_its_descriptions_room(monkeypatch):
    """Issue 42: `charlm task --help` gave the descriptions 20 columns: --hidden,--hidden-size and
    --wavefront --no-wavefront side by side took the rest. Each name of an option is on a line of its own."""
    terminal_of(monkeypatch, 80)
    monkeypatch.setenv("NO_COLOR", "1")
    text = cli("task", "--help", check_code=0).stdout
    assert_fits(text)
    lines = text.splitlines()
    hidden = next(index for index, line in enumerate(lines) if "│ --hidden " in line)
    assert "Units per layer. Must be in [1, 1048576]." in lines[hidden]
    assert lines[hidden + 1].startswith("│ --hidden-size ")
    wavefront = next(index for index, line in enumerate(lines) if "│ --wavefront " in line)
    assert lines[wavefront + 1].startswith("│ --no-wavefront ")


def kept(headings: list[str], columns: list[str]) -> list[int]:
    """The index in ``columns`` of each of the ``headings`` a table shows (in order, some left out):
    each heading whole (one of free text wrapped between words, joined again)."""
    indices, index = [], 0
    for heading in headings:
        while index < len(columns) and columns[index] != heading:
            index += 1
        assert index < len(columns), f"{heading!r} is not one of {columns}, in their order"
        indices.append(index)
        index += 1
    return indices


def printed_tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """Each table in ``text``: its headings (one that wraps joined again) and the cells of its body
    lines (``helpers.table_lines``: a name on a line of its own read as its row's first cell)."""
    tables = []
    for block in re.findall(r"^┏.*?^└[^\n]*$", text, re.S | re.M):
        heads = [line for line in block.splitlines() if line.startswith("┃")]
        first = [heads.pop(0)[1:].strip()] if not heads[0].endswith("┃") else []
        parts = [[cell.strip() for cell in line.split("┃")[1:-1]] for line in heads]
        tables.append((first + [" ".join(filter(None, column)) for column in zip(*parts)], table_lines(block)))
    return tables
