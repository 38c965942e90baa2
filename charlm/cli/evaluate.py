"""`charlm eval`: bits per character and perplexity of a checkpoint on a split."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from charlm.cli.output import stdout
from charlm.errors import CharlmError


def evaluate(
    checkpoint: Path = typer.Argument(..., help="A run directory (uses its best.pt) or a checkpoint file."),
    split: str = typer.Option("test", "--split", help="valid or test."),
    batch_size: int = typer.Option(16, "--batch-size", help="Parallel streams; every symbol is scored once whatever the value."),
    bptt: Optional[int] = typer.Option(None, "--bptt", help="Window length [default: the training bptt]."),
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="Root of prepared corpora [default: the one used in training]."),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda."),
):
    """Report bits per character and perplexity over a whole split, state carried across windows."""
    from tqdm import tqdm

    from charlm.evaluation import corpus_for_checkpoint, score_split
    from charlm.runs import RunDirectory
    from charlm.sampling import load_model

    if split not in ("valid", "test", "train"):
        raise CharlmError(f"--split must be valid or test, not {split!r}")
    model, _, payload = load_model(str(checkpoint), device)
    corpus = corpus_for_checkpoint(payload, data_dir)
    window = bptt or payload["config"]["bptt"]
    device_used = next(model.parameters()).device
    with tqdm(total=corpus.tokens(split), desc=f"eval {split}", unit="tok", unit_scale=True, leave=False, disable=None) as bar:
        score = score_split(model, corpus, split, batch_size=batch_size, bptt=window, device=device_used, progress=bar.update)
    unit = "bits per byte" if corpus.unit == "byte" else "bits per character"
    stdout.print(f"checkpoint      {payload['path']}")
    stdout.print(f"split           {corpus.name} {split} ({score.tokens:,} {corpus.unit} tokens scored)")
    stdout.print(f"bpc             {score.bpc:.4f} ({unit})")
    if corpus.unit == "subword":
        stdout.print(f"nll per token   {score.loss:.4f} nats")
    stdout.print(f"perplexity      {score.perplexity:.4f} (per {corpus.unit} token)")
    run = RunDirectory(Path(payload["path"]).parent)
    if run.metrics.exists():
        run.record("eval", checkpoint=payload["path"], split=split, mode="static", **score.as_dict())


def register(app: typer.Typer) -> None:
    app.command(name="eval")(evaluate)
