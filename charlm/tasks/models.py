"""The networks the algorithmic tasks are run with.

Sequence tasks (memorization, addition) use charlm's ``LanguageModel``: any registered cell stacked
``layers`` deep, reading one token per step and predicting the target at every step. The 2-D Grid
LSTM has depth as its second dimension (its ``tied`` option); any other cell is tied across layers
by repeating one block (``ModelConfig.tie_layers``), the paper's tied Stacked LSTM.

Parity reads all k bits at once, so its networks are feed-forward along depth only:

- ``DepthLSTM``, the 1-D Grid LSTM: the bits are projected into the first hidden vector and memory,
  h₀ = W_h x, m₀ = W_m x, then one LSTM transform applied ``layers`` times along depth with tied
  weights, g^u, g^f, g^o = σ(W^· h + b^·), g^c = tanh(W^c h + b^c), m′ = g^f ⊙ m + g^u ⊙ g^c,
  h′ = tanh(g^o ⊙ m′) (the paper's output), and a softmax over even / odd on the last h;
- ``FeedForward``, the baselines: ``layers`` fully connected layers with ReLU or tanh (untied), then
  the softmax.
"""

from __future__ import annotations

import dataclasses
import time

import torch
from torch import Tensor, nn

from charlm.cells import CELLS
from charlm.cells.base import glorot_uniform_
from charlm.errors import CharlmError
from charlm.model import LanguageModel, ModelConfig, count_parameters
from charlm.runtime.memory import MemoryEstimate, estimate_training_memory

PARITY_NETWORKS = ("grid-lstm", "relu", "tanh")
WAVEFRONT_CELLS = ("grid-lstm",)  # measured faster as a wavefront (docs/papers/grid-lstm.md)
WAVEFRONT_MIN_LAYERS = 4  # at 2 layers the wavefront was slower (0.74x), from 4 on faster (1.21-1.79x)


class DepthLSTM(nn.Module):
    """The 1-D Grid LSTM: an LSTM transform along depth, the same weights at every layer."""

    activation_factor = 13  # as a cell's (charlm.cells.base): peak memory of a forward + backward, rounded up a quarter

    def __init__(self, bits: int, hidden_size: int, layers: int):
        super().__init__()
        n = hidden_size
        self.layers = layers
        self.input = nn.Linear(bits, 2 * n)  # rows: h₀, then m₀
        self.gates = nn.Linear(n, 4 * n)  # rows: u, f, o, c
        self.head = nn.Linear(n, 2)
        glorot_uniform_(self.input.weight, blocks=2)
        glorot_uniform_(self.gates.weight, blocks=4)
        glorot_uniform_(self.head.weight)
        with torch.no_grad():
            for bias in (self.input.bias, self.gates.bias, self.head.bias):
                bias.zero_()
            self.gates.bias[n : 2 * n].fill_(1.0)  # forget gate starts open, as the cells do

    def forward(self, bits: Tensor) -> Tensor:
        h, m = self.input(bits).chunk(2, dim=-1)
        for _ in range(self.layers):
            u, f, o, c = self.gates(h).chunk(4, dim=-1)
            m = torch.sigmoid(f) * m + torch.sigmoid(u) * torch.tanh(c)  # memory along depth
            h = torch.tanh(torch.sigmoid(o) * m)  # the paper's output
        return self.head(h).unsqueeze(1)  # [B, 1, 2]: one "position", the parity


class FeedForward(nn.Module):
    """``layers`` fully connected layers with ``activation`` (relu or tanh), then a softmax layer."""

    activation_factor = 3  # as DepthLSTM's

    def __init__(self, bits: int, hidden_size: int, layers: int, activation: str):
        super().__init__()
        widths = [bits] + [hidden_size] * layers
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths, widths[1:]))
        self.activation = {"relu": torch.relu, "tanh": torch.tanh}[activation]
        self.head = nn.Linear(hidden_size, 2)
        for layer in (*self.hidden, self.head):
            glorot_uniform_(layer.weight)
            nn.init.zeros_(layer.bias)

    def forward(self, bits: Tensor) -> Tensor:
        for layer in self.hidden:
            bits = self.activation(layer(bits))
        return self.head(bits).unsqueeze(1)


class SequenceTaskModel(nn.Module):
    """A ``LanguageModel`` read as a sequence-task network: whole sequences from a zero state.

    A tied stack can run as a wavefront (``wavefront``): the same function, one batched block per
    anti-diagonal of the time × depth grid instead of one per grid point. It is used where it was
    measured faster (``WAVEFRONT_CELLS``, from ``WAVEFRONT_MIN_LAYERS`` layers; see docs/papers/grid-lstm.md):
    cells whose layer-by-layer code hoists each layer's input product over the whole window lose
    that by going diagonal by diagonal. ``use_wavefront`` False runs the layer-by-layer code.
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.language_model = LanguageModel(config)
        layers = self.language_model.layers
        self.tied = len(layers) > 1 and all(layer is layers[0] for layer in layers)
        self.use_wavefront = self.tied and config.cell in WAVEFRONT_CELLS and len(layers) >= WAVEFRONT_MIN_LAYERS

    def forward(self, tokens: Tensor) -> Tensor:
        model = self.language_model
        if not self.use_wavefront:
            logits, _ = model(tokens, model.initial_state(tokens.shape[0], device=tokens.device))
            return logits
        outputs = wavefront(model.layers[0], len(model.layers), model.embedding(tokens.t()))
        return model.head(outputs).transpose(0, 1)


def wavefront(block, depth: int, inputs: Tensor) -> Tensor:
    """The top layer's outputs ``[T, B, ·]`` of ``block`` stacked ``depth`` deep over ``inputs`` ``[T, B, d]``.

    Block (t, l) reads (t, l − 1) and (t − 1, l), so the blocks of one anti-diagonal t + l = k are
    independent; with one set of weights they are a single ``block.step`` on the batch of every
    active layer side by side: T + depth − 1 calls instead of T × depth.
    """
    steps, batch = inputs.shape[:2]
    state = [block.initial_state(batch, device=inputs.device, dtype=inputs.dtype)] * depth  # per layer, after t − 1
    below = [None] * depth  # below[l]: the output of layer l − 1 that layer l reads next
    top = []
    for diagonal in range(steps + depth - 1):
        active = range(max(0, diagonal - steps + 1), min(depth, diagonal + 1))  # layer l is at time diagonal − l
        x = torch.cat([inputs[diagonal] if layer == 0 else below[layer] for layer in active])
        carried = tuple(torch.cat(parts) for parts in zip(*(state[layer] for layer in active)))
        output, carried = block.step(x, carried)
        outputs = output.split(batch)
        pieces = list(zip(*(part.split(batch) for part in carried)))
        for index, layer in enumerate(active):
            state[layer] = pieces[index]
            if layer + 1 < depth:
                below[layer + 1] = outputs[index]
            else:
                top.append(outputs[index])
    return torch.stack(top)


def check_wavefront(model: SequenceTaskModel, tokens: Tensor, tolerance: float = 1e-4) -> dict:
    """Hold the wavefront to the layer-by-layer code on ``tokens``: the largest difference of the
    logits, and whether it is within ``tolerance`` (the wavefront is turned off where it is not)."""
    started = time.perf_counter()
    with torch.no_grad():
        model.use_wavefront = True
        fast = model(tokens)
        model.use_wavefront = False
        plain = model(tokens)
    difference = float((fast - plain).abs().max())
    model.use_wavefront = difference <= tolerance
    return {
        "path": "wavefront",
        "active": model.use_wavefront,
        "checked": True,
        "max_difference": difference,
        "tolerance": tolerance,
        "check_seconds": round(time.perf_counter() - started, 4),
        "failure": None if model.use_wavefront else f"differs from the layer-by-layer code by {difference:.3g}",
    }


def model_config(task, cell: str, hidden_size: int, layers: int, tied: bool | None, cell_options: dict) -> ModelConfig:
    """The ``ModelConfig`` of a sequence-task network; ``tied`` None: the cell's default (untied, but
    grid-lstm's own default, tied)."""
    cell_class = CELLS.get(cell)  # an unknown cell: one line naming the known ones
    options = dict(cell_options)
    tie_layers = False
    if tied is not None:
        if any(field.name == "tied" for field in dataclasses.fields(cell_class.Config)):
            options["tied"] = tied
        else:
            tie_layers = tied
    return ModelConfig(
        cell=cell,
        vocab_size=len(task.vocab),
        hidden_size=hidden_size,
        layers=layers,
        cell_options=options,
        tie_layers=tie_layers,
    )


def build_task_model(
    task, cell: str, hidden_size: int, layers: int, tied: bool | None = None, cell_options: dict | None = None
) -> nn.Module:
    """The network for ``task``: a stack of ``cell`` for the sequence tasks; for parity ``cell`` is
    grid-lstm (the 1-D Grid LSTM, tied), relu or tanh (feed-forward, untied)."""
    if hidden_size < 1 or layers < 1:
        raise CharlmError(f"hidden size and layers must be at least 1, not {hidden_size} and {layers}")
    if task.sequence:
        return SequenceTaskModel(model_config(task, cell, hidden_size, layers, tied, cell_options or {}))
    if cell not in PARITY_NETWORKS:
        raise CharlmError(
            f"parity is run with {', '.join(PARITY_NETWORKS)} (the 1-D Grid LSTM and the feed-forward "
            f"baselines), not {cell!r}"
        )
    if cell_options:
        raise CharlmError("parity's networks take no --cell-opt")
    if cell == "grid-lstm":
        if tied is False:
            raise CharlmError("the 1-D Grid LSTM of parity is tied across depth: drop --untied")
        return DepthLSTM(task.bits, hidden_size, layers)
    if tied:
        raise CharlmError(f"the {cell} feed-forward baseline cannot tie its layers: its first layer reads the bits")
    return FeedForward(task.bits, hidden_size, layers, cell)


def estimate_task_memory(
    task,
    cell: str,
    hidden_size: int,
    layers: int,
    tied: bool | None,
    cell_options: dict,
    batch_size: int,
    eval_samples: int,
) -> MemoryEstimate:
    """The memory a run of ``task`` needs (``charlm.runtime.memory``), from its network built on the meta
    device: weights, gradients and optimizer state; one batch's activations (a sequence task's are a
    window of ``task.positions`` steps, with its embedding and softmax; parity's one step whose
    input is the bits); and the samples drawn (a training batch and the held-out set, ``task.sample_bytes`` each)."""
    with torch.device("meta"):
        model = build_task_model(task, cell, hidden_size, layers, tied, cell_options)
    if task.sequence:
        embedding = model.language_model.embedding
        width = getattr(embedding, "embedding_dim", getattr(embedding, "vocab_size", 0))  # one-hot: the vocabulary
        factor, vocab_size, steps = CELLS.get(cell).activation_factor, len(task.vocab), task.positions
    else:
        width, factor, vocab_size, steps = task.bits, type(model).activation_factor, len(task.vocab), 1
    estimate = estimate_training_memory(
        count_parameters(model),
        factor,
        hidden_size,
        layers,
        vocab_size,
        width,
        batch_size,
        steps,
    )
    return dataclasses.replace(estimate, sample_bytes=(batch_size + eval_samples) * task.sample_bytes)
