"""`charlm task`: train a network on one of the Grid LSTM paper's algorithmic tasks."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from charlm.errors import CharlmError


def task(
    name: Optional[str] = typer.Argument(None, help="memorization, addition or parity (not with --resume)."),
    cell: str = typer.Option("grid-lstm", "--cell", help="A registered cell stacked --layers deep; for parity grid-lstm (the 1-D Grid LSTM), relu or tanh."),
    layers: int = typer.Option(1, "--layers", help="Depth."),
    tied: Optional[bool] = typer.Option(None, "--tied/--untied", help="The same weights at every layer (default: grid-lstm tied, other cells untied)."),
    cell_opt: Optional[List[str]] = typer.Option(None, "--cell-opt", help="Cell option key=value (repeatable)."),
    length: Optional[int] = typer.Option(None, "--length", help="memorization: symbols per sequence [20]."),
    symbols: Optional[int] = typer.Option(None, "--symbols", help="memorization: vocabulary [64]."),
    digits: Optional[int] = typer.Option(None, "--digits", help="addition: digits per number [15]."),
    bits: Optional[int] = typer.Option(None, "--bits", help="parity: bits per string [50]."),
    hidden_size: Optional[int] = typer.Option(None, "--hidden-size", help="Units per layer [the paper's: 100, 400, 500]."),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", help="Samples per step [15; parity 20]."),
    optimizer: Optional[str] = typer.Option(None, "--optimizer", help="adam, adagrad or sgd [adam; parity adagrad]."),
    lr: Optional[float] = typer.Option(None, "--lr", help="Learning rate [1e-3; parity 0.06]."),
    clip: Optional[float] = typer.Option(None, "--clip", help="Clip the gradient norm (the paper clips nothing)."),
    max_samples: Optional[int] = typer.Option(None, "--max-samples", help="Training samples at most [5M; parity 10M]; raise it to resume a run that used its budget."),
    eval_every: int = typer.Option(10_000, "--eval-every", help="Score the held-out samples every this many training samples."),
    eval_samples: int = typer.Option(100, "--eval-samples", help="Held-out samples (the paper: 100)."),
    seed: int = typer.Option(1, "--seed", help="Seeds the weights and both sample streams."),
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda, cuda:N or mps."),
    wavefront: bool = typer.Option(True, "--wavefront/--no-wavefront", help="Run a tied stack one anti-diagonal of time × depth at a time (checked against the layer-by-layer code at the start)."),
    run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="Where the run goes [runs/TASK-CELL-Lx-TIME]."),
    resume: Optional[Path] = typer.Option(None, "--resume", help="Continue the run in this directory."),
):
    """Train on memorization, addition or parity until 100% held-out accuracy or --max-samples; prints the
    samples at which 50/80/99/100% were first exceeded."""
    import time

    from charlm.cells import parse_key_values
    from charlm.cli.output import stdout
    from charlm.tasks.training import TaskConfig, train_task

    if resume is not None:
        if name is not None:
            raise CharlmError("--resume continues a run with its own task: drop the task name")
        end = train_task(run_dir=resume, resume=True, max_samples=max_samples)
    else:
        if name is None:
            raise CharlmError("name a task: memorization, addition or parity (or --resume RUN)")
        config = TaskConfig(task=name, cell=cell, layers=layers, tied=tied, cell_options=parse_key_values(cell_opt or []),
                            length=length, symbols=symbols, digits=digits, bits=bits, hidden_size=hidden_size,
                            batch_size=batch_size, optimizer=optimizer, lr=lr, clip=clip, max_samples=max_samples,
                            eval_every=eval_every, eval_samples=eval_samples, seed=seed, device=device,
                            wavefront=wavefront)
        target = run_dir or Path("runs") / f"{name}-{cell}-{layers}x-{time.strftime('%Y%m%d-%H%M%S')}"
        end = train_task(config, run_dir=target)
    reached = ", ".join(f">{float(key):.0%} at {value:,}" if float(key) < 1 else f"100% at {value:,}"
                        for key, value in end["reached"].items()) or "no threshold"
    stdout.print(f"{end['run_dir']}: {end['stopped_by']} after {end['samples']:,} samples; held-out accuracy "
                 f"{end['accuracy']:.2%} (sequences {end['sequence_accuracy']:.2%}); {reached}", highlight=False)


def register(app: typer.Typer) -> None:
    app.command()(task)
