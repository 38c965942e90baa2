"""minGRU and minLSTM (Feng, Tung, Ahmed, Bengio & Hajimirsadeghi 2024, "Were RNNs All We Needed?"):
a GRU and an LSTM whose gates and candidate read the input alone, so that the state enters its
own update linearly and a whole window is one linear scan (``charlm.cells.scan``)."""

from __future__ import annotations

import math
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from charlm.cells.base import State
from charlm.cells.scan import ScanConfig
from charlm.cells.scan_cell import ScanCell


def g(x: Tensor) -> Tensor:
    """The paper's candidate activation: x + 0.5 for x ≥ 0, σ(x) below; positive, continuous."""
    return torch.where(x >= 0, x + 0.5, torch.sigmoid(x))


def log_g(x: Tensor) -> Tensor:
    """log g(x): log(relu(x) + 0.5) for x ≥ 0, −softplus(−x) below (both branches finite everywhere)."""
    return torch.where(x >= 0, torch.log(F.relu(x) + 0.5), -F.softplus(-x))


class _MinimalRNN(ScanCell):
    """What minGRU and minLSTM share: ``gates`` row blocks of one input-only affine map, turned
    (elementwise) into the scan's coefficients ``a`` and ``b`` (or their logarithms), then one scan."""

    gates: ClassVar[int] = 2

    def __init__(self, input_size: int, hidden_size: int, config: ScanConfig | None = None):
        super().__init__(input_size, hidden_size, config)
        self.weight = nn.Parameter(torch.empty(self.gates * hidden_size, input_size))
        self.bias = nn.Parameter(torch.empty(self.gates * hidden_size))
        self.reset_parameters()

    def reset_parameters(self):
        # The paper's code builds each block as nn.Linear(d, n): weight and bias from U(±1/√d).
        bound = 1.0 / math.sqrt(self.input_size)
        with torch.no_grad():
            self.weight.uniform_(-bound, bound)
            self.bias.uniform_(-bound, bound)


class MinGRU(_MinimalRNN):
    r"""minGRU: a GRU without the reset gate whose update gate and candidate read only the input.

        z_t = σ(Linear_{d_h}(x_t))
        h̃_t = g(Linear_{d_h}(x_t)),   g(x) = x + 0.5 (x ≥ 0), σ(x) (x < 0)
        h_t = (1 − z_t) ⊙ h_{t−1} + z_t ⊙ h̃_t

    g keeps h̃_t > 0, so that from a positive state every h_t is positive and the log-space scan
    (``scan=log``) applies: log(1 − z_t) = −softplus(k), log z_t = −softplus(−k) for k = W_z x + b_z.
    The carried state enters that scan outside the logarithms, so a zero state (every sequence's
    start) or a negative one is computed exactly too. Rows are stored in the order (z, h).
    """

    name = "mingru"
    # autograd keeps ≈ 7.8 float32 per (step, unit) (saved-tensor hooks, 2 layers of 256, batch 128 ×
    # bptt 50, the model's ends included; lstm counts 12.7 so, against its RSS-measured 15): rounded up by half
    activation_factor = 12
    description = "minGRU: input-only update gate and candidate; a linear scan over the window"
    paper = "Feng et al. 2024, Were RNNs all we needed?"
    formula = "2(dn + n)"
    gates = 2

    def step(self, x: Tensor, state: State) -> tuple[Tensor, State]:
        (h,) = state
        W_z, W_h = self.weight.chunk(2)
        b_z, b_h = self.bias.chunk(2)
        z = torch.sigmoid(x @ W_z.T + b_z)  # z_t = σ(Linear(x_t))
        h_tilde = g(x @ W_h.T + b_h)  # h̃_t = g(Linear(x_t))
        h = (1 - z) * h + z * h_tilde  # h_t = (1 − z_t) ⊙ h_{t−1} + z_t ⊙ h̃_t
        return h, (h,)

    def coefficients(self, pre):
        k, candidate = pre.chunk(2, dim=-1)
        return torch.sigmoid(-k), torch.sigmoid(k) * g(candidate)  # a = 1 − z, b = z ⊙ h̃

    def log_coefficients(self, pre):
        k, candidate = pre.chunk(2, dim=-1)
        return -F.softplus(k), log_g(candidate) - F.softplus(-k)  # log(1 − z), log z + log h̃


class MinLSTM(_MinimalRNN):
    r"""minLSTM: an LSTM without the output gate and memory/output split, whose forget gate, input
    gate and candidate read only the input, the two gates normalised to sum to one.

        f_t = σ(Linear_{d_h}(x_t)),   i_t = σ(Linear_{d_h}(x_t))
        f′_t = f_t / (f_t + i_t),      i′_t = i_t / (f_t + i_t)
        h̃_t = g(Linear_{d_h}(x_t))
        h_t = f′_t ⊙ h_{t−1} + i′_t ⊙ h̃_t

    In log space (``scan=log``): with δ = softplus(−k_f) − softplus(−k_i) = log(i_t / f_t),
    log f′_t = −softplus(δ) and log i′_t = −softplus(−δ). Rows are stored in the order (f, i, h).
    """

    name = "minlstm"
    activation_factor = 14  # measured as minGRU's: ≈ 8.9, rounded up by half
    description = "minLSTM: input-only forget and input gates (normalised) and candidate; a linear scan"
    paper = "Feng et al. 2024, Were RNNs all we needed?"
    formula = "3(dn + n)"
    gates = 3

    def step(self, x: Tensor, state: State) -> tuple[Tensor, State]:
        (h,) = state
        W_f, W_i, W_h = self.weight.chunk(3)
        b_f, b_i, b_h = self.bias.chunk(3)
        f = torch.sigmoid(x @ W_f.T + b_f)  # f_t = σ(Linear(x_t))
        i = torch.sigmoid(x @ W_i.T + b_i)  # i_t = σ(Linear(x_t))
        f_norm, i_norm = f / (f + i), i / (f + i)  # f′_t, i′_t
        h_tilde = g(x @ W_h.T + b_h)  # h̃_t = g(Linear(x_t))
        h = f_norm * h + i_norm * h_tilde  # h_t = f′_t ⊙ h_{t−1} + i′_t ⊙ h̃_t
        return h, (h,)

    def coefficients(self, pre):
        k_f, k_i, candidate = pre.chunk(3, dim=-1)
        f, i = torch.sigmoid(k_f), torch.sigmoid(k_i)
        total = f + i
        return f / total, i / total * g(candidate)  # a = f′, b = i′ ⊙ h̃

    def log_coefficients(self, pre):
        k_f, k_i, candidate = pre.chunk(3, dim=-1)
        delta = F.softplus(-k_f) - F.softplus(-k_i)  # log(i / f)
        return -F.softplus(delta), log_g(candidate) - F.softplus(-delta)  # log f′, log i′ + log h̃
