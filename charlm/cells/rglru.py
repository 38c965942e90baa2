"""Griffin's Real-Gated Linear Recurrent Unit (De et al. 2024, Griffin/Hawk): a diagonal linear
recurrence whose decay and input gates read the input alone, run as one linear scan per window.

Not to be confused with charlm's ``rg-lru`` and ``lru``: those are Ahuja & Morency's Lattice
Recurrent Units (``charlm.cells.lru``), an unrelated cell that shares the initials.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from charlm.cells.base import State
from charlm.cells.scan import ScanConfig
from charlm.cells.scan_cell import ScanCell

C = 8.0  # the paper's constant c: a_t = a^{c r_t}


class GriffinRGLRU(ScanCell):
    r"""The RG-LRU of Griffin and Hawk, with the linear layer in front of it that Griffin's
    recurrent block has (x_t = W_in u_t + b_in, from this layer's input u_t of any width d):

        r_t = σ(W_a x_t + b_a)                      recurrence gate
        i_t = σ(W_x x_t + b_x)                      input gate
        a_t = a^{c r_t},   a = σ(Λ),   c = 8        log a_t = −c r_t ⊙ softplus(−Λ)
        h_t = a_t ⊙ h_{t−1} + √(1 − a_t²) ⊙ (i_t ⊙ x_t)

    The output is h_t. Λ is drawn so that a = σ(Λ) is uniform in [0.9, 0.999].
    (The paper words it for a^c; its reference code, recurrentgemma, draws a² uniform in
    [0.9², 0.999²]; all three put the decay near 1.) W_in, W_a, W_x: LeCun normal (std 1/√fan-in),
    biases zero, as recurrentgemma; the paper's block-diagonal gate weights are dense here, and the
    block's short convolution and GeLU branch (around the RG-LRU in Griffin) are left out.
    The paper's bounded gradient of √(1 − a_t²) near a_t = 1 is not reproduced: the plain square root.
    Gate rows are stored in the order (r, i).

    The gates read the input only, so ``forward`` computes a_t and the offset b_t = √(1 − a_t²) ⊙
    i_t ⊙ x_t for the window (for the V symbols of the vocabulary at the bottom layer) and runs one
    linear scan. ``scan=log`` splits b_t, which has either sign, into two positive parts.
    """

    name = "griffin-rglru"
    # autograd keeps ≈ 9.7 float32 per (step, unit), measured as minGRU's (saved-tensor hooks); rounded up by half
    activation_factor = 15
    description = "Griffin's real-gated linear recurrent unit (not rg-lru: the lattice unit); a linear scan"
    paper = "De et al. 2024, Griffin: mixing gated linear recurrences with local attention"
    formula = "dn + 2n² + 4n"

    def __init__(self, input_size: int, hidden_size: int, config: ScanConfig | None = None):
        super().__init__(input_size, hidden_size, config)
        n = hidden_size
        self.weight_in = nn.Parameter(torch.empty(n, input_size))
        self.bias_in = nn.Parameter(torch.zeros(n))
        self.gate_weight = nn.Parameter(torch.empty(2 * n, n))
        self.gate_bias = nn.Parameter(torch.zeros(2 * n))
        self.decay = nn.Parameter(torch.empty(n))  # Λ
        self.reset_parameters()

    def reset_parameters(self):
        with torch.no_grad():
            self.weight_in.normal_(0.0, 1.0 / math.sqrt(self.input_size))
            self.gate_weight.normal_(0.0, 1.0 / math.sqrt(self.hidden_size))
            self.bias_in.zero_()
            self.gate_bias.zero_()
            a = torch.empty_like(self.decay).uniform_(0.9, 0.999)
            self.decay.copy_(torch.log(a) - torch.log1p(-a))  # Λ = σ⁻¹(a)

    def step(self, x: Tensor, state: State) -> tuple[Tensor, State]:
        (h,) = state
        W_a, W_x = self.gate_weight.chunk(2)
        b_a, b_x = self.gate_bias.chunk(2)
        x = x @ self.weight_in.T + self.bias_in  # the block's linear layer: the RG-LRU's x_t
        r = torch.sigmoid(x @ W_a.T + b_a)  # r_t = σ(W_a x_t + b_a)
        i = torch.sigmoid(x @ W_x.T + b_x)  # i_t = σ(W_x x_t + b_x)
        a = torch.sigmoid(self.decay) ** (C * r)  # a_t = a^{c r_t}, a = σ(Λ)
        h = a * h + torch.sqrt(1 - a * a) * (i * x)  # h_t = a_t ⊙ h_{t−1} + √(1 − a_t²) ⊙ (i_t ⊙ x_t)
        return h, (h,)

    def input_map(self) -> tuple[Tensor, Tensor]:
        return self.weight_in, self.bias_in  # the block's linear layer: the RG-LRU's x_t

    def coefficients(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``(a, b)`` of ``h_t = a_t ⊙ h_{t−1} + b_t`` from the RG-LRU's input x (after W_in)."""
        r, i = torch.sigmoid(x @ self.gate_weight.T + self.gate_bias).chunk(2, dim=-1)
        log_a = -C * r * F.softplus(-self.decay)  # log a_t = c r_t log σ(Λ), in log space as the paper
        multiplier = torch.sqrt(-torch.expm1(2 * log_a))  # √(1 − a_t²), without cancelling near a_t = 1
        return torch.exp(log_a), multiplier * i * x
