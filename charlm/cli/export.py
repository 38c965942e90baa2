"""`charlm export`: a slim inference file (weights, configs, vocabulary), loadable everywhere, as a
charlm checkpoint or a safetensors file (``charlm.checkpoint_safetensors``); or
the model's one-symbol step as TorchScript or ONNX, with a JSON description beside it, for running
the model without charlm (``charlm.inference.export_step``)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from charlm.cli.loading import CELL, CHECKPOINT, TRUST_CODE, load_model
from charlm.cli.output import stdout
from charlm.errors import CharlmError
from charlm.inference.export_formats import FORMATS, STEP_FORMATS, check_available, description_path
from charlm.files import atomic_write, path_value

FORMAT_HELP = escape(
    f"One of: {', '.join(FORMATS)}. charlm: a slim checkpoint for charlm.load, eval, sample, score. "
    "safetensors (needs charlm[safetensors]): the same, as a safetensors file any safetensors reader loads, "
    "the settings and vocabulary as JSON in its metadata. torchscript or onnx (needs "
    "charlm[onnx]): the one-symbol step (tokens, state) -> (logits, new state) for use without "
    "charlm, checked against charlm's step, with OUTPUT.json describing it. Default: safetensors for "
    "an OUTPUT named *.safetensors, else charlm."
)  # help is rich markup


def export(
    checkpoint: str = CHECKPOINT,
    output: str = typer.Argument(..., help="File to write (for example model.pt or model.safetensors)."),
    cell: Optional[str] = CELL,
    trust_code: bool = TRUST_CODE,
    force: bool = typer.Option(False, "--force", help="Replace OUTPUT if it exists."),
    format: Optional[str] = typer.Option(None, "--format", help=FORMAT_HELP, show_default=False),
):
    """Write the model without optimizer, RNG or carried state: for `charlm.load`, eval, sample, score
    (--format charlm or safetensors); or (--format torchscript|onnx) its inference step, to run outside charlm."""
    output = path_value(output, "OUTPUT")
    if format is None:
        format = "safetensors" if output.suffix.lower() == ".safetensors" else "charlm"
    check_available(format)  # an unknown format, or a format without its packages: before any work
    if output.is_dir():
        raise CharlmError(f"{output} is a directory: give a file name such as {output / 'model.pt'}")
    if not output.parent.is_dir():
        raise CharlmError(f"cannot write {output}: the directory {output.parent} does not exist")
    model = load_model(checkpoint, "cpu", cell, trust_code)
    source = model.checkpoint.path
    if output.resolve() == source.resolve():
        raise CharlmError(f"{output} is the checkpoint being exported: give another file name")
    sidecar = description_path(output) if format in STEP_FORMATS else None
    for target in (output, sidecar):
        if target is not None and target.exists() and not force:
            raise CharlmError(f"{target} exists: pass --force to replace it, or give another file name")
    if format in STEP_FORMATS:
        return export_step(model, output, format)
    if format == "safetensors":
        from charlm.checkpoint_safetensors import encode

        data = encode(model.checkpoint)
        atomic_write(output, lambda temporary: temporary.write_bytes(data))
    else:
        model.export(output)
    before, after = source.stat().st_size, output.stat().st_size
    kind = "safetensors, " if format == "safetensors" else ""
    stdout.print(
        f"exported        {output} ({kind}{after:,} bytes; {source} is {before:,} bytes, {after / before:.0%} of it)"
    )
    stdout.print(
        f"model           {model.config.cell}, {model.config.layers}×{model.config.hidden_size}, "
        f"{model.parameters_count:,} parameters, vocabulary {len(model.vocabulary)}"
    )


def export_step(model, output: Path, format: str) -> None:
    """The step as TorchScript or ONNX, kept only if it computes charlm's step; then its description."""
    from charlm.inference.export_step import CHECK_BATCH, CHECK_STEPS, TOLERANCE, write_description, write_step

    differences = []
    atomic_write(output, lambda temporary: differences.append(write_step(model.network, temporary, format)))
    written = write_description(model, format, output)
    stdout.print(
        f"exported        {output} ({format}, {output.stat().st_size:,} bytes): the step "
        f"(tokens, state) -> (logits, new state)"
    )
    stdout.print(
        f"checked         max difference from charlm's step {differences[0]:.2e} over {CHECK_STEPS} steps "
        f"carrying state (batch {CHECK_BATCH}; at most {TOLERANCE:g})"
    )
    stdout.print(f"described in    {', '.join(str(path) for path in written)}")


def register(app: typer.Typer) -> None:
    app.command()(export)
