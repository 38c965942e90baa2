"""The quasi-recurrent neural network (Bradbury, Merity, Xiong & Socher 2017)."""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from charlm.cells.base import State
from charlm.cells.scan import SCAN_METHODS
from charlm.cells.scan_cell import ScanCell
from charlm.settings import setting

POOLINGS = ("fo", "f")


@dataclasses.dataclass
class QRNNConfig:
    width: int = setting(
        2, "k, the causal convolution's filter width over time (2 in the paper's LM runs).", choices=(1, 2)
    )
    pooling: str = setting("fo", "fo: c_t pooled, h_t = o_t ⊙ c_t; f: h_t pooled, no output gate.", choices=POOLINGS)
    scan: str = setting(
        "auto", "How the pooling's linear recurrence is computed (a form of the linear scan).", choices=SCAN_METHODS
    )


class QRNN(ScanCell):
    r"""Quasi-recurrent network: gates from a causal convolution over the inputs, then a pooling
    that is a linear recurrence with no weights on the state (the paper's notation, inputs X):

        Z = tanh(W_z ∗ X),   F = σ(W_f ∗ X),   O = σ(W_o ∗ X)      (∗: masked convolution of width k)
        f-pooling:   h_t = f_t ⊙ h_{t−1} + (1 − f_t) ⊙ z_t
        fo-pooling:  c_t = f_t ⊙ c_{t−1} + (1 − f_t) ⊙ z_t,   h_t = o_t ⊙ c_t

    With k = 2, z_t = tanh(W_z¹ x_{t−1} + W_z² x_t + b_z) and likewise for f and o. The filters
    are stored as ``weight`` ``[k·g·n, d]`` (g = 3 gates for fo, 2 for f): the rows for x_t
    (z, f[, o]) first, then those for x_{t−1}; ``bias`` is ``[g·n]``. The time state is c (h for
    f-pooling) and, for k = 2, the window's last input x_{t−1}, so that a window carried on from
    the previous one convolves over its boundary as one long window would.

    ``forward`` takes every gate of the window in one matrix product and the pooling as a linear
    scan, ``linear_scan(a = F, b = (1 − F) ⊙ Z)``, whose form the ``scan`` option chooses.

    Initialisation: the paper does not give one; as the authors' code (``torchqrnn``, one
    ``nn.Linear`` over [x_t; x_{t−1}]), weights and biases U(±1/√(k·d)).
    """

    name = "qrnn"
    # Measured as the built-in cells' factors (peak resident memory of one forward + backward at batch
    # 128 × bptt 50, 2 layers of 256, rounded up by a quarter): 27–30 for fo, k = 2, 21 for f-pooling,
    # 24 for k = 1, with the loop form of the scan (charlm.cells.scan's placeholder).
    activation_factor = 30
    description = "Quasi-recurrent network: gates from a width-k causal convolution, fo-pooling as a linear scan"
    paper = "Bradbury et al. 2017, Quasi-recurrent neural networks"
    formula = "3(kdn + n) (k = width, 2; pooling=f: 2(kdn + n))"
    Config = QRNNConfig

    def __init__(self, input_size: int, hidden_size: int, config: QRNNConfig | None = None):
        super().__init__(input_size, hidden_size, config)
        self.width = self.config.width
        self.gates = 3 if self.config.pooling == "fo" else 2
        self.per_symbol = self.width == 1  # with k = 2 a step's gates read x_{t−1} too
        self.reads_input = self.width == 2  # the state carries x_t on, the next step's x_{t−1}
        rows = self.gates * hidden_size
        self.weight = nn.Parameter(torch.empty(self.width * rows, input_size))
        self.bias = nn.Parameter(torch.empty(rows))
        self.reset_parameters()

    def reset_parameters(self):
        bound = 1.0 / math.sqrt(self.width * self.input_size)
        with torch.no_grad():
            self.weight.uniform_(-bound, bound)
            self.bias.uniform_(-bound, bound)

    def initial_state(self, batch_size: int, device=None, dtype=None) -> State:
        c = self._zeros(batch_size, device, dtype)
        if self.width == 1:
            return (c,)
        return c, self._zeros(batch_size, device, dtype, width=self.input_size)

    def step(self, x: Tensor, state: State) -> tuple[Tensor, State]:
        n, rows = self.hidden_size, self.gates * self.hidden_size
        c = state[0]
        pre = x @ self.weight[:rows].T + self.bias  # W² x_t + b (the filter tap on x_t)
        if self.width == 2:
            pre = pre + state[1] @ self.weight[rows:].T  # + W¹ x_{t−1} (the tap on the previous input)
        z = torch.tanh(pre[:, :n])  # z_t = tanh(W_z ∗ X)_t
        f = torch.sigmoid(pre[:, n : 2 * n])  # f_t = σ(W_f ∗ X)_t
        c = f * c + (1 - f) * z  # c_t = f_t ⊙ c_{t−1} + (1 − f_t) ⊙ z_t
        h = torch.sigmoid(pre[:, 2 * n :]) * c if self.gates == 3 else c  # h_t = o_t ⊙ c_t (fo), or c_t (f)
        return h, ((c, x) if self.width == 2 else (c,))

    def input_map(self) -> tuple[Tensor, Tensor]:
        return self.weight[: self.gates * self.hidden_size], self.bias  # the filter's tap on x_t

    def window_input_map(self, inputs: Tensor, state: State, lookup=None) -> Tensor:
        if self.width == 1:
            return super().window_input_map(inputs, state, lookup)
        # Both taps in one product: x_t's rows (with the bias) and x_{t−1}'s rows, then the
        # latter moved one step on, the carried input's product in front.
        rows = self.gates * self.hidden_size
        both = self.input_product(inputs, self.weight, F.pad(self.bias, (0, rows)), lookup)
        now, before = both.split(rows, dim=-1)
        first = (state[1] @ self.weight[rows:].T).unsqueeze(0)
        return now + torch.cat([first, before[:-1]])

    def step_input_map(self, projected: Tensor, state: State) -> Tensor:
        if self.width == 1:
            return projected
        return torch.addmm(projected, state[1], self.weight[self.gates * self.hidden_size :].T)  # + W¹ x_{t−1}

    def coefficients(self, pre: Tensor) -> tuple[Tensor, ...]:
        """(f, (1 − f) ⊙ z), and o for fo-pooling, from the gates' pre-activations [z, f(, o)]."""
        n = self.hidden_size
        z, f = torch.tanh(pre[..., :n]), torch.sigmoid(pre[..., n : 2 * n])
        pooled = (f, torch.addcmul(z, f, z, value=-1))  # a = f, b = (1 − f) ⊙ z
        return (*pooled, torch.sigmoid(pre[..., 2 * n :])) if self.gates == 3 else pooled

    def output(self, c: Tensor, x: Tensor | None, *o: Tensor) -> Tensor:
        return o[0] * c if o else c  # h_t = o_t ⊙ c_t (fo), or c_t (f)

    def carried(self, c: Tensor, x: Tensor) -> State:
        return (c, x) if self.width == 2 else (c,)
