"""`charlm train`: parse options into a TrainConfig, run the trainer, print the result."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from charlm.cli.output import print_summary
from charlm.config import TrainConfig, read_config_file

DEFAULTS = TrainConfig()


def _default(name: str) -> str:
    return f" (default: {getattr(DEFAULTS, name)})"


def train(
    corpus: Optional[str] = typer.Option(None, "--corpus", help="Prepared corpus to train on (see `charlm corpora`)." + _default("corpus")),
    cell: Optional[str] = typer.Option(None, "--cell", help="Recurrent cell (see `charlm cells`), or module:Class for your own." + _default("cell")),
    layers: Optional[int] = typer.Option(None, "--layers", help="Number of stacked recurrent layers." + _default("layers")),
    hidden: Optional[int] = typer.Option(None, "--hidden", help="Hidden size n (256 when neither --hidden nor --params is given)."),
    params: Optional[str] = typer.Option(None, "--params", help="Parameter budget such as 1M or 2.5e6: chooses the hidden size whose total count is closest."),
    embed_size: Optional[int] = typer.Option(None, "--embed-size", help="Embedding width (default: what the cell needs, else n; 0 feeds one-hot symbols)."),
    dropout: Optional[float] = typer.Option(None, "--dropout", help="Dropout between layers and on the softmax input." + _default("dropout")),
    cell_opt: Optional[List[str]] = typer.Option(None, "--cell-opt", help="Cell option key=value (repeatable), e.g. --cell-opt peephole=true."),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", help="Parallel streams per step." + _default("batch_size")),
    bptt: Optional[int] = typer.Option(None, "--bptt", help="Truncated backpropagation window (steps)." + _default("bptt")),
    lr: Optional[float] = typer.Option(None, "--lr", help="Adam learning rate." + _default("lr")),
    lr_decay: Optional[float] = typer.Option(None, "--lr-decay", help="Learning rate factor applied after every epoch." + _default("lr_decay")),
    epochs: Optional[int] = typer.Option(None, "--epochs", help="Maximum number of epochs (with --resume: the new total)." + _default("epochs")),
    patience: Optional[int] = typer.Option(None, "--patience", help="Stop after this many epochs without a better validation bpc." + _default("patience")),
    clip: Optional[float] = typer.Option(None, "--clip", help="Gradient-norm clipping threshold, 0 for none." + _default("clip")),
    seed: Optional[int] = typer.Option(None, "--seed", help="Random seed (initialisation, dropout)." + _default("seed")),
    device: Optional[str] = typer.Option(None, "--device", help="auto, cpu or cuda." + _default("device")),
    train_fraction: Optional[float] = typer.Option(None, "--train-fraction", help="Train on this leading fraction of the training split (0.2, 0.4, ...)." + _default("train_fraction")),
    eval_batch_size: Optional[int] = typer.Option(None, "--eval-batch-size", help="Streams used to score validation/test." + _default("eval_batch_size")),
    eval_every: Optional[int] = typer.Option(None, "--eval-every", help="Also score validation every K steps (0: epoch ends only)." + _default("eval_every")),
    log_every: Optional[int] = typer.Option(None, "--log-every", help="Write a step record to metrics.jsonl every K steps." + _default("log_every")),
    max_minutes: Optional[float] = typer.Option(None, "--max-minutes", help="Stop training after this many minutes (the run is evaluated and resumable)."),
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="Root of prepared corpora (default: $CHARLM_DATA or ./data)."),
    run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="Where to write checkpoints and metrics (default: runs/CORPUS-CELL-TIME)."),
    resume: Optional[Path] = typer.Option(None, "--resume", help="Continue the run in this directory from its last checkpoint."),
    init_from: Optional[Path] = typer.Option(None, "--init-from", help="Start from this checkpoint's weights (fine-tuning)."),
    config: Optional[Path] = typer.Option(None, "--config", help="JSON file of settings (keys as the options, e.g. \"cell_options\"); options given here win."),
):
    """Train a recurrent language model with truncated BPTT; keeps best.pt and last.pt."""
    from charlm.cells import parse_key_values
    from charlm.training import Trainer, resume_training

    if resume is not None:
        trainer = resume_training(str(resume), epochs=epochs, max_minutes=max_minutes)
    else:
        settings = read_config_file(config) if config else {}
        given = {
            "corpus": corpus, "cell": cell, "layers": layers, "hidden": hidden, "params": params,
            "embed_size": embed_size, "dropout": dropout, "batch_size": batch_size, "bptt": bptt, "lr": lr,
            "lr_decay": lr_decay, "epochs": epochs, "patience": patience, "clip": clip, "seed": seed,
            "device": device, "train_fraction": train_fraction, "eval_batch_size": eval_batch_size,
            "eval_every": eval_every, "log_every": log_every, "max_minutes": max_minutes,
            "data_dir": str(data_dir) if data_dir else None, "run_dir": str(run_dir) if run_dir else None,
            "init_from": str(init_from) if init_from else None,
        }
        settings.update({key: value for key, value in given.items() if value is not None})
        if cell_opt:
            settings["cell_options"] = {**settings.get("cell_options", {}), **parse_key_values(cell_opt)}
        trainer = Trainer(TrainConfig.from_dict(settings))
    print_summary(trainer.fit())


def register(app: typer.Typer) -> None:
    app.command()(train)


__all__ = ["register", "train"]
