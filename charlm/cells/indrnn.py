"""The independently recurrent neural network (Li, Li, Cook, Zhu & Gao 2018)."""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor, nn

from charlm.cells.base import InferenceStep, RecurrentCell, State
from charlm.settings import setting


@dataclasses.dataclass
class IndRNNConfig:
    gamma: float = setting(
        2.0, "γ, the largest growth of a gradient over `horizon` steps: |u| ≤ γ^(1/T).", min=0, min_open=True
    )
    horizon: int = setting(
        50, "T, the steps the bound is set for (charlm's default bptt; the authors' cPTB window).", min=1
    )

    @property
    def bound(self) -> float:
        """The largest |u| the recurrence uses, γ^{1/T}."""
        return self.gamma ** (1.0 / self.horizon)


class _ReluRecurrence(torch.autograd.Function):
    """``h_t = ReLU(p_t + u ⊙ h_{t−1})`` over a window: every h_t ``[T, B, n]`` from ``p``
    ``[T, B, n]``, ``u`` ``[n]`` and ``h₀`` ``[B, n]``; two operations a step into a preallocated
    buffer, and a backward written out (three a step) instead of autograd's node per operation."""

    @staticmethod
    def forward(ctx, pre: Tensor, u: Tensor, h0: Tensor) -> Tensor:
        dtype = torch.promote_types(pre.dtype, torch.promote_types(u.dtype, h0.dtype))
        pre, u, h = pre.to(dtype), u.to(dtype), h0.to(dtype)
        hidden = torch.empty(pre.shape, dtype=dtype, device=pre.device)
        for t in range(pre.shape[0]):
            h = torch.addcmul(pre[t], u, h, out=hidden[t]).relu_()  # h_t = ReLU(p_t + u ⊙ h_{t−1})
        ctx.save_for_backward(u, h0.to(dtype), hidden)
        return hidden

    @staticmethod
    def backward(ctx, grad_hidden: Tensor):
        u, h0, hidden = ctx.saved_tensors
        active = (hidden > 0).to(hidden.dtype)  # ReLU′
        grad_pre = torch.empty_like(hidden)
        grad_h = torch.zeros_like(h0)  # ∂L/∂h_t through h_{t+1}
        for t in range(hidden.shape[0] - 1, -1, -1):
            g = torch.add(grad_hidden[t], grad_h, out=grad_pre[t]).mul_(active[t])  # ∂L/∂p_t
            torch.mul(g, u, out=grad_h)  # ∂L/∂h_{t−1} = ∂L/∂p_t ⊙ u
        grad_u = None
        if ctx.needs_input_grad[1]:
            previous = torch.cat([h0.unsqueeze(0), hidden[:-1]])
            grad_u = (grad_pre * previous).sum((0, 1))
        return grad_pre, grad_u, grad_h


class IndRNN(RecurrentCell):
    r"""Independently recurrent network: each unit sees only its own past, through one weight.

        h_t = σ(W x_t + u ⊙ h_{t−1} + b),   σ = ReLU,   |u_n| ≤ ᵀ√γ

    The paper keeps the gradient of a unit from exploding over T steps by bounding |u_n| by
    γ^{1/T} (γ = 2: a gradient at most doubles over the T steps of a window), and does so by
    clipping u after every optimiser step. A cell cannot reach the optimiser, so the bound is
    applied in the forward instead: the recurrence uses clamp(u, −γ^{1/T}, γ^{1/T}) (``gamma``
    and ``horizon`` set γ and T), whose gradient is zero where u lies beyond the bound.

    ``forward`` takes W x + b for the whole window in one product (a table lookup for the bottom
    layer); the loop is elementwise, with a backward of its own.

    Initialisation as the authors' character-level PTB code: u U(0, 1), W Kaiming-uniform for a
    leaky ReLU of slope 2 (U(±√(1.2/d))), b = 0.
    """

    name = "indrnn"
    parallel_form = "elementwise"
    # Measured as the built-in cells' factors (peak resident memory of one forward + backward at batch
    # 128 × bptt 50, 2 layers of 256, rounded up by a quarter): 5.2–7.6 over runs.
    activation_factor = 8
    folds_embedding = True
    description = "Independently recurrent network: ReLU(Wx + u ⊙ h + b), |u| bounded by γ^(1/T)"
    paper = "Li et al. 2018, Independently recurrent neural network (IndRNN)"
    formula = "dn + 2n"
    Config = IndRNNConfig

    def __init__(self, input_size: int, hidden_size: int, config: IndRNNConfig | None = None):
        super().__init__(input_size, hidden_size, config)
        n = hidden_size
        self.weight_input = nn.Parameter(torch.empty(n, input_size))
        self.u = nn.Parameter(torch.empty(n))
        self.bias = nn.Parameter(torch.empty(n))
        self.reset_parameters()

    def reset_parameters(self):
        with torch.no_grad():
            nn.init.kaiming_uniform_(self.weight_input, a=2, mode="fan_in")
            self.u.uniform_(0.0, 1.0)
            self.bias.zero_()

    def bounded_u(self) -> Tensor:
        """u as the recurrence uses it: clamped to [−γ^{1/T}, γ^{1/T}]."""
        bound = self.config.bound
        return self.u.clamp(-bound, bound)

    def step(self, x: Tensor, state: State) -> tuple[Tensor, State]:
        (h,) = state
        u = self.bounded_u()  # |u| ≤ γ^{1/T}
        h = torch.relu(x @ self.weight_input.T + u * h + self.bias)  # h_t = ReLU(W x_t + u ⊙ h_{t−1} + b)
        return h, (h,)

    def inference_step(self) -> "IndRNNInference":
        return IndRNNInference(self)

    def forward(self, inputs: Tensor, state: State, lookup=None) -> tuple[Tensor, State]:
        (h0,) = state
        pre = self.input_product(inputs, self.weight_input, self.bias, lookup)
        hidden = _ReluRecurrence.apply(pre, self.bounded_u(), h0)
        return hidden, (hidden[-1],)


class IndRNNInference(InferenceStep):
    """The IndRNN step for sampling: W x + b taken ahead, then one multiply-add and a ReLU."""

    reads_input = False

    def __init__(self, cell: IndRNN):
        super().__init__(cell)
        self.weight, self.bias, self.u = cell.weight_input.T, cell.bias, cell.bounded_u()

    def project(self, x: Tensor) -> Tensor:
        return torch.addmm(self.bias, x, self.weight)

    def advance(self, projected: Tensor, x: Tensor | None, state: State) -> tuple[Tensor, State]:
        (h,) = state
        h = torch.addcmul(projected, self.u, h).relu_()
        return h, (h,)
