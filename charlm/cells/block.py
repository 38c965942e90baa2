"""The block that the recurrences of 2017–2025 are published in, around any cell (``--wiring block``).

Griffin, Hawk, HGRN, minGRU and the LRU put their recurrence inside a residual block with
pre-normalisation, a short causal convolution before it and a gated MLP after it. A block of width
n, around a cell whose input and output are n wide::

    u_t = RMSNorm(x_t)
    v_t = b + Σ_{j<k} w_j ⊙ u_{t−j}                 a depthwise causal convolution of width k (k = 0: v_t = u_t)
    y_t, s_t = cell(v_t, s_{t−1})
    r_t = x_t + drop(y_t)                           the residual connection around the cell
    o_t = r_t + drop(W_down (SiLU(W_gate z_t) ⊙ W_up z_t)),  z_t = RMSNorm(r_t)
                                                    the gated MLP, of width m = expansion · n (0: none)

drop is dropout at the model's ``--dropout`` (the identity in evaluation): the branches are dropped before
they join the residual stream, as GPT-2 drops its block's, and the model drops its embedding once and
nothing between blocks.

The block's time state is the cell's, followed by the convolution's last k − 1 inputs (one tensor,
``[B, (k−1)·n]``, oldest first), so that carrying state across windows equals one long window.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from charlm.cells.base import RecurrentCell, RMSNorm, State


class Block(RecurrentCell):
    """``cell`` wired as above; ``conv_width`` k and ``expansion`` as the model's settings say."""

    name = "block"  # a wiring, not a registered cell
    drops_inside = True

    def __init__(self, cell: RecurrentCell, conv_width: int, expansion: float):
        super().__init__(cell.input_size, cell.hidden_size)
        if cell.output_size != cell.input_size:
            raise ValueError(
                f"a block adds the cell's output to its input, but {cell.name}'s output is {cell.output_size} "
                f"wide and its input {cell.input_size}"
            )
        n = cell.input_size
        self.cell, self.conv_width = cell, conv_width
        self.norm = RMSNorm(n, eps=None)
        if conv_width:
            self.conv_weight = nn.Parameter(torch.empty(n, conv_width))  # column j multiplies u_{t−j}
            self.conv_bias = nn.Parameter(torch.zeros(n))
        width = round(expansion * n)
        self.mlp = GatedMLP(n, width) if width else None
        self.reset_parameters()

    activation_factor = 0  # the model's memory estimate adds the block's own to the cell's (block_activation_factor)

    @property
    def output_size(self) -> int:
        return self.input_size

    def reset_parameters(self):
        if self.conv_width:  # as torch's Conv1d: U(±1/√k) for a depthwise kernel of width k
            bound = 1 / math.sqrt(self.conv_width)
            nn.init.uniform_(self.conv_weight, -bound, bound)
            nn.init.zeros_(self.conv_bias)

    @property
    def history(self) -> int:
        """How many past inputs the convolution keeps."""
        return max(self.conv_width - 1, 0)

    def initial_state(self, batch_size: int, device=None, dtype=None) -> State:
        cell_state = self.cell.initial_state(batch_size, device=device, dtype=dtype)
        if not self.history:
            return cell_state
        return (*cell_state, self._zeros(batch_size, device, dtype, width=self.history * self.input_size))

    def _split(self, state: State) -> tuple[State, Tensor | None]:
        return (state[:-1], state[-1]) if self.history else (state, None)

    def step(self, x: Tensor, state: State) -> tuple[Tensor, State]:
        cell_state, past = self._split(state)
        u = self.norm(x)  # u_t = RMSNorm(x_t)
        if self.conv_width:
            window = (
                u[:, None] if past is None else torch.cat([past.view(-1, self.history, self.input_size), u[:, None]], 1)
            )
            v = self.conv_bias + (window.flip(1) * self.conv_weight.T).sum(1)  # v_t = b + Σ_j w_j ⊙ u_{t−j}
            past = None if past is None else window[:, 1:].flatten(1)
        else:
            v = u
        y, cell_state = self.cell.step(v, cell_state)  # y_t, s_t = cell(v_t, s_{t−1})
        r = x + self.dropped(y)  # r_t = x_t + drop(y_t)
        output = r if self.mlp is None else r + self.dropped(self.mlp(r))  # o_t = r_t + drop(MLP(RMSNorm(r_t)))
        return output, cell_state if past is None else (*cell_state, past)

    def forward(self, inputs: Tensor, state: State) -> tuple[Tensor, State]:
        cell_state, past = self._split(state)
        u = self.norm(inputs)
        if self.conv_width:
            steps = inputs.shape[0]
            if past is not None:  # the last k − 1 inputs, oldest first, then the window
                u = torch.cat([past.view(-1, self.history, self.input_size).transpose(0, 1), u])
            v = self.conv_bias + sum(
                self.conv_weight[:, j] * u[self.history - j : self.history - j + steps] for j in range(self.conv_width)
            )
            past = None if past is None else u[-self.history :].transpose(0, 1).flatten(1)
        else:
            v = u
        y, cell_state = self.cell(v, cell_state)
        r = inputs + self.dropped(y)
        output = r if self.mlp is None else r + self.dropped(self.mlp(r))
        return output, cell_state if past is None else (*cell_state, past)


class GatedMLP(nn.Module):
    """``W_down (SiLU(W_gate z) ⊙ W_up z)`` with ``z = RMSNorm(r)``: the block's position-wise part."""

    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.norm = RMSNorm(width, eps=None)
        self.gate = nn.Linear(width, hidden, bias=False)
        self.up = nn.Linear(width, hidden, bias=False)
        self.down = nn.Linear(hidden, width, bias=False)

    def forward(self, r: Tensor) -> Tensor:
        z = self.norm(r)
        return self.down(F.silu(self.gate(z)) * self.up(z))


def block_parameters(n: int, conv_width: int, expansion: float) -> int:
    """The parameters a block adds to its cell: two RMSNorm gains, the convolution, the gated MLP."""
    width = round(expansion * n)
    return n + (conv_width * n + n if conv_width else 0) + ((n + 3 * n * width) if width else 0)


def block_activation_factor(conv_width: int, expansion: float) -> int:
    """Float32 values per (step, stream, unit) a block keeps for the backward pass beside its cell's:
    a count of the tensors autograd keeps (the norms' inputs and outputs, the convolution's, the
    residuals, the MLP's three products and its SiLU), not a measurement."""
    return 4 + (2 if conv_width else 0) + math.ceil(4 * expansion)
