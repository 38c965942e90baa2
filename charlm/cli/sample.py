"""`charlm sample`: stream generated text to stdout."""

from __future__ import annotations

import sys
from typing import Optional
import random

import typer

from charlm.cli.loading import CELL, CHECKPOINT, DEVICE, NO_CUDA_GRAPH, TRUST_CODE, load_model, warn_if_corpus_changed
from charlm.cli.options import settings_options
from charlm.config_inference import SampleConfig
from charlm.settings import validate
from charlm.errors import CharlmError
from charlm.files import read_text
from charlm.logs import get_logger


@settings_options(SampleConfig)
def sample(
    checkpoint: str = CHECKPOINT,
    prime: Optional[str] = typer.Option(None, "--prime", help="Text to start from (default: a line break)."),
    prime_file: Optional[str] = typer.Option(
        None,
        "--prime-file",
        help="Read the prime text from this UTF-8 file (-: from standard input).",
        metavar="<path>",
    ),
    logprob: bool = typer.Option(
        False,
        "--logprob",
        help="Print on stderr, per sample, the log probability of the "
        "generated text given the prime (natural log and bits; under the model itself, "
        "whatever the temperature or filters) and its bits per symbol.",
    ),
    device: str = DEVICE,
    cell: Optional[str] = CELL,
    trust_code: bool = TRUST_CODE,
    no_cuda_graph: bool = NO_CUDA_GRAPH,
    given: dict = None,
):
    """Generate text from a checkpoint, streamed as it is drawn."""
    from charlm.inference.beam import check_beam_settings

    if prime is not None and prime_file is not None:
        raise CharlmError("give --prime or --prime-file, not both")
    if prime_file is not None:
        prime = _read_prime(prime_file)
    config = SampleConfig(**given)
    validate(config)
    check_beam_settings(config)
    model = load_model(checkpoint, device, cell, trust_code, no_cuda_graph)
    warn_if_corpus_changed(model, "sampling")
    base_seed = config.seed
    if base_seed is None and not config.beam and config.temperature:  # draw one, say it: the text can be drawn again
        base_seed = random.SystemRandom().randrange(2**31)
        get_logger().info(f"seed {base_seed} (pass --seed {base_seed} to draw the same text again)")
    for index in range(config.num_samples):
        seed = None if base_seed is None else base_seed + index
        # stream() checks the settings and the prime: nothing is written before they pass
        pieces = model.stream(
            prime,
            config.length,
            config.temperature,
            config.top_k,
            config.top_p,
            seed,
            stop=config.stop,
            beam=config.beam,
            length_penalty=config.length_penalty,
        )
        if index:
            _write("\n")  # a blank line between samples
        _write(model.sample(prime, length=0) if prime is None else prime)
        for piece in pieces:
            _write(piece)
        _write("\n")  # before the log probability, so that the two never share a line where stderr joins stdout
        if logprob:
            _report_log_prob(pieces, f"sample {index + 1}: " if config.num_samples > 1 else "")


def _report_log_prob(generation, which: str) -> None:
    """One line on stderr, after the sample's last line."""
    sys.stderr.write(
        f"{which}log probability {generation.log_prob:.4f} nats = {generation.log2_prob:.4f} bits "
        f"over {len(generation.ids)} symbols ({generation.bits_per_symbol:.4f} bits per symbol)\n"
    )
    sys.stderr.flush()


def _read_prime(prime_file: str) -> str:
    """The prime file's text; ``-`` reads standard input."""
    if prime_file != "-":
        return read_text(prime_file, "prime file")
    data = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode("utf-8")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise CharlmError(f"the prime on standard input is not UTF-8 text (byte {error.start})") from None


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def register(app: typer.Typer) -> None:
    app.command()(sample)
