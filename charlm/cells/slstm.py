"""xLSTM's sLSTM layer (Beck et al. 2024): scalar memory with exponential gating, a normaliser and a
stabiliser, and head-wise recurrent connections; a loop over time."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from charlm.cells.base import InferenceStep, RecurrentCell, State
from charlm.cells.xlstm_parts import FORGET_GATES, causal_conv, conv_init_, head_norm, headwise, small_init_
from charlm.settings import setting


@dataclasses.dataclass
class SLSTMConfig:
    heads: int = setting(4, "Heads of the head-wise recurrence.", min=1)
    conv_width: int = setting(4, "The causal convolution on the i/f path (0: none).", min=0)
    forget_gate: str = setting("sigmoid", "The forget gate's activation.", choices=FORGET_GATES)


class SLSTM(RecurrentCell):
    r"""The sLSTM layer of xLSTM (Beck et al. 2024), the part of its pre-up-projection block inside the
    first residual connection. With H heads of d_h = n/H units, every W_* and R_* block-diagonal (one
    d_h × d_h block per head: the heads mix nothing)::

        u_t = SiLU(conv_k(x)_t)                           causal depthwise convolution of width k
        ĩ_t = W_i u_t + R_i h_{t−1} + b_i,   f̃_t = W_f u_t + R_f h_{t−1} + b_f
        z̃_t = W_z x_t + R_z h_{t−1} + b_z,   õ_t = W_o x_t + R_o h_{t−1} + b_o
        i_t = exp(ĩ_t),  f_t = σ(f̃_t)  (forget_gate=exp: exp(f̃_t)),  z_t = tanh(z̃_t),  o_t = σ(õ_t)
        c_t = f_t ⊙ c_{t−1} + i_t ⊙ z_t                   cell state
        n_t = f_t ⊙ n_{t−1} + i_t                         normaliser
        h_t = o_t ⊙ c_t / n_t
        y_t = GN(h_t)                                     LayerNorm per head (gain, no bias)

    computed in the stabilised form: m_t = max(log f_t + m_{t−1}, ĩ_t), i′_t = exp(ĩ_t − m_t),
    f′_t = exp(log f_t + m_{t−1} − m_t) in place of i_t, f_t, which scales c_t and n_t alike and leaves
    h_t as it is. h_t goes round the loop; y_t goes up. The block around it, x + y(LN(x)) and then a
    gated MLP of 4/3 n (GeLU in the paper), is charlm's ``--wiring block --block-conv 0
    --block-expansion 1.333`` (RMSNorm and a SiLU-gated MLP); in the default ``stacked`` wiring the
    layers stack without a residual. The input must be n wide (the projections are per head).

    There is no parallel form (h_{t−1} enters every gate through R): ``forward`` takes every input
    product for the window at once, then loops with one batched product per step. The time state,
    each ``[B, width]``: h, c, n, m (n each) and the convolution's last k − 1 inputs ((k−1)·n, oldest
    first; none for k ≤ 1).

    Options: ``heads`` H (4), ``conv_width`` k (4; 0: u_t = x_t, no SiLU), ``forget_gate`` (sigmoid, as
    the authors' code; exp). The initialisation as the authors' code: W_* N(0, √(2/5n)), R_* zero, b_i,
    b_z, b_o zero, b_f by unit j of each head −(−5 + 12 (j/(d_h−1))^{0.3 + 1.3 l/(L−1)}) for layer l of L
    (from +5 down to −7; l/(L−1) = 0 for one layer), the convolution U(±1/√k), GN gain 1.
    Left open by the paper and taken here: the convolution feeds i and f only (the authors' code);
    n_0 = 0 and m_0 = 0 with no special first step (the authors set m_1 = ĩ_1 when n is all zero, which
    changes the range only); GN's gain is stored as itself (the authors' code stores gain − 1).
    """

    name = "slstm"
    recurrent_weights = ("recurrent_weight",)
    # Measured with saved-tensor hooks (bytes autograd keeps, the tensors of a forward), batch 128 × bptt 50,
    # 2 layers of 256: 20.7 float32 per (step, stream, unit), rounded up by a quarter.
    activation_factor = 26
    description = "xLSTM's sLSTM: exponential gating, normaliser and stabiliser, head-wise recurrence (a loop)"
    paper = "Beck et al. 2024, xLSTM: Extended Long Short-Term Memory"
    formula = "8n²/H + (k + 6)n (d = n; H = heads 4, k = conv_width 4: 2n² + 10n; conv_width=0: 8n²/H + 5n)"
    Config = SLSTMConfig

    def __init__(self, input_size: int, hidden_size: int, config: SLSTMConfig | None = None):
        super().__init__(input_size, hidden_size, config)
        n, heads, width = hidden_size, self.config.heads, self.config.conv_width
        if input_size != n:
            raise ValueError(f"an sLSTM layer's input must be as wide as its output: {input_size} ≠ {n}")
        if n % heads:
            raise ValueError(f"the hidden size {n} is not divisible by heads={heads}")
        self.heads, self.head_size = heads, n // heads
        self.layer_index, self.num_layers = 0, 1  # in the stack (make_stack sets them): the forget bias
        if width:
            self.conv_weight = nn.Parameter(torch.empty(n, width))  # column j multiplies x_{t−j}
            self.conv_bias = nn.Parameter(torch.empty(n))
        self.weight_input = nn.Parameter(torch.empty(4, heads, self.head_size, self.head_size))  # i, f, z, o
        self.recurrent_weight = nn.Parameter(torch.empty(4, heads, self.head_size, self.head_size))
        self.bias = nn.Parameter(torch.empty(4, n))
        self.norm_weight = nn.Parameter(torch.empty(n))
        self.reset_parameters()

    @classmethod
    def required_input_size(cls, hidden_size: int, config) -> int | None:
        return hidden_size

    @classmethod
    def hidden_size_multiple(cls, config) -> int:
        return config.heads

    @classmethod
    def make_stack(cls, input_size: int, hidden_size: int, num_layers: int, config) -> list[RecurrentCell]:
        layers = super().make_stack(input_size, hidden_size, num_layers, config)
        for index, layer in enumerate(layers):
            layer.layer_index, layer.num_layers = index, num_layers
            layer.reset_parameters()
        return layers

    def reset_parameters(self):
        small_init_(self.weight_input, self.hidden_size)
        with torch.no_grad():
            self.recurrent_weight.zero_()
            self.bias.zero_()
            depth = self.layer_index / (self.num_layers - 1) if self.num_layers > 1 else 0.0
            units = torch.linspace(0.0, 1.0, self.head_size, dtype=self.bias.dtype)
            self.bias[1] = (5.0 - 12.0 * units ** (0.3 + 1.3 * depth)).repeat(self.heads)
            self.norm_weight.fill_(1.0)
            if self.config.conv_width:
                conv_init_(self.conv_weight, self.conv_bias)

    def initial_state(self, batch_size: int, device=None, dtype=None) -> State:
        memory = tuple(self._zeros(batch_size, device, dtype) for _ in range(4))  # h, c, n, m
        history = max(self.config.conv_width - 1, 0)
        return memory + ((self._zeros(batch_size, device, dtype, width=history * self.hidden_size),) if history else ())

    def _convolved(self, inputs: Tensor, past: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """u = SiLU(conv(x)) over ``[T, B, n]``, and the convolution's new history."""
        if not self.config.conv_width:
            return inputs, past
        convolved, past = causal_conv(inputs, past, self.conv_weight, self.conv_bias)
        return F.silu(convolved), past

    def inference_step(self) -> "SLSTMInference":
        return SLSTMInference(self)

    def step(self, x: Tensor, state: State) -> tuple[Tensor, State]:
        (h, c, n, m), past = state[:4], state[4] if len(state) > 4 else None
        u, past = self._convolved(x[None], past)
        u = u[0]
        W_i, W_f, W_z, W_o = self.weight_input
        R_i, R_f, R_z, R_o = self.recurrent_weight
        b_i, b_f, b_z, b_o = self.bias
        i_pre = headwise(u, W_i) + headwise(h, R_i) + b_i  # ĩ_t = W_i u_t + R_i h_{t−1} + b_i
        f_pre = headwise(u, W_f) + headwise(h, R_f) + b_f
        z = torch.tanh(headwise(x, W_z) + headwise(h, R_z) + b_z)
        o = torch.sigmoid(headwise(x, W_o) + headwise(h, R_o) + b_o)
        log_f = F.logsigmoid(f_pre) if self.config.forget_gate == "sigmoid" else f_pre
        m_new = torch.maximum(log_f + m, i_pre)  # m_t = max(log f_t + m_{t−1}, ĩ_t)
        i = torch.exp(i_pre - m_new)  # i′_t
        f = torch.exp(log_f + m - m_new)  # f′_t
        c = f * c + i * z  # c_t = f_t ⊙ c_{t−1} + i_t ⊙ z_t
        n = f * n + i  # n_t = f_t ⊙ n_{t−1} + i_t
        h = o * c / n  # h_t = o_t ⊙ c_t / n_t
        y = head_norm(h.unflatten(-1, (self.heads, self.head_size)), self.norm_weight, self.head_size)
        return y, ((h, c, n, m_new) if past is None else (h, c, n, m_new, past))

    def forward(self, inputs: Tensor, state: State) -> tuple[Tensor, State]:
        (h, c, n, m), past = state[:4], state[4] if len(state) > 4 else None
        steps, batch, width = inputs.shape
        H, d = self.heads, self.head_size
        u, past = self._convolved(inputs, past)
        bias = self.bias.view(4, H, 1, d)
        products = [  # u feeds i and f, x feeds z and o: [H, T·B, (gate, out)] each
            torch.baddbmm(
                torch.cat([bias[g], bias[g + 1]], -1),
                source.reshape(steps * batch, H, d).transpose(0, 1),
                by_head(self.weight_input[g : g + 2]),
            )
            for g, source in ((0, u), (2, inputs))
        ]
        pre_input = torch.cat(products, -1).view(H, steps, batch, 4 * d)  # [H, T, B, (i, f, z, o) d]
        recurrent = by_head(self.recurrent_weight)  # [H, in, (gate, out)]
        h, c, n, m = (s.reshape(batch, H, d).transpose(0, 1) for s in (h, c, n, m))  # [H, B, d]
        sigmoid_forget = self.config.forget_gate == "sigmoid"
        outputs = []
        for pre_t in pre_input.unbind(1):
            i_pre, f_pre, z_pre, o_pre = torch.baddbmm(pre_t, h, recurrent).chunk(4, dim=-1)
            log_f = F.logsigmoid(f_pre) if sigmoid_forget else f_pre
            m_new = torch.maximum(log_f + m, i_pre)
            i = torch.exp(i_pre - m_new)
            f = torch.exp(log_f + m - m_new)
            c = torch.addcmul(f * c, i, torch.tanh(z_pre))
            n = f * n + i
            h = torch.sigmoid(o_pre) * c / n
            m = m_new
            outputs.append(h)
        y = head_norm(torch.stack(outputs).transpose(1, 2), self.norm_weight, d)  # [T, B, n]
        h, c, n, m = (s.transpose(0, 1).reshape(batch, width) for s in (h, c, n, m))
        return y, ((h, c, n, m) if past is None else (h, c, n, m, past))


class SLSTMInference(InferenceStep):
    """The step for sampling: W_z x + b_z and W_o x + b_o taken ahead (i and f read the convolution of
    x, which needs the inputs before it); the recurrent products R h as one batched product."""

    def __init__(self, cell: SLSTM):
        super().__init__(cell)
        H, d = cell.heads, cell.head_size
        self.heads, self.head_size, self.norm_weight = H, d, cell.norm_weight
        self.weight_gates = cell.weight_input[:2]  # [2, H, d, d]: i, f
        self.weight_candidates = cell.weight_input[2:]
        self.bias = cell.bias.view(4, H, d).transpose(0, 1)  # [H, gate, d]
        self.recurrent = by_head(cell.recurrent_weight)  # [H, in, (gate, out)]
        self.sigmoid_forget = cell.config.forget_gate == "sigmoid"

    def project(self, x: Tensor) -> Tensor:
        """[W_z x + b_z; W_o x + b_o] head by head, ``[B, H·2·d]``."""
        products = torch.einsum("bhi,ghoi->bhgo", x.view(-1, self.heads, self.head_size), self.weight_candidates)
        return (products + self.bias[:, 2:]).flatten(1)

    def advance(self, projected: Tensor, x: Tensor | None, state: State) -> tuple[Tensor, State]:
        (h, c, n, m), past = state[:4], state[4] if len(state) > 4 else None
        H, d = self.heads, self.head_size
        u, past = self.cell._convolved(x[None], past)
        gates = torch.einsum("bhi,ghoi->bhgo", u[0].view(-1, H, d), self.weight_gates) + self.bias[:, :2]
        pre = torch.cat([gates, projected.view(-1, H, 2, d)], 2).flatten(2)  # [B, H, (i, f, z, o) d]
        pre = pre + torch.einsum("bhi,hio->bho", h.view(-1, H, d), self.recurrent)
        i_pre, f_pre, z_pre, o_pre = (g.flatten(1) for g in pre.unflatten(2, (4, d)).unbind(2))
        log_f = F.logsigmoid(f_pre) if self.sigmoid_forget else f_pre
        m_new = torch.maximum(log_f + m, i_pre)
        i, f = torch.exp(i_pre - m_new), torch.exp(log_f + m - m_new)
        c = torch.addcmul(f * c, i, torch.tanh(z_pre))
        n = f * n + i
        h = torch.sigmoid(o_pre) * c / n
        y = head_norm(h.view(-1, H, d), self.norm_weight, d)
        return y, ((h, c, n, m_new) if past is None else (h, c, n, m_new, past))


def by_head(weight: Tensor) -> Tensor:
    """Gate matrices ``[G, H, out, in]`` (block-diagonal, one block per head) as ``[H, in, G·out]``: one
    batched product per head gives the G gates' pre-activations side by side."""
    gates, heads, out, width = weight.shape
    return weight.permute(1, 3, 0, 2).reshape(heads, width, gates * out)
