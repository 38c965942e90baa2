"""Scaling under torchrun (``charlm bench`` with several processes): each model's training
throughput on rank 0 alone with the whole batch, then on every process with DistributedDataParallel
on its share of the streams, in interleaved rounds (``charlm.tools.benchmark`` times one process)."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

import torch
from torch.nn.parallel import DistributedDataParallel

from charlm.config_tools import BenchmarkConfig
from charlm.model import count_parameters
from charlm.runtime.seeds import torch_seed
from charlm.tools.benchmark import BASELINE_NAME, Contender, FusedLSTMBaseline, Spread, baseline_size, cell_model


@dataclass
class Scaling:
    """Training throughput of one model on one process and on every process of a torchrun world."""

    name: str
    parameters: int
    processes: int
    single: Spread = field(default_factory=Spread)  # chars/s, rank 0 alone with the whole batch
    together: Spread = field(default_factory=Spread)  # chars/s, the batch dealt out over every process
    step_seconds: Spread = field(default_factory=Spread)  # one training step of the whole world

    @property
    def allreduce_bytes(self) -> int:
        """Gradient bytes each process sends into the all-reduce per step (float32)."""
        return 4 * self.parameters

    @property
    def efficiency(self) -> float:
        return self.together.median / (self.processes * self.single.median)

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "parameters": self.parameters,
            "processes": self.processes,
            "single_chars_per_second": self.single.to_dict(),
            "together_chars_per_second": self.together.to_dict(),
            "step_seconds": self.step_seconds.to_dict(),
            "allreduce_bytes_per_step": self.allreduce_bytes,
            "speedup": self.together.median / self.single.median,
            "efficiency": self.efficiency,
        }


def benchmark_scaling(cells: list[str], config: BenchmarkConfig, world, progress=None) -> list[Scaling]:
    """Under torchrun: each model trained by rank 0 alone on the whole batch, then by every process
    with DistributedDataParallel on its share of the streams, in interleaved rounds."""
    device = torch.device(config.device)
    torch.manual_seed(torch_seed(config.seed))
    models = [(BASELINE_NAME, FusedLSTMBaseline(config.vocab_size, baseline_size(config), config.layers))]
    models += [(cell, cell_model(cell, config)) for cell in cells]
    rows = world.share(config.batch_size)
    results = []
    for name, model in models:
        model.to(device)
        alone = Contender(name, model, config, device, 0.0) if world.is_main else None
        shared_model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
        shared = Contender(
            name,
            shared_model,
            dataclasses.replace(config, batch_size=rows.stop - rows.start),
            device,
            0.0,
            initial_state=model.initial_state,
        )
        result = Scaling(name, count_parameters(model), world.size)
        for round_index in range(config.repeat):
            if progress and world.is_main:
                progress(f"{name}: round {round_index + 1}/{config.repeat}")
            world.barrier()
            if world.is_main:
                result.single.runs.append(alone.time_training())
            world.barrier()
            started = time.perf_counter()
            shared.time_training()
            world.barrier()
            seconds = time.perf_counter() - started
            result.together.runs.append(config.steps * config.batch_size * config.bptt / seconds)
            result.step_seconds.runs.append(seconds / config.steps)
        results.append(result)
    return results
