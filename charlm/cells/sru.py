"""The simple recurrent unit (Lei, Zhang, Wang, Dai & Artzi 2018), the published version."""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from charlm.cells.base import InferenceStep, RecurrentCell, State
from charlm.settings import setting


@dataclasses.dataclass
class SRUConfig:
    highway_bias: float = setting(0.0, "b_r's initial value; with rescale, α = √(1 + 2·e^(b_r)) (√3 at 0).")
    rescale: bool = setting(True, "Scale the skip by α (the paper's scaling correction); false: α = 1.")


class _ForgetRecurrence(torch.autograd.Function):
    """``c_t = f_t ⊙ c_{t−1} + (1 − f_t) ⊙ x̃_t`` with ``f_t = σ(a_t + v ⊙ c_{t−1})`` over a window,
    every c_t ``[T, B, n]`` from ``a``, ``x̃`` ``[T, B, n]``, ``v`` ``[n]``, ``c₀`` ``[B, n]``.

    The loop is elementwise: four operations a step into preallocated buffers, and a backward
    written out (four a step) instead of autograd's graph of a node per operation and step."""

    @staticmethod
    def forward(ctx, a: Tensor, x_tilde: Tensor, v: Tensor, c0: Tensor) -> Tensor:
        dtype = torch.promote_types(torch.promote_types(a.dtype, x_tilde.dtype), torch.promote_types(v.dtype, c0.dtype))
        a, x_tilde, v, c = a.to(dtype), x_tilde.to(dtype), v.to(dtype), c0.to(dtype)
        forget, gap, cells = (torch.empty(a.shape, dtype=dtype, device=a.device) for _ in range(3))
        for t in range(a.shape[0]):
            f = torch.addcmul(a[t], v, c, out=forget[t]).sigmoid_()  # f_t = σ(a_t + v ⊙ c_{t−1})
            d = torch.sub(c, x_tilde[t], out=gap[t])  # c_{t−1} − x̃_t
            c = torch.addcmul(x_tilde[t], f, d, out=cells[t])  # c_t = x̃_t + f_t ⊙ (c_{t−1} − x̃_t)
        ctx.save_for_backward(forget, gap, v, c0.to(dtype), cells)
        return cells

    @staticmethod
    def backward(ctx, grad_cells: Tensor):
        forget, gap, v, c0, cells = ctx.saved_tensors
        keep = torch.sub(1, forget)  # 1 − f_t (few new window-sized buffers: each costs page faults)
        slope = torch.mul(keep, forget).mul_(gap)  # ∂c_t/∂a_t = (c_{t−1} − x̃_t) ⊙ f_t ⊙ (1 − f_t)
        grad_total, grad_a = torch.empty_like(forget), torch.empty_like(forget)
        grad_c = torch.zeros_like(c0)  # ∂L/∂c_t through c_{t+1}
        carried = torch.empty_like(c0)
        for t in range(forget.shape[0] - 1, -1, -1):
            g = torch.add(grad_cells[t], grad_c, out=grad_total[t])  # ∂L/∂c_t
            g_a = torch.mul(g, slope[t], out=grad_a[t])  # ∂L/∂a_t
            torch.mul(g, forget[t], out=carried).addcmul_(g_a, v)  # ∂L/∂c_{t−1} = g ⊙ f_t + g_a ⊙ v
            grad_c, carried = carried, grad_c
        grad_x = grad_total.mul_(keep)  # ∂L/∂x̃_t = ∂L/∂c_t ⊙ (1 − f_t)
        grad_v = None
        if ctx.needs_input_grad[2]:  # Σ_t ∂L/∂a_t ⊙ c_{t−1}
            grad_v = (grad_a[1:] * cells[:-1]).sum((0, 1)) + (grad_a[0] * c0).sum(0)
        return grad_a, grad_x, grad_v, grad_c


class SRU(RecurrentCell):
    r"""Simple recurrent unit (Lei et al. 2018, the published version with v ⊙ c_{t−1} terms):

        f_t = σ(W_f x_t + v_f ⊙ c_{t−1} + b_f)
        c_t = f_t ⊙ c_{t−1} + (1 − f_t) ⊙ (W x_t)
        r_t = σ(W_r x_t + v_r ⊙ c_{t−1} + b_r)
        h_t = r_t ⊙ c_t + (1 − r_t) ⊙ x_t · α

    α is the paper's scaling correction, √(1 + 2·e^{b_r}) for the initial b_r (√3 at b_r = 0), a
    constant. When the input width d differs from n the skip is a projection W′ x_t (as the
    authors' code; its initial weights carry α, and the forward adds W′ x_t unscaled).

    The state is c. Every matrix product is taken for the whole window at once (rows W, W_f,
    W_r[, W′] of ``weight``, ``[k·n, d]``, k = 3 or 4); the loop over time runs only f_t and c_t,
    elementwise, with a backward of its own; r_t and h_t follow for the window at once.

    Initialisation as the authors' code (``sru``, not v1): weights U(±√(3/d)) (variance 1/d, the
    paper's), the rows of W_f and W_r then scaled by √½; v U(±√3)·√½ (variance ½); b_f = 0,
    b_r = ``highway_bias``.
    """

    name = "sru"
    parallel_form = "elementwise"
    # Measured as the built-in cells' factors (peak resident memory of one forward + backward at batch
    # 128 × bptt 50, 2 layers of 256, d = n, rounded up by a quarter): 20.7.
    activation_factor = 21
    folds_embedding = True
    description = "Simple recurrent unit: elementwise forget/reset gates on c_{t-1}, highway output scaled by α"
    paper = "Lei et al. 2018, Simple recurrent units for highly parallelizable recurrence"
    formula = "3dn + 4n (d ≠ n: 4dn + 4n, the skip projected)"
    Config = SRUConfig

    def __init__(self, input_size: int, hidden_size: int, config: SRUConfig | None = None):
        super().__init__(input_size, hidden_size, config)
        n = hidden_size
        self.projects_skip = input_size != hidden_size
        self.matrices = 4 if self.projects_skip else 3
        self.alpha = math.sqrt(1 + 2 * math.exp(self.config.highway_bias)) if self.config.rescale else 1.0
        self.weight = nn.Parameter(torch.empty(self.matrices * n, input_size))  # rows W, W_f, W_r[, W′]
        self.v = nn.Parameter(torch.empty(2 * n))  # v_f, v_r
        self.bias = nn.Parameter(torch.empty(2 * n))  # b_f, b_r
        self.reset_parameters()

    def reset_parameters(self):
        n = self.hidden_size
        bound = math.sqrt(3.0 / self.input_size)
        with torch.no_grad():
            self.weight.uniform_(-bound, bound)
            self.weight[n : 3 * n].mul_(math.sqrt(0.5))
            if self.projects_skip:
                self.weight[3 * n :].mul_(self.alpha)
            self.v.uniform_(-math.sqrt(3.0), math.sqrt(3.0)).mul_(math.sqrt(0.5))
            self.bias[:n].zero_()
            self.bias[n:].fill_(self.config.highway_bias)

    def _skip_scale(self) -> float:
        """What x_t is multiplied by in the highway (1 when the skip is the projection W′ x_t)."""
        return 1.0 if self.projects_skip else self.alpha

    def step(self, x: Tensor, state: State) -> tuple[Tensor, State]:
        (c,) = state
        n = self.hidden_size
        W, W_f, W_r = self.weight[:n], self.weight[n : 2 * n], self.weight[2 * n : 3 * n]
        v_f, v_r = self.v.chunk(2)
        b_f, b_r = self.bias.chunk(2)
        f = torch.sigmoid(x @ W_f.T + v_f * c + b_f)  # f_t = σ(W_f x_t + v_f ⊙ c_{t−1} + b_f)
        r = torch.sigmoid(x @ W_r.T + v_r * c + b_r)  # r_t = σ(W_r x_t + v_r ⊙ c_{t−1} + b_r)
        c = f * c + (1 - f) * (x @ W.T)  # c_t = f_t ⊙ c_{t−1} + (1 − f_t) ⊙ (W x_t)
        skip = x @ self.weight[3 * n :].T if self.projects_skip else self.alpha * x  # W′ x_t, or α · x_t
        h = r * c + (1 - r) * skip  # h_t = r_t ⊙ c_t + (1 − r_t) ⊙ skip
        return h, (c,)

    def inference_step(self) -> "SRUInference":
        return SRUInference(self)

    def _full_bias(self) -> Tensor:
        """The bias of every row of ``weight``: none on W x and W′ x."""
        n = self.hidden_size
        return F.pad(self.bias, (n, n if self.projects_skip else 0))

    def forward(self, inputs: Tensor, state: State, lookup=None) -> tuple[Tensor, State]:
        (c0,) = state
        n = self.hidden_size
        product = self.input_product(inputs, self.weight, self._full_bias(), lookup)
        parts = product.split(n, dim=-1)
        x_tilde, pre_f, pre_r = parts[0], parts[1], parts[2]
        v_f, v_r = self.v.chunk(2)
        cells = _ForgetRecurrence.apply(pre_f, x_tilde, v_f, c0)
        previous = torch.cat([c0.unsqueeze(0).to(cells.dtype), cells[:-1]])
        r = torch.sigmoid(torch.addcmul(pre_r, v_r, previous))
        skip = parts[3] if self.projects_skip else self.alpha * inputs
        outputs = torch.addcmul(skip, r, cells - skip)  # r ⊙ c + (1 − r) ⊙ skip
        return outputs, (cells[-1],)


class SRUInference(InferenceStep):
    """The SRU step for sampling: W x, W_f x + b_f, W_r x + b_r (and W′ x) taken ahead; the rest is
    elementwise."""

    def __init__(self, cell: SRU):
        super().__init__(cell)
        self.hidden_size, self.projects_skip, self.alpha = cell.hidden_size, cell.projects_skip, cell.alpha
        self.reads_input = not cell.projects_skip  # the highway reads α · x_t itself
        self.weight, self.bias = cell.weight.T, cell._full_bias()
        self.v_f, self.v_r = cell.v.chunk(2)

    def project(self, x: Tensor) -> Tensor:
        return torch.addmm(self.bias, x, self.weight)

    def advance(self, projected: Tensor, x: Tensor | None, state: State) -> tuple[Tensor, State]:
        (c,) = state
        n = self.hidden_size
        x_tilde = projected[:, :n]
        f = torch.addcmul(projected[:, n : 2 * n], self.v_f, c).sigmoid_()
        r = torch.addcmul(projected[:, 2 * n : 3 * n], self.v_r, c).sigmoid_()
        c = torch.addcmul(x_tilde, f, c - x_tilde)  # f ⊙ c + (1 − f) ⊙ W x
        skip = projected[:, 3 * n :] if self.projects_skip else self.alpha * x
        return torch.addcmul(skip, r, c - skip), (c,)
