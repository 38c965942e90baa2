"""`charlm sample`: stream generated text to stdout."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from charlm.errors import CharlmError


def sample(
    checkpoint: Path = typer.Argument(..., help="A run directory (uses its best.pt) or a checkpoint file."),
    prime: Optional[str] = typer.Option(None, "--prime", help="Text to start from (default: a line break)."),
    prime_file: Optional[Path] = typer.Option(None, "--prime-file", help="Read the prime text from this UTF-8 file."),
    length: int = typer.Option(500, "--length", help="Symbols (tokens) to generate per sample."),
    temperature: float = typer.Option(1.0, "--temperature", help="Softmax temperature: below 1 is more conservative."),
    top_k: int = typer.Option(0, "--top-k", help="Draw only from the k most likely symbols (0: off)."),
    top_p: float = typer.Option(1.0, "--top-p", help="Draw only from the smallest set with this much probability (1: off)."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Random seed: the same seed gives the same text."),
    num_samples: int = typer.Option(1, "--num-samples", help="How many samples to draw (separated by a blank line)."),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda."),
):
    """Generate text from a checkpoint, streamed as it is drawn."""
    from charlm.sampling import SamplingOptions, encode_prime, generate, load_model, stream_text, unknown_ids

    if prime is not None and prime_file is not None:
        raise CharlmError("give --prime or --prime-file, not both")
    if num_samples < 1:
        raise CharlmError("--num-samples must be at least 1")
    if prime_file is not None:
        try:
            prime = prime_file.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise CharlmError(f"prime file {prime_file} does not exist") from None
        except UnicodeDecodeError:
            raise CharlmError(f"prime file {prime_file} is not UTF-8 text") from None
    model, tokenizer, _ = load_model(str(checkpoint), device)
    if prime is None:
        prime_ids = tokenizer.encode("\n") if "\n" in tokenizer.vocab else [0]
        prime_text = tokenizer.decode(prime_ids)
    else:
        prime_ids = encode_prime(tokenizer, prime)
        prime_text = prime
    options = SamplingOptions(length=length, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    options.validate()

    def write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    for index in range(num_samples):
        if index:
            write("\n\n")
            if options.seed is not None:
                options.seed += 1
        write(prime_text)
        stream_text(tokenizer, generate(model, prime_ids, options, unknown_ids(tokenizer)), write)
    write("\n")


def register(app: typer.Typer) -> None:
    app.command()(sample)
