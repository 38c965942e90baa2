"""`charlm score`: bits per character of any UTF-8 text (a file or stdin) under a checkpoint."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Optional

import typer

from charlm.cli.loading import CELL, CHECKPOINT, DATA_DIR, DEVICE, NO_CUDA_GRAPH, TRUST_CODE, load_model
from charlm.cli.options import dynamic_option, settings_options
from charlm.cli.output import print_table, stdout
from charlm.config_inference import DynamicOptions, ScoreConfig
from charlm.logs import ProgressBars
from charlm.settings import flag_of, validate
from charlm.errors import CharlmError
from charlm.files import WriteError, atomic_write_text, path_value, read_bytes


@settings_options(DynamicOptions, into="dyn")
@settings_options(ScoreConfig)
def score(
    checkpoint: str = CHECKPOINT,
    text_file: str = typer.Argument(..., metavar="FILE|-", help="UTF-8 text to score, or - for standard input."),
    per_char: Optional[str] = typer.Option(
        None,
        "--per-char",
        help="Write each predicted symbol's log-probability to this TSV file (- for stdout).",
        metavar="<path>",
    ),
    dynamic: Optional[str] = typer.Option(
        None,
        "--dynamic",
        callback=dynamic_option,
        help="Also score dynamically (sgd or rms, as in `charlm eval`); rms reads gradient statistics from the "
        "model's training split.",
    ),
    data_dir: Optional[str] = DATA_DIR,
    device: str = DEVICE,
    cell: Optional[str] = CELL,
    trust_code: bool = TRUST_CODE,
    no_cuda_graph: bool = NO_CUDA_GRAPH,
    given: dict = None,
    dyn: dict = None,
):
    """Bits per character and perplexity of a text, state carried through it."""
    from charlm.inference.dynamic_options import check_method

    config = ScoreConfig(**given)
    validate(config)
    check_method(dynamic, [flag_of(DynamicOptions, name) for name in dyn], purpose="scoring")
    dynamic_options = None if dynamic is None else DynamicOptions(method=dynamic, **dyn)
    if dynamic_options is not None:
        dynamic_options.validate()  # before the model is loaded, as eval does
    if per_char not in (None, "-"):  # before the scoring, not after it
        per_char = path_value(per_char, "--per-char")
    text = _read(text_file)
    model = load_model(checkpoint, device, cell, trust_code, no_cuda_graph)
    bars = ProgressBars("bits/token" if model.unit in ("subword", "word") else "bpc")
    static = model.score(
        text,
        per_char=per_char is not None and dynamic is None,
        unknown=config.unknown,
        batch_size=config.batch_size,
        progress=bars,
    )
    adapted = None
    if dynamic_options is not None:
        adapted = model.score(
            text,
            per_char=per_char is not None,
            unknown=config.unknown,
            dynamic=dynamic_options,
            batch_size=config.batch_size,
            data_dir=data_dir,
            progress=bars,
        )
    unit = {"byte": "bits per byte"}.get(model.unit, "bits per character")
    source = "standard input" if text_file == "-" else text_file
    stdout.print(f"checkpoint      {model.checkpoint.path}")
    skipped = f", {static.skipped:,} characters outside the vocabulary skipped" if static.skipped else ""
    stdout.print(f"text            {source} ({static.tokens:,} {model.unit} tokens scored{skipped})")
    stdout.print(f"bpc             {static.bpc:.4f} ({unit})")
    stdout.print(f"nats            {static.nats:.4f} (total)")
    stdout.print(f"perplexity      {static.perplexity:.4f} (per {model.unit} token)")
    if model.last_fast_path is not None:
        stdout.print(f"fast path       {model.last_fast_path.summary()}")
    if adapted is not None:
        print_table(
            None,
            ["mode", "bpc", f"perplexity (per {model.unit})"],
            [
                ["static", f"{static.bpc:.4f}", f"{static.perplexity:.4f}"],
                [f"dynamic {dynamic} (η={dynamic_options.lr:g})", f"{adapted.bpc:.4f}", f"{adapted.perplexity:.4f}"],
            ],
        )
    if per_char is not None:
        _write_per_char(per_char, adapted or static)


def _read(text_file: str) -> str:
    if text_file == "-":
        data = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode("utf-8")
        where = "standard input"
    else:
        path = path_value(text_file, "text file")
        data = read_bytes(path, "text file")
        where = f"text file {path}"
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise CharlmError(f"{where} is not UTF-8 text (byte {error.start})") from None


def _write_per_char(path: Path, result) -> None:
    rows = ["position\tsymbol\tlogprob\tbits"]
    for position, (symbol, log_prob) in enumerate(zip(result.symbols, result.log_probs), start=1):
        rows.append(f"{position}\t{_escape(symbol)}\t{log_prob:.6f}\t{-log_prob / math.log(2):.6f}")
    text = "\n".join(rows) + "\n"
    if str(path) == "-":
        sys.stdout.write(text)
        return
    try:
        atomic_write_text(path, text)
    except WriteError as error:  # exit 1 for a full disk, 2 for a missing directory
        raise WriteError(f"--per-char {path}", error.strerror, error.errno) from None
    stdout.print(f"per-character   {path} ({len(rows) - 1:,} rows: position, symbol, logprob in nats, bits)")


def _escape(symbol: str) -> str:
    return symbol.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


def register(app: typer.Typer) -> None:
    app.command()(score)
