"""docs/results.md: every figure of charlm's on the page is the figure of the run record it names.

A figure reads ``valid 1.814 nats`` or ``test 1.767 ± 0.010 bpc``; the figures of one table cell (or one
line of prose) are followed by their source: ``(record FILE.json, RUN)`` (several runs joined by `` + ``:
their mean, and ± the standard deviation over them), a file of docs/records/ written by `charlm runs DIR
--json`, or ``(record not in the repository: DEVICE, DATE)`` (which may also follow figures of other
kinds, such as accuracies). Code, in blocks or inline, holds examples, not figures.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from pathlib import Path

import pytest

from helpers import REPO

PAGE = REPO / "docs" / "results.md"
RECORDS = REPO / "docs" / "records"

FIGURE = re.compile(r"\b(valid|test) (\d+\.\d+)(?: ± (\d+\.\d+))? (bpc|nats)\b")
SOURCE = re.compile(r"\(record (?:([\w.-]+\.json), ([^()]+)|not in the repository: ([^()]+))\)")
DATED = re.compile(r"[^,]+, .*\b\d{4}-\d{2}-\d{2}$")
FIELD = {"valid": "best_valid_bpc", "test": "test_bpc"}


def segments(text: str) -> list[str]:
    """Each table cell and each line of prose, without code: a figure's source is in its own."""
    text = re.sub(r"`[^`\n]*`", "", re.sub(r"```.*?```", "", text, flags=re.S))
    return [cell for line in text.splitlines() for cell in line.split(" | ")]


def printed(value: float, like: str) -> str:
    return f"{value:.{len(like.split('.')[1])}f}"


def figure_problems(text: str, records: Path) -> list[str]:
    """What is wrong with the page's figures: each as one line naming the figure; [] when nothing is."""
    problems, loaded = [], {}
    for segment in segments(text):
        start = 0
        for source in SOURCE.finditer(segment):
            figures = list(FIGURE.finditer(segment, start, source.start()))
            start = source.end()
            if source.group(3) is not None:
                if not DATED.match(source.group(3).strip()):
                    problems.append(f"{source.group(0)}: name the device and the date (YYYY-MM-DD)")
            elif not figures:
                problems.append(f"{source.group(0)}: no figure before it")
            else:
                problems += _against_record(figures, source.group(1), source.group(2), records, loaded)
        problems += [f"{figure.group(0)}: no (record ...) after it" for figure in FIGURE.finditer(segment, start)]
    return problems


def _against_record(figures, name: str, runs: str, records: Path, loaded: dict) -> list[str]:
    if name not in loaded:
        path = records / name
        loaded[name] = {row["run"]: row for row in json.loads(path.read_text())} if path.is_file() else None
    record = loaded[name]
    if record is None:
        return [f"record {name}: no such file in {records.name}/"]
    names = [run.strip() for run in runs.split(" + ")]
    missing = [run for run in names if run not in record]
    if missing:
        return [f"record {name}: no run {run}" for run in missing]
    problems = []
    for figure in figures:
        kind, value, spread, unit = figure.groups()
        values = [record[run][FIELD[kind]] for run in names]
        if any(v is None for v in values):
            problems.append(f"{figure.group(0)}: {FIELD[kind]} is null in {name}")
            continue
        values = [v * math.log(2) if unit == "nats" else v for v in values]
        expected = printed(statistics.fmean(values), value)
        if spread is not None:
            expected += " ± " + (printed(statistics.stdev(values), spread) if len(values) > 1 else "(one run)")
        if f"{value}" + (f" ± {spread}" if spread else "") != expected:
            problems.append(f"{figure.group(0)}: the record ({name}, {runs}) gives {kind} {expected} {unit}")
    return problems


def test_every_figure_on_the_results_page_is_its_records():
    assert figure_problems(PAGE.read_text(encoding="utf-8"), RECORDS) == []


def test_every_record_the_page_names_is_in_docs_records():
    named = {match.group(1) for match in SOURCE.finditer(PAGE.read_text(encoding="utf-8")) if match.group(1)}
    assert sorted(name for name in named if not (RECORDS / name).is_file()) == []


@pytest.fixture
def records(tmp_path):
    rows = [
        {"run": "runs/a", "best_valid_bpc": 2.618, "test_bpc": 2.7},
        {"run": "runs/b", "best_valid_bpc": 2.610, "test_bpc": None},
    ]
    (tmp_path / "r.json").write_text(json.dumps(rows))
    return tmp_path


def test_a_figure_equal_to_its_record_at_the_printed_precision_passes(records):
    page = (
        "| x | valid 1.815 nats, valid 2.62 bpc (record r.json, runs/a) | test 2.700 bpc (record r.json, runs/a) |\n"
        "mean valid 2.614 ± 0.006 bpc (record r.json, runs/a + runs/b), and 1.47 nats published\n"
        "valid 1.629 bpc, test 1.214 nats (record not in the repository: NVIDIA H200, 2026-11-27)\n"
        "| 96% accurate (record not in the repository: a 2-core CPU, on or before 2026-11-26) |\n"
        "```\nvalid 9.999 bpc in a code block is not a figure\n```\n"
        "nor is `valid 9.999 bpc (record r.json, runs/a)`, an example inline\n"
    )
    assert figure_problems(page, records) == []


def test_a_figure_that_differs_from_its_record_is_named(records):
    page = "valid 1.816 nats (record r.json, runs/a); valid 2.614 ± 0.004 bpc (record r.json, runs/a + runs/b)"
    assert figure_problems(page, records) == [
        "valid 1.816 nats: the record (r.json, runs/a) gives valid 1.815 nats",
        "valid 2.614 ± 0.004 bpc: the record (r.json, runs/a + runs/b) gives valid 2.614 ± 0.006 bpc",
    ]


def test_a_figure_without_its_source_in_its_own_cell_is_named(records):
    page = "| valid 1.815 nats | (record r.json, runs/a) |\ntest 2.700 bpc\n"
    assert figure_problems(page, records) == [
        "valid 1.815 nats: no (record ...) after it",
        "(record r.json, runs/a): no figure before it",
        "test 2.700 bpc: no (record ...) after it",
    ]


def test_a_missing_record_run_or_score_and_an_undated_figure_are_named(records):
    page = (
        "valid 1.0 bpc (record gone.json, runs/a)\n"
        "valid 1.0 bpc (record r.json, runs/c)\n"
        "test 1.0 bpc (record r.json, runs/b)\n"
        "valid 1.0 bpc (record not in the repository: an H200)\n"
    )
    assert figure_problems(page, records) == [
        f"record gone.json: no such file in {records.name}/",
        "record r.json: no run runs/c",
        "test 1.0 bpc: test_bpc is null in r.json",
        "(record not in the repository: an H200): name the device and the date (YYYY-MM-DD)",
    ]
