"""xLSTM's mLSTM layer (Beck et al. 2024): a matrix memory per head with exponential gating, in the
post-up-projection block it is published in. Not Krause et al.'s multiplicative LSTM (2016)."""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from charlm.cells.base import InferenceStep, RecurrentCell, State
from charlm.cells.matrix_memory import memory_chunked, memory_step
from charlm.cells.xlstm_parts import (
    FORGET_GATES,
    causal_conv,
    conv_init_,
    head_norm,
    headwise,
    in_state_precision,
    log_forget,
    small_init_,
)
from charlm.settings import setting

EXPANSION = 2  # the block's up-projection factor, as published


@dataclasses.dataclass
class MLSTMConfig:
    heads: int = setting(4, "Heads of the matrix memory.", min=1)
    qkv_blocksize: int = setting(4, "q, k, v from block-diagonal matrices with blocks of this size (0: dense).", min=0)
    conv_width: int = setting(4, "The causal convolution on the q/k path (0: none).", min=0)
    forget_gate: str = setting("sigmoid", "The forget gate's activation.", choices=FORGET_GATES)
    chunk_size: int = setting(64, "Positions per chunk of the chunkwise-parallel form.", min=1)


class MLSTM(RecurrentCell):
    r"""The mLSTM layer of xLSTM (Beck et al. 2024), the part of its post-up-projection block inside
    the residual connection. From the layer's input x_t (d wide) and inner width m = 2n::

        [x̂_t; z_t] = W_up x_t                           up-projection, 2m
        a_t = SiLU(conv_k(x̂)_t)                          causal depthwise convolution of width k
        q_t = W_q a_t,  k_t = W_k a_t / √d_h,  v_t = W_v x̂_t     block-diagonal, per head of d_h = m/H
        ĩ_t = w_iᵀ [q_t; k_t; v_t] + b_i,  f̃_t = w_fᵀ [q_t; k_t; v_t] + b_f   one scalar per head
        i_t = exp(ĩ_t),  f_t = σ(f̃_t)  (forget_gate=exp: exp(f̃_t))
        C_t = f_t C_{t−1} + i_t v_t k_tᵀ,  n_t = f_t n_{t−1} + i_t k_t            per head, d_h × d_h
        h̃_t = C_t q_t / max(|n_tᵀ q_t|, 1)
        y_t = W_down ((GN(h̃_t) + s ⊙ a_t) ⊙ SiLU(z_t))   GN: LayerNorm per head (gain, no bias)

    computed in the stabilised form (a stabiliser m_t per head, :mod:`charlm.cells.matrix_memory`),
    which is the same function. The output gate o_t of the paper's mLSTM cell is, in its block, the
    SiLU(z_t) branch; s is the learnable skip. The block around it, x_t + y(LN(x_t)) with a norm
    before the softmax and no MLP, is charlm's ``--wiring block --block-conv 0 --block-expansion 0``
    (RMSNorm where the paper has LayerNorm); in the default ``stacked`` wiring the layers stack
    without a residual.

    Training runs the chunkwise-parallel form: a causal L × L matrix per head within each chunk of
    L = ``chunk_size`` positions, the state carried from chunk to chunk; ``step`` is the recurrence.
    The time state, each ``[B, width]``: C (H·d_h², per head d_h rows of v by d_h columns of k), n
    (H·d_h), m (H) and the convolution's last k − 1 inputs x̂ ((k−1)·m, oldest first; none for k ≤ 1).

    Options: ``heads`` H (4), ``qkv_blocksize`` (4, the published block size; 0: dense W_q, W_k, W_v),
    ``conv_width`` k (4; 0: a_t = x̂_t, no SiLU), ``forget_gate`` (sigmoid, as the authors' code; exp),
    ``chunk_size`` L (64). The initialisation as the authors' code: W_up N(0, √(2/5d)), W_q, W_k, W_v
    N(0, √(2/5n)), W_down N(0, 2/(L_s √n)) for a stack of L_s layers, the convolution U(±1/√k) (weight
    and bias), w_i, w_f zero, b_i ~ N(0, 0.1), b_f evenly from 3 to 6 over the heads (exp: log σ of
    those, the same forget gates), GN gain 1, s = 1; no biases in the projections.
    Left open by the paper and taken here: the gates read [q; k; v] (the authors' code; the paper
    writes them from x_t); no ε in the denominator (the authors add 10⁻⁶ at the stabilised scale);
    GN's gain is stored as itself (the authors' code stores gain − 1).
    """

    name = "mlstm"
    parallel_form = "chunked"
    folds_embedding = True
    # Measured with saved-tensor hooks (bytes autograd keeps, the tensors of a forward), batch 128 × bptt 50,
    # 2 layers of 256: 43.6 float32 per (step, stream, unit), rounded up by a quarter. It grows with the
    # chunk's L × L matrices (H·L/n a position each) and the chunk states (4n/(H·L) each).
    activation_factor = 55
    scaled_by_depth = True
    description = "xLSTM's mLSTM: matrix memory per head, exponential gating, chunkwise-parallel (not Krause's mLSTM)"
    paper = "Beck et al. 2024, xLSTM: Extended Long Short-Term Memory"
    formula = (
        "2dm + mn + m(k + 3b + 6H + 3) + 2H (m = 2n; k = conv_width 4, b = qkv_blocksize 4, H = heads 4: "
        "4dn + 2n² + 86n + 8; conv_width=0: m(3b + 6H + 2); qkv_blocksize=0: b = m)"
    )
    Config = MLSTMConfig

    def __init__(self, input_size: int, hidden_size: int, config: MLSTMConfig | None = None):
        super().__init__(input_size, hidden_size, config)
        heads, width = self.config.heads, self.config.conv_width
        inner = EXPANSION * hidden_size
        block = self.config.qkv_blocksize or inner
        if inner % heads or inner % block:
            multiple = self.hidden_size_multiple(self.config)
            raise ValueError(
                f"the inner width {inner} (2 × hidden size {hidden_size}) must be a multiple of heads={heads} "
                f"and of qkv_blocksize={block}: make the hidden size a multiple of {multiple}"
            )
        self.inner, self.heads, self.head_size, self.depth = inner, heads, inner // heads, 1
        self.weight_up = nn.Parameter(torch.empty(2 * inner, input_size))  # rows: x̂, z
        if width:
            self.conv_weight = nn.Parameter(torch.empty(inner, width))  # column j multiplies x̂_{t−j}
            self.conv_bias = nn.Parameter(torch.empty(inner))
        self.weight_q, self.weight_k, self.weight_v = (
            nn.Parameter(torch.empty(inner // block, block, block)) for _ in range(3)
        )
        self.gate_weight = nn.Parameter(torch.empty(2 * heads, 3 * inner))  # rows: ĩ, f̃
        self.gate_bias = nn.Parameter(torch.empty(2 * heads))
        self.norm_weight = nn.Parameter(torch.empty(inner))
        self.skip = nn.Parameter(torch.empty(inner))
        self.weight_down = nn.Parameter(torch.empty(hidden_size, inner))
        self.reset_parameters()

    @classmethod
    def hidden_size_multiple(cls, config) -> int:
        multiple = math.lcm(config.heads, config.qkv_blocksize or 1)
        return multiple // math.gcd(multiple, EXPANSION)

    def reset_parameters(self):
        n, heads = self.hidden_size, self.heads
        small_init_(self.weight_up, self.input_size)
        for weight in (self.weight_q, self.weight_k, self.weight_v):
            small_init_(weight, n)
        with torch.no_grad():
            self.weight_down.normal_(0.0, 2 / self.depth / math.sqrt(n))
            if self.config.conv_width:
                conv_init_(self.conv_weight, self.conv_bias)
            self.gate_weight.zero_()
            self.gate_bias[:heads].normal_(0.0, 0.1)
            forget = torch.linspace(3.0, 6.0, heads, dtype=self.gate_bias.dtype)
            self.gate_bias[heads:] = forget if self.config.forget_gate == "sigmoid" else F.logsigmoid(forget)
            self.norm_weight.fill_(1.0)
            self.skip.fill_(1.0)

    def initial_state(self, batch_size: int, device=None, dtype=None) -> State:
        H, d = self.heads, self.head_size
        memory = (
            self._zeros(batch_size, device, dtype, width=H * d * d),
            self._zeros(batch_size, device, dtype, width=H * d),
            self._zeros(batch_size, device, dtype, width=H),
        )
        history = max(self.config.conv_width - 1, 0)
        return memory + ((self._zeros(batch_size, device, dtype, width=history * self.inner),) if history else ())

    def step(self, x: Tensor, state: State) -> tuple[Tensor, State]:
        return self._advance(x @ self.weight_up.T, state)

    def inference_step(self) -> "MLSTMInference":
        return MLSTMInference(self)

    def _advance(self, up: Tensor, state: State) -> tuple[Tensor, State]:
        """One step from the up-projection W_up x_t ``[B, 2m]``: the recurrence of :func:`memory_step`."""
        (C, n, m), past = state[:3], state[3] if len(state) > 3 else None
        H, d = self.heads, self.head_size
        x_hat, z, a, past = self._branches(up[None], past)
        q, k, v, log_i, log_f = (y[0] for y in self._queries_keys_values(x_hat, a))
        with in_state_precision(up.device.type):
            h, (C, n, m) = memory_step(
                *(y.view(-1, H, d).to(C.dtype) for y in (q, k, v)),
                log_i.to(C.dtype),
                log_f.to(C.dtype),
                (C.reshape(-1, H, d, d), n.reshape(-1, H, d), m),
            )
        return self._output(h, a[0], z[0]), self._state(C, n, m, past)

    def forward(self, inputs: Tensor, state: State, lookup=None) -> tuple[Tensor, State]:
        (C, n, m), past = state[:3], state[3] if len(state) > 3 else None
        H, d = self.heads, self.head_size
        steps, batch = inputs.shape[:2]
        x_hat, z, a, past = self._branches(self.input_product(inputs, self.weight_up, None, lookup), past)
        q, k, v, log_i, log_f = self._queries_keys_values(x_hat, a)
        with in_state_precision(inputs.device.type):
            h, (C, n, m) = memory_chunked(
                *(y.view(steps, batch, H, d).permute(1, 2, 0, 3).to(C.dtype) for y in (q, k, v)),  # [B, H, T, d]
                log_i.permute(1, 2, 0).to(C.dtype),
                log_f.permute(1, 2, 0).to(C.dtype),
                (C.reshape(batch, H, d, d), n.reshape(batch, H, d), m),
                self.config.chunk_size,
            )
        return self._output(h.permute(2, 0, 1, 3), a, z), self._state(C, n, m, past)

    def _branches(self, up: Tensor, past: Tensor | None):
        """x̂ and z from the up-projection ``[T, B, 2m]``, a = SiLU(conv(x̂)), and the convolution's new history."""
        x_hat, z = up.split(self.inner, dim=-1)
        if not self.config.conv_width:
            return x_hat, z, x_hat, past
        convolved, past = causal_conv(x_hat, past, self.conv_weight, self.conv_bias)
        return x_hat, z, F.silu(convolved), past

    def _queries_keys_values(self, x_hat: Tensor, a: Tensor):
        """q, k (scaled by 1/√d_h), v ``[T, B, m]`` and the log-gates ĩ, log f ``[T, B, H]``."""
        q, k, v = headwise(a, self.weight_q), headwise(a, self.weight_k), headwise(x_hat, self.weight_v)
        with in_state_precision(q.device.type):  # exponential gates magnify a half type's rounding
            W_q, W_k, W_v = self.gate_weight.split(self.inner, dim=1)  # the gates read [q; k; v]
            dtype = self.gate_weight.dtype
            gates = q.to(dtype) @ W_q.T + k.to(dtype) @ W_k.T + v.to(dtype) @ W_v.T + self.gate_bias
            log_i, pre_f = gates.split(self.heads, -1)
        return q, k / math.sqrt(self.head_size), v, log_i, log_forget(pre_f, self.config.forget_gate)

    def _output(self, h: Tensor, a: Tensor, z: Tensor) -> Tensor:
        """W_down ((GN(h̃) + s ⊙ a) ⊙ SiLU(z)) from h̃ ``[..., H, d_h]``."""
        return ((head_norm(h, self.norm_weight, self.head_size) + self.skip * a) * F.silu(z)) @ self.weight_down.T

    @staticmethod
    def _state(C: Tensor, n: Tensor, m: Tensor, past: Tensor | None) -> State:
        memory = (C.flatten(1), n.flatten(1), m)
        return memory if past is None else (*memory, past)


class MLSTMInference(InferenceStep):
    """The step for sampling: the up-projection W_up x taken ahead (at the bottom layer, once for every
    symbol), then the rest of the step."""

    reads_input = False

    def __init__(self, cell: MLSTM):
        super().__init__(cell)
        self.weight_up = cell.weight_up.T

    def project(self, x: Tensor) -> Tensor:
        return x @ self.weight_up

    def advance(self, projected: Tensor, x: Tensor | None, state: State) -> tuple[Tensor, State]:
        return self.cell._advance(projected, state)
