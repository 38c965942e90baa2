"""Will a model fit? The memory a training run needs, estimated before anything is allocated.

A run holds four float32 copies of every parameter (weights, gradients, Adam's two moments) and,
for one window, the activations autograd keeps for the backward pass. The parameter part is
exact; the activation part is ``batch × bptt × layers × hidden × 4 bytes`` times the cell's own
``activation_factor`` (each cell class declares it, see ``charlm.cells.base.RecurrentCell``), plus
the embedding and the softmax layer's inputs, logits and their gradients. ``--cuda-graph`` keeps one
window's activations in the graphs' private memory pool for the whole run, beside the eager windows'
(an epoch's last, shorter one, evaluation), so the activation part counts twice. ``charlm task``
draws its samples as it trains: the tensors of a batch and of the held-out set are a part of their
own (``MemoryEstimate.sample_bytes``). The state a run carries from window to window (a Transformer's
memory of past keys and values can dwarf the rest) counts three times: the state carried in, joined with
the window's own, and carried out (``carried_bytes``).

What is not estimated (scoring, dynamic evaluation, a GPU's library workspaces) is caught when it
happens: an allocation that fails reaches the user as one line (``charlm.errors.out_of_memory``).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import torch

from charlm.errors import CharlmError

BYTES_PER_PARAMETER = 16  # float32 weight, gradient, Adam first and second moment
GIB = 1024**3


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    parameters: int
    state_bytes: int  # weights, gradients and optimizer moments
    activation_bytes: int  # one window's forward and backward
    graph_bytes: int = 0  # --cuda-graph: the captured window's activations, held by the graphs' pool
    sample_bytes: int = 0  # `charlm task`: the samples it draws (a training batch, the held-out set)
    carried_bytes: int = 0  # the state carried between windows, in, joined with the window's and out

    @property
    def total_bytes(self) -> int:
        return self.state_bytes + self.activation_bytes + self.graph_bytes + self.sample_bytes + self.carried_bytes


def estimate_training_memory(
    parameters: int,
    activation_factor: int,
    hidden_size: int,
    layers: int,
    vocab_size: int,
    embed_size: int,
    batch_size: int,
    bptt: int,
    cuda_graph: bool = False,
    carried_values: int = 0,
) -> MemoryEstimate:
    """``carried_values``: the numbers of the state carried from window to window, all layers, the whole batch."""
    positions = batch_size * bptt
    recurrent = positions * layers * hidden_size * 4 * activation_factor
    ends = positions * (embed_size + 4 * vocab_size) * 4  # embedding rows; logits, softmax and their gradients
    activations = recurrent + ends
    return MemoryEstimate(
        parameters,
        parameters * BYTES_PER_PARAMETER,
        activations,
        activations if cuda_graph else 0,
        carried_bytes=3 * 4 * carried_values,
    )


def available_memory(device: torch.device) -> int | None:
    """Bytes free for a new run on ``device``; None where it cannot be told."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type != "cpu":
        return None
    known = [value for value in (_meminfo_available(), _cgroup_available()) if value is not None]
    return min(known) if known else None


TRAINING_ADVICE = "use a smaller --hidden or --params, or a smaller --batch-size or --bptt"


def check_fits(
    estimate: MemoryEstimate, device: torch.device, available: int | None = None, advice: str = TRAINING_ADVICE
) -> None:
    """Refuse, naming the figures and ``advice`` (the options to change), a run that ``device`` cannot hold."""
    available = available_memory(device) if available is None else available
    if available is None or estimate.total_bytes <= available:
        return
    extra = f", {_gib(estimate.graph_bytes)} held by the CUDA graphs" if estimate.graph_bytes else ""
    extra += f", {_gib(estimate.sample_bytes)} for the samples drawn" if estimate.sample_bytes else ""
    extra += f", {_gib(estimate.carried_bytes)} for the state carried between windows" if estimate.carried_bytes else ""
    raise CharlmError(
        f"a model of {estimate.parameters:,} parameters needs about {_gib(estimate.total_bytes)} to train "
        f"({_gib(estimate.state_bytes)} for weights, gradients and optimizer state, {_gib(estimate.activation_bytes)} "
        f"for one window's activations{extra}) but {device} has {_gib(available)} free: {advice}"
    )


def check_budget_fits(budget: int, device: torch.device, available: int | None = None) -> None:
    """Refuse at once a parameter budget whose optimizer state alone cannot fit (``--params 1e20``)."""
    available = available_memory(device) if available is None else available
    needed = budget * BYTES_PER_PARAMETER
    if available is not None and needed > available:
        raise CharlmError(
            f"a budget of {budget:,} parameters needs at least {_gib(needed)} for weights, gradients "
            f"and optimizer state alone, but {device} has {_gib(available)} free: use a smaller --params"
        )


# Beam search, per live beam: 16 bytes a value of its recurrent state (the beams' and the rows picked
# for the next step, float32); 32 a symbol of the vocabulary (the step's logits, log-probabilities and
# candidate totals, float32, with the ranking's copies); 100 a symbol of its text so far (the Python
# lists of ids and log-probabilities, the old beam's and its extension's); 512 for the objects. The peak
# measured on CPU was 1.0-1.6 times below this (widths 2,000-100,000, lengths 20-1,000, 104 symbols).
BEAM_BYTES = (16, 32, 100, 512)  # a state value, a next-symbol score, a symbol of text, a beam


def live_beams(width: int, vocab_size: int, length: int) -> int:
    """The most beams a search of ``width`` keeps live over ``length`` symbols: ``width``, or every
    continuation where there are fewer (``vocab_size ** length``, not computed beyond ``width``)."""
    beams = 1
    for _ in range(length if vocab_size > 1 else 0):
        beams *= vocab_size
        if beams >= width:
            return width
    return min(beams, width)


def check_beam_fits(model, width: int, length: int, available: int | None = None) -> None:
    """Refuse, before the search, a beam search of ``width`` over ``length`` symbols that the device of
    ``model`` (a built ``LanguageModel``) cannot hold; a width beyond every continuation costs nothing."""
    device, vocab_size = next(model.parameters()).device, model.config.vocab_size
    state_values = sum(part.numel() for layer in model.initial_state(1, device=device) for part in layer)
    beams = live_beams(width, vocab_size, length)
    needed = beams * sum(size * count for size, count in zip(BEAM_BYTES, (state_values, vocab_size, length, 1)))
    available = available_memory(device) if available is None else available
    if available is not None and needed > available:
        raise CharlmError(
            f"beam search of width {width:,} over {length:,} symbols needs about {_gib(needed)} ({beams:,} "
            f"live beams, each with its state, its {vocab_size:,} next-symbol scores and its text) but {device} "
            f"has {_gib(available)} free: use a smaller --beam or --length"
        )


def _gib(size: int) -> str:
    if size < 1024**2 / 2:
        return f"{size / 1024:,.0f} KiB"  # not "0 MiB"
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
