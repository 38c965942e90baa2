"""The quasi-recurrent neural network (Bradbury, Merity, Xiong & Socher 2017)."""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from charlm.cells.base import InferenceStep, RecurrentCell, State
from charlm.cells.scan import SCAN_METHODS, linear_scan

POOLINGS = ("fo", "f")


@dataclasses.dataclass
class QRNNConfig:
    width: int = 2  # k, the causal convolution's filter width over time (1 or 2; 2 in the paper's LM runs)
    pooling: str = "fo"  # "fo": c_t pooled, h_t = o_t ⊙ c_t; "f": h_t pooled, no output gate
    scan: str = "auto"  # how the pooling's linear recurrence is computed (charlm.cells.scan)

    def __post_init__(self):
        if self.width not in (1, 2):
            raise ValueError(f"width must be 1 or 2, not {self.width!r}")
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, not {self.pooling!r}")
        if self.scan not in SCAN_METHODS:
            raise ValueError(f"scan must be one of {', '.join(SCAN_METHODS)}, not {self.scan!r}")


class QRNN(RecurrentCell):
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
    parallel_form = "scan"
    # Measured as the built-in cells' factors (peak resident memory of one forward + backward at batch
    # 128 × bptt 50, 2 layers of 256, rounded up by a quarter): 27–30 for fo, k = 2, 21 for f-pooling,
    # 24 for k = 1, with the loop form of the scan (charlm.cells.scan's placeholder).
    activation_factor = 30
    folds_embedding = True
    description = "Quasi-recurrent network: gates from a width-k causal convolution, fo-pooling as a linear scan"
    paper = "Bradbury et al. 2017, Quasi-recurrent neural networks"
    formula = "3(kdn + n) (k = width, 2; pooling=f: 2(kdn + n))"
    Config = QRNNConfig

    def __init__(self, input_size: int, hidden_size: int, config: QRNNConfig | None = None):
        super().__init__(input_size, hidden_size, config)
        self.width = self.config.width
        self.gates = 3 if self.config.pooling == "fo" else 2
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

    def inference_step(self) -> "QRNNInference":
        return QRNNInference(self)

    def forward(self, inputs: Tensor, state: State, lookup=None) -> tuple[Tensor, State]:
        n, rows = self.hidden_size, self.gates * self.hidden_size
        c = state[0]
        if self.width == 1:
            pre = self.input_product(inputs, self.weight, self.bias, lookup)
        else:
            # Both taps in one product: x_t's rows (with the bias) and x_{t−1}'s rows, then the
            # latter moved one step on, the carried input's product in front.
            both = self.input_product(inputs, self.weight, F.pad(self.bias, (0, rows)), lookup)
            now, before = both.split(rows, dim=-1)
            first = (state[1] @ self.weight[rows:].T).unsqueeze(0)
            pre = now + torch.cat([first, before[:-1]])
        z = torch.tanh(pre[..., :n])
        f = torch.sigmoid(pre[..., n : 2 * n])
        cells = linear_scan(f, torch.addcmul(z, f, z, value=-1), c, method=self.config.scan)  # b = (1 − f) ⊙ z
        outputs = torch.sigmoid(pre[..., 2 * n :]) * cells if self.gates == 3 else cells
        last = cells[-1]
        return outputs, ((last, inputs[-1]) if self.width == 2 else (last,))


class QRNNInference(InferenceStep):
    """The QRNN step for sampling: x_t's tap (with the bias) taken ahead, then x_{t−1}'s tap
    (k = 2) and the pooling."""

    def __init__(self, cell: QRNN):
        super().__init__(cell)
        rows = cell.gates * cell.hidden_size
        self.hidden_size, self.gates, self.width = cell.hidden_size, cell.gates, cell.width
        self.reads_input = cell.width == 2  # the input is the next step's x_{t−1}
        self.now, self.bias = cell.weight[:rows].T, cell.bias
        self.before = cell.weight[rows:].T.contiguous() if cell.width == 2 else None

    def project(self, x: Tensor) -> Tensor:
        return torch.addmm(self.bias, x, self.now)

    def advance(self, projected: Tensor, x: Tensor | None, state: State) -> tuple[Tensor, State]:
        n = self.hidden_size
        c = state[0]
        pre = torch.addmm(projected, state[1], self.before) if self.width == 2 else projected
        z = pre[:, :n].tanh()
        f = pre[:, n : 2 * n].sigmoid()
        c = torch.addcmul(z, f, c - z)  # f ⊙ c + (1 − f) ⊙ z
        h = pre[:, 2 * n :].sigmoid().mul_(c) if self.gates == 3 else c
        return h, ((c, x) if self.width == 2 else (c,))
