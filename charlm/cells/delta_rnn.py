"""The Delta-RNN of the Differential State Framework (Ororbia, Mikolov & Reitter 2017)."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from charlm.cells.base import InferenceStep, RecurrentCell, State, glorot_uniform_
from charlm.cells.multiplicative import MultiplicativeIntegration
from charlm.settings import setting


class AdditiveIntegration(nn.Module):
    """The first-order inner function tanh(u + a + b), with the interface of MultiplicativeIntegration."""

    def __init__(self, size: int):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(size))

    def reset_parameters(self):
        with torch.no_grad():
            self.bias.zero_()

    def forward(self, a: Tensor, u: Tensor) -> Tensor:
        return torch.tanh(u + a + self.bias)

    def prepare(self, a: Tensor) -> Tensor:
        return a + self.bias

    def combine(self, u: Tensor, prepared: Tensor) -> Tensor:
        return torch.tanh(u + prepared)


INNER = {
    "second": lambda size, config: MultiplicativeIntegration(size, alpha_init=config.alpha_init),
    "first": lambda size, config: AdditiveIntegration(size),
}
OUTER = {"identity": lambda v: v, "tanh": torch.tanh}


@dataclasses.dataclass
class DeltaRNNConfig:
    inner: str = setting(
        "second", "The proposal z_t: second order (the general MI block) or first order.", choices=tuple(INNER)
    )
    outer: str = setting(
        "identity", "Φ: identity (character and word models) or tanh (subword models).", choices=tuple(OUTER)
    )
    alpha_init: float = setting(2.0, "Initial α of the second-order inner function (the paper's PTB value).")
    dropout: float = setting(
        0.0, "Delta-RNN-drop: dropout on z_t before mixing (training mode only).", min=0, max=1, max_open=True
    )


class DeltaRNN(RecurrentCell):
    r"""Delta-RNN: a proposal z_t mixed with the old state by a gate driven by the data.

    Shared projections a = W x_t and u = V h_{t−1} (no biases of their own).

        z_t = tanh(α ⊙ u ⊙ a + β₁ ⊙ u + β₂ ⊙ a + b)    inner, second order (default)
        z_t = tanh(u + a + b)                           inner, first order (``inner=first``)
        r_t = σ(a + b_r)                                gate, through the same W
        h_t = Φ((1 − r_t) ⊙ z_t + r_t ⊙ h_{t−1})        outer, Φ = identity (default) or tanh

    α = ``alpha_init`` (2), β₁ = β₂ = 1, b = b_r = 0 at the start. With ``dropout`` p > 0, z_t is
    dropped before mixing in training mode (inverted scaling: kept units are divided by 1 − p).
    The paper's character models feed the one-hot symbol straight into W: use ``embed_size=0``.
    """

    name = "delta-rnn"
    recurrent_weights = ("weight_hidden",)
    activation_factor = 17
    folds_embedding = True
    description = "Delta-RNN (Differential State Framework) (options: inner, outer, alpha_init, dropout)"
    paper = "Ororbia, Mikolov & Reitter 2017, Learning simpler language models with the Delta-RNN"
    formula = "dn + n² + 5n (second-order inner); dn + n² + 2n (first-order)"
    Config = DeltaRNNConfig

    def __init__(self, input_size: int, hidden_size: int, config: DeltaRNNConfig | None = None):
        super().__init__(input_size, hidden_size, config)
        n = hidden_size
        self.weight_input = nn.Parameter(torch.empty(n, input_size))  # W
        self.weight_hidden = nn.Parameter(torch.empty(n, n))  # V
        self.inner = INNER[self.config.inner](n, self.config)
        self.gate_bias = nn.Parameter(torch.zeros(n))  # b_r
        self.outer = OUTER[self.config.outer]
        self.reset_parameters()

    def reset_parameters(self):
        glorot_uniform_(self.weight_input)
        glorot_uniform_(self.weight_hidden)
        self.inner.reset_parameters()
        with torch.no_grad():
            self.gate_bias.zero_()

    def step(self, x: Tensor, state: State) -> tuple[Tensor, State]:
        (h,) = state
        a = x @ self.weight_input.T
        u = h @ self.weight_hidden.T
        z = F.dropout(self.inner(a, u), self.config.dropout, self.training)
        r = torch.sigmoid(a + self.gate_bias)
        h = self.outer((1 - r) * z + r * h)
        return h, (h,)

    def inference_step(self) -> "DeltaInference":
        return DeltaInference(self)

    def forward(self, inputs: Tensor, state: State, lookup=None) -> tuple[Tensor, State]:
        if lookup is None:
            a = self.input_product(inputs, self.weight_input)
            prepared, gates = self.inner.prepare(a), torch.sigmoid(a + self.gate_bias)
        else:  # what depends on a alone, for each of the V symbols rather than each position
            a = lookup.rows(self.weight_input)
            prepared, gates = lookup.spread(self.inner.prepare(a)), lookup.spread(torch.sigmoid(a + self.gate_bias))
        masks = None
        if self.training and self.config.dropout > 0:
            masks = F.dropout(torch.ones_like(gates), self.config.dropout, True)  # one draw for the whole window
        (h,) = state
        outputs = []
        for t, (prepared_t, r) in enumerate(zip(prepared, gates)):
            z = self.inner.combine(h @ self.weight_hidden.T, prepared_t)
            if masks is not None:
                z = z * masks[t]
            h = self.outer((1 - r) * z + r * h)
            outputs.append(h)
        return torch.stack(outputs), (h,)


class DeltaInference(InferenceStep):
    """The Delta-RNN step for sampling (no dropout: eval mode): the inner function's input-only
    parts and the gate r taken ahead from W x, then one product V h."""

    reads_input = False

    def __init__(self, cell: DeltaRNN):
        super().__init__(cell)
        self.weight_input, self.weight_hidden = cell.weight_input.T, cell.weight_hidden.T
        self.inner, self.outer, self.gate_bias = cell.inner, cell.outer, cell.gate_bias

    def project(self, x: Tensor) -> Tensor:
        a = x @ self.weight_input
        return torch.cat([self.inner.prepare(a), torch.sigmoid(a + self.gate_bias)], dim=-1)

    def advance(self, projected: Tensor, x: Tensor | None, state: State) -> tuple[Tensor, State]:
        (h,) = state
        n = h.shape[-1]
        prepared, r = projected.split([projected.shape[-1] - n, n], dim=-1)
        z = self.inner.combine(h @ self.weight_hidden, prepared)
        h = self.outer(torch.addcmul(z, r, h - z))  # (1 − r) ⊙ z + r ⊙ h
        return h, (h,)
