"""Gated recurrent unit (Cho et al. 2014), in the form the Lattice Recurrent Unit paper writes."""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor, nn

from charlm.cells.base import InferenceStep, RecurrentCell, State, glorot_uniform_, library_rnn
from charlm.settings import setting


@dataclasses.dataclass
class GRUConfig:
    reset_after: bool = setting(False, "cuDNN's form: ĥ = tanh(W_h x + r ⊙ (U_h h + b_hn)); a different function.")


class GRU(RecurrentCell):
    r"""Gated recurrent unit.

        z_t = σ(W_z x_t + U_z h_{t−1} + b_z)
        r_t = σ(W_r x_t + U_r h_{t−1} + b_r)
        ĥ_t = tanh(W_h x_t + U_h (r_t ⊙ h_{t−1}) + b_h)
        h_t = z_t ⊙ h_{t−1} + (1 − z_t) ⊙ ĥ_t

    Option ``reset_after`` computes ĥ_t = tanh(W_h x_t + b_h + r_t ⊙ (U_h h_{t−1} + b_hn)), the
    function of cuDNN and PyTorch's fused GRU (one extra bias b_hn); it then uses that kernel.
    Rows are stored in PyTorch's order (r, z, h).
    """

    name = "gru"
    recurrent_weights = ("weight_hidden",)
    activation_factor = 19
    description = "Gated recurrent unit, reset before the recurrent product (option: reset_after)"
    paper = "Cho et al. 2014; form of Ahuja & Morency 2017 (LRU paper)"
    formula = "3(dn + n² + n) (+n with reset_after)"
    Config = GRUConfig
    folds_embedding = True

    def __init__(self, input_size: int, hidden_size: int, config: GRUConfig | None = None):
        super().__init__(input_size, hidden_size, config)
        n = hidden_size
        self.weight_input = nn.Parameter(torch.empty(3 * n, input_size))
        self.weight_hidden = nn.Parameter(torch.empty(3 * n, n))
        self.bias = nn.Parameter(torch.zeros(3 * n))
        if self.config.reset_after:
            self.bias_hidden_candidate = nn.Parameter(torch.zeros(n))
        self.reset_parameters()

    def reset_parameters(self):
        glorot_uniform_(self.weight_input, blocks=3)
        glorot_uniform_(self.weight_hidden, blocks=3)
        with torch.no_grad():
            self.bias.zero_()
            if self.config.reset_after:
                self.bias_hidden_candidate.zero_()

    def step(self, x: Tensor, state: State) -> tuple[Tensor, State]:
        (h,) = state
        W_r, W_z, W_h = self.weight_input.chunk(3)
        U_r, U_z, U_h = self.weight_hidden.chunk(3)
        b_r, b_z, b_h = self.bias.chunk(3)
        r = torch.sigmoid(x @ W_r.T + h @ U_r.T + b_r)
        z = torch.sigmoid(x @ W_z.T + h @ U_z.T + b_z)
        if self.config.reset_after:
            h_hat = torch.tanh(x @ W_h.T + b_h + r * (h @ U_h.T + self.bias_hidden_candidate))
        else:
            h_hat = torch.tanh(x @ W_h.T + (r * h) @ U_h.T + b_h)
        h = z * h + (1 - z) * h_hat
        return h, (h,)

    def inference_step(self) -> "GRUInference":
        return GRUInference(self)

    def forward(self, inputs: Tensor, state: State, lookup=None) -> tuple[Tensor, State]:
        if self.config.reset_after and not self.prefers_python_loop(inputs, lookup):
            return self._fused_forward(inputs, state)
        n = self.hidden_size
        pre_input = self.input_product(inputs, self.weight_input, self.bias, lookup)
        (h,) = state
        outputs = []
        if self.config.reset_after:
            for pre_t in pre_input:
                from_hidden = h @ self.weight_hidden.T  # U h for r, z and ĥ at once
                r, z = torch.sigmoid(pre_t[:, : 2 * n] + from_hidden[:, : 2 * n]).chunk(2, dim=-1)
                h_hat = torch.tanh(pre_t[:, 2 * n :] + r * (from_hidden[:, 2 * n :] + self.bias_hidden_candidate))
                h = torch.addcmul(h_hat, z, h - h_hat)  # z ⊙ h + (1 − z) ⊙ ĥ
                outputs.append(h)
            return torch.stack(outputs), (h,)
        U_rz, U_h = self.weight_hidden[: 2 * n], self.weight_hidden[2 * n :]
        for pre_t in pre_input:
            r, z = torch.sigmoid(pre_t[:, : 2 * n] + h @ U_rz.T).chunk(2, dim=-1)
            h_hat = torch.tanh(pre_t[:, 2 * n :] + (r * h) @ U_h.T)
            h = torch.addcmul(h_hat, z, h - h_hat)  # z ⊙ h + (1 − z) ⊙ ĥ
            outputs.append(h)
        return torch.stack(outputs), (h,)

    def _fused_forward(self, inputs: Tensor, state: State) -> tuple[Tensor, State]:
        (h,) = state
        n = self.hidden_size
        hidden_bias = torch.cat([self.bias.new_zeros(2 * n), self.bias_hidden_candidate])
        weights = [self.weight_input, self.weight_hidden, self.bias, hidden_bias]
        outputs, h_n = library_rnn(torch.gru, inputs, h.unsqueeze(0), weights, self.training)
        return outputs, (h_n.squeeze(0),)


class GRUInference(InferenceStep):
    """The GRU step for sampling: W x + b taken ahead for r, z and ĥ; then one product for r and
    z and one for ĥ (reset_after: one product U h + [0; 0; b_hn] for all three)."""

    reads_input = False

    def __init__(self, cell: GRU):
        super().__init__(cell)
        n = self.hidden_size = cell.hidden_size
        self.reset_after = cell.config.reset_after
        self.weight_input = cell.weight_input.T
        self.bias = cell.bias
        if self.reset_after:
            self.weight_hidden = cell.weight_hidden.T
            self.bias_hidden = torch.cat([cell.bias.new_zeros(2 * n), cell.bias_hidden_candidate])
        else:
            self.weight_gates = cell.weight_hidden[: 2 * n].T  # U_r, U_z
            self.weight_candidate = cell.weight_hidden[2 * n :].T  # U_h

    def project(self, x: Tensor) -> Tensor:
        return torch.addmm(self.bias, x, self.weight_input)

    def gates(self, projected: Tensor, h: Tensor) -> Tensor:
        """The pre-activations of r and z, side by side (reset before the product)."""
        return torch.addmm(projected.narrow(-1, 0, 2 * self.hidden_size), h, self.weight_gates)

    def advance(self, projected: Tensor, x: Tensor | None, state: State) -> tuple[Tensor, State]:
        (h,) = state
        n = self.hidden_size
        from_input = projected.narrow(-1, 2 * n, n)  # W_h x + b_h
        if self.reset_after:
            from_hidden = torch.addmm(self.bias_hidden, h, self.weight_hidden)
            r, z = (projected + from_hidden).narrow(-1, 0, 2 * n).sigmoid_().unflatten(-1, (2, n)).unbind(-2)
            h_hat = torch.addcmul(from_input, r, from_hidden.narrow(-1, 2 * n, n)).tanh_()
        else:
            r, z = self.gates(projected, h).sigmoid_().unflatten(-1, (2, n)).unbind(-2)
            h_hat = torch.addmm(from_input, r * h, self.weight_candidate).tanh_()
        h = torch.addcmul(h_hat, z, h - h_hat)  # z ⊙ h + (1 − z) ⊙ ĥ
        return h, (h,)
