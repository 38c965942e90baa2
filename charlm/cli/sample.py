"""`charlm sample`: stream generated text to stdout."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from charlm.cli.loading import CELL, CHECKPOINT, DEVICE, NO_CUDA_GRAPH, TRUST_CODE, load_model
from charlm.cli.options import settings_options
from charlm.config import SampleConfig
from charlm.errors import CharlmError
from charlm.files import read_text
from charlm.logs import get_logger


@settings_options(SampleConfig)
def sample(
    checkpoint: Path = CHECKPOINT,
    prime: Optional[str] = typer.Option(None, "--prime", help="Text to start from (default: a line break)."),
    prime_file: Optional[Path] = typer.Option(None, "--prime-file", help="Read the prime text from this UTF-8 file."),
    device: str = DEVICE,
    cell: Optional[str] = CELL,
    trust_code: bool = TRUST_CODE,
    no_cuda_graph: bool = NO_CUDA_GRAPH,
    given: dict = None,
):
    """Generate text from a checkpoint, streamed as it is drawn."""
    if prime is not None and prime_file is not None:
        raise CharlmError("give --prime or --prime-file, not both")
    if prime_file is not None:
        prime = read_text(prime_file, "prime file")
    config = SampleConfig(**given)
    model = load_model(checkpoint, device, cell, trust_code, no_cuda_graph)
    base_seed = config.seed
    if base_seed is None:  # draw one, and say it, so that the text can be drawn again
        import random

        base_seed = random.SystemRandom().randrange(2**31)
        get_logger().info(f"seed {base_seed} (pass --seed {base_seed} to draw the same text again)")
    for index in range(config.num_samples):
        seed = base_seed + index
        # stream() checks the settings and the prime: nothing is written before they pass
        pieces = model.stream(prime, config.length, config.temperature, config.top_k, config.top_p, seed)
        if index:
            _write("\n\n")
        _write(model.sample(prime, length=0) if prime is None else prime)
        for piece in pieces:
            _write(piece)
    _write("\n")


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def register(app: typer.Typer) -> None:
    app.command()(sample)
