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

Scoring and dynamic evaluation, of a model already built, count their own working memory
(``estimate_evaluation_memory``): one window's activations and logits, and while adapting, the
gradients and the update's copies of the parameters.

``charlm task`` draws its samples as it trains: the tensors of a batch and of the held-out set are
a part of their own (``MemoryEstimate.sample_bytes``).
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
    sample_bytes: int = 0  # `charlm task`: the samples it draws (a training batch, the held-out set)

    @property
    def total_bytes(self) -> int:
        return self.state_bytes + self.activation_bytes + self.graph_bytes + self.workspace_bytes + self.sample_bytes


def estimate_training_memory(
    parameters: int,
    activation_factor: int,
    hidden_size: int,
    layers: int,
    vocab_size: int,
    embed_size: int,
    batch_size: int,
    bptt: int,
    device_type: str = "cpu",
    cuda_graph: bool = False,
) -> MemoryEstimate:
    positions = batch_size * bptt
    recurrent = positions * layers * hidden_size * 4 * activation_factor
    ends = positions * (embed_size + 4 * vocab_size) * 4  # embedding rows; logits, softmax and their gradients
    activations = recurrent + ends
    on_gpu = device_type == "cuda"
    return MemoryEstimate(
        parameters,
        parameters * BYTES_PER_PARAMETER,
        activations,
        graph_bytes=activations if cuda_graph else 0,
        workspace_bytes=WORKSPACE_BYTES + activations // 10 if on_gpu else 0,
    )


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


def check_fits(
    estimate: MemoryEstimate, device: torch.device, available: int | None = None, advice: str = TRAINING_ADVICE
) -> None:
    """Refuse, naming the figures and ``advice`` (the options to change), a run that ``device`` cannot hold."""
    available = available_memory(device) if available is None else available
    if available is None or estimate.total_bytes <= available:
        return
    extra = ""
    if estimate.graph_bytes:
        extra += f", {_gib(estimate.graph_bytes)} held by the CUDA graphs"
    if estimate.workspace_bytes:
        extra += f", {_gib(estimate.workspace_bytes)} for cuBLAS and cuDNN workspaces"
    if estimate.sample_bytes:
        extra += f", {_gib(estimate.sample_bytes)} for the samples drawn"
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


def check_weights_fit(parameters: int, device: torch.device, source: str, available: int | None = None) -> None:
    """Refuse, before it is built, a model read from ``source`` (a checkpoint) whose float32 weights
    alone ``device`` cannot hold: the file's own weights are already in memory, the model is a second copy."""
    available = available_memory(device) if available is None else available
    needed = parameters * 4
    if available is not None and needed > available:
        raise CharlmError(
            f"the model in {source} has {parameters:,} parameters, which need about {_gib(needed)} on "
            f"{device}, but it has {_gib(available)} free: load it where more memory is free"
        )


# Float32 copies of every parameter dynamic evaluation keeps while it adapts: sgd, the gradient; rms,
# the gradient, √MS, 1/(√MS + ε), λ·decay and θ₀, and one more as an allowance for the step being formed
# (two tensors of one parameter at a time).
DYNAMIC_COPIES = {"sgd": 1, "rms": 6}
# The options that make a dynamic evaluation's windows smaller, by method.
DYNAMIC_ADVICE = {
    "sgd": "use a smaller --batch-size or --segment",
    "rms": "use a smaller --batch-size or --segment, or a smaller --dyn-stat-batch-size",
}


@dataclasses.dataclass(frozen=True)
class EvaluationMemory:
    """What scoring or dynamic evaluation needs beside the model's weights (already in memory when it
    is checked), an estimate: see ``estimate_evaluation_memory``."""

    parameters: int
    streams: int  # the largest window counted: streams × steps
    steps: int
    activation_bytes: int  # that window's activations, logits and log-softmax (and, adapting, their gradients)
    copies: int = 0  # adapting: float32 copies of every parameter (gradient, update state, a weights copy)
    graph_bytes: int = 0  # a GPU scoring from a CUDA graph: the captured window's activations, in the graph's pool
    workspace_bytes: int = 0  # a GPU: cuBLAS and cuDNN workspaces (an allowance)

    @property
    def copy_bytes(self) -> int:
        return self.copies * self.parameters * 4

    @property
    def total_bytes(self) -> int:
        return self.activation_bytes + self.copy_bytes + self.graph_bytes + self.workspace_bytes


def estimate_evaluation_memory(
    parameters: int,
    activation_factor: int,
    hidden_size: int,
    layers: int,
    vocab_size: int,
    embed_size: int,
    streams: int,
    steps: int,
    *,
    method: str | None = None,
    restore_copy: bool = False,
    device_type: str = "cpu",
    cuda_graph: bool = False,
) -> EvaluationMemory:
    """The working memory of one window of ``streams × steps`` positions (P = streams × steps), in
    bytes, an estimate counted from the model's sizes (nothing is allocated):

    - scoring (``method`` None, no gradients): ``P × (hidden × activation_factor + embed + 3 × vocab) × 4``.
      Without gradients each layer's intermediates are freed before the next layer runs, so one
      layer's are counted, at the most autograd would keep of it (the cell's ``activation_factor``;
      an upper bound: on the CPU the built-in cells hold an eighth to three quarters of it); then the
      embedded window, and the logits, their row-major copy and their log-softmax.
    - dynamic evaluation (``method`` "sgd" or "rms"): a training window's activations, counted as
      ``estimate_training_memory`` counts them, ``P × (layers × hidden × activation_factor + embed
      + 4 × vocab) × 4``, plus ``DYNAMIC_COPIES[method]`` float32 copies of the ``parameters``, one
      more with ``restore_copy`` (the weights put back afterwards: ``--dyn-search``, ``Model.score``).
      ``--save-adapted`` copies the weights after the gradients are freed, within this peak.

    On a GPU, the cuBLAS and cuDNN allowance of ``estimate_training_memory``, and with ``cuda_graph``
    (scoring) the captured window's activations once more, held by the graph's pool. Not counted:
    the carried state (a window holds ``steps`` times more), the text laid out in streams (16 bytes
    a token) and, asked for, each prediction's NLL (8 bytes a token)."""
    positions = streams * steps
    if method is None:
        activations = positions * (hidden_size * activation_factor + embed_size + 3 * vocab_size) * 4
        copies = 0
    else:
        activations = positions * (layers * hidden_size * activation_factor + embed_size + 4 * vocab_size) * 4
        copies = DYNAMIC_COPIES[method] + int(restore_copy)
    on_gpu = device_type == "cuda"
    return EvaluationMemory(
        parameters,
        streams,
        steps,
        activations,
        copies,
        graph_bytes=activations if on_gpu and cuda_graph and method is None else 0,
        workspace_bytes=WORKSPACE_BYTES + activations // 10 if on_gpu else 0,
    )


def scored_window(predictions: int, batch_size: int, bptt: int, cover_all: bool = True) -> tuple[int, int]:
    """Streams and steps of the largest window ``TokenStreams`` cuts from ``predictions`` predictions:
    ``cover_all`` (scoring) pads the last stream, training batches (the rms statistics) drop the rest."""
    streams = max(1, min(batch_size, predictions))
    length = -(-predictions // streams) if cover_all else predictions // streams
    return streams, max(1, min(bptt, length))


def check_evaluation_fits(
    model,
    device: torch.device | None,
    *,
    predictions: int,
    batch_size: int,
    bptt: int,
    advice: str,
    method: str | None = None,
    stat_batch_size: int = 0,
    train_predictions: int = 0,
    restore_copy: bool = False,
    cuda_graph: bool = False,
    available: int | None = None,
) -> None:
    """Refuse, before the first window, scoring (``method`` None) or dynamic evaluation of ``predictions``
    in ``batch_size`` streams of ``bptt`` steps that ``device`` cannot hold beside ``model`` (a built
    ``LanguageModel``: its config and ``count_parameters``); rms also collects its statistics over
    ``stat_batch_size`` streams of the ``train_predictions`` training predictions, and the larger window
    is counted. The one-line error names the figures and ``advice`` (the options to change)."""
    device = torch.device("cpu") if device is None else torch.device(device)
    config = model.config
    streams, steps = scored_window(predictions, batch_size, bptt)
    if method == "rms" and stat_batch_size:
        stat_streams = max(1, min(stat_batch_size, (train_predictions + 1) // (bptt + 1)))
        stat_window = scored_window(train_predictions, stat_streams, bptt, cover_all=False)
        if stat_window[0] * stat_window[1] > streams * steps:
            streams, steps = stat_window
    estimate = estimate_evaluation_memory(
        sum(parameter.numel() for parameter in model.parameters()),
        type(model.layers[0]).activation_factor,
        config.hidden_size,
        len(model.layers),
        config.vocab_size,
        getattr(model.embedding, "embedding_dim", 0),
        streams,
        steps,
        method=method,
        restore_copy=restore_copy,
        device_type=device.type,
        cuda_graph=cuda_graph,
    )
    available = available_memory(device) if available is None else available
    if available is None or estimate.total_bytes <= available:
        return
    work = "scoring" if method is None else f"dynamic evaluation ({method})"
    parts = [
        f"{_gib(estimate.activation_bytes)} for a window of {streams:,} stream{'s' * (streams != 1)} × "
        f"{steps:,} step{'s' * (steps != 1)}"
    ]
    if estimate.copies:
        copies = f"{estimate.copies} float32 cop{'ies' if estimate.copies != 1 else 'y'}"
        parts.append(f"{_gib(estimate.copy_bytes)} for {copies} of the model's {estimate.parameters:,} parameters")
    if estimate.graph_bytes:
        parts.append(f"{_gib(estimate.graph_bytes)} held by the CUDA graph")
    if estimate.workspace_bytes:
        parts.append(f"{_gib(estimate.workspace_bytes)} for cuBLAS and cuDNN workspaces")
    raise CharlmError(
        f"{work} needs about {_gib(estimate.total_bytes)} ({', '.join(parts)}) but {device} has "
        f"{_gib(available)} free: {advice}"
    )


# Beam search, per live beam: its recurrent state (the beams' and the rows picked for the next step,
# float32) and, for each symbol of the vocabulary, the step's logits, log-probabilities and candidate
# totals (float32) with the ranking's copies; per symbol of its text so far, the Python lists of ids
# and log-probabilities (the old beam's and its extension's); plus the objects themselves. The peak
# measured on CPU was 1.0-1.6 times below this (widths 2,000-100,000, lengths 20-1,000, 104 symbols).
BEAM_BYTES_PER_STATE_VALUE = 16
BEAM_BYTES_PER_SCORE = 32
BEAM_BYTES_PER_SYMBOL = 100
BEAM_BYTES_PER_BEAM = 512


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
    device = next(model.parameters()).device
    state_values = sum(part.numel() for layer in model.initial_state(1, device=device) for part in layer)
    beams = live_beams(width, model.config.vocab_size, length)
    per_beam = (
        BEAM_BYTES_PER_STATE_VALUE * state_values
        + BEAM_BYTES_PER_SCORE * model.config.vocab_size
        + BEAM_BYTES_PER_SYMBOL * length
        + BEAM_BYTES_PER_BEAM
    )
    available = available_memory(device) if available is None else available
    if available is None or beams * per_beam <= available:
        return
    raise CharlmError(
        f"beam search of width {width:,} over {length:,} symbols needs about {_gib(beams * per_beam)} "
        f"({beams:,} live beams, each with its state, its {model.config.vocab_size:,} next-symbol scores "
        f"and its text) but {device} has {_gib(available)} free: use a smaller --beam or --length"
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
