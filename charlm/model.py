"""The language model: embedding → a stack of recurrent cells → linear softmax layer."""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor, nn

from charlm.cells import CELLS, glorot_uniform_, parse_cell_options
from charlm.cells.base import EmbeddingLookup, RMSNorm
from charlm.cells.block import Block
from charlm.embedding import OneHot, input_layer, softmax_layer  # noqa: F401 (OneHot: charlm.model's, as before)
from charlm.regularisers import Regularisers
from charlm.settings import from_dict
from charlm.errors import CharlmError


@dataclasses.dataclass
class ModelConfig:
    cell: str
    vocab_size: int
    hidden_size: int
    layers: int = 1
    embed_size: int | None = None  # None: what the cell needs, else the hidden size; 0: one-hot input
    dropout: float = 0.0  # between layers and on the softmax input (residual blocks: where GPT-2 has it)
    cell_options: dict = dataclasses.field(default_factory=dict)
    tie_layers: bool = False  # every layer the same block (a tied stack); grid-lstm ties by its own option
    wiring: str = "stacked"  # "block": each cell in a residual block (charlm.cells.block)
    block_conv: int = 4  # the block's causal convolution width (0: none)
    block_expansion: float = 3.0  # the block's gated MLP width over the hidden size (0: none)
    tie_weights: bool = False  # the softmax's weight is the embedding table (Press & Wolf 2017)
    head_bias: bool = True  # the softmax layer's bias
    # AWD-LSTM's regularisers, training mode only (charlm.regularisers)
    weight_drop: float = 0.0
    dropout_embed: float = 0.0
    dropout_input: float = 0.0
    dropout_hidden: float = 0.0
    dropout_output: float = 0.0

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "ModelConfig":
        return from_dict(cls, values)


class LanguageModel(nn.Module):
    """Predicts the next symbol at every position of a window, carrying each layer's time state.

    ``fold_embedding``: the bottom layer's input product is taken over the V rows of the embedding
    table and gathered (see :mod:`charlm.cells.base`) whenever the window has more positions than
    the vocabulary has symbols; the same function as multiplying the embedded window.
    """

    fold_embedding: bool = True
    # Training mode: keep the last window's top-layer output, undropped and dropped (``top_output``), for
    # the activation penalties of the training step (AR and TAR).
    keeps_top_output: bool = False

    def __init__(self, config: ModelConfig, cell_class=None):
        """``cell_class``: the class of ``config.cell`` when the caller has resolved it already
        (a user cell that a checkpoint names); otherwise it is looked up in the registry."""
        super().__init__()
        if config.hidden_size < 1 or config.layers < 1 or config.vocab_size < 1:
            raise CharlmError("hidden size, layers and vocabulary size must all be at least 1")
        if not 0.0 <= config.dropout < 1.0:
            raise CharlmError(f"dropout must be in [0, 1), not {config.dropout}")
        self.config = config
        cell_class = cell_class or CELLS.get(config.cell)
        cell_config = parse_cell_options(cell_class, config.cell_options)
        required = cell_class.required_input_size(config.hidden_size, cell_config)
        if config.wiring not in ("stacked", "block"):
            raise CharlmError(f"wiring must be stacked or block, not {config.wiring!r}")
        blocks = config.wiring == "block"
        if blocks:  # a block's residual needs the cell's input as wide as its output, the hidden size
            if required not in (None, config.hidden_size):
                raise CharlmError(
                    f"cell {config.cell!r} cannot be wired in blocks: its input must be {required} wide, "
                    f"not the hidden size {config.hidden_size}"
                )
            required = config.hidden_size
        embed_size = config.embed_size
        if embed_size is None:
            embed_size = required if required is not None else config.hidden_size
        elif required is not None and embed_size != required:
            wired = " in blocks" if blocks else ""
            raise CharlmError(
                f"cell {config.cell!r}{wired} needs --embed-size {required} at hidden size {config.hidden_size}"
            )
        self.embedding, input_size = input_layer(config.vocab_size, embed_size)
        try:
            if config.tie_layers:
                layers = tied_stack(cell_class, input_size, config, cell_config)
            else:
                layers = cell_class.make_stack(input_size, config.hidden_size, config.layers, cell_config)
            if blocks:
                wrapped = {}  # a tied stack repeats one cell: one block around it
                for layer in layers:
                    wrapped.setdefault(id(layer), Block(layer, config.block_conv, config.block_expansion))
                layers = [wrapped[id(layer)] for layer in layers]
        except ValueError as error:
            raise CharlmError(f"cannot build cell {config.cell!r}: {error}") from None
        self.layers = nn.ModuleList(layers)
        self.dropout = nn.Dropout(config.dropout)
        self.drops_inside = all(layer.drops_inside for layer in layers)  # see RecurrentCell.drops_inside
        if self.drops_inside:
            for layer in layers:
                layer.dropout = config.dropout
        if blocks:
            self.final_norm = RMSNorm(self.layers[-1].output_size, eps=None)
        elif cell_class.final_layer_norm == "rms":  # an RMSNorm (ε = 1e-5), as Mamba's norm_f
            self.final_norm = RMSNorm(self.layers[-1].output_size, eps=1e-5)
        elif cell_class.final_layer_norm:  # without a bias where the cell has none (bias=false)
            self.final_norm = nn.LayerNorm(self.layers[-1].output_size, bias=getattr(cell_config, "bias", True))
        else:
            self.final_norm = nn.Identity()
        self.head_projection, self.head = softmax_layer(
            self.embedding, self.layers[-1].output_size, config.vocab_size, config.tie_weights, config.head_bias
        )
        self.regularisers = Regularisers.of(config, self.layers)
        self.top_output: tuple[Tensor, Tensor] | None = None
        self.reset_parameters()

    def reset_parameters(self):
        if isinstance(self.embedding, nn.Embedding):
            glorot_uniform_(self.embedding.weight)
        if not self.config.tie_weights:
            glorot_uniform_(self.head.weight)
        if isinstance(self.head_projection, nn.Linear):
            glorot_uniform_(self.head_projection.weight)
        if self.head.bias is not None:
            nn.init.zeros_(self.head.bias)

    def _embedding_table(self) -> Tensor | None:
        """The vector each symbol enters the bottom layer as, one row per symbol (None: one-hot)."""
        return self.embedding.weight if isinstance(self.embedding, nn.Embedding) else None

    def initial_state(self, batch_size: int, device=None) -> list[tuple[Tensor, ...]]:
        return [layer.initial_state(batch_size, device=device) for layer in self.layers]

    def forward(self, tokens: Tensor, state: list) -> tuple[Tensor, list]:
        """``tokens`` is ``[B, T]``; returns logits ``[B, T, V]`` and the new state."""
        tokens = tokens.t()
        masks = self.regularisers.window(self.layers, self.training)  # none in eval mode
        output, table = masks.embed(self.embedding, tokens, self._embedding_table())
        output = masks.inputs(output)
        if self.drops_inside:
            output = self.dropout(output)
        bottom = {}  # what the bottom layer is told about its inputs
        folds = self.fold_embedding and masks.folds_embedding and self.layers[0].folds_embedding
        if self.drops_inside and self.training and self.dropout.p > 0:
            folds = False  # the bottom block reads the dropped embedding, not the table's rows
        if folds and tokens.numel() > self.config.vocab_size:
            bottom = {"lookup": EmbeddingLookup(tokens, table)}
        new_state = []
        evaluating = not torch.is_grad_enabled()
        for index, (layer, layer_state) in enumerate(zip(self.layers, state)):
            if index > 0:
                output = masks.hidden(self._between_layers(output))
            run = layer.inference_forward if evaluating and layer.evaluates_through_step else layer
            run = masks.layer(index, layer, run)
            output, layer_state = run(output, layer_state, **(bottom if index == 0 else {}))
            new_state.append(layer_state)
        top = self.final_norm(output)
        dropped = masks.output(self._between_layers(top))
        if self.training and self.keeps_top_output and torch.is_grad_enabled():
            self.top_output = (top, dropped)
        logits = self.head(self.head_projection(dropped))
        return logits.transpose(0, 1), new_state

    def step(self, tokens: Tensor, state: list) -> tuple[Tensor, list]:
        """One symbol per stream: ``tokens`` is ``[B]``; returns logits ``[B, V]`` and the new state.

        Runs each layer's ``step`` (its equations, one time step) rather than its window
        ``forward``: at one step a fused library kernel costs more to set up than it saves, and
        the two are held to the same function by the reference check.
        """
        output = self.embedding(tokens)
        if self.drops_inside:
            output = self.dropout(output)
        new_state = []
        for index, (layer, layer_state) in enumerate(zip(self.layers, state)):
            if index > 0:
                output = self._between_layers(output)
            output, layer_state = layer.step(output, layer_state)
            new_state.append(layer_state)
        return self.head(self.head_projection(self._between_layers(self.final_norm(output)))), new_state

    def _between_layers(self, x: Tensor) -> Tensor:
        """--dropout between layers and on the softmax input; none in a stack of residual blocks, which drop
        their own branches (``RecurrentCell.drops_inside``)."""
        return x if self.drops_inside else self.dropout(x)

    @torch.no_grad()
    def for_sampling(self) -> "InferenceModel | LanguageModel":
        """What sampling calls ``step`` on, symbol after symbol: an :class:`InferenceModel` of the
        current weights, or in training mode (dropout drawn) the model itself."""
        return self if self.training else InferenceModel(self)

    def layer_groups(self) -> dict[str, list[nn.Parameter]]:
        """Parameters by layer, for per-layer gradient norms (tied layers count once; a table tied to the
        softmax is the embedding's)."""
        groups = {"embedding": list(self.embedding.parameters())}
        seen = set()
        for index, layer in enumerate(self.layers):
            if id(layer) in seen:
                continue
            seen.add(id(layer))
            groups[f"layer{index}"] = list(layer.parameters())
        embedding = {id(parameter) for parameter in groups["embedding"]}
        softmax = [*self.head_projection.parameters(), *self.head.parameters()]
        groups["softmax"] = [parameter for parameter in softmax if id(parameter) not in embedding]
        return {name: params for name, params in groups.items() if params}


class InferenceModel:
    """``LanguageModel.step`` of an eval-mode model, with the weights arranged once for sampling.

    Each layer runs its :class:`~charlm.cells.base.InferenceStep`; the bottom layer's input share
    is taken once for every symbol of the vocabulary and gathered by token, as the window path
    does. Its weights are views or copies of the model's: build it again after they change.
    """

    def __init__(self, model: LanguageModel):
        table = model._embedding_table()
        vocabulary = torch.arange(model.config.vocab_size, device=model.head.weight.device)
        self.inputs = table if table is not None else model.embedding(vocabulary)  # one row per symbol
        built = {}  # tied layers (one module repeated in the stack) share one
        for layer in model.layers:
            if id(layer) not in built:
                built[id(layer)] = layer.inference_step()
        self.layers = [built[id(layer)] for layer in model.layers]
        self.table = self.layers[0].project(self.inputs)  # [V, k], or None where the cell takes nothing ahead
        self.final_norm = model.final_norm
        self.head_projection = model.head_projection
        self.head_weight = model.head.weight.T
        self.head_bias = model.head.bias

    def step(self, tokens: Tensor, state: list) -> tuple[Tensor, list]:
        """The same function as :meth:`LanguageModel.step` in eval mode."""
        bottom = self.layers[0]
        output = self.inputs.index_select(0, tokens) if bottom.reads_input or self.table is None else None
        projected = None if self.table is None else self.table.index_select(0, tokens)
        new_state = []
        for index, (layer, layer_state) in enumerate(zip(self.layers, state)):
            if index > 0:
                projected = layer.project(output)
            output, layer_state = layer.advance(projected, output, layer_state)
            new_state.append(layer_state)
        top = self.head_projection(self.final_norm(output))
        if self.head_bias is None:
            return top @ self.head_weight, new_state
        return torch.addmm(self.head_bias, top, self.head_weight), new_state


def tied_stack(cell_class, input_size: int, config: ModelConfig, cell_config) -> list:
    """One block repeated ``config.layers`` times: each layer reads the one below with the same weights,
    so the block's output must be as wide as its input."""
    if hasattr(cell_config, "tied"):
        raise CharlmError(f"cell {config.cell!r} ties its layers itself: use --cell-opt tied=true (or false)")
    block = cell_class(input_size, config.hidden_size, cell_config)
    if config.layers > 1 and block.output_size != input_size:
        raise CharlmError(
            f"cell {config.cell!r} cannot tie its layers: its output width {block.output_size} differs "
            f"from its input width {input_size}"
        )
    return [block] * config.layers


def count_parameters(model: nn.Module) -> int:
    return sum(parameter.numel() for parameter in model.parameters())


def detach_state(state):
    return [tuple(tensor.detach() for tensor in layer_state) for layer_state in state]
