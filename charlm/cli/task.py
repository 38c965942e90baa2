"""`charlm task`: train a network on one of the Grid LSTM paper's algorithmic tasks."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional
import time

import typer
from rich.markup import escape

from charlm.cli.completion import complete_cells
from charlm.cli.options import help_text
from charlm.errors import CharlmError
from charlm.tasks.config import TaskConfig
from charlm.cli.output import stdout


def _help(name: str) -> str:
    """The help of an option: its setting's, with the bounds and the default (per task where the paper's differ)."""
    return help_text(TaskConfig, name)


def task(
    name: Optional[str] = typer.Argument(None, help="memorization, addition or parity (not with --resume)."),
    cell: str = typer.Option(
        "grid-lstm", "--cell", help=_help("cell"), show_default=False, autocompletion=complete_cells
    ),
    layers: int = typer.Option(1, "--layers", help=_help("layers"), show_default=False),
    tied: Optional[bool] = typer.Option(None, "--tied/--untied", help=_help("tied")),
    cell_opt: Optional[List[str]] = typer.Option(None, "--cell-opt", help="Cell option key=value (repeatable)."),
    length: Optional[int] = typer.Option(None, "--length", help=_help("length")),
    symbols: Optional[int] = typer.Option(None, "--symbols", help=_help("symbols")),
    digits: Optional[int] = typer.Option(None, "--digits", help=_help("digits")),
    bits: Optional[int] = typer.Option(None, "--bits", help=_help("bits")),
    hidden_size: Optional[int] = typer.Option(None, "--hidden", "--hidden-size", help=_help("hidden_size")),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", help=_help("batch_size")),
    optimizer: Optional[str] = typer.Option(None, "--optimizer", help=_help("optimizer")),
    lr: Optional[float] = typer.Option(None, "--lr", help=_help("lr")),
    clip: Optional[float] = typer.Option(None, "--clip", help=_help("clip")),
    max_samples: Optional[int] = typer.Option(None, "--max-samples", help=_help("max_samples")),
    eval_every: int = typer.Option(10_000, "--eval-every", help=_help("eval_every"), show_default=False),
    eval_samples: int = typer.Option(100, "--eval-samples", help=_help("eval_samples"), show_default=False),
    seed: int = typer.Option(1, "--seed", help=_help("seed"), show_default=False),
    device: str = typer.Option("auto", "--device", help=_help("device"), show_default=False),
    wavefront: bool = typer.Option(True, "--wavefront/--no-wavefront", help=_help("wavefront"), show_default=False),
    run_dir: Optional[str] = typer.Option(
        None, "--run-dir", help=escape("Where the run goes (default: runs/TASK-CELL-LAYERSx-TIME)."), metavar="<path>"
    ),
    resume: Optional[str] = typer.Option(
        None, "--resume", help="Continue the run in this directory.", metavar="<path>"
    ),
):
    """Train on memorization, addition or parity until 100% held-out accuracy or --max-samples; prints the
    samples at which 50/80/99/100% were first exceeded."""
    from charlm.cells import parse_key_values
    from charlm.tasks.training import train_task

    if resume is not None:
        if name is not None:
            raise CharlmError("--resume continues a run with its own task: drop the task name")
        end = train_task(run_dir=resume, resume=True, max_samples=max_samples)
    else:
        if name is None:
            raise CharlmError("name a task: memorization, addition or parity (or --resume RUN)")
        config = TaskConfig(
            task=name,
            cell=cell,
            layers=layers,
            tied=tied,
            cell_options=parse_key_values(cell_opt or []),
            length=length,
            symbols=symbols,
            digits=digits,
            bits=bits,
            hidden_size=hidden_size,
            batch_size=batch_size,
            optimizer=optimizer,
            lr=lr,
            clip=clip,
            max_samples=max_samples,
            eval_every=eval_every,
            eval_samples=eval_samples,
            seed=seed,
            device=device,
            wavefront=wavefront,
        )
        if run_dir is None:
            run_dir = Path("runs") / f"{name}-{cell}-{layers}x-{time.strftime('%Y%m%d-%H%M%S')}"
        end = train_task(config, run_dir=run_dir)
    reached = (
        ", ".join(
            f">{float(key):.0%} at {value:,}" if float(key) < 1 else f"100% at {value:,}"
            for key, value in end["reached"].items()
        )
        or "no threshold"
    )
    why = STOPPED_BY.get(end["stopped_by"], f"stopped ({end['stopped_by']})")
    stdout.print(
        f"{end['run_dir']}: {why} after {end['samples']:,} samples; held-out accuracy "
        f"{end['accuracy']:.2%} (sequences {end['sequence_accuracy']:.2%}); {reached}",
        highlight=False,
    )


STOPPED_BY = {"solved": "solved", "samples": "stopped at --max-samples"}  # why a run ended, in the last line


def register(app: typer.Typer) -> None:
    app.command()(task)
