"""`charlm bench`: throughput of cells as a ratio against PyTorch's fused LSTM in the same run."""

from __future__ import annotations

import typer

from charlm.cli.output import print_table
from charlm.config import BenchmarkSettings

DEFAULTS = BenchmarkSettings()


def bench(
    cells: str = typer.Option("lstm,gru,lru", "--cells", help="Comma-separated cell names, or 'all'."),
    params: str = typer.Option("1M", "--params", help="Parameter budget every model is sized to."),
    layers: int = typer.Option(DEFAULTS.layers, "--layers", help="Recurrent layers."),
    vocab_size: int = typer.Option(DEFAULTS.vocab_size, "--vocab-size", help="Vocabulary size of the synthetic data."),
    batch_size: int = typer.Option(DEFAULTS.batch_size, "--batch-size", help="Streams per step."),
    bptt: int = typer.Option(DEFAULTS.bptt, "--bptt", help="Window length."),
    steps: int = typer.Option(DEFAULTS.steps, "--steps", help="Timed steps per measurement (after one warm-up)."),
    sample_length: int = typer.Option(DEFAULTS.sample_length, "--sample-length", help="Symbols drawn to time sampling."),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda."),
):
    """Measure training, evaluation and sampling throughput (characters per second)."""
    from charlm.benchmark import benchmark_cells
    from charlm.cells import CELLS
    from charlm.devices import resolve_device
    from charlm.model import parse_budget

    names = CELLS.names() if cells == "all" else [name.strip() for name in cells.split(",") if name.strip()]
    for name in names:
        CELLS.get(name)
    settings = BenchmarkSettings(
        budget=parse_budget(params), layers=layers, vocab_size=vocab_size, batch_size=batch_size, bptt=bptt,
        steps=steps, sample_length=sample_length, device=str(resolve_device(device)),
    )
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
    title = f"Throughput on {settings.device}, batch {batch_size} × bptt {bptt}, ~{params} parameters"
    print_table(title, ["model", "n", "params", "train chars/s", "× fused", "eval chars/s", "× fused", "sample chars/s"], rows)


def register(app: typer.Typer) -> None:
    app.command()(bench)
