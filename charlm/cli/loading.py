"""The options every command that reads a checkpoint shares, and loading through the facade."""

from __future__ import annotations

from typing import Optional

import typer

from charlm.cli.options import directory_flag, help_text
from charlm.config import TrainConfig
from charlm.logs import get_logger

CHECKPOINT = typer.Argument(..., help="A run directory (uses its best.pt), a checkpoint file or an exported model.")
DEVICE = typer.Option("auto", "--device", help=help_text(TrainConfig, "device"), show_default=False)
CELL = typer.Option(
    None,
    "--cell",
    help="Allow the checkpoint's own cell module:Class to be imported (a checkpoint never imports code unless you "
    "name it).",
)
TRUST_CODE = typer.Option(False, "--trust-code", help="Import whatever module:Class cell the checkpoint names.")
DATA_DIR = directory_flag("--data-dir", "Root of prepared corpora (default: the one used in training).")
NO_CUDA_GRAPH = typer.Option(
    False,
    "--no-cuda-graph",
    help="On a GPU, do not replay the model from CUDA graphs (each "
    "graph is checked against the eager model on first use; this turns them off, as "
    "CHARLM_NO_CUDA_GRAPHS=1 does for every command).",
)


def load_model(reference: str, device: str, cell: Optional[str], trust_code: bool, no_cuda_graph: bool = False):
    """The checkpoint through ``charlm.load``, with float32 products in float32 (no TensorFloat-32:
    the arithmetic training uses by default)."""
    from charlm.api import load
    from charlm.runtime.precision import set_tf32

    set_tf32(False)
    return load(
        reference, device=device, cells=[cell] if cell else [], trust_code=trust_code, cuda_graphs=not no_cuda_graph
    )


def warn_if_corpus_changed(model, command: str) -> None:
    """For the commands that do not read the corpus (sample, serve): a warning when the corpus the model
    trained on was prepared again and that version is gone; nothing when it is absent (a model copied
    to another machine samples without it)."""
    from charlm.corpora.catalog import CorpusChanged, TrainedOn, load_corpus
    from charlm.errors import CharlmError

    trained = model.checkpoint.train_config
    try:
        load_corpus(trained.corpus, trained.data_dir, trained_on=TrainedOn.of(model.checkpoint.provenance))
    except CorpusChanged as changed:
        get_logger().warning(
            f"warning: corpus {changed.name!r} was prepared again since {model.checkpoint.path} trained on it, "
            f"and that version is not kept: {command} uses the model's own vocabulary and is unaffected, "
            "but its scores on the corpus are refused"
        )
    except CharlmError:
        pass
