"""The settings of the tools: the benchmark (``BenchmarkConfig``), the demo (``DemoConfig``), the
defaults of ``charlm prepare`` that are not a recipe's own (``PrepareConfig``) and what ``charlm runs
--prune`` keeps (``PruneConfig``), as in ``charlm.config``.
"""

from __future__ import annotations

import dataclasses

from charlm.config import MAX_LAYERS
from charlm.settings import setting


@dataclasses.dataclass
class BenchmarkConfig:
    """`charlm bench`: models sized to one budget, timed on synthetic data."""

    cells: str = setting("lstm,gru,lru", "Comma-separated cell names, or 'all'.")
    params: str = setting("1M", "Parameter budget every model is sized to.")
    layers: int = setting(1, "Recurrent layers.", min=1, max=MAX_LAYERS)
    vocab_size: int = setting(82, "Vocabulary size of the synthetic data.", min=2)
    batch_size: int = setting(250, "Streams per step.", min=1)
    bptt: int = setting(50, "Window length.", min=1)
    steps: int = setting(5, "Timed steps per measurement (after one warm-up).", min=1)
    repeat: int = setting(3, "Interleaved rounds; figures are medians over rounds, with their spread.", min=1)
    sample_length: int = setting(200, "Symbols drawn to time sampling.", min=1)
    device: str = setting("auto", "auto, cpu, cuda, cuda:N or mps.")
    precision: str = setting(
        "fp32",
        "Arithmetic of every contender's forward pass, as train --precision: fp32, bf16, or fp16 (CUDA).",
        choices=("fp32", "bf16", "fp16"),
    )
    compile: bool = setting(
        False,
        "Train every cell through torch.compile, as train --compile, and report its compile time (the fused "
        "baseline stays eager).",
    )
    cuda_graph: bool = setting(
        False,
        "CUDA only: train every cell through captured CUDA graphs, as train --cuda-graph (the fused baseline "
        "stays eager).",
    )
    tf32: bool = setting(
        False,
        "CUDA only: TensorFloat-32 for float32 products, as train --tf32, for every contender and the fused "
        "baseline alike.",
    )
    json: bool = setting(False, "Print the results as JSON (every round's figures) instead of a table.")
    seed: int = setting(0, "Random seed of the synthetic data and weights.", cli=False)


@dataclasses.dataclass
class DemoConfig:
    """`charlm demo`: a small LRU on the embedded pydoc corpus for a couple of minutes.

    ``sizes`` maps each hidden size the demo may choose to the characters of training after which
    its sample reads as words (valid ≈ 2.2 bpc on pydoc, measured with the settings below).
    """

    minutes: float = setting(2.0, "Time budget in minutes (the sizing measurement included).", min=0, min_open=True)
    cell: str = setting("lru", "Cell to train.", cli=False)
    sizes: dict = setting(
        {192: 400_000, 128: 600_000, 64: 1_500_000},
        "Hidden size → characters of training it needs for readable text.",
        cli=False,
    )
    calibration_steps: int = setting(
        3, "Training steps timed per size measured (after one warm-up step).", min=1, cli=False
    )
    layers: int = setting(1, "Layers.", min=1, max=MAX_LAYERS, cli=False)
    batch_size: int = setting(32, "Streams.", cli=False)
    bptt: int = setting(50, "Window.", cli=False)
    lr: float = setting(3e-3, "Learning rate.", cli=False)
    sample_length: int = setting(400, "Characters sampled after the prime.", cli=False)
    temperature: float = setting(0.8, "Sampling temperature.", cli=False)
    prime: str = setting("The ", "Prime of the sample.", cli=False)
    seed: int = setting(1, "Random seed.", cli=False)


@dataclasses.dataclass
class PrepareConfig:
    """`charlm prepare`: the defaults that are not a recipe's own."""

    vocab_size: int = setting(2000, "Pieces in the subword model (with --subword and the *-subword corpora).", min=2)


@dataclasses.dataclass
class PruneConfig:
    """`charlm runs --prune`: what it keeps of each run beyond last.pt and best.pt."""

    keep: int | None = setting(
        None,
        "With --prune: epoch checkpoints to keep in each run.",
        min=0,
        show_default="the run's --keep-checkpoints",
    )
