"""`charlm bench`: throughput of cells as a ratio against PyTorch's fused LSTM in the same run."""

from __future__ import annotations

import dataclasses

import typer

from charlm.cli.options import settings_options
from charlm.cli.output import print_table
from charlm.config import BenchmarkSettings


@settings_options(BenchmarkSettings)
def bench(given: dict = None):
    """Measure training, evaluation and sampling throughput (characters per second)."""
    from charlm.benchmark import benchmark_cells
    from charlm.cells import CELLS
    from charlm.config import validate
    from charlm.devices import resolve_device
    from charlm.model import parse_budget

    settings = BenchmarkSettings(**given)
    validate(settings)
    names = CELLS.names() if settings.cells == "all" else [name.strip() for name in settings.cells.split(",") if name.strip()]
    for name in names:
        CELLS.get(name)
    parse_budget(settings.params)
    settings = dataclasses.replace(settings, device=str(resolve_device(settings.device)))
    results = benchmark_cells(names, settings)
    baseline = results[0]
    rows = []
    for result in results:
        rows.append([
            result.name,
            str(result.hidden_size),
            f"{result.parameters:,}",
            f"{result.train_chars_per_second:,.0f}",
            f"{result.train_chars_per_second / baseline.train_chars_per_second:.2f}",
            f"{result.eval_chars_per_second:,.0f}",
            f"{result.eval_chars_per_second / baseline.eval_chars_per_second:.2f}",
            "-" if result.sample_chars_per_second is None else f"{result.sample_chars_per_second:,.0f}",
        ])
    title = f"Throughput on {settings.device}, batch {settings.batch_size} × bptt {settings.bptt}, ~{settings.params} parameters"
    print_table(title, ["model", "n", "params", "train chars/s", "× fused", "eval chars/s", "× fused", "sample chars/s"], rows)


def register(app: typer.Typer) -> None:
    app.command()(bench)
