"""Multiplicative integration (Wu, Zhang, Zhang, Bengio & Salakhutdinov 2016).

The "general MI" block combines an input projection a and a recurrent projection u with a
Hadamard product as well as a sum. It is the whole of the MI-RNN and the second-order inner
function of the Delta-RNN (charlm.cells.delta_rnn), so it lives here once.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from charlm.cells.base import InferenceStep, RecurrentCell, State, glorot_uniform_


class MultiplicativeIntegration(nn.Module):
    r"""The general MI block: tanh(α ⊙ a ⊙ u + β₁ ⊙ u + β₂ ⊙ a + b), with α, β₁, β₂, b ∈ R^n (4n).

    ``forward(a, u)`` is the equation. For a whole window, ``prepare(a)`` computes the parts that
    depend on a alone, gain = α ⊙ a + β₁ and offset = β₂ ⊙ a + b, and ``combine(u, prepared_t)``
    finishes one step as tanh(gain ⊙ u + offset), the same function with fewer products per step.
    """

    def __init__(self, size: int, alpha_init: float = 1.0):
        super().__init__()
        self.alpha_init = alpha_init
        self.alpha = nn.Parameter(torch.empty(size))
        self.beta_hidden = nn.Parameter(torch.empty(size))  # β₁, scales u
        self.beta_input = nn.Parameter(torch.empty(size))  # β₂, scales a
        self.bias = nn.Parameter(torch.empty(size))
        self.reset_parameters()

    def reset_parameters(self):
        with torch.no_grad():
            self.alpha.fill_(self.alpha_init)
            self.beta_hidden.fill_(1.0)
            self.beta_input.fill_(1.0)
            self.bias.zero_()

    def forward(self, a: Tensor, u: Tensor) -> Tensor:
        return torch.tanh(self.alpha * a * u + self.beta_hidden * u + self.beta_input * a + self.bias)

    def prepare(self, a: Tensor) -> Tensor:
        """[gain; offset] for every step of a window of input projections ``a``."""
        return torch.cat([self.alpha * a + self.beta_hidden, self.beta_input * a + self.bias], dim=-1)

    def combine(self, u: Tensor, prepared: Tensor) -> Tensor:
        gain, offset = prepared.chunk(2, dim=-1)
        return torch.tanh(gain * u + offset)


class MultiplicativeRNN(RecurrentCell):
    r"""MI-RNN: an Elman network whose two projections meet through the general MI block.

        a_t = W x_t,  u_t = U h_{t−1}
        h_t = tanh(α ⊙ a_t ⊙ u_t + β₁ ⊙ u_t + β₂ ⊙ a_t + b)

    α, β₁, β₂ start at 1 and b at 0. W and U have no biases of their own.
    """

    name = "mi-rnn"
    recurrent_weights = ("weight_hidden",)
    activation_factor = 14
    folds_embedding = True
    description = "Multiplicative-integration RNN, tanh(α⊙Wx⊙Uh + β₁⊙Uh + β₂⊙Wx + b)"
    paper = "Wu et al. 2016, On multiplicative integration with recurrent neural networks"
    formula = "dn + n² + 4n"

    def __init__(self, input_size: int, hidden_size: int, config=None):
        super().__init__(input_size, hidden_size, config)
        n = hidden_size
        self.weight_input = nn.Parameter(torch.empty(n, input_size))
        self.weight_hidden = nn.Parameter(torch.empty(n, n))
        self.integration = MultiplicativeIntegration(n, alpha_init=1.0)
        self.reset_parameters()

    def reset_parameters(self):
        glorot_uniform_(self.weight_input)
        glorot_uniform_(self.weight_hidden)
        self.integration.reset_parameters()

    def step(self, x: Tensor, state: State) -> tuple[Tensor, State]:
        (h,) = state
        h = self.integration(x @ self.weight_input.T, h @ self.weight_hidden.T)
        return h, (h,)

    def inference_step(self) -> "IntegrationInference":
        return IntegrationInference(self)

    def forward(self, inputs: Tensor, state: State, lookup=None) -> tuple[Tensor, State]:
        if lookup is None:
            prepared = self.integration.prepare(self.input_product(inputs, self.weight_input))
        else:  # gain and offset for each of the V symbols rather than each position
            prepared = lookup.spread(self.integration.prepare(lookup.rows(self.weight_input)))
        (h,) = state
        outputs = []
        for prepared_t in prepared:
            h = self.integration.combine(h @ self.weight_hidden.T, prepared_t)
            outputs.append(h)
        return torch.stack(outputs), (h,)


class IntegrationInference(InferenceStep):
    """The MI-RNN step for sampling: the integration's input-only parts (gain and offset) taken
    ahead from W x, then one product U h and the block's combine."""

    reads_input = False

    def __init__(self, cell: MultiplicativeRNN):
        super().__init__(cell)
        self.weight_input, self.weight_hidden = cell.weight_input.T, cell.weight_hidden.T
        self.integration = cell.integration

    def project(self, x: Tensor) -> Tensor:
        return self.integration.prepare(x @ self.weight_input)

    def advance(self, projected: Tensor, x: Tensor | None, state: State) -> tuple[Tensor, State]:
        (h,) = state
        h = self.integration.combine(h @ self.weight_hidden, projected)
        return h, (h,)
