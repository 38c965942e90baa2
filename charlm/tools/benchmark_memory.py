"""Will a benchmark fit? `charlm bench` holds every contender at once (the fused baseline and each
cell, with its Adam state) and trains one window of one of them at a time: the memory that asks
for is estimated (``charlm.runtime.memory``) from models sized on the meta device, and a benchmark
the device cannot hold is refused before the first model is allocated (``--params 1e23`` would
otherwise grow until the kernel's out-of-memory killer ends it, and perhaps other jobs with it).
"""

from __future__ import annotations

import dataclasses

import torch

from charlm.cells import CELLS
from charlm.config_tools import BenchmarkConfig
from charlm.errors import CharlmError
from charlm.model import LanguageModel, ModelConfig, count_parameters
from charlm.sizing import parse_budget, size_for_budget
from charlm.runtime.memory import (
    BYTES_PER_PARAMETER,
    MemoryEstimate,
    available_memory,
    check_budget_fits,
    check_fits,
    estimate_training_memory,
)
from charlm.tools.benchmark import FusedLSTMBaseline, baseline_size

ADVICE = (
    "use a smaller --params, fewer --cells or --layers, a smaller --vocab-size, or a smaller --batch-size or --bptt"
)


def check_benchmark_fits(
    cells: list[str], config: BenchmarkConfig, device: torch.device, available: int | None = None
) -> MemoryEstimate:
    """The memory the benchmark of ``cells`` needs on ``device``, refused (one line naming the
    options) where ``device`` has less free; nothing is allocated to find out."""
    available = available_memory(device) if available is None else available
    budget = parse_budget(config.params)
    check_budget_fits(budget, device, available)  # --params 1e23: at once, before any model is sized
    shapes = []
    try:
        for cell in cells:
            model_config = ModelConfig(cell, vocab_size=config.vocab_size, hidden_size=1, layers=config.layers)
            hidden_size, _ = size_for_budget(model_config, budget)
            shapes.append(
                (CELLS.get(cell).activation_factor, dataclasses.replace(model_config, hidden_size=hidden_size))
            )
    except CharlmError as error:
        raise CharlmError(f"{error}: use a smaller --params") from None
    baseline_hidden = baseline_size(config)
    with torch.device("meta"):
        baseline = count_parameters(FusedLSTMBaseline(config.vocab_size, baseline_hidden, config.layers))
    reference = ModelConfig("lstm", config.vocab_size, baseline_hidden, config.layers)  # its FLOPs are counted
    shapes.append((CELLS.get("lstm").activation_factor, reference))  # the baseline's activations are the same
    held, activations, parameters = 0, 0, baseline
    for factor, model_config in shapes:
        with torch.device("meta"):
            count = count_parameters(LanguageModel(model_config))
        estimate = estimate_training_memory(
            count,
            factor,
            model_config.hidden_size,
            model_config.layers,
            config.vocab_size,
            model_config.hidden_size,
            config.batch_size,
            config.bptt,
            cuda_graph=config.cuda_graph,
        )
        held += estimate.state_bytes if model_config is not reference else count * 4  # the reference: weights only
        activations = max(activations, estimate.activation_bytes + estimate.graph_bytes)
        parameters += count
    held += baseline * BYTES_PER_PARAMETER  # the fused baseline trains, with its Adam state, beside the others
    total = MemoryEstimate(parameters, held, activations)
    check_fits(total, device, available, advice=ADVICE)
    return total
