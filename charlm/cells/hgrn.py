"""The Hierarchically Gated Recurrent Network (Qin, Yang & Zhong 2023), real-valued HGRU layer."""

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

LAYER_NORM_EPS = 1e-5


@dataclasses.dataclass
class HGRNConfig:
    lower_bound: bool = setting(
        True, "Forget-gate lower bounds rising with depth (false: the paper's ablation without them)."
    )
    scan: str = setting(
        "auto",
        "How forward computes h_t = f_t ⊙ h_{t−1} + (1 − f_t) ⊙ i_t (a form of the linear scan).",
        choices=SCAN_METHODS,
    )


class HGRNLowerBounds(nn.Module):
    """The stack's forget-gate lower bounds: Γ ∈ R^{L×n}, one module shared by every layer.

    γ = cumsum(softmax(Γ, over the layers)) − softmax(Γ)_1, so layer 1's bound is 0 and the bounds
    rise monotonically with depth and stay below 1. Γ starts at 0 (the published code's ones give
    the same softmax): the bounds start evenly spaced, γ_k = (k − 1)/L for layer k.
    """

    def __init__(self, num_layers: int, hidden_size: int):
        super().__init__()
        self.logits = nn.Parameter(torch.zeros(num_layers, hidden_size))

    def bound(self, index: int) -> Tensor:
        """γ for layer ``index`` (from 0): Σ_{j=1..index} softmax(Γ)_j, ``[n]``."""
        weights = torch.softmax(self.logits, dim=0)
        return weights[1 : index + 1].sum(dim=0)


class HGRN(ScanCell):
    r"""One HGRU layer of the Hierarchically Gated Recurrent Neural Network, in its real form (Qin,
    Yang & Zhong 2023). Layer k of L has a forget-gate lower bound γ^k ∈ [0, 1)^n that rises with k:

        f_t = γ^k + (1 − γ^k) ⊙ σ(x_t W_f + b_f)      (forget gate, bounded below)
        i_t = SiLU(x_t W_i + b_i)                      (input)
        g_t = σ(x_t W_g + b_g)                         (output gate)
        h_t = f_t ⊙ h_{t−1} + (1 − f_t) ⊙ i_t
        o_t = LayerNorm(h_t ⊙ g_t) W_o + b_o

    with γ = cumsum(softmax(Γ)) − softmax(Γ)_1 over the layers (Γ ∈ R^{L×n}, so γ^1 = 0: the bottom
    layer may forget fast, upper layers keep longer memories). Γ is one module shared by the layers
    of a stack (:class:`HGRNLowerBounds`, made by ``make_stack``); it counts once in the model, and
    L·n in all, n per layer. Option ``lower_bound=false`` drops it (f_t = σ(x_t W_f + b_f)). A layer
    built alone, or the one block of a tied stack (``tie_layers``), is a stack of one: its bound is 0.

    The gates read the input only, so the whole window's gates are computed at once, and the
    recurrence is a first-order linear scan (a_t = f_t, b_t = (1 − f_t) ⊙ i_t; ``scan`` picks its
    form, see :mod:`charlm.cells.scan`). Initialisation as the published code leaves it: PyTorch's
    ``nn.Linear`` default, weights and biases U(±1/√fan_in), LayerNorm gain 1 and bias 0, Γ = 0.
    The paper's complex form (a phase θ on λ_t, an input of two SiLUs) is not implemented.
    """

    name = "hgrn"
    # Measured as for the built-in cells (peak resident memory, batch 128 × bptt 50, 2 layers of 256): 21.3 with
    # scan=auto, 13.8 with the loop; auto's, rounded up by a quarter.
    activation_factor = 27
    description = "HGRN (Qin et al.): gated linear recurrence, forget-gate lower bounds rising with depth"
    paper = "Qin, Yang & Zhong 2023, Hierarchically Gated Recurrent Neural Network for Sequence Modeling"
    formula = "3dn + n² + 7n (Γ's row n; lower_bound=false: 3dn + n² + 6n)"
    Config = HGRNConfig

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        config: HGRNConfig | None = None,
        layer_index: int = 0,
        lower_bounds: HGRNLowerBounds | None = None,
    ):
        super().__init__(input_size, hidden_size, config)
        n = hidden_size
        self.layer_index = layer_index
        if self.config.lower_bound:  # a layer built alone (or a tied stack's block) is a stack of one: bound 0
            self.lower_bounds = lower_bounds if lower_bounds is not None else HGRNLowerBounds(1, n)
        else:
            self.lower_bounds = None
        self.weight_input = nn.Parameter(torch.empty(3 * n, input_size))  # rows: f, i, g
        self.bias_input = nn.Parameter(torch.empty(3 * n))
        self.norm_weight = nn.Parameter(torch.ones(n))
        self.norm_bias = nn.Parameter(torch.zeros(n))
        self.weight_output = nn.Parameter(torch.empty(n, n))
        self.bias_output = nn.Parameter(torch.empty(n))
        self.reset_parameters()

    @classmethod
    def make_stack(cls, input_size, hidden_size, num_layers, config):
        """Every layer knows its index and reads its bound from the stack's one Γ."""
        bounds = HGRNLowerBounds(num_layers, hidden_size) if config.lower_bound else None
        layers = []
        for index in range(num_layers):
            layer = cls(input_size, hidden_size, config, layer_index=index, lower_bounds=bounds)
            layers.append(layer)
            input_size = layer.output_size
        return layers

    def reset_parameters(self):
        with torch.no_grad():
            bound = 1.0 / math.sqrt(self.input_size)
            self.weight_input.uniform_(-bound, bound)
            self.bias_input.uniform_(-bound, bound)
            bound = 1.0 / math.sqrt(self.hidden_size)
            self.weight_output.uniform_(-bound, bound)
            self.bias_output.uniform_(-bound, bound)
            self.norm_weight.fill_(1.0)
            self.norm_bias.zero_()

    def lower_bound(self) -> Tensor | float:
        """γ^k of this layer, ``[n]`` (0 without lower bounds)."""
        return 0.0 if self.lower_bounds is None else self.lower_bounds.bound(self.layer_index)

    def step(self, x: Tensor, state: State) -> tuple[Tensor, State]:
        (h,) = state
        W_f, W_i, W_g = self.weight_input.chunk(3)
        b_f, b_i, b_g = self.bias_input.chunk(3)
        bound = self.lower_bound()  # γ^k
        f = bound + (1 - bound) * torch.sigmoid(x @ W_f.T + b_f)  # f_t = γ^k + (1 − γ^k) ⊙ σ(x_t W_f + b_f)
        i = F.silu(x @ W_i.T + b_i)  # i_t = SiLU(x_t W_i + b_i)
        g = torch.sigmoid(x @ W_g.T + b_g)  # g_t = σ(x_t W_g + b_g)
        h = f * h + (1 - f) * i  # h_t = f_t ⊙ h_{t−1} + (1 − f_t) ⊙ i_t
        normed = F.layer_norm(h * g, (self.hidden_size,), self.norm_weight, self.norm_bias, LAYER_NORM_EPS)
        output = normed @ self.weight_output.T + self.bias_output  # o_t = LayerNorm(h_t ⊙ g_t) W_o + b_o
        return output, (h,)

    def input_map(self) -> tuple[Tensor, Tensor]:
        return self.weight_input, self.bias_input

    def coefficients(self, pre: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(f, (1 − f) ⊙ i, g) from the input map [x W_f + b_f, x W_i + b_i, x W_g + b_g]."""
        pre_f, pre_i, pre_g = pre.chunk(3, dim=-1)
        bound = self.lower_bound()
        f = bound + (1 - bound) * torch.sigmoid(pre_f)
        return f, (1 - f) * F.silu(pre_i), torch.sigmoid(pre_g)

    def output(self, h: Tensor, x: Tensor | None, g: Tensor) -> Tensor:
        normed = F.layer_norm(h * g, (self.hidden_size,), self.norm_weight, self.norm_bias, LAYER_NORM_EPS)
        return F.linear(normed, self.weight_output, self.bias_output)  # o_t = LayerNorm(h_t ⊙ g_t) W_o + b_o
