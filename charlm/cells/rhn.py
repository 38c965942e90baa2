"""The recurrent highway network (Zilly, Srivastava, Koutník & Schmidhuber 2017)."""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor, nn

from charlm.cells.base import InferenceStep, RecurrentCell, State, glorot_uniform_
from charlm.settings import setting


@dataclasses.dataclass
class RHNConfig:
    depth: int = setting(5, "L, highway micro-layers per time step.", min=1)
    gate_bias: float = setting(-2.0, "Initial b_T (−4 was used for enwik8/text8): start by carrying.")


class RecurrentHighwayNetwork(RecurrentCell):
    r"""Recurrent highway network with coupled carry gate (c = 1 − t).

    s₀ = s_{t−1} (the previous output). For ℓ = 1..L:

        h_ℓ = tanh(1[ℓ=1] W_H x_t + R_{H,ℓ} s_{ℓ−1} + b_{H,ℓ})
        t_ℓ = σ(1[ℓ=1] W_T x_t + R_{T,ℓ} s_{ℓ−1} + b_{T,ℓ})
        s_ℓ = h_ℓ ⊙ t_ℓ + s_{ℓ−1} ⊙ (1 − t_ℓ)

    Output s_t = s_L. The input enters only micro-layer 1. b_T starts at ``gate_bias``.
    Rows of W and of each R_ℓ, b_ℓ are stored in the order (H, T).
    """

    name = "rhn"
    recurrent_weights = ("weight_hidden",)
    activation_factor = 48
    description = "Recurrent highway network, L micro-layers, coupled carry gate (options: depth, gate_bias)"
    paper = "Zilly et al. 2017, Recurrent highway networks"
    formula = "2dn + 2Ln² + 2Ln (L = depth, default 5)"
    Config = RHNConfig
    folds_embedding = True

    def __init__(self, input_size: int, hidden_size: int, config: RHNConfig | None = None):
        super().__init__(input_size, hidden_size, config)
        n, L = hidden_size, self.config.depth
        self.weight_input = nn.Parameter(torch.empty(2 * n, input_size))  # [W_H; W_T]
        self.weight_hidden = nn.Parameter(torch.empty(L, 2 * n, n))  # [R_{H,ℓ}; R_{T,ℓ}]
        self.bias = nn.Parameter(torch.empty(L, 2 * n))  # [b_{H,ℓ}; b_{T,ℓ}]
        self.reset_parameters()

    def reset_parameters(self):
        n = self.hidden_size
        glorot_uniform_(self.weight_input, blocks=2)
        for weight in self.weight_hidden:
            glorot_uniform_(weight, blocks=2)
        with torch.no_grad():
            self.bias.zero_()
            self.bias[:, n:].fill_(self.config.gate_bias)

    def step(self, x: Tensor, state: State) -> tuple[Tensor, State]:
        (s,) = state
        W_H, W_T = self.weight_input.chunk(2)
        for layer in range(self.config.depth):
            R_H, R_T = self.weight_hidden[layer].chunk(2)
            b_H, b_T = self.bias[layer].chunk(2)
            x_H, x_T = (x @ W_H.T, x @ W_T.T) if layer == 0 else (0.0, 0.0)
            h = torch.tanh(x_H + s @ R_H.T + b_H)
            t = torch.sigmoid(x_T + s @ R_T.T + b_T)
            s = h * t + s * (1 - t)
        return s, (s,)

    def inference_step(self) -> "HighwayInference":
        return HighwayInference(self)

    def forward(self, inputs: Tensor, state: State, lookup=None) -> tuple[Tensor, State]:
        first_layer_input = self.input_product(inputs, self.weight_input, self.bias[0], lookup)
        (s,) = state
        if HighwayWindow.applies(first_layer_input, s, self.weight_hidden, self.bias):
            outputs, s = HighwayWindow.apply(first_layer_input, s, self.weight_hidden, self.bias)
            return outputs, (s,)
        if not torch.is_grad_enabled():
            outputs, s = highway_columns(first_layer_input, s, self.weight_hidden, self.bias)
            return outputs, (s,)
        hidden_weights, biases = self.weight_hidden.unbind(0), self.bias.unbind(0)  # not re-indexed every step
        outputs = []
        for input_t in first_layer_input:
            s = _highway(s, torch.addmm(input_t, s, hidden_weights[0].T))
            for layer in range(1, self.config.depth):
                s = _highway(s, torch.addmm(biases[layer], s, hidden_weights[layer].T))
            outputs.append(s)
        return torch.stack(outputs), (s,)


class HighwayInference(InferenceStep):
    """The highway step for sampling: W x + b₁ taken ahead, then per micro-layer one product
    R_ℓ s + (that, or b_ℓ) and the gates applied in place."""

    reads_input = False

    def __init__(self, cell: RecurrentHighwayNetwork):
        super().__init__(cell)
        self.weight_input = cell.weight_input.T
        self.first_bias = cell.bias[0]
        self.micro_layers = [(weight.T, bias) for weight, bias in zip(cell.weight_hidden, cell.bias)]

    def project(self, x: Tensor) -> Tensor:
        return torch.addmm(self.first_bias, x, self.weight_input)

    def advance(self, projected: Tensor, x: Tensor | None, state: State) -> tuple[Tensor, State]:
        (s,) = state
        n = s.shape[-1]
        for layer, (weight, bias) in enumerate(self.micro_layers):
            pre = torch.addmm(projected if layer == 0 else bias, s, weight)
            h = pre.narrow(-1, 0, n).tanh_()
            t = pre.narrow(-1, n, n).sigmoid_()
            s = torch.addcmul(s, t, h - s)  # h ⊙ t + s ⊙ (1 − t)
        return s, (s,)


def _highway(s: Tensor, pre: Tensor) -> Tensor:
    """s_ℓ from s_{ℓ−1} and the micro-layer's pre-activations [H; T]."""
    pre_h, pre_t = pre.chunk(2, dim=-1)
    t = torch.sigmoid(pre_t)
    return torch.tanh(pre_h) * t + s * (1 - t)


def highway_columns(
    first_layer_input: Tensor,
    s0: Tensor,
    weight_hidden: Tensor,
    bias: Tensor,
    states: list | None = None,
    activations: list | None = None,
) -> tuple[Tensor, Tensor]:
    """The highway recurrence over a window without autograd: outputs ``[T, B, n]`` and the last s.

    Column layout: s is kept as sᵀ ``[n, B]`` and the pre-activations as ``[2n, B]``, so the H and T
    halves are contiguous row blocks and every elementwise op runs on contiguous memory; h_ℓ is
    computed as 2σ(2 pre_H) − 1, the same function as tanh, so one sigmoid serves both halves
    (PyTorch's CPU tanh costs about five sigmoids). Each step's tensors are allocated separately:
    small blocks are reused by the memory allocator, where one window-sized buffer would be fresh
    pages to fault in on every call. ``states``/``activations``, when given, collect each
    micro-layer's s_{ℓ−1}ᵀ and [h_ℓ; t_ℓ] for :class:`HighwayWindow`'s backward.
    """
    n = weight_hidden.shape[2]
    inputs = first_layer_input.transpose(1, 2).contiguous()  # [T, 2n, B]
    biases = bias.unsqueeze(-1)  # [L, 2n, 1]
    s = s0.T.contiguous()
    outputs = []
    for input_t in inputs:
        for layer, weight in enumerate(weight_hidden):
            pre = torch.addmm(input_t if layer == 0 else biases[layer], weight, s)  # [pre_H; pre_T]
            pre[:n] *= 2
            act = torch.sigmoid_(pre)  # [σ(2 pre_H); σ(pre_T)]
            h, gate = act[:n].mul_(2).sub_(1), act[n:]  # h_ℓ = tanh(pre_H), t_ℓ
            if states is not None:
                states.append(s)
                activations.append(act)
            s = torch.addcmul(s, gate, h - s)  # s_ℓ = h ⊙ t + s_{ℓ−1} ⊙ (1 − t)
        outputs.append(s)
    return torch.stack([output.T for output in outputs]), s.T.contiguous()


class HighwayWindow(torch.autograd.Function):
    r"""The highway recurrence over a window, with a hand-written backward (torch-rnn style).

    Inputs: the hoisted first micro-layer input ``W x_t + b_1`` ``[T, B, 2n]``, the carried
    s₀ ``[B, n]``, every R_ℓ ``[L, 2n, n]`` and b_ℓ ``[L, 2n]`` (b₁ is already in the input; its
    row gets no gradient here). Outputs: s_t for every t ``[T, B, n]`` and the last s.

    Forward (:func:`highway_columns`) keeps s_{ℓ−1}, h_ℓ and t_ℓ of every micro-layer. With
    s_ℓ = s_{ℓ−1} + t_ℓ (h_ℓ − s_{ℓ−1}), backward runs through the window in reverse:

        ∂pre_H = ∂s_ℓ ⊙ t_ℓ ⊙ (1 − h_ℓ²)
        ∂pre_T = ∂s_ℓ ⊙ (h_ℓ − s_{ℓ−1}) ⊙ t_ℓ (1 − t_ℓ)
        ∂s_{ℓ−1} = ∂s_ℓ ⊙ (1 − t_ℓ) + [∂pre_H; ∂pre_T] R_ℓ

    accumulating ∂R_ℓ = Σ_t ∂pre_ℓᵀ s_{ℓ−1} and ∂b_ℓ in place: two matrix products and five
    elementwise ops per micro-layer, where autograd's graph of the same loop runs about twice as
    many ops, each allocating its result.
    """

    @staticmethod
    def applies(first_layer_input: Tensor, s: Tensor, weight_hidden: Tensor, bias: Tensor) -> bool:
        """Training outside autocast (under autocast the autograd loop lets PyTorch pick each
        product's precision; inference runs :func:`highway_columns` alone)."""
        wants_grad = any(t.requires_grad for t in (first_layer_input, s, weight_hidden, bias))
        autocast = torch.is_autocast_enabled(first_layer_input.device.type)
        return torch.is_grad_enabled() and wants_grad and not autocast

    @staticmethod
    def forward(ctx, first_layer_input, s0, weight_hidden, bias):
        ctx.states, ctx.activations = [], []
        outputs, s = highway_columns(first_layer_input, s0, weight_hidden, bias, ctx.states, ctx.activations)
        ctx.save_for_backward(weight_hidden)
        return outputs, s

    @staticmethod
    def backward(ctx, grad_outputs, grad_last):
        (weight_hidden,) = ctx.saved_tensors
        states, activations = ctx.states, ctx.activations
        L, two_n, n = weight_hidden.shape
        T, B = len(states) // L, states[0].shape[1]
        grad_weight, grad_bias = torch.zeros_like(weight_hidden), weight_hidden.new_zeros(L, two_n)
        grad_first = []  # [∂pre_H; ∂pre_T]ᵀ of the first micro-layer, last step first
        ds = grad_last.T.clone() if grad_last is not None else weight_hidden.new_zeros(n, B)
        for t in reversed(range(T)):
            if grad_outputs is not None:
                ds += grad_outputs[t].T
            for layer in reversed(range(L)):
                s, act = states[t * L + layer], activations[t * L + layer]
                h, gate = act[:n], act[n:]
                ds_gated = ds * gate
                grad = ds.new_empty(two_n, B)  # [∂pre_H; ∂pre_T]
                torch.ops.aten.tanh_backward.grad_input(ds_gated, h, grad_input=grad[:n])  # ∂s ⊙ t ⊙ (1 − h²)
                torch.ops.aten.sigmoid_backward.grad_input(
                    ds * (h - s), gate, grad_input=grad[n:]
                )  # ⊙ (h − s) t(1 − t)
                grad_weight[layer].addmm_(grad, s.T)  # ∂R_ℓ += ∂preᵀ s_{ℓ−1}
                grad_bias[layer] += grad.sum(dim=1)
                ds = torch.addmm(ds.sub_(ds_gated), weight_hidden[layer].T, grad)  # ∂s_{ℓ−1}
            grad_first.append(grad)
        grad_bias[0] = 0  # b₁ reached the first micro-layer through the hoisted input
        return torch.stack([grad.T for grad in reversed(grad_first)]), ds.T.contiguous(), grad_weight, grad_bias
