"""Gated DeltaNet (Yang, Kautz & Hatamizadeh 2025, "Gated Delta Networks: Improving Mamba2 with Delta
Rule"): a matrix state per head, decayed by a Mamba-2 gate and written by the delta rule.

Not to be confused with charlm's ``delta-rnn`` (Ororbia, Mikolov & Reitter 2017), an unrelated cell.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from charlm.cells.base import InferenceStep, RecurrentCell, State
from charlm.cells.delta_rule import delta_rule_chunked, delta_rule_loop
from charlm.settings import setting

INIT_STD = 0.02  # the published code's N(0, 0.02) for every projection and convolution weight
NORM_EPS = 1e-6  # the output RMSNorm's ε (the published configuration's norm_eps)
L2_EPS = 1e-6  # k / √(‖k‖² + ε), as the published kernels normalise q and k
INITS = ("fan_in", "normal")
DT_MIN, DT_MAX, DT_FLOOR = 0.001, 0.1, 1e-4  # Mamba-2's range for the initial step sizes


@dataclasses.dataclass
class GatedDeltaNetConfig:
    heads: int = setting(4, "H: the hidden size n is cut into H key heads of d_k = n / H.", min=1)
    expand_v: int = setting(2, "d_v = expand_v · d_k (the published configuration's 2).", min=1)
    conv: int = setting(4, "Width of the short causal convolutions on q, k, v (0: none, SiLU alone).", min=0)
    chunk: int = setting(
        64, "Positions per chunk of the training form (any window length; the last chunk is padded).", min=1
    )
    init: str = setting(
        "fan_in",
        "The weights' draw: fan_in, the published layer's own (PyTorch's); normal, its language model's N(0, 0.02).",
        choices=INITS,
    )


class GatedDeltaNet(RecurrentCell):
    r"""The Gated DeltaNet layer (the token mixer of the paper's block), from an input of width d to n.

    Per head h of H (heads), with d_k = n / H and d_v = expand_v · d_k, from the input x_t::

        q_t, k_t, v_t = SiLU(Conv(W_q x)_t), SiLU(Conv(W_k x)_t), SiLU(Conv(W_v x)_t)
        q_t ← q_t / (‖q_t‖ √d_k),   k_t ← k_t / ‖k_t‖                  L2-normalised keys and queries
        α_t = exp(g_t),  g_t = −exp(A_log) · softplus(w_α · x_t + dt_bias)   the decay, Mamba-2's form
        β_t = σ(w_β · x_t)                                                   the writing strength
        S_t = S_{t−1} (α_t (I − β_t k_t k_tᵀ)) + β_t v_t k_tᵀ              the gated delta rule
        o_t = S_t q_t
        y_t = W_o [RMSNorm(o_t) ⊙ SiLU(W_g x_t)]_heads                      output gate, norm per head

    Conv is a depthwise causal convolution of width ``conv`` (4) without bias, over each channel of
    q, k and v; α_t and β_t are one scalar per head. The state, S ∈ R^{d_v×d_k} per head in the paper,
    is kept transposed, d_k × d_v (keys down, values across; ``charlm.cells.delta_rule``), as the
    published kernels keep it. The time state is two ``[B, width]`` tensors: S of every head,
    ``[B, H·d_k·d_v]`` (head, key, value), then the convolution's last ``conv − 1`` inputs,
    ``[B, (conv − 1)·(2n + H·d_v)]`` (oldest first; absent when conv ≤ 1). Carrying both across windows
    equals one long window.

    ``step`` runs the recurrence one position at a time; ``forward`` (training and evaluation) runs
    it in chunks of ``chunk`` positions in the WY form (the UT transform, one triangular solve for all
    chunks at once), which the tests hold to the step loop in float64. Under a bfloat16 autocast the
    projections run in bfloat16 and the recurrence in float32 (S is carried in float32).

    **What is the cell and what is the block.** The paper's block is a pre-norm residual stack:
    x + GatedDeltaNet(RMSNorm(x)), then x + SwiGLU(RMSNorm(x)), a final RMSNorm. This cell is the
    layer inside it (projections, convolutions, gates, recurrence, output gate and norm, W_o);
    ``--wiring block --block-conv 0`` adds the rest (the block's own convolution is not in the paper's
    block: the layer has its convolutions). The published MLP is 8/3 of the width (charlm's default
    ``--block-expansion`` is 3).

    **Initialisation** (option ``init``), as the published code (flash-linear-attention's GatedDeltaNet,
    which the authors' code runs) draws it: A ~ U(0, 16), A_log = log A; dt log-uniform in [0.001, 0.1]
    (floored at 10⁻⁴), dt_bias = softplus⁻¹(dt); the norm's gain 1. The weights: ``fan_in`` (the
    default) as the layer draws them when built, nn.Linear's U(±1/√fan_in) for the projections and a
    depthwise nn.Conv1d's U(±1/√conv) for the convolution; ``normal`` as its language model redraws
    them, N(0, 0.02) everywhere (no rescaling of W_o by depth, that code's default). ``normal`` is made
    for the residual block: in a bare stack the signal shrinks layer by layer (two layers of 16 units
    did not learn a sentence in 250 steps that ``fan_in`` learns in 60).

    **Choices the paper leaves open, and the ones taken** (the published code's, unless said):
    the key width H·d_k is n (the published configuration's is 0.75 d: 6 heads of 256 at d = 2048;
    here the heads divide the hidden size); queries scaled by 1/√d_k after normalisation (the paper writes
    o_t = S_t q_t); the L2 norm's ε, 10⁻⁶ inside the root; the output RMSNorm's gain shared by the
    heads (d_v values), ε 10⁻⁶; the convolutions after the projections, one per channel of q, k and v;
    no bias anywhere but dt_bias; decays below e⁻⁶⁰ within a chunk taken as 0 by the chunked form (a
    difference of 10⁻²⁶ that keeps denormal numbers, slow on a CPU, out of its products).
    Not implemented: grouped value heads, negative eigenvalues (β ∈ (0, 2)), the hybrids with attention
    (Gated DeltaNet-H1/H2).
    """

    name = "gated-deltanet"
    parallel_form = "chunked"
    # autograd keeps ≈ 42–50 float32 per (step, stream, unit), counted as minGRU's (saved-tensor hooks, 2 layers of
    # 256, batch 128 × bptt 50 or 64, one chunk): the convolution's 5n channels, q, k, v by head, the chunks' C × C
    # matrices, the output's norm and gate; 50 rounded up by a quarter
    activation_factor = 62
    folds_embedding = True
    description = "Gated DeltaNet: a d_k × d_v state per head, gated delta rule; chunked WY form (not delta-rnn)"
    paper = "Yang, Kautz & Hatamizadeh 2025, Gated Delta Networks: Improving Mamba2 with Delta Rule"
    formula = (
        "2(1 + e)dn + 2Hd + en² + (2 + e)wn + en/H + 2H (H heads, e = expand_v, w = conv; "
        "defaults: 6dn + 8d + 2n² + 16n + n/2 + 8)"
    )
    Config = GatedDeltaNetConfig

    def __init__(self, input_size: int, hidden_size: int, config: GatedDeltaNetConfig | None = None):
        super().__init__(input_size, hidden_size, config)
        n, heads = hidden_size, self.config.heads
        if n % heads:
            raise ValueError(f"the hidden size {n} is not divisible by heads={heads}")
        self.heads, self.key_size = heads, n // heads
        self.value_size = self.config.expand_v * self.key_size
        self.values = heads * self.value_size  # H·d_v
        self.channels = 2 * n + self.values  # what the convolution runs over: q, k, v
        self.history = max(self.config.conv - 1, 0)
        # rows: q (n), k (n), v (H·d_v), the output gate (H·d_v), the decay's w_α (H), β's w_β (H)
        self.weight_in = nn.Parameter(torch.empty(self.channels + self.values + 2 * heads, input_size))
        if self.config.conv:
            self.conv_weight = nn.Parameter(torch.empty(self.channels, self.config.conv))  # column j: x_{t−j}
        self.log_decay_rate = nn.Parameter(torch.empty(heads))  # A_log
        self.time_step_bias = nn.Parameter(torch.empty(heads))  # dt_bias
        self.norm_weight = nn.Parameter(torch.ones(self.value_size))
        self.weight_out = nn.Parameter(torch.empty(n, self.values))
        self.reset_parameters()

    @classmethod
    def hidden_size_multiple(cls, config) -> int:
        return max(config.heads, 1)

    def reset_parameters(self):
        weights = [self.weight_in, self.weight_out] + ([self.conv_weight] if self.config.conv else [])
        with torch.no_grad():
            for weight in weights:  # fan_in: nn.Linear's and a depthwise nn.Conv1d's U(±1/√fan_in)
                if self.config.init == "normal":
                    weight.normal_(0.0, INIT_STD)
                else:
                    bound = 1.0 / math.sqrt(weight.shape[1])
                    weight.uniform_(-bound, bound)
            self.log_decay_rate.copy_(torch.empty_like(self.log_decay_rate).uniform_(0, 16).log())
            spread = torch.rand_like(self.time_step_bias) * (math.log(DT_MAX) - math.log(DT_MIN))
            dt = torch.exp(spread + math.log(DT_MIN)).clamp(min=DT_FLOOR)
            self.time_step_bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus⁻¹(dt)
            self.norm_weight.fill_(1.0)

    def initial_state(self, batch_size: int, device=None, dtype=None) -> State:
        matrices = self._zeros(batch_size, device, dtype, width=self.heads * self.key_size * self.value_size)
        if not self.history:
            return (matrices,)
        return matrices, self._zeros(batch_size, device, dtype, width=self.history * self.channels)

    def step(self, x: Tensor, state: State) -> tuple[Tensor, State]:
        """One position: the layer on a window of one, its recurrence one :func:`delta_rule_step`."""
        output, state = self._layer((x @ self.weight_in.T)[None], state, delta_rule_loop)
        return output[0], state

    def inference_step(self) -> InferenceStep:
        return GatedDeltaNetStep(self)

    def forward(self, inputs: Tensor, state: State, lookup=None) -> tuple[Tensor, State]:
        projected = self.input_product(inputs, self.weight_in, None, lookup)
        chunk = self.config.chunk
        return self._layer(projected, state, lambda *tensors: delta_rule_chunked(*tensors, chunk))

    def _layer(self, projected: Tensor, state: State, recurrence) -> tuple[Tensor, State]:
        """The layer from its input's projections ``[T, B, ·]`` (the rows of ``weight_in``), with
        ``recurrence`` (:func:`delta_rule_loop` or the chunked form) running the delta rule."""
        steps, batch = projected.shape[:2]
        heads, key_size, value_size, n = self.heads, self.key_size, self.value_size, self.hidden_size
        qkv, gate, decay_input, beta_input = projected.split([self.channels, self.values, heads, heads], -1)
        matrices, past = state if self.history else (state[0], None)
        qkv, past = self._convolve(qkv, past)
        work = torch.float64 if matrices.dtype == torch.float64 else torch.float32
        with torch.autocast(projected.device.type, enabled=False):  # the recurrence in float32 at least
            q, k, v = (by_head(x.to(work), heads) for x in qkv.split([n, n, self.values], -1))
            q = l2_normalised(q) / math.sqrt(key_size)
            k = l2_normalised(k)
            log_alpha = -self.log_decay_rate.exp() * F.softplus(decay_input.to(work) + self.time_step_bias)
            beta = torch.sigmoid(beta_input.to(work))
            o, matrices = recurrence(
                q,
                k,
                v,
                log_alpha.permute(1, 2, 0),
                beta.permute(1, 2, 0),
                matrices.view(batch, heads, key_size, value_size).to(work),
            )
        o = o.permute(2, 0, 1, 3)  # [T, B, H, d_v]
        # the gate copied out of the projections, which autograd would otherwise keep whole for SiLU's backward
        gated = rms_norm(o, self.norm_weight) * F.silu(gate.reshape(o.shape).contiguous())
        output = gated.flatten(2) @ self.weight_out.T
        carried = state[0].dtype
        new_state = (matrices.reshape(batch, -1).to(carried),)
        return output, new_state if past is None else (*new_state, past.to(carried))

    def _convolve(self, u: Tensor, past: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """SiLU of the depthwise causal convolution of ``u`` ``[T, B, channels]``, from the ``past``
        inputs carried (``[B, (conv − 1)·channels]``, oldest first), and the inputs to carry on."""
        width = self.config.conv
        if not width:
            return F.silu(u), None
        steps, history = u.shape[0], self.history
        if history:  # the last conv − 1 inputs, oldest first, then the window
            u = torch.cat([past.view(-1, history, self.channels).transpose(0, 1).to(u.dtype), u])
        convolved = sum(self.conv_weight[:, j] * u[history - j : history - j + steps] for j in range(width))
        return F.silu(convolved), u[-history:].transpose(0, 1).flatten(1) if history else None


class GatedDeltaNetStep(InferenceStep):
    """Sampling: the input's projections (q, k, v, the gate, α's and β's inputs: the rows of ``weight_in``)
    taken ahead, for the embedding table's rows at once; ``advance`` convolves and runs one delta-rule step."""

    reads_input = False

    def __init__(self, cell: GatedDeltaNet):
        super().__init__(cell)
        self.weight_in = cell.weight_in.T.contiguous()

    def project(self, x: Tensor) -> Tensor:
        return x @ self.weight_in

    def advance(self, projected: Tensor, x: Tensor | None, state: State) -> tuple[Tensor, State]:
        output, state = self.cell._layer(projected[None], state, delta_rule_loop)
        return output[0], state


def by_head(x: Tensor, heads: int) -> Tensor:
    """``[T, B, H·d]`` as ``[B, H, T, d]``."""
    steps, batch = x.shape[:2]
    return x.view(steps, batch, heads, -1).permute(1, 2, 0, 3)


def rms_norm(x: Tensor, weight: Tensor) -> Tensor:
    """x / √(mean(x²) + ε) ⊙ weight over the last dimension; written out for the ONNX exporter (its opset 17
    has no rms_norm), PyTorch's otherwise (one operation, which keeps less for the backward pass)."""
    if torch.onnx.is_in_onnx_export():
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + NORM_EPS) * weight
    return F.rms_norm(x, (x.shape[-1],), weight, NORM_EPS)


def l2_normalised(x: Tensor) -> Tensor:
    """x / √(‖x‖² + ε) over the last dimension."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2_EPS)
