"""AWD-LSTM's regularisers (Merity, Keskar & Socher 2018), for any cell: the masks a training window draws.

Each training window draws, once, before its first step:

- weight drop (``weight_drop``): DropConnect on the recurrent matrices, the parameters a cell names in
  ``recurrent_weights`` (only their ``recurrent_columns`` where a matrix also multiplies the input). The
  layer runs its forward with the masked matrices in their place (``torch.func.functional_call``), so a
  fused library kernel (cuDNN, oneDNN) is given the masked weight, as AWD-LSTM does it, and the gradient
  flows through the mask to the weight itself. One mask per matrix per window: the same at every step,
  and for every layer of a tied stack;
- embedding dropout (``dropout_embed``, AWD-LSTM's dropoute): whole symbols dropped, rows of the
  embedding table zeroed and the others scaled by 1 / (1 − p);
- locked (variational) dropout on the embedding output, between layers and before the softmax
  (``dropout_input``, ``dropout_hidden``, ``dropout_output``; AWD-LSTM's dropouti, dropouth, dropout): one
  mask per stream, the same at every step of the window.

In eval mode nothing is drawn and the model computes the function it always did. AR and TAR, the
activation penalties, are the training step's (``charlm.training.step``): they read the top layer's
output, which the model keeps for them (``LanguageModel.keeps_top_output``).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from charlm.cells.base import RecurrentCell
from charlm.errors import CharlmError


# The rates' settings, as ModelConfig and TrainConfig name them (in the order of ``Rates``).
REGULARISER_FIELDS = ("weight_drop", "dropout_embed", "dropout_input", "dropout_hidden", "dropout_output")


@dataclasses.dataclass(frozen=True)
class Rates:
    """The rates of the masks a training window draws (0: none)."""

    weight_drop: float = 0.0
    embed: float = 0.0
    input: float = 0.0
    hidden: float = 0.0
    output: float = 0.0

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not 0.0 <= value < 1.0:
                raise CharlmError(f"{field.name.replace('_', ' ')} rate must be in [0, 1), not {value}")

    @property
    def any(self) -> bool:
        return any(dataclasses.astuple(self))


NONE = Rates()


def recurrent_weights(layer: nn.Module) -> dict[str, slice]:
    """The recurrent matrices of ``layer`` (a cell, or a block around one) by their name in it, each with
    the columns that multiply the carried state."""
    found = {}
    for prefix, module in layer.named_modules():
        if isinstance(module, RecurrentCell):
            for name in module.recurrent_weights:
                found[f"{prefix}.{name}" if prefix else name] = module.recurrent_columns(name)
    return found


class Regularisers:
    """A model's masks (``rates``) for its ``layers``, drawn by :meth:`window`. ``cell`` names the cell
    in the error of a weight drop that has nothing to mask."""

    def __init__(self, rates: Rates, layers: nn.ModuleList, cell: str):
        self.rates = rates
        self.recurrent = [recurrent_weights(layer) if rates.weight_drop else {} for layer in layers]
        if rates.weight_drop and not any(self.recurrent):
            raise CharlmError(f"cell {cell!r} has no recurrent matrices for --weight-drop to mask")

    @classmethod
    def of(cls, config, layers: nn.ModuleList) -> "Regularisers":
        """The regularisers a ``ModelConfig`` asks for."""
        if config.dropout_embed and config.embed_size == 0:
            raise CharlmError("--dropout-embed needs an embedding table, not --embed-size 0")
        return cls(Rates(*(getattr(config, name) for name in REGULARISER_FIELDS)), layers, config.cell)

    @property
    def active(self) -> bool:
        """Whether a training window draws masks."""
        return self.rates.any

    def window(self, layers: nn.ModuleList, training: bool) -> "WindowMasks":
        """This window's masks: drawn now in training mode, none in eval mode."""
        if not training or not self.rates.any:
            return WindowMasks(NONE, [])
        masked = []
        drawn = {}  # a tied stack repeats one module: one mask for all its layers
        for layer, names in zip(layers, self.recurrent):
            if id(layer) not in drawn:
                drawn[id(layer)] = {
                    name: drop_connect(layer.get_parameter(name), self.rates.weight_drop, columns)
                    for name, columns in names.items()
                }
            masked.append(drawn[id(layer)])
        return WindowMasks(self.rates, masked)


class WindowMasks:
    """The masks of one window, applied where the model's forward calls for them."""

    def __init__(self, rates: Rates, masked_weights: list[dict[str, Tensor]]):
        self.rates, self.masked_weights = rates, masked_weights

    @property
    def folds_embedding(self) -> bool:
        """Whether the bottom layer may read its inputs as rows of the table (not with dropped inputs)."""
        return self.rates.input == 0

    def embed(self, embedding: nn.Module, tokens: Tensor, table: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """The embedded window and the table it was read from, whole symbols dropped."""
        if self.rates.embed == 0:
            return embedding(tokens), table
        table = symbol_dropout(table, self.rates.embed)
        return F.embedding(tokens, table), table

    def inputs(self, x: Tensor) -> Tensor:
        return locked_dropout(x, self.rates.input)

    def hidden(self, x: Tensor) -> Tensor:
        return locked_dropout(x, self.rates.hidden)

    def output(self, x: Tensor) -> Tensor:
        return locked_dropout(x, self.rates.output)

    def layer(self, index: int, layer: nn.Module, run):
        """What runs layer ``index``: ``run``, or the layer's forward with its masked recurrent matrices."""
        if index >= len(self.masked_weights) or not self.masked_weights[index]:
            return run
        masked = self.masked_weights[index]
        return lambda *args, **kwargs: torch.func.functional_call(layer, masked, args, kwargs)


def locked_dropout(x: Tensor, p: float) -> Tensor:
    """``x`` ``[T, B, d]`` with one dropout mask per stream b, the same at every step t."""
    if p == 0:
        return x
    return x * x.new_empty(1, *x.shape[1:]).bernoulli_(1 - p).div_(1 - p)


def symbol_dropout(table: Tensor, p: float) -> Tensor:
    """``table`` ``[V, d]`` with whole rows (symbols) zeroed, the others scaled by 1 / (1 − p)."""
    return table * table.new_empty(table.shape[0], 1).bernoulli_(1 - p).div_(1 - p)


def drop_connect(weight: Tensor, p: float, columns: slice) -> Tensor:
    """``weight`` with its entries in ``columns`` (of the last dimension) dropped, each alone (DropConnect)."""
    if columns == slice(None):
        return F.dropout(weight, p, training=True)
    mask = torch.ones_like(weight)
    mask[..., columns] = F.dropout(mask[..., columns], p, training=True)
    return weight * mask
