"""The options every command that reads a checkpoint shares, and loading through the facade."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from charlm.cli.options import directory_option, help_text
from charlm.config import TrainConfig

CHECKPOINT = typer.Argument(..., help="A run directory (uses its best.pt), a checkpoint file or an exported model.")
DEVICE = typer.Option("auto", "--device", help=help_text(TrainConfig, "device"), show_default=False)
CELL = typer.Option(
    None,
    "--cell",
    help="Allow the checkpoint's own cell module:Class to be imported (a checkpoint never imports code unless you "
    "name it).",
)
TRUST_CODE = typer.Option(False, "--trust-code", help="Import whatever module:Class cell the checkpoint names.")
DATA_DIR = typer.Option(
    None, "--data-dir", callback=directory_option, help="Root of prepared corpora (default: the one used in training)."
)
NO_CUDA_GRAPH = typer.Option(
    False,
    "--no-cuda-graph",
    help="On a GPU, do not replay the model from CUDA graphs (each "
    "graph is checked against the eager model on first use; this turns them off, as "
    "CHARLM_NO_CUDA_GRAPHS=1 does for every command).",
)


def load_model(reference: Path, device: str, cell: Optional[str], trust_code: bool, no_cuda_graph: bool = False):
    """The checkpoint through ``charlm.load``, with float32 products in float32 (no TensorFloat-32:
    the arithmetic training uses by default)."""
    from charlm.api import load
    from charlm.runtime.precision import set_tf32

    set_tf32(False)
    return load(
        reference, device=device, cells=[cell] if cell else [], trust_code=trust_code, cuda_graphs=not no_cuda_graph
    )
