"""The Lattice Recurrent Unit family (Ahuja & Morency 2017): PS-LRU, RG-LRU and LRU (UG-LRU)."""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import torch
from torch import Tensor, nn

from charlm.cells.base import InferenceStep, RecurrentCell, State, glorot_uniform_, uniform_all_
from charlm.settings import setting


@dataclasses.dataclass
class LatticeConfig:
    init: str = setting(
        "glorot",
        "glorot: Glorot uniform weights, zero biases (the paper); uniform: all U(±1/√n).",
        choices=("glorot", "uniform"),
    )


class _Lattice(RecurrentCell):
    r"""Common machinery of the three Lattice Recurrent Units.

    A node reads h₁ (depth stream: the layer below, or the embedding, so d = n) and h₂ (time
    stream: this layer at t − 1). Every gate sees both: g = σ(A_g [h₁; h₂] + b_g). The projections
    are ĥ₁ = tanh(A₁ [h₁; r₂ ⊙ h₂] + b₁) and ĥ₂ = tanh(A₂ [r₁ ⊙ h₁; h₂] + b₂), where r₁ = r₂ = r
    when the reset gate is shared. The new depth output h₁′ goes up; the new time output h₂′ is
    carried to t + 1. Subclasses say how many reset and update gates there are; the LRU also says
    how they mix (PS-LRU and RG-LRU keep the default ``_mix``).
    """

    reset_gates: ClassVar[int] = 1
    update_gates: ClassVar[int] = 1
    Config = LatticeConfig
    folds_embedding = True
    evaluates_through_step = True  # measured faster without gradients (see RecurrentCell)
    recurrent_weights = ("gate_weight", "projection_weight")  # their columns n.. multiply h₂

    def __init__(self, input_size: int, hidden_size: int, config: LatticeConfig | None = None):
        super().__init__(input_size, hidden_size, config)
        if input_size != hidden_size:
            raise ValueError(f"{self.name} needs input size = hidden size (got {input_size} and {hidden_size})")
        n = hidden_size
        gates = self.reset_gates + self.update_gates
        self.gate_weight = nn.Parameter(torch.empty(gates * n, 2 * n))  # rows: r (or r₁, r₂), then z (or z₁, z₂)
        self.gate_bias = nn.Parameter(torch.zeros(gates * n))
        self.projection_weight = nn.Parameter(torch.empty(2 * n, 2 * n))  # rows: A₁, then A₂
        self.projection_bias = nn.Parameter(torch.zeros(2 * n))
        self.reset_parameters()

    @classmethod
    def required_input_size(cls, hidden_size, config):
        return hidden_size

    def reset_parameters(self):
        if self.config.init == "uniform":
            uniform_all_(self, 1.0 / math.sqrt(self.hidden_size))
            return
        glorot_uniform_(self.gate_weight, blocks=self.reset_gates + self.update_gates)
        glorot_uniform_(self.projection_weight, blocks=2)
        with torch.no_grad():
            self.gate_bias.zero_()
            self.projection_bias.zero_()

    def recurrent_columns(self, name: str) -> slice:
        return slice(self.hidden_size, None)

    def _split_gates(self, gates: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(r₁, r₂, z₁, z₂) from the stacked gate activations; shared gates appear twice."""
        chunks = gates.chunk(self.reset_gates + self.update_gates, dim=-1)
        resets, updates = chunks[: self.reset_gates], chunks[self.reset_gates :]
        r1, r2 = (resets[0], resets[0]) if self.reset_gates == 1 else resets
        z1, z2 = (updates[0], updates[0]) if self.update_gates == 1 else updates
        return r1, r2, z1, z2

    def _mix(self, h1, h2, h1_hat, h2_hat, z1, z2) -> tuple[Tensor, Tensor]:
        """(h₁′, h₂′) from the inputs, the two projections and the update gates: by default (PS-LRU,
        RG-LRU) h₁′ = z₁ ⊙ h₁ + (1 − z₁) ⊙ ĥ₂ and h₂′ = z₂ ⊙ h₂ + (1 − z₂) ⊙ ĥ₁."""
        return z1 * h1 + (1 - z1) * h2_hat, z2 * h2 + (1 - z2) * h1_hat

    def _mix_(self, h1, h2, h1_hat, h2_hat, z1, z2) -> tuple[Tensor, Tensor]:
        """``_mix`` in fewer operations (one addcmul per output); may overwrite h1_hat and h2_hat."""
        return torch.addcmul(h2_hat, z1, h1 - h2_hat), torch.addcmul(h1_hat, z2, h2 - h1_hat)

    def inference_step(self) -> "LatticeInference":
        return LatticeInference(self)

    def step(self, x: Tensor, state: State) -> tuple[Tensor, State]:
        h1, (h2,) = x, state
        n = self.hidden_size
        gates = torch.sigmoid(torch.cat([h1, h2], dim=-1) @ self.gate_weight.T + self.gate_bias)
        r1, r2, z1, z2 = self._split_gates(gates)
        A1, A2 = self.projection_weight[:n], self.projection_weight[n:]
        b1, b2 = self.projection_bias[:n], self.projection_bias[n:]
        h1_hat = torch.tanh(torch.cat([h1, r2 * h2], dim=-1) @ A1.T + b1)
        h2_hat = torch.tanh(torch.cat([r1 * h1, h2], dim=-1) @ A2.T + b2)
        h1_new, h2_new = self._mix(h1, h2, h1_hat, h2_hat, z1, z2)
        return h1_new, (h2_new,)

    def forward(self, inputs: Tensor, state: State, lookup=None) -> tuple[Tensor, State]:
        n = self.hidden_size
        A1, A2 = self.projection_weight[:n], self.projection_weight[n:]
        # Everything h₁ enters without a gate in front, for the whole window at once.
        depth_weight = torch.cat([self.gate_weight[:, :n], A1[:, :n]])
        depth_bias = torch.cat([self.gate_bias, self.projection_bias[:n]])
        depth_part = self.input_product(inputs, depth_weight, depth_bias, lookup)
        time_weight = torch.cat([self.gate_weight[:, n:], A2[:, n:]])  # what h₂ enters ungated
        A1_time, A2_depth, b2 = A1[:, n:], A2[:, :n], self.projection_bias[n:]
        gate_rows = self.gate_weight.shape[0]
        (h2,) = state
        outputs = []
        widths = [gate_rows, n]  # split, not sliced: autograd then joins the two gradients in one copy
        for h1, depth_t in zip(inputs, depth_part):
            depth_gates, depth_projection = depth_t.split(widths, dim=1)
            time_gates, time_projection = (h2 @ time_weight.T).split(widths, dim=1)
            gates = torch.sigmoid(depth_gates + time_gates)
            r1, r2, z1, z2 = self._split_gates(gates)
            h1_hat = torch.tanh(depth_projection + (r2 * h2) @ A1_time.T)
            h2_hat = torch.tanh((r1 * h1) @ A2_depth.T + time_projection + b2)
            h1_out, h2 = self._mix(h1, h2, h1_hat, h2_hat, z1, z2)
            outputs.append(h1_out)
        return torch.stack(outputs), (h2,)


class LatticeInference(InferenceStep):
    """The lattice step for sampling: what h₁ enters ungated (every gate's A_g h₁ + b_g and
    A₁'s h₁ columns + b₁) is taken ahead; then one product of h₂ for the gates, and two each for
    the projections."""

    def __init__(self, cell: _Lattice):
        super().__init__(cell)
        n = self.hidden_size = cell.hidden_size
        A1, A2 = cell.projection_weight[:n], cell.projection_weight[n:]
        # Copies of the column blocks, transposed: views of them are slower operands at batch 1.
        self.depth_weight = torch.cat([cell.gate_weight[:, :n], A1[:, :n]]).T.contiguous()
        self.depth_bias = torch.cat([cell.gate_bias, cell.projection_bias[:n]])
        self.gate_time_weight = cell.gate_weight[:, n:].T.contiguous()
        self.A1_time, self.A2_depth = A1[:, n:].T.contiguous(), A2[:, :n].T.contiguous()
        self.A2_time, self.b2 = A2[:, n:].T.contiguous(), cell.projection_bias[n:]

    def project(self, x: Tensor) -> Tensor:
        return torch.addmm(self.depth_bias, x, self.depth_weight)

    def advance(self, projected: Tensor, h1: Tensor, state: State) -> tuple[Tensor, State]:
        (h2,) = state
        n, rows = self.hidden_size, self.gate_time_weight.shape[1]
        gates = torch.addmm(projected.narrow(-1, 0, rows), h2, self.gate_time_weight).sigmoid_()
        r1, r2, z1, z2 = self.cell._split_gates(gates)
        h1_hat = torch.addmm(projected.narrow(-1, rows, n), r2 * h2, self.A1_time).tanh_()
        h2_hat = torch.addmm(torch.addmm(self.b2, h2, self.A2_time), r1 * h1, self.A2_depth).tanh_()
        h1_new, h2_new = self.cell._mix_(h1, h2, h1_hat, h2_hat, z1, z2)
        return h1_new, (h2_new,)


class ProjectedStateLRU(_Lattice):
    r"""PS-LRU: projected state decoupled; one reset gate r, one update gate z.

    r = σ(A_r [h₁; h₂] + b_r),  z = σ(A_z [h₁; h₂] + b_z)
    ĥ₁ = tanh(A₁ [h₁; r ⊙ h₂] + b₁),  ĥ₂ = tanh(A₂ [r ⊙ h₁; h₂] + b₂)
    h₁′ = z ⊙ h₁ + (1 − z) ⊙ ĥ₂,  h₂′ = z ⊙ h₂ + (1 − z) ⊙ ĥ₁
    """

    name = "ps-lru"
    activation_factor = 32
    description = "Lattice Recurrent Unit, projected state decoupled (one r, one z)"
    paper = "Ahuja & Morency 2017, Lattice Recurrent Unit"
    formula = "8n² + 4n (d = n)"
    reset_gates, update_gates = 1, 1


class ResetGateLRU(_Lattice):
    r"""RG-LRU: reset gate also decoupled; r₁, r₂, one update gate z.

    r₁, r₂, z = σ(A_· [h₁; h₂] + b_·)
    ĥ₁ = tanh(A₁ [h₁; r₂ ⊙ h₂] + b₁),  ĥ₂ = tanh(A₂ [r₁ ⊙ h₁; h₂] + b₂)
    h₁′ = z ⊙ h₁ + (1 − z) ⊙ ĥ₂,  h₂′ = z ⊙ h₂ + (1 − z) ⊙ ĥ₁
    """

    name = "rg-lru"
    activation_factor = 33
    description = "Lattice Recurrent Unit, reset gate decoupled (r₁, r₂, one z)"
    paper = "Ahuja & Morency 2017, Lattice Recurrent Unit"
    formula = "10n² + 5n (d = n)"
    reset_gates, update_gates = 2, 1


class LatticeRecurrentUnit(_Lattice):
    r"""LRU (UG-LRU): update gate also decoupled; r₁, r₂, z₁, z₂.

    r₁, r₂, z₁, z₂ = σ(A_· [h₁; h₂] + b_·)
    ĥ₁ = tanh(A₁ [h₁; r₂ ⊙ h₂] + b₁),  ĥ₂ = tanh(A₂ [r₁ ⊙ h₁; h₂] + b₂)
    h₁′ = z₁ ⊙ ĥ₂ + (1 − z₁) ⊙ h₁,  h₂′ = z₂ ⊙ ĥ₁ + (1 − z₂) ⊙ h₂
    """

    name = "lru"
    activation_factor = 36
    description = "Lattice Recurrent Unit, update gate decoupled too (UG-LRU: r₁, r₂, z₁, z₂)"
    paper = "Ahuja & Morency 2017, Lattice Recurrent Unit"
    formula = "12n² + 6n (d = n)"
    reset_gates, update_gates = 2, 2

    def _mix(self, h1, h2, h1_hat, h2_hat, z1, z2):
        return z1 * h2_hat + (1 - z1) * h1, z2 * h1_hat + (1 - z2) * h2

    def _mix_(self, h1, h2, h1_hat, h2_hat, z1, z2):
        return torch.addcmul(h1, z1, h2_hat.sub_(h1)), torch.addcmul(h2, z2, h1_hat.sub_(h2))
