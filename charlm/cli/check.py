"""`charlm check`: this machine's fast paths against the plain code, as a table; no corpus needed."""

from __future__ import annotations

import json
import sys
from typing import Optional

import typer

from charlm.cli.loading import DEVICE
from charlm.cli.output import print_table


def check(
    device: str = DEVICE,
    cells: str = typer.Option("all", "--cells", help="Comma-separated cells to check, or all."),
    precision: Optional[str] = typer.Option(None, "--precision", help="Comma-separated precisions whose layer types "
                                            "are checked (default: every one the device runs: fp32, bf16, fp16)."),
    compile: bool = typer.Option(False, "--compile", help="Also check torch.compile of each cell's training "
                                 "forward against eager (compiles every cell: minutes on a CPU)."),
    as_json: bool = typer.Option(False, "--json", help="Print the rows as JSON instead of a table."),
):
    """Check every cell's fast paths (training window, evaluation, sampling; CUDA graphs and compiled
    steps where they run) against its step equations and the eager code, on this device. Exits 1
    when a check fails."""
    import torch

    from charlm.cells import CELLS
    from charlm.errors import CharlmError
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
    progress = None if as_json else (lambda cell: print(f"check: {cell}", file=sys.stderr, flush=True))
    rows = run_checks(target, names, precisions or precisions_on(target), compile=compile, progress=progress)
    failures = sum(row.failed for row in rows)
    if as_json:
        print(json.dumps({"device": str(target), "torch": torch.__version__, "failures": failures,
                          "rows": [row.__dict__ for row in rows]}, indent=2))
    else:
        print_table(f"charlm check on {target}: {failures} failure(s)", ["check", "result", "figure", "tolerance"],
                    [[row.check, row.result, row.figure, row.tolerance] for row in rows])
    if failures:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command()(check)
