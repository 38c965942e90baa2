"""The Elman network (Elman 1990): the plain recurrent layer every other cell is compared with."""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor, nn

from charlm.cells.base import InferenceStep, RecurrentCell, State, glorot_uniform_, library_rnn
from charlm.settings import setting

ACTIVATIONS = {"tanh": torch.tanh, "sigmoid": torch.sigmoid, "relu": torch.relu}
IN_PLACE = {"tanh": torch.tanh_, "sigmoid": torch.sigmoid_, "relu": torch.relu_}
FUSED_KERNELS = {"tanh": torch.rnn_tanh, "relu": torch.rnn_relu}  # PyTorch's own loops for the same function


@dataclasses.dataclass
class ElmanConfig:
    activation: str = setting("tanh", "φ, the activation.", choices=tuple(ACTIVATIONS))


class Elman(RecurrentCell):
    r"""Elman network (simple recurrent network).

        h_t = φ(W x_t + U h_{t−1} + b),   φ ∈ {tanh, sigmoid, relu}

    With tanh or relu, ``forward`` runs PyTorch's fused kernel, which computes exactly this
    function with these weights; ``step`` is the equation itself.
    """

    name = "rnn"
    recurrent_weights = ("weight_hidden",)
    activation_factor = 6
    folds_embedding = True
    description = "Elman network, h = φ(Wx + Uh + b) (option: activation tanh|sigmoid|relu)"
    paper = "Elman 1990, Finding structure in time"
    formula = "dn + n² + n"
    Config = ElmanConfig

    def __init__(self, input_size: int, hidden_size: int, config: ElmanConfig | None = None):
        super().__init__(input_size, hidden_size, config)
        n = hidden_size
        self.weight_input = nn.Parameter(torch.empty(n, input_size))
        self.weight_hidden = nn.Parameter(torch.empty(n, n))
        self.bias = nn.Parameter(torch.zeros(n))
        self.activation = ACTIVATIONS[self.config.activation]
        self.reset_parameters()

    def reset_parameters(self):
        glorot_uniform_(self.weight_input)
        glorot_uniform_(self.weight_hidden)
        with torch.no_grad():
            self.bias.zero_()

    def step(self, x: Tensor, state: State) -> tuple[Tensor, State]:
        (h,) = state
        h = self.activation(x @ self.weight_input.T + h @ self.weight_hidden.T + self.bias)
        return h, (h,)

    def inference_step(self) -> "ElmanInference":
        return ElmanInference(self)

    def forward(self, inputs: Tensor, state: State, lookup=None) -> tuple[Tensor, State]:
        (h,) = state
        fused = FUSED_KERNELS.get(self.config.activation)
        if fused is not None and not self.prefers_python_loop(inputs, lookup):
            weights = [self.weight_input, self.weight_hidden, self.bias, torch.zeros_like(self.bias)]
            outputs, h_n = library_rnn(fused, inputs, h.unsqueeze(0), weights, self.training)
            return outputs, (h_n.squeeze(0),)
        pre_input = self.input_product(inputs, self.weight_input, self.bias, lookup)
        outputs = []
        for pre_t in pre_input:
            h = self.activation(pre_t + h @ self.weight_hidden.T)
            outputs.append(h)
        return torch.stack(outputs), (h,)


class ElmanInference(InferenceStep):
    """The Elman step for sampling: W x + b taken ahead, then one product and φ in place."""

    reads_input = False

    def __init__(self, cell: Elman):
        super().__init__(cell)
        self.weight_input, self.weight_hidden = cell.weight_input.T, cell.weight_hidden.T
        self.bias = cell.bias
        self.activation_ = IN_PLACE[cell.config.activation]

    def project(self, x: Tensor) -> Tensor:
        return torch.addmm(self.bias, x, self.weight_input)

    def advance(self, projected: Tensor, x: Tensor | None, state: State) -> tuple[Tensor, State]:
        (h,) = state
        h = self.activation_(torch.addmm(projected, h, self.weight_hidden))
        return h, (h,)
