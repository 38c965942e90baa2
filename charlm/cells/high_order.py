"""High-order gating for LSTM and GRU (Luo 2016, High Order LSTM/GRU).

Each gate (LSTM: i, f, o; GRU: z, r; never the candidate) gains a second-order term in the
input and the previous hidden state:

    g = σ(W_g x_t + U_g h_{t−1} + b_g + f_g(x_t, h_{t−1}))

    factored (default):  f_g = W_g^f ((U_g^f x) ⊙ (V_g^f h)),   U ∈ R^{m×d}, V ∈ R^{m×n}, W^f ∈ R^{n×m}
    symmetric:           f_g = W_g^f [⟨V_g^{(k)} x, V_g^{(k)} h⟩]_{k=1..m},  V^{(k)} ∈ R^{r×n}  (needs d = n)

The rest of each cell is exactly charlm's ``lstm`` (no peepholes) and ``gru`` (reset before the
recurrent product), with the same parameter layout; the cells below subclass them.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch
from torch import Tensor, nn

from charlm.cells.base import State, glorot_uniform_
from charlm.cells.gru import GRU, GRUInference
from charlm.cells.lstm import LSTM, LSTMInference
from charlm.settings import setting


@dataclasses.dataclass
class HighOrderConfig:
    ho_form: str = setting(
        "factored",
        "factored: W^f((U^f x) ⊙ (V^f h)); symmetric: W^f[⟨V^(k) x, V^(k) h⟩]_k (d = n).",
        choices=("factored", "symmetric"),
    )
    ho_kernels: int = setting(16, "m: factors (factored) or kernels V^(k) (symmetric) per gate.", min=1)
    ho_rank: int = setting(4, "r: rows of each V^(k) (symmetric form only).", min=1)


@dataclasses.dataclass
class HighOrderLSTMConfig(HighOrderConfig):
    peephole: ClassVar[str] = "none"  # the base LSTM's option, fixed off (not an option here)


@dataclasses.dataclass
class HighOrderGRUConfig(HighOrderConfig):
    reset_after: ClassVar[bool] = False  # the base GRU's option, fixed off (not an option here)


class SecondOrderTerm(nn.Module):
    """f_g(x, h) for G gates at once, returned side by side as ``[B, G·n]``.

    Both forms are a sum of products of a projection of x and a projection of h: factored pairs
    m rows of U^f with m rows of V^f; symmetric uses the m·r rows of the V^(k) on both sides and
    sums each kernel's r products (the inner product). The fast path uses that shape: the x side
    of every window step comes from one matrix product (:meth:`input_weight`), the h side joins
    the cell's recurrent product (:meth:`hidden_weight`), and one more product with
    :meth:`mixing_matrix` finishes the term (:meth:`combine`).
    """

    def __init__(self, gates: int, input_size: int, hidden_size: int, config: HighOrderConfig):
        super().__init__()
        n, m, r = hidden_size, config.ho_kernels, config.ho_rank
        self.symmetric = config.ho_form == "symmetric"
        if self.symmetric:
            if input_size != hidden_size:
                raise ValueError(f"ho_form=symmetric needs input size = hidden size (got {input_size}, {hidden_size})")
            self.kernels = nn.Parameter(torch.empty(gates, m, r, n))  # V_g^(k)
        else:
            self.input_factors = nn.Parameter(torch.empty(gates, m, input_size))  # U_g^f
            self.hidden_factors = nn.Parameter(torch.empty(gates, m, n))  # V_g^f
        self.mixing = nn.Parameter(torch.empty(gates, n, m))  # W_g^f
        self.reset_parameters()

    def reset_parameters(self):
        """Glorot uniform per gate on every matrix (there are no biases)."""
        gates = self.mixing.shape[0]
        with torch.no_grad():
            for weight in (self.input_weight(), self.hidden_weight(), self.mixing.flatten(0, 1)):
                glorot_uniform_(weight, blocks=gates)

    def forward(self, x: Tensor, h: Tensor) -> Tensor:
        """The equations: f_g(x, h) for every gate g."""
        if self.symmetric:
            Vx = torch.einsum("gkrn,bn->bgkr", self.kernels, x)
            Vh = torch.einsum("gkrn,bn->bgkr", self.kernels, h)
            features = (Vx * Vh).sum(-1)  # ⟨V_g^(k) x, V_g^(k) h⟩, [B, G, m]
        else:
            Ux = torch.einsum("gmd,bd->bgm", self.input_factors, x)
            Vh = torch.einsum("gmn,bn->bgm", self.hidden_factors, h)
            features = Ux * Vh
        return torch.einsum("gnm,bgm->bgn", self.mixing, features).flatten(1)

    def input_weight(self) -> Tensor:
        """The rows that project x, ``[G·m·r, d]`` (symmetric) or ``[G·m, d]`` (factored)."""
        return (self.kernels if self.symmetric else self.input_factors).flatten(0, -2)

    def hidden_weight(self) -> Tensor:
        """The rows that project h, in the same order as :meth:`input_weight`."""
        return (self.kernels if self.symmetric else self.hidden_factors).flatten(0, -2)

    def mixing_matrix(self) -> Tensor:
        """Every gate's W^f as one block-diagonal ``[G·n, G·m·r]`` matrix (r = 1 when factored).

        Each column is repeated r times, so multiplying the products of the projections by it
        also sums each kernel's r products into its inner product.
        """
        rank = self.kernels.shape[2] if self.symmetric else 1
        return torch.block_diag(*self.mixing.repeat_interleave(rank, dim=2))

    def combine(self, x_projected: Tensor, h_projected: Tensor, mixing_matrix: Tensor) -> Tensor:
        """f_g from x @ input_weight().T, h @ hidden_weight().T and :meth:`mixing_matrix`."""
        return (x_projected * h_projected) @ mixing_matrix.T


def _required_input_size(hidden_size: int, config: HighOrderConfig) -> int | None:
    return hidden_size if config.ho_form == "symmetric" else None


class HighOrderLSTM(LSTM):
    r"""LSTM with high-order gating on i, f and o.

        i, f, o = σ(W_* x_t + U_* h_{t−1} + b_* + f_*(x_t, h_{t−1}))
        g       = tanh(W_g x_t + U_g h_{t−1} + b_g)
        c_t     = f ⊙ c_{t−1} + i ⊙ g
        h_t     = o ⊙ tanh(c_t)

    f_* as in the module docstring (``ho_form``, m = ``ho_kernels``, r = ``ho_rank``). Base
    weights are the ``lstm`` cell's (rows i, f, g, o; forget bias +1); second-order terms are
    stacked in the order i, f, o.
    """

    name = "ho-lstm"
    activation_factor = 33
    evaluates_through_step = True  # measured faster without gradients (see RecurrentCell)
    description = "LSTM with high-order (second-order) gating on i, f, o"
    paper = "Luo 2016, High Order LSTM/GRU"
    formula = "4(dn + n² + n) + 3m(d + 2n) (factored); 4(dn + n² + n) + 3(nm + rnm), d = n (symmetric)"
    Config = HighOrderLSTMConfig

    def __init__(self, input_size: int, hidden_size: int, config: HighOrderLSTMConfig | None = None):
        super().__init__(input_size, hidden_size, config)
        self.second_order = SecondOrderTerm(3, input_size, hidden_size, self.config)

    @classmethod
    def required_input_size(cls, hidden_size, config):
        return _required_input_size(hidden_size, config)

    def reset_parameters(self):
        super().reset_parameters()
        if hasattr(self, "second_order"):  # not built yet while LSTM.__init__ runs; it initialises itself
            self.second_order.reset_parameters()

    def step(self, x: Tensor, state: State) -> tuple[Tensor, State]:
        h, c = state
        i, f, g, o = (x @ self.weight_input.T + h @ self.weight_hidden.T + self.bias).chunk(4, dim=-1)
        f_i, f_f, f_o = self.second_order(x, h).chunk(3, dim=-1)
        c = torch.sigmoid(f + f_f) * c + torch.sigmoid(i + f_i) * torch.tanh(g)
        h = torch.sigmoid(o + f_o) * torch.tanh(c)
        return h, (h, c)

    def inference_step(self) -> "HighOrderLSTMInference":
        return HighOrderLSTMInference(self)

    def forward(self, inputs: Tensor, state: State, lookup=None) -> tuple[Tensor, State]:
        n = self.hidden_size
        term = self.second_order
        from_input = self.input_product(inputs, torch.cat([self.weight_input, term.input_weight()]), lookup=lookup)
        pre_input, x_projected = from_input[..., : 4 * n] + self.bias, from_input[..., 4 * n :]
        hidden_weight = torch.cat([self.weight_hidden, term.hidden_weight()])
        mixing = term.mixing_matrix()  # rows i, f, o; a zero block for g lines them up with pre's i, f, g, o
        mixing = torch.cat([mixing[: 2 * n], mixing.new_zeros(n, mixing.shape[1]), mixing[2 * n :]])
        h, c = state
        outputs = []
        for pre_t, x_projected_t in zip(pre_input, x_projected):
            from_hidden = h @ hidden_weight.T
            second_order = term.combine(x_projected_t, from_hidden[:, 4 * n :], mixing)
            _, (h, c) = self._gates_to_output(pre_t + from_hidden[:, : 4 * n] + second_order, c)
            outputs.append(h)
        return torch.stack(outputs), (h, c)


def second_order_factors(term: SecondOrderTerm) -> tuple[Tensor, Tensor]:
    """The projections of x and of h that the second-order terms multiply, transposed."""
    return term.input_weight().T, term.hidden_weight().T


class HighOrderLSTMInference(LSTMInference):
    """The LSTM step for sampling with the second-order terms: the input takes W x + b and the x
    side of the terms ahead; the h side is one more product, and one product with the mixing
    matrix (a zero block for g) adds the terms to i, f and o."""

    def __init__(self, cell: HighOrderLSTM):
        super().__init__(cell)
        self.hidden_size = n = cell.hidden_size
        self.factors_input, self.factors_hidden = second_order_factors(cell.second_order)
        mixing = cell.second_order.mixing_matrix()  # rows i, f, o
        self.mixing = torch.cat([mixing[: 2 * n], mixing.new_zeros(n, mixing.shape[1]), mixing[2 * n :]]).T

    def project(self, x: Tensor) -> Tensor:
        return torch.cat([super().project(x), x @ self.factors_input], dim=-1)

    def gates(self, projected: Tensor, h: Tensor) -> Tensor:
        width = 4 * self.hidden_size
        features = projected.narrow(-1, width, self.factors_input.shape[1]) * (h @ self.factors_hidden)
        return torch.addmm(
            super().gates(projected.narrow(-1, 0, width), h), features, self.mixing
        )  # out of place: autocast casts it


class HighOrderGRU(GRU):
    r"""GRU (reset before the recurrent product) with high-order gating on z and r.

        z_t = σ(W_z x_t + U_z h_{t−1} + b_z + f_z(x_t, h_{t−1}))
        r_t = σ(W_r x_t + U_r h_{t−1} + b_r + f_r(x_t, h_{t−1}))
        ĥ_t = tanh(W_h x_t + U_h (r_t ⊙ h_{t−1}) + b_h)
        h_t = z_t ⊙ h_{t−1} + (1 − z_t) ⊙ ĥ_t

    f_* as in the module docstring. Base weights are the ``gru`` cell's (rows r, z, h);
    second-order terms are stacked in the order r, z.
    """

    name = "ho-gru"
    activation_factor = 30
    evaluates_through_step = True  # measured faster without gradients (see RecurrentCell)
    description = "GRU with high-order (second-order) gating on z, r"
    paper = "Luo 2016, High Order LSTM/GRU"
    formula = "3(dn + n² + n) + 2m(d + 2n) (factored); 3(dn + n² + n) + 2(nm + rnm), d = n (symmetric)"
    Config = HighOrderGRUConfig

    def __init__(self, input_size: int, hidden_size: int, config: HighOrderGRUConfig | None = None):
        super().__init__(input_size, hidden_size, config)
        self.second_order = SecondOrderTerm(2, input_size, hidden_size, self.config)

    @classmethod
    def required_input_size(cls, hidden_size, config):
        return _required_input_size(hidden_size, config)

    def reset_parameters(self):
        super().reset_parameters()
        if hasattr(self, "second_order"):  # not built yet while GRU.__init__ runs; it initialises itself
            self.second_order.reset_parameters()

    def step(self, x: Tensor, state: State) -> tuple[Tensor, State]:
        (h,) = state
        W_r, W_z, W_h = self.weight_input.chunk(3)
        U_r, U_z, U_h = self.weight_hidden.chunk(3)
        b_r, b_z, b_h = self.bias.chunk(3)
        f_r, f_z = self.second_order(x, h).chunk(2, dim=-1)
        r = torch.sigmoid(x @ W_r.T + h @ U_r.T + b_r + f_r)
        z = torch.sigmoid(x @ W_z.T + h @ U_z.T + b_z + f_z)
        h_hat = torch.tanh(x @ W_h.T + (r * h) @ U_h.T + b_h)
        h = z * h + (1 - z) * h_hat
        return h, (h,)

    def inference_step(self) -> "HighOrderGRUInference":
        return HighOrderGRUInference(self)

    def forward(self, inputs: Tensor, state: State, lookup=None) -> tuple[Tensor, State]:
        n = self.hidden_size
        term = self.second_order
        from_input = self.input_product(inputs, torch.cat([self.weight_input, term.input_weight()]), lookup=lookup)
        pre_input, x_projected = from_input[..., : 3 * n] + self.bias, from_input[..., 3 * n :]
        hidden_weight = torch.cat([self.weight_hidden[: 2 * n], term.hidden_weight()])  # U_r, U_z, then f's h side
        U_h = self.weight_hidden[2 * n :]
        mixing = term.mixing_matrix()  # rows r, z, as in pre
        (h,) = state
        outputs = []
        for pre_t, x_projected_t in zip(pre_input, x_projected):
            from_hidden = h @ hidden_weight.T
            second_order = term.combine(x_projected_t, from_hidden[:, 2 * n :], mixing)
            r, z = torch.sigmoid(pre_t[:, : 2 * n] + from_hidden[:, : 2 * n] + second_order).chunk(2, dim=-1)
            h_hat = torch.tanh(pre_t[:, 2 * n :] + (r * h) @ U_h.T)
            h = z * h + (1 - z) * h_hat
            outputs.append(h)
        return torch.stack(outputs), (h,)


class HighOrderGRUInference(GRUInference):
    """The GRU step for sampling with the second-order terms on r and z: the input takes W x + b
    and the x side of the terms ahead; the h side is one more product."""

    def __init__(self, cell: HighOrderGRU):
        super().__init__(cell)
        self.factors_input, self.factors_hidden = second_order_factors(cell.second_order)
        self.mixing = cell.second_order.mixing_matrix().T

    def project(self, x: Tensor) -> Tensor:
        return torch.cat([super().project(x), x @ self.factors_input], dim=-1)

    def gates(self, projected: Tensor, h: Tensor) -> Tensor:
        features = projected.narrow(-1, 3 * self.hidden_size, self.factors_input.shape[1]) * (h @ self.factors_hidden)
        return torch.addmm(super().gates(projected, h), features, self.mixing)  # out of place: autocast casts it
