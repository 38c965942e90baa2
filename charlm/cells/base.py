"""The interface every recurrent cell follows, and the initialisers cells share.

A cell is one recurrent layer. It reads a whole window of inputs, time-major ``[T, B, d]``,
together with the time state it carried from the previous window, and returns its depth output
for every step, ``[T, B, output_size]``, with the new time state. The model stacks cells layer
by layer (layer l runs over all T steps before layer l + 1 starts), so a cell is free to compute
the input-dependent part of its pre-activations for the whole window in one matrix product.

To write a cell of your own, subclass :class:`RecurrentCell`, set the class attributes, and
implement ``initial_state`` and ``step`` (the equations, one time step). ``forward`` defaults to
looping ``step`` over the window; override it with a faster path when there is one, and the test
suite's reference check will hold the two to the same function.

The bottom layer's inputs are rows of the embedding table. A cell that sets ``folds_embedding``
accepts ``forward(inputs, state, lookup=...)`` and computes its hoisted input product through
:meth:`input_product`, which then multiplies the V rows of the table once instead of the T·B
positions of the window and gathers the result (a lookup instead of a matrix product).

Sampling calls a layer once per symbol at batch 1, where every operation costs more to dispatch
than to compute. :meth:`RecurrentCell.inference_step` gives the step in a form for that: weights
transposed (and stacked) once, and the step split into the input's share
(:meth:`InferenceStep.project`, which the model takes for every symbol of the vocabulary at once)
and the rest (:meth:`InferenceStep.advance`). The default wraps ``step``; the test suite holds
every cell's own version to ``step``.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from charlm.errors import CharlmError, ConfigError
from charlm.settings import check_field

State = tuple[Tensor, ...]


@dataclasses.dataclass
class EmbeddingLookup:
    """What the bottom layer's inputs are: ``inputs[t, b] = table[tokens[t, b]]``."""

    tokens: Tensor  # [T, B]
    table: Tensor | None  # [V, d]: the embedding matrix; None for one-hot inputs (the identity)

    def project(self, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        """``inputs @ weight.T + bias`` for the whole window, from the V rows of the table."""
        return self.spread(self.rows(weight, bias))

    def rows(self, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        """``table @ weight.T + bias``: the product for each symbol, ``[V, k]``. A cell that goes on
        with elementwise work on its input product alone does it on these V rows, then spreads."""
        rows = weight.T if self.table is None else self.table @ weight.T
        return rows if bias is None else rows + bias

    def spread(self, rows: Tensor) -> Tensor:
        """A value per symbol ``[V, k]`` at every position of the window, ``[T, B, k]``."""
        return F.embedding(self.tokens, rows)

    def narrowed(self, width: int) -> "EmbeddingLookup":
        """The lookup of ``inputs[..., :width]`` (inputs from an embedding table)."""
        return EmbeddingLookup(self.tokens, self.table[:, :width])


@dataclasses.dataclass
class NoOptions:
    """The options of a cell that has none."""


def check_options(cell, options) -> None:
    """A cell's options, its ``Config`` or a dict of some of its fields, against the type, choices and
    bounds each field declares with ``charlm.settings.setting(...)``, as the training settings are
    checked (a field declared without it is not); one line names the cell, the option, its value and
    what it may be."""
    owner = type(options) if dataclasses.is_dataclass(options) else cell.Config
    if not dataclasses.is_dataclass(owner):
        return
    fields = dataclasses.fields(owner)
    values = options if isinstance(options, dict) else {field.name: getattr(options, field.name) for field in fields}
    try:
        for field in fields:
            if field.metadata and field.name in values:
                check_field(owner, field, values[field.name])
    except ConfigError as error:
        raise CharlmError(f"bad option for cell {cell.name!r}: {error}") from None


class RecurrentCell(nn.Module):
    """Base class of every cell: one recurrent layer over a time-major window."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    paper: ClassVar[str] = ""
    formula: ClassVar[str] = ""
    Config: ClassVar[type] = NoOptions
    folds_embedding: ClassVar[bool] = False  # forward accepts lookup= (see the module docstring)
    # Without gradients (evaluation) the model runs windows through inference_forward, not forward.
    evaluates_through_step: ClassVar[bool] = False
    # Bytes autograd keeps per (step, stream, unit) of one layer for the backward pass, in float32
    # units: the memory check's estimate (charlm.runtime.memory). Measured on the CPU for the built-in
    # cells (peak resident memory of one forward + backward at batch 128 × bptt 50, 2 layers of 256,
    # rounded up by a quarter); a user's cell that does not say is assumed to keep more than any.
    activation_factor: ClassVar[int] = 64
    # How the window's forward avoids a step loop with matrix products in it: "scan" (a linear recurrence,
    # charlm.cells.scan), "elementwise" (every product hoisted, an elementwise loop left), "chunked" (a matrix
    # state computed chunk by chunk, parallel within each chunk) or "" (neither).
    # `charlm bench` times the cells that say one against their own step loop.
    parallel_form: ClassVar[str] = ""
    # Whether the model normalises the last layer's output (a LayerNorm, with a bias unless the cell's options
    # say bias=false) before the softmax, as a pre-norm residual stack needs (GPT-2's final ln_f); "rms": an
    # RMSNorm (ε = 1e-5) there instead (Mamba's norm_f); block wiring has its own RMSNorm there.
    final_layer_norm: ClassVar[bool | str] = False
    scaled_by_depth: ClassVar[bool] = False  # its initialisation reads self.depth, the stack's (make_stack sets it)
    # A residual block that applies the model's --dropout itself, where GPT-2 does (on each branch before it
    # joins the stream, and a transformer on its attention weights), as ``self.dropout``; a stack of them has
    # the model drop the embedding once and nothing between layers or before the softmax, since a mask on the
    # residual stream cuts its skip path too.
    drops_inside: bool = False
    dropout: float = 0.0  # the model's --dropout, for a cell that drops_inside (the model sets it)
    # The parameters that multiply the carried state (the hidden-to-hidden matrices): what --weight-drop
    # masks (charlm.regularisers). Of a matrix that also multiplies the input, only recurrent_columns.
    recurrent_weights: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs):
        """A subclass that writes its own ``step`` samples through it unless it also writes its own
        ``inference_step`` (its parent's would compute the parent's equations)."""
        super().__init_subclass__(**kwargs)
        if "step" in cls.__dict__ and "inference_step" not in cls.__dict__:
            cls.inference_step = RecurrentCell.inference_step

    def __init__(self, input_size: int, hidden_size: int, config=None):
        super().__init__()
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.config = config if config is not None else self.Config()
        check_options(type(self), self.config)  # also a config built in Python, not read by parse_cell_options

    def dropped(self, branch: Tensor) -> Tensor:
        """``branch`` under the model's --dropout in training, before it joins the residual stream."""
        return F.dropout(branch, self.dropout, training=True) if self.dropout and self.training else branch

    @property
    def output_size(self) -> int:
        """Width of the depth output that goes up to the next layer (and to the softmax)."""
        return self.hidden_size

    def recurrent_columns(self, name: str) -> slice:
        """The columns (last dimension) of ``name``, one of ``recurrent_weights``, that multiply the carried state."""
        return slice(None)

    @classmethod
    def required_input_size(cls, hidden_size: int, config) -> int | None:
        """The embedding width the bottom layer needs, or None to accept any."""
        return None

    @classmethod
    def hidden_size_multiple(cls, config) -> int:
        """The hidden sizes the cell can be built at are the multiples of this (``--params`` sizes to one)."""
        return 1

    @classmethod
    def make_stack(cls, input_size: int, hidden_size: int, num_layers: int, config) -> list["RecurrentCell"]:
        """The layers of a model built from this cell; cells that tie weights across depth override it. A cell
        whose initialisation depends on the stack's depth (``scaled_by_depth``) is told it, and initialised again."""
        layers = []
        for _ in range(num_layers):
            layer = cls(input_size, hidden_size, config)
            layers.append(layer)
            input_size = layer.output_size
        if cls.scaled_by_depth:
            for layer in layers:
                layer.depth = num_layers
                layer.reset_parameters()
        return layers

    def initial_state(self, batch_size: int, device=None, dtype=None) -> State:
        """The time state at the start of a sequence (zeros)."""
        return (self._zeros(batch_size, device, dtype),)

    def step(self, x: Tensor, state: State) -> tuple[Tensor, State]:
        """One time step written from the cell's equations: ``x`` is ``[B, d]``."""
        raise NotImplementedError

    def inference_step(self) -> "InferenceStep":
        """This layer's ``step`` for many calls without autograd (sampling); build it under
        ``torch.no_grad()`` or ``torch.inference_mode()``, and again after the weights change."""
        return InferenceStep(self)

    def forward(self, inputs: Tensor, state: State) -> tuple[Tensor, State]:
        outputs = []
        for x in inputs:
            output, state = self.step(x, state)
            outputs.append(output)
        return torch.stack(outputs), state

    def inference_forward(
        self, inputs: Tensor, state: State, lookup: EmbeddingLookup | None = None
    ) -> tuple[Tensor, State]:
        """``forward`` where nothing needs a gradient, through :meth:`inference_step`: the input's
        share for the whole window at once (for the V symbols when ``lookup`` says what the inputs
        are), then ``advance`` step by step. The model calls it instead of ``forward`` for cells
        that set ``evaluates_through_step`` (where it measured faster than their autograd loop)."""
        fast = self.inference_step()
        if lookup is not None:
            symbols = (
                lookup.table
                if lookup.table is not None
                else torch.eye(inputs.shape[-1], dtype=inputs.dtype, device=inputs.device)
            )  # one-hot inputs
            rows = fast.project(symbols)
            projected = None if rows is None else lookup.spread(rows)
        else:
            steps, batch = inputs.shape[:2]
            flat = fast.project(inputs.reshape(steps * batch, -1))
            projected = None if flat is None else flat.view(steps, batch, -1)
        outputs = []
        for t, x in enumerate(inputs):
            output, state = fast.advance(None if projected is None else projected[t], x, state)
            outputs.append(output)
        return torch.stack(outputs), state

    @staticmethod
    def input_product(
        inputs: Tensor, weight: Tensor, bias: Tensor | None = None, lookup: EmbeddingLookup | None = None
    ) -> Tensor:
        """``inputs @ weight.T + bias`` over a window ``[T, B, d]``; a table lookup when ``lookup``
        says what the inputs are."""
        if lookup is not None:
            return lookup.project(weight, bias)
        return inputs @ weight.T if bias is None else inputs @ weight.T + bias

    @staticmethod
    def prefers_python_loop(inputs: Tensor, lookup: EmbeddingLookup | None) -> bool:
        """Whether a cell with a fused library kernel should run its Python loop instead.

        A fused kernel multiplies the input of every position; with a folded input product the
        loop skips that work. On the CPU the loop then wins (``charlm bench``, 1M parameters:
        training 1.35× for lstm, 1.85× for rnn); on a GPU the kernel's single launch wins. Under
        autocast the CPU runs the loop too: oneDNN's bfloat16 RNN kernels need bf16 instructions
        that many CPUs lack ("could not create a primitive descriptor for the LSTM forward").
        """
        if inputs.device.type != "cpu":
            return False
        return lookup is not None or torch.is_autocast_enabled("cpu")

    def _zeros(self, batch_size, device=None, dtype=None, width=None) -> Tensor:
        reference = next(self.parameters(), None)
        if reference is not None:
            device = device or reference.device
            dtype = dtype or reference.dtype
        return torch.zeros(batch_size, width or self.hidden_size, device=device, dtype=dtype)


class InferenceStep:
    """A cell's ``step`` in two parts, ``advance(project(x), x, state) == cell.step(x, state)``.

    ``project`` is the share of the step that depends on the input alone, computed row by row, so
    the model can take it once for every row of the embedding table and gather a row per symbol.
    ``advance`` finishes the step. This default projects nothing and calls ``cell.step``; cells
    override both with their weights arranged once, in as few operations as their equations allow.
    """

    reads_input = True  # whether advance reads x itself, besides its projection

    def __init__(self, cell: RecurrentCell):
        self.cell = cell

    def project(self, x: Tensor) -> Tensor | None:
        """The input's share of the step, ``[B, k]`` (None: nothing is taken ahead)."""
        return None

    def advance(self, projected: Tensor | None, x: Tensor | None, state: State) -> tuple[Tensor, State]:
        """The depth output and the new state, from ``project(x)`` (and ``x``, if ``reads_input``)."""
        return self.cell.step(x, state)


class RMSNorm(nn.Module):
    """``x / √(mean(x²) + ε) ⊙ g`` over the last dimension, in float32 at least: ``nn.RMSNorm`` written out,
    which the ONNX exporter takes (opset 17 has no rms_norm). ``eps=None``: ε is the machine epsilon of the
    input's dtype, as ``nn.RMSNorm``'s default."""

    def __init__(self, width: int, eps: float | None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(width))

    def reset_parameters(self):
        nn.init.ones_(self.weight)

    def forward(self, x: Tensor) -> Tensor:
        wide = x.to(torch.promote_types(x.dtype, torch.float32))
        eps = torch.finfo(x.dtype).eps if self.eps is None else self.eps
        normed = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)
        return normed.to(x.dtype) * self.weight


def library_rnn(kernel, inputs: Tensor, hidden, weights: list[Tensor], training: bool):
    """One layer of PyTorch's fused RNN ``kernel`` (``torch.lstm``, ``torch.gru``, ``torch.rnn_tanh``;
    cuDNN on a GPU) over a time-major window, in the precision the run asked for.

    CUDA's autocast casts a cuDNN RNN's inputs and weights to float16 whatever type autocast was
    given, so ``--precision bf16`` would run these layers in fp16 without a gradient scaler. Under
    a bfloat16 autocast the inputs, the state and the weights are cast to bfloat16 here and the
    kernel runs with autocast off: bf16 means bf16 for every cell (cuDNN runs bf16 RNNs from
    cuDNN 9.13; before that PyTorch's own kernel does).
    """
    device_type = inputs.device.type
    # cuDNN refuses a state that is not contiguous, as torch.compile may hand it on ("hx is not contiguous")
    hidden = tuple(h.contiguous() for h in hidden) if isinstance(hidden, (tuple, list)) else hidden.contiguous()
    if not (torch.is_autocast_enabled(device_type) and torch.get_autocast_dtype(device_type) == torch.bfloat16):
        return kernel(inputs, hidden, weights, True, 1, 0.0, training, False, False)
    low = torch.bfloat16
    hidden = tuple(h.to(low) for h in hidden) if isinstance(hidden, (tuple, list)) else hidden.to(low)
    with torch.autocast(device_type, enabled=False), warnings.catch_warnings():
        # The bf16 weights are separate tensors, so cuDNN packs them into one buffer at every call and warns
        # at every call (5,000 lines in a run of 5,000 steps): a copy of the size of the cast just made.
        warnings.filterwarnings("ignore", message="RNN module weights are not part of single contiguous")
        return kernel(
            inputs.to(low), hidden, [weight.to(low) for weight in weights], True, 1, 0.0, training, False, False
        )


def glorot_uniform_(weight: Tensor, blocks: int = 1) -> Tensor:
    """Glorot/Xavier uniform, applied to each of ``blocks`` equal row blocks (one per gate)."""
    with torch.no_grad():
        for block in weight.chunk(blocks, dim=0):
            fan_out, fan_in = block.shape
            bound = math.sqrt(6.0 / (fan_in + fan_out))
            block.uniform_(-bound, bound)
    return weight


def uniform_all_(module: nn.Module, bound: float) -> None:
    """Draw every parameter of ``module`` from U(-bound, bound)."""
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.uniform_(-bound, bound)
