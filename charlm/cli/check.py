"""`charlm check`: this machine's fast paths against the plain code, as a table; no corpus needed."""

from __future__ import annotations

import json
import sys
from typing import Optional
import time
from pathlib import Path

import typer

from charlm.cli.completion import complete_cell_lists
from charlm.cli.loading import DEVICE
from charlm.cli.output import print_table, stdout
from charlm.errors import CharlmError

FULL_CHECK_MINUTES = 8.0  # --budget's default


def check(
    device: str = DEVICE,
    cells: str = typer.Option(
        "all", "--cells", help="Comma-separated cells to check, or all.", autocompletion=complete_cell_lists
    ),
    precision: Optional[str] = typer.Option(
        None,
        "--precision",
        help="Comma-separated precisions whose layer types "
        "are checked (default: every one the device runs: fp32, bf16, fp16).",
    ),
    compile: bool = typer.Option(
        False,
        "--compile",
        help="Also check torch.compile of each cell's training "
        "forward against eager (compiles every cell: minutes on a CPU).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the rows as JSON instead of a table."),
    full: bool = typer.Option(
        False,
        "--full",
        help="Also run the cuda tests, the benchmark (fp32, bf16, bf16 "
        "with graphs, compiled; 10M parameters on a GPU) and a short training of each cell "
        "with and without graphs, within --budget; writes report.md and report.json to --out.",
    ),
    out: Optional[str] = typer.Option(
        None,
        "--out",
        help="--full: the directory of the report (default: charlm-check-DEVICE-TIME here); must be new or empty.",
    ),
    budget: Optional[float] = typer.Option(
        None,
        "--budget",
        show_default=False,
        help=f"--full: minutes for every step together (default: {FULL_CHECK_MINUTES:g}); a step that runs "
        "past its share of the time left is stopped and named.",
    ),
):
    """Check every cell's fast paths (training window, evaluation, sampling; CUDA graphs and compiled
    steps where they run) against its step equations and the eager code, on this device. Exits 1
    when a check fails. With --full: every check a GPU machine needs, in one report."""
    import torch

    from charlm.cells import CELLS
    from charlm.runtime.devices import resolve_device
    from charlm.runtime.precision import PRECISIONS, check_precision
    from charlm.tools.selfcheck import precisions_on, run_checks

    target = resolve_device(device)
    names = CELLS.names() if cells == "all" else [name.strip() for name in cells.split(",") if name.strip()]
    if not names:
        raise CharlmError("--cells names no cell")
    for name in names:
        CELLS.get(name)
    precisions = None
    if precision is not None:
        precisions = [name.strip() for name in precision.split(",") if name.strip()]
        if not precisions:  # not the default, every precision, by accident
            raise CharlmError("--precision names no precision")
        for name in precisions:
            if name not in PRECISIONS:
                raise CharlmError(f"--precision {name!r} is not one of fp32, bf16, fp16")
            check_precision(name, target)
    if full:
        if precisions is not None or compile:
            raise CharlmError(
                "--full checks every precision and compiles in its benchmark: leave out --precision and --compile"
            )
        return _full(target, names, out, FULL_CHECK_MINUTES if budget is None else budget, as_json)
    if out is not None:
        raise CharlmError("--out is where --full writes its report: give --full too")
    if budget is not None:
        raise CharlmError("--budget is the time --full takes: give --full too")
    progress = None if as_json else (lambda cell: print(f"check: {cell}", file=sys.stderr, flush=True))
    rows = run_checks(target, names, precisions or precisions_on(target), compile=compile, progress=progress)
    failures = sum(row.failed for row in rows)
    if as_json:
        print(
            json.dumps(
                {
                    "device": str(target),
                    "torch": torch.__version__,
                    "failures": failures,
                    "rows": [row.__dict__ for row in rows],
                },
                indent=2,
            )
        )
    else:
        print_table(
            f"charlm check on {target}: {failures} failure(s)",
            ["check", "result", "figure", "tolerance"],
            [[row.check, row.result, row.figure, row.tolerance] for row in rows],
            drop_order=("tolerance",),
            wrap=("check", "result", "figure", "tolerance"),
        )
        results = [row.result.split(":")[0] for row in rows]  # pass, fail, skipped (: why) or info
        stdout.print(", ".join(f"{results.count(result)} {result}" for result in ("pass", "fail", "skipped", "info")))
    if failures:
        raise typer.Exit(1)


def _full(target, names: list[str], out: Optional[str], budget: float, as_json: bool) -> None:
    from charlm.tools.full_check import FullCheck

    if not (0 < budget <= 24 * 60):
        raise CharlmError(f"--budget is {budget:g} minutes: give a positive number of minutes, at most a day")
    directory = Path(
        out if out is not None else f"charlm-check-{str(target).replace(':', '')}-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise CharlmError(f"--out {directory} already exists and is not an empty directory: give a new one")
    report = FullCheck(
        target, names, budget * 60, directory, progress=lambda message: print(message, file=sys.stderr, flush=True)
    ).run()
    if as_json:
        print(json.dumps(report, indent=1, default=str))
    else:
        print_table(
            f"charlm check --full on {target}: {len(report['failures'])} failure(s)",
            ["step", "status", "seconds", "found"],
            [[step["name"], step["status"], f"{step['seconds']:.0f}", step["detail"]] for step in report["steps"]],
            wrap=("status", "found"),
        )
        for failure in report["failures"]:
            print(f"failed: {failure}", file=sys.stderr)
        print(f"report: {directory / 'report.md'} and report.json")
    if report["failures"]:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command()(check)
