"""The recurrent highway network (Zilly, Srivastava, Koutník & Schmidhuber 2017)."""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor, nn

from charlm.cells.base import RecurrentCell, State, glorot_uniform_


@dataclasses.dataclass
class RHNConfig:
    depth: int = 5  # L, highway micro-layers per time step
    gate_bias: float = -2.0  # initial b_T (−4 was used for enwik8/text8): start by carrying

    def __post_init__(self):
        if self.depth < 1:
            raise ValueError(f"depth must be at least 1, not {self.depth}")


class RecurrentHighwayNetwork(RecurrentCell):
    r"""Recurrent highway network with coupled carry gate (c = 1 − t).

    s₀ = s_{t−1} (the previous output). For ℓ = 1..L:

        h_ℓ = tanh(1[ℓ=1] W_H x_t + R_{H,ℓ} s_{ℓ−1} + b_{H,ℓ})
        t_ℓ = σ(1[ℓ=1] W_T x_t + R_{T,ℓ} s_{ℓ−1} + b_{T,ℓ})
        s_ℓ = h_ℓ ⊙ t_ℓ + s_{ℓ−1} ⊙ (1 − t_ℓ)

    Output s_t = s_L. The input enters only micro-layer 1. b_T starts at ``gate_bias``.
    Rows of W and of each R_ℓ, b_ℓ are stored in the order (H, T).
    """

    name = "rhn"
    description = "Recurrent highway network, L micro-layers, coupled carry gate (options: depth, gate_bias)"
    paper = "Zilly et al. 2017, Recurrent highway networks"
    formula = "2dn + 2Ln² + 2Ln (L = depth, default 5)"
    Config = RHNConfig
    folds_embedding = True

    def __init__(self, input_size: int, hidden_size: int, config: RHNConfig | None = None):
        super().__init__(input_size, hidden_size, config)
        n, L = hidden_size, self.config.depth
        self.weight_input = nn.Parameter(torch.empty(2 * n, input_size))  # [W_H; W_T]
        self.weight_hidden = nn.Parameter(torch.empty(L, 2 * n, n))  # [R_{H,ℓ}; R_{T,ℓ}]
        self.bias = nn.Parameter(torch.empty(L, 2 * n))  # [b_{H,ℓ}; b_{T,ℓ}]
        self.reset_parameters()

    def reset_parameters(self):
        n = self.hidden_size
        glorot_uniform_(self.weight_input, blocks=2)
        for weight in self.weight_hidden:
            glorot_uniform_(weight, blocks=2)
        with torch.no_grad():
            self.bias.zero_()
            self.bias[:, n:].fill_(self.config.gate_bias)

    def step(self, x: Tensor, state: State) -> tuple[Tensor, State]:
        (s,) = state
        W_H, W_T = self.weight_input.chunk(2)
        for layer in range(self.config.depth):
            R_H, R_T = self.weight_hidden[layer].chunk(2)
            b_H, b_T = self.bias[layer].chunk(2)
            x_H, x_T = (x @ W_H.T, x @ W_T.T) if layer == 0 else (0.0, 0.0)
            h = torch.tanh(x_H + s @ R_H.T + b_H)
            t = torch.sigmoid(x_T + s @ R_T.T + b_T)
            s = h * t + s * (1 - t)
        return s, (s,)

    def forward(self, inputs: Tensor, state: State, lookup=None) -> tuple[Tensor, State]:
        first_layer_input = self.input_product(inputs, self.weight_input, self.bias[0], lookup)
        (s,) = state
        outputs = []
        for input_t in first_layer_input:
            s = self._highway(s, input_t + s @ self.weight_hidden[0].T)
            for layer in range(1, self.config.depth):
                s = self._highway(s, torch.addmm(self.bias[layer], s, self.weight_hidden[layer].T))
            outputs.append(s)
        return torch.stack(outputs), (s,)

    @staticmethod
    def _highway(s: Tensor, pre: Tensor) -> Tensor:
        """s_ℓ from s_{ℓ−1} and the micro-layer's pre-activations [H; T]."""
        pre_h, pre_t = pre.chunk(2, dim=-1)
        t = torch.sigmoid(pre_t)
        return torch.tanh(pre_h) * t + s * (1 - t)
