"""The minimal gated unit (Zhou, Wu, Zhang & Zhou 2016): a GRU with one gate."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from charlm.cells.base import InferenceStep, RecurrentCell, State, glorot_uniform_


class MinimalGatedUnit(RecurrentCell):
    r"""Minimal gated unit: the forget gate doubles as the reset gate.

        f_t = σ(W_f x_t + U_f h_{t−1} + b_f)
        ĥ_t = tanh(W_h x_t + U_h (f_t ⊙ h_{t−1}) + b_h)
        h_t = (1 − f_t) ⊙ h_{t−1} + f_t ⊙ ĥ_t

    Rows are stored in the order (f, h).
    """

    name = "mgu"
    recurrent_weights = ("weight_hidden",)
    activation_factor = 19
    folds_embedding = True
    evaluates_through_step = True  # measured faster without gradients (see RecurrentCell)
    description = "Minimal gated unit: one gate f, used to reset and to update"
    paper = "Zhou et al. 2016, Minimal gated unit for recurrent neural networks"
    formula = "2(dn + n² + n)"

    def __init__(self, input_size: int, hidden_size: int, config=None):
        super().__init__(input_size, hidden_size, config)
        n = hidden_size
        self.weight_input = nn.Parameter(torch.empty(2 * n, input_size))
        self.weight_hidden = nn.Parameter(torch.empty(2 * n, n))
        self.bias = nn.Parameter(torch.zeros(2 * n))
        self.reset_parameters()

    def reset_parameters(self):
        glorot_uniform_(self.weight_input, blocks=2)
        glorot_uniform_(self.weight_hidden, blocks=2)
        with torch.no_grad():
            self.bias.zero_()

    def step(self, x: Tensor, state: State) -> tuple[Tensor, State]:
        (h,) = state
        W_f, W_h = self.weight_input.chunk(2)
        U_f, U_h = self.weight_hidden.chunk(2)
        b_f, b_h = self.bias.chunk(2)
        f = torch.sigmoid(x @ W_f.T + h @ U_f.T + b_f)
        h_hat = torch.tanh(x @ W_h.T + (f * h) @ U_h.T + b_h)
        h = (1 - f) * h + f * h_hat
        return h, (h,)

    def inference_step(self) -> "MGUInference":
        return MGUInference(self)

    def forward(self, inputs: Tensor, state: State, lookup=None) -> tuple[Tensor, State]:
        pre_f, pre_h = self.input_product(inputs, self.weight_input, self.bias, lookup).chunk(2, dim=-1)
        U_f, U_h = self.weight_hidden.chunk(2)
        (h,) = state
        outputs = []
        for pre_f_t, pre_h_t in zip(pre_f, pre_h):
            f = torch.sigmoid(pre_f_t + h @ U_f.T)
            h_hat = torch.tanh(pre_h_t + (f * h) @ U_h.T)
            h = (1 - f) * h + f * h_hat
            outputs.append(h)
        return torch.stack(outputs), (h,)


class MGUInference(InferenceStep):
    """The MGU step for sampling: W x + b taken ahead for f and ĥ, then one product each."""

    reads_input = False

    def __init__(self, cell: MinimalGatedUnit):
        super().__init__(cell)
        n = self.hidden_size = cell.hidden_size
        self.weight_input, self.bias = cell.weight_input.T, cell.bias
        self.U_f, self.U_h = cell.weight_hidden[:n].T, cell.weight_hidden[n:].T

    def project(self, x: Tensor) -> Tensor:
        return torch.addmm(self.bias, x, self.weight_input)

    def advance(self, projected: Tensor, x: Tensor | None, state: State) -> tuple[Tensor, State]:
        (h,) = state
        n = self.hidden_size
        f = torch.addmm(projected.narrow(-1, 0, n), h, self.U_f).sigmoid_()
        h_hat = torch.addmm(projected.narrow(-1, n, n), f * h, self.U_h).tanh_()
        h = torch.addcmul(h, f, h_hat.sub_(h))  # (1 − f) ⊙ h + f ⊙ ĥ
        return h, (h,)
