"""Will a model fit? The memory a training run needs, estimated before anything is allocated.

A run holds four float32 copies of every parameter (weights, gradients, Adam's two moments) and,
for one window, the activations autograd keeps for the backward pass. The parameter part is
exact; the activation part is ``batch × bptt × layers × hidden × 4 bytes`` times the cell's own
``activation_factor`` (each cell class declares it, see ``charlm.cells.base.RecurrentCell``), plus
the embedding and the softmax layer's inputs, logits and their gradients.

On a GPU two more parts are counted. ``--cuda-graph`` keeps one window's activations in the graphs'
private memory pool for the whole run, beside the eager windows' (an epoch's last, shorter one,
evaluation), so the activation part counts twice. cuBLAS and cuDNN take workspaces of their own:
an allowance of ``WORKSPACE_BYTES`` plus a tenth of the activations (an allowance, not a
measurement: no GPU was available to measure it).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import torch

from charlm.errors import CharlmError

BYTES_PER_PARAMETER = 16  # float32 weight, gradient, Adam first and second moment
GIB = 1024**3
WORKSPACE_BYTES = 256 * 1024**2  # cuBLAS and cuDNN workspaces on a GPU, allowed for


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    parameters: int
    state_bytes: int  # weights, gradients and optimizer moments
    activation_bytes: int  # one window's forward and backward
    graph_bytes: int = 0  # --cuda-graph: the captured window's activations, held by the graphs' pool
    workspace_bytes: int = 0  # a GPU: cuBLAS and cuDNN workspaces (an allowance)

    @property
    def total_bytes(self) -> int:
        return self.state_bytes + self.activation_bytes + self.graph_bytes + self.workspace_bytes


def estimate_training_memory(parameters: int, activation_factor: int, hidden_size: int, layers: int, vocab_size: int,
                             embed_size: int, batch_size: int, bptt: int, device_type: str = "cpu",
                             cuda_graph: bool = False) -> MemoryEstimate:
    positions = batch_size * bptt
    recurrent = positions * layers * hidden_size * 4 * activation_factor
    ends = positions * (embed_size + 4 * vocab_size) * 4  # embedding rows; logits, softmax and their gradients
    activations = recurrent + ends
    on_gpu = device_type == "cuda"
    return MemoryEstimate(parameters, parameters * BYTES_PER_PARAMETER, activations,
                          graph_bytes=activations if cuda_graph else 0,
                          workspace_bytes=WORKSPACE_BYTES + activations // 10 if on_gpu else 0)


def available_memory(device: torch.device) -> int | None:
    """Bytes free for a new run on ``device``; None where it cannot be told."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    if device.type != "cpu":
        return None
    candidates = [_meminfo_available(), _cgroup_available()]
    known = [value for value in candidates if value is not None]
    return min(known) if known else None


TRAINING_ADVICE = "use a smaller --hidden or --params, or a smaller --batch-size or --bptt"


def check_fits(estimate: MemoryEstimate, device: torch.device, available: int | None = None,
               advice: str = TRAINING_ADVICE) -> None:
    """Refuse, naming the figures and ``advice`` (the options to change), a run that ``device`` cannot hold."""
    available = available_memory(device) if available is None else available
    if available is None or estimate.total_bytes <= available:
        return
    extra = ""
    if estimate.graph_bytes:
        extra += f", {_gib(estimate.graph_bytes)} held by the CUDA graphs"
    if estimate.workspace_bytes:
        extra += f", {_gib(estimate.workspace_bytes)} for cuBLAS and cuDNN workspaces"
    raise CharlmError(
        f"a model of {estimate.parameters:,} parameters needs about {_gib(estimate.total_bytes)} to train "
        f"({_gib(estimate.state_bytes)} for weights, gradients and Adam state, {_gib(estimate.activation_bytes)} "
        f"for one window's activations{extra}) but {device} has {_gib(available)} free: {advice}")


def check_budget_fits(budget: int, device: torch.device, available: int | None = None) -> None:
    """Refuse at once a parameter budget whose optimizer state alone cannot fit (``--params 1e20``)."""
    available = available_memory(device) if available is None else available
    needed = budget * BYTES_PER_PARAMETER
    if available is not None and needed > available:
        raise CharlmError(f"a budget of {budget:,} parameters needs at least {_gib(needed)} for weights, gradients "
                          f"and Adam state alone, but {device} has {_gib(available)} free: use a smaller --params")


def check_weights_fit(parameters: int, device: torch.device, source: str, available: int | None = None) -> None:
    """Refuse, before it is built, a model read from ``source`` (a checkpoint) whose float32 weights
    alone ``device`` cannot hold: the file's own weights are already in memory, the model is a second copy."""
    available = available_memory(device) if available is None else available
    needed = parameters * 4
    if available is not None and needed > available:
        raise CharlmError(f"the model in {source} has {parameters:,} parameters, which need about {_gib(needed)} on "
                          f"{device}, but it has {_gib(available)} free: load it where more memory is free")


def _gib(size: int) -> str:
    return f"{size / GIB:,.1f} GiB" if size >= GIB / 10 else f"{size / 1024**2:,.0f} MiB"


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def _cgroup_available() -> int | None:
    """What a cgroup v2 memory limit leaves (containers, Slurm jobs)."""
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit == "max":
            return None
        used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
        return max(int(limit) - used, 0)
    except (OSError, ValueError):
        return None
