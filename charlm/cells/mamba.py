"""Mamba (Gu & Dao 2023): the selective state space model, as the residual block of its language model."""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from charlm.cells.base import InferenceStep, RecurrentCell, RMSNorm, State
from charlm.cells.scan import SCAN_METHODS
from charlm.cells.selective_scan import CHUNK, selective_scan_chunked, selective_scan_linear
from charlm.settings import setting

MAMBA_SCANS = ("selective", *SCAN_METHODS)
NORM_EPS = 1e-5  # the published norm_epsilon, for the block's RMSNorm and the model's last one
DT_FLOOR = 1e-4  # the published dt_init_floor: no Δ drawn at initialisation is smaller


@dataclasses.dataclass
class MambaConfig:
    state_size: int = setting(16, "N, the states of each channel.", min=1)
    expand: int = setting(2, "E: the SSM runs on E·n channels.", min=1)
    conv_width: int = setting(4, "k, the causal depthwise convolution's width.", min=1)
    dt_rank: int | None = setting(None, "R, the rank of Δ's projection; none: ⌈n/16⌉, the published auto.", min=1)
    dt_min: float = setting(0.001, "Δ's initial values are log-uniform in [dt_min, dt_max].", min=0, min_open=True)
    dt_max: float = setting(0.1, "See dt_min.", min=0, min_open=True)
    residual: bool = setting(True, "The block's RMSNorm and residual; false: the mixer alone (for --wiring block).")
    scan: str = setting(
        "selective",
        "How forward runs the SSM over a window: selective (its own chunked scan), or the coefficients formed for "
        "the window and one of the linear scan's forms.",
        choices=MAMBA_SCANS,
    )
    chunk: int = setting(CHUNK, "Steps a chunk of the selective scan (its states are formed a chunk at a time).", min=1)

    def __post_init__(self):
        if self.dt_min > self.dt_max:
            raise ValueError(f"need dt_min ≤ dt_max, not dt_min={self.dt_min}, dt_max={self.dt_max}")


class Mamba(RecurrentCell):
    r"""One Mamba block (Gu & Dao 2023, arXiv 2312.00752): the selective SSM with its convolution and
    gate, a pre-RMSNorm and a residual, as the authors' language model stacks it. For a block of width n
    with e = E·n inner channels (E = ``expand``, 2), N states a channel (``state_size``, 16) and Δ of
    rank R (``dt_rank``, ⌈n/16⌉)::

        u_t = RMSNorm(x_t)
        [x'_t; z_t] = W_in u_t                                   W_in: n → 2e, no bias
        x̃_t = SiLU(b_conv + Σ_{j<k} w_j ⊙ x'_{t−j})             causal depthwise convolution of width k
        Δ_t = softplus(W_Δ (W_R x̃_t) + b_Δ),  B_t = W_B x̃_t,  C_t = W_C x̃_t        (x_proj: W_R, W_B, W_C)
        h_t = exp(Δ_t A) ⊙ h_{t−1} + (Δ_t ⊙ x̃_t) B_t            each channel d: h_t,d ∈ R^N, Ā = exp(ΔA)
        y_t = (C_t · h_t + D ⊙ x̃_t) ⊙ SiLU(z_t)
        o_t = x_t + drop(W_out y_t)                              W_out: e → n, no bias

    with A = −exp(A_log) ∈ R^{e×N} (diagonal per channel), and drop dropout at the model's ``--dropout`` (the
    identity in evaluation; the model then drops its embedding once and nothing between blocks). Ā = exp(ΔA)
    is the zero-order hold; B̄ ≈ ΔB is the simplification of the paper's code (its eq. 4 gives
    B̄ = (ΔA)⁻¹(exp(ΔA) − I)·ΔB).

    **Initialisation as published** (mamba_ssm's Mamba and its language model's ``_init_weights``): A
    by S4D-real, A_{d,n} = −n (n = 1..N); D = 1; Δ's bias b_Δ = softplus⁻¹(Δ₀) with Δ₀ log-uniform in
    [dt_min, dt_max] = [0.001, 0.1], floored at 1e-4; W_Δ uniform in ±R^{−1/2}; the convolution
    as torch's Conv1d, U(±1/√k) for weights and bias; W_in, the x_proj and W_out as torch's Linear,
    U(±1/√fan_in), W_out then divided by √L in a stack of L blocks; RMSNorm gains 1, ε = 1e-5.

    **Wiring.** The cell is the whole block, its RMSNorm and residual included, so the default
    ``--wiring stacked`` is the paper's model: embedding, L blocks, a final RMSNorm (the cell asks the
    model for it, Mamba's norm_f), the softmax. ``--wiring block`` wraps any cell in charlm's block (an
    RMSNorm, a convolution, a residual, a gated MLP): give it ``residual=false`` for the mixer alone
    (W_in … W_out, no RMSNorm or residual of its own), and ``--block-conv 0``, as the mixer has its own
    convolution: Mamba interleaved with a gated MLP. Left as is, the block nests inside charlm's.

    **State**, carried between windows: h, ``[B, e·N]`` (channel by channel, N numbers each), and the
    convolution's last k − 1 inputs x', ``[B, (k − 1)·e]``, oldest first (none when k = 1). A window
    equals its steps; two windows equal one long one.

    **Training's whole-window form** (``scan=selective``, the default): the projections, the convolution
    and the gate for the whole window at once, and the SSM by :mod:`charlm.cells.selective_scan`'s
    chunked scan (the states formed ``chunk`` = 16 steps at a time, in tiles of streams that stay in a
    core's cache on the CPU; gradients by hand; only the states between chunks kept: the backward pass
    forms them again). ``scan=auto|loop|log|doubling|chunked`` instead forms exp(ΔA) and ΔxB for the
    window and runs the e·N states through :mod:`charlm.cells.scan`, with autograd (about 3× the memory).
    The SSM runs in the state's type, float32 under a bf16 or fp16 autocast.

    **Choices the paper leaves open**, and the one taken: B̄ ≈ ΔB (the code's, not eq. 4's ZOH); Δ's
    projection of rank R = ⌈n/16⌉ (the code's "auto"; the paper's Algorithm 2 writes a broadcast of a
    rank-1 projection); the pre-normalisation RMSNorm, ε = 1e-5 (the released models' ``rms_norm=True``),
    and no normalisation inside the block (the optional one the paper mentions is not in the released
    Mamba code); the residual stream in the model's precision (the code's ``residual_in_fp32`` is for
    fp16 runs); no bias in W_in and W_out, a bias in the convolution (the code's defaults); weight decay
    as ``--decay-on`` says (the code exempts A_log and D; ``--decay-on matrices`` decays A_log); the
    embedding and softmax are charlm's (untied unless ``--tie-weights``; the released models tie them,
    the embedding drawn from N(0, 0.02)).
    """

    name = "mamba"
    parallel_form = "scan"
    description = "Mamba block: selective SSM (input-dependent Δ, B, C; diagonal A, N states a channel)"
    paper = "Gu & Dao 2023, Mamba: linear-time sequence modeling with selective state spaces"
    formula = (
        "6n² + 4nR + 111n, R = ⌈n/16⌉ (d = n; expand E, state_size N, conv_width k: 3En² + 2EnR + En(k + 3 + 3N) + n; "
        "residual=false: 2Edn + En² + 2EnR + En(k + 3 + 3N))"
    )
    # Saved-tensor hooks (as minGRU's, 2 layers of 256, batch 128 × bptt 50, the model's ends included): autograd
    # keeps ≈ 26.3 float32 per (step, stream, unit) with scan=selective, rounded up by half. The scan.py forms
    # keep the window's coefficients and states, e·N numbers each a step: ≈ 122 (scan=loop), not counted here.
    activation_factor = 40
    final_layer_norm = "rms"  # the model's last RMSNorm, Mamba's norm_f
    scaled_by_depth = True
    folds_embedding = True
    Config = MambaConfig

    def __init__(self, input_size: int, hidden_size: int, config: MambaConfig | None = None):
        super().__init__(input_size, hidden_size, config)
        c = self.config
        if c.residual and input_size != hidden_size:
            raise ValueError(f"a mamba block's input must be as wide as its output: {input_size} ≠ {hidden_size}")
        inner, states = c.expand * hidden_size, c.state_size
        self.inner, self.states = inner, states
        self.rank = c.dt_rank if c.dt_rank is not None else math.ceil(hidden_size / 16)
        self.history = c.conv_width - 1
        self.depth = 1  # the stack's, for W_out's initialisation (make_stack sets it)
        self.norm = RMSNorm(input_size, eps=NORM_EPS) if c.residual else None
        self.in_proj = nn.Linear(input_size, 2 * inner, bias=False)  # rows: x', z
        self.conv_weight = nn.Parameter(torch.empty(inner, c.conv_width))  # column j multiplies x'_{t−k+1+j}
        self.conv_bias = nn.Parameter(torch.empty(inner))
        self.x_proj = nn.Linear(inner, self.rank + 2 * states, bias=False)  # rows: W_R, W_B, W_C
        self.dt_proj = nn.Linear(self.rank, inner)  # W_Δ, b_Δ
        self.A_log = nn.Parameter(torch.empty(inner, states))
        self.D = nn.Parameter(torch.empty(inner))
        self.out_proj = nn.Linear(inner, hidden_size, bias=False)
        self.reset_parameters()

    @classmethod
    def required_input_size(cls, hidden_size: int, config) -> int | None:
        return hidden_size if config.residual else None

    def reset_parameters(self):
        c = self.config
        with torch.no_grad():
            for linear in (self.in_proj, self.x_proj, self.out_proj):
                linear.reset_parameters()  # U(±1/√fan_in)
            self.out_proj.weight /= math.sqrt(self.depth)
            bound = 1 / math.sqrt(c.conv_width)
            self.conv_weight.uniform_(-bound, bound)
            self.conv_bias.uniform_(-bound, bound)
            self.dt_proj.weight.uniform_(-(self.rank**-0.5), self.rank**-0.5)
            low, high = math.log(c.dt_min), math.log(c.dt_max)
            dt = torch.exp(torch.rand_like(self.dt_proj.bias) * (high - low) + low).clamp(min=DT_FLOOR)
            self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus⁻¹(Δ₀)
            n = torch.arange(1, self.states + 1, dtype=self.A_log.dtype, device=self.A_log.device)
            self.A_log.copy_(torch.log(n).expand(self.inner, -1))  # A = −(1, …, N) in every channel
            self.D.fill_(1.0)
            if self.norm is not None:
                self.norm.reset_parameters()

    def initial_state(self, batch_size: int, device=None, dtype=None) -> State:
        ssm = self._zeros(batch_size, device, dtype, width=self.inner * self.states)
        if not self.history:
            return (ssm,)
        return ssm, self._zeros(batch_size, device, dtype, width=self.history * self.inner)

    def _split(self, state: State) -> tuple[Tensor, Tensor | None]:
        return (state[0], state[1]) if self.history else (state[0], None)

    def _joined(self, h: Tensor, past: Tensor | None) -> State:
        return (h,) if past is None else (h, past)

    def _normed(self, x: Tensor) -> Tensor:
        return x if self.norm is None else self.norm(x)

    def _selection(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Δ, B and C from the convolved input x̃ (any leading shape)."""
        low, B, C = self.x_proj(x).split([self.rank, self.states, self.states], dim=-1)
        return F.softplus(self.dt_proj(low)), B, C

    def step(self, x: Tensor, state: State) -> tuple[Tensor, State]:
        return self._advance(self.in_proj(self._normed(x)), x, state, -torch.exp(self.A_log))

    def _advance(self, projected: Tensor, x: Tensor, state: State, A: Tensor) -> tuple[Tensor, State]:
        """The step from [x'_t; z_t] = W_in u_t on: the equations of the class docstring, one position."""
        h, past = self._split(state)
        inner, states = self.inner, self.states
        x_in, z = projected.split(inner, dim=-1)
        window = x_in[:, None] if past is None else torch.cat([past.view(-1, self.history, inner), x_in[:, None]], 1)
        x_conv = F.silu(self.conv_bias + (window * self.conv_weight.T).sum(1))  # x̃_t
        delta, B, C = self._selection(x_conv)  # Δ_t, B_t, C_t
        h = h.view(-1, inner, states)
        h = torch.exp(delta[:, :, None] * A) * h + (delta * x_conv)[:, :, None] * B[:, None, :]  # h_t
        y = ((h * C[:, None, :]).sum(-1) + self.D * x_conv) * F.silu(z)  # y_t = (C_t h_t + D x̃_t) ⊙ SiLU(z_t)
        output = self.out_proj(y)
        past = None if past is None else window[:, 1:].flatten(1).to(past.dtype)
        return (x + self.dropped(output) if self.norm is not None else output), self._joined(h.flatten(1), past)

    def inference_step(self) -> "MambaInference":
        return MambaInference(self)

    def _convolved(self, x: Tensor, past: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """x̃ for a window of x' ``[T, B, e]``, after the k − 1 inputs ``past``; and the last k − 1 inputs."""
        if past is None:
            return F.silu(self.conv_bias + self.conv_weight[:, 0] * x), None
        steps, history = x.shape[0], self.history
        carried = past.dtype  # the state keeps its type (float32 under a bf16 autocast)
        x = torch.cat([past.view(-1, history, self.inner).transpose(0, 1).to(x.dtype), x])  # the past, then the window
        convolved = self.conv_bias + sum(self.conv_weight[:, j] * x[j : j + steps] for j in range(history + 1))
        return F.silu(convolved), x[-history:].transpose(0, 1).flatten(1).to(carried)

    def forward(self, inputs: Tensor, state: State, lookup=None) -> tuple[Tensor, State]:
        h0, past = self._split(state)
        steps, batch = inputs.shape[:2]
        if lookup is not None:  # RMSNorm and W_in for the V symbols, then a row per position
            table = lookup.table
            if table is None:  # one-hot inputs
                table = torch.eye(inputs.shape[-1], dtype=inputs.dtype, device=inputs.device)
            projected = lookup.spread(self.in_proj(self._normed(table)))
        else:
            projected = self.in_proj(self._normed(inputs))
        x_in, z = projected.split(self.inner, dim=-1)
        x_conv, past = self._convolved(x_in, past)
        delta, B, C = self._selection(x_conv)
        work = h0.dtype  # the SSM in the state's type: float32 under autocast
        with torch.autocast(inputs.device.type, enabled=False):
            A = -torch.exp(self.A_log.to(work))
            ssm = (delta.to(work), A, B.to(work), C.to(work), x_conv.to(work), h0.view(batch, self.inner, self.states))
            if self.config.scan == "selective":
                y, h = selective_scan_chunked(*ssm, chunk=self.config.chunk)
            else:
                y, h = selective_scan_linear(*ssm, method=self.config.scan)
        y = (y + self.D * x_conv) * F.silu(z)
        output = self.out_proj(y)
        if self.norm is not None:
            output = inputs + self.dropped(output)
        return output, self._joined(h.flatten(1), past)

    @property
    def drops_inside(self) -> bool:
        return self.norm is not None  # the whole block; the mixer alone (residual=false) is a block's cell


class MambaInference(InferenceStep):
    """The step for sampling: RMSNorm and W_in taken ahead (at the bottom layer, once for every symbol);
    A = −exp(A_log) formed once; the rest as ``step``."""

    def __init__(self, cell: Mamba):
        super().__init__(cell)
        self.A = -torch.exp(cell.A_log)

    def project(self, x: Tensor) -> Tensor:
        return self.cell.in_proj(self.cell._normed(x))  # [B, 2e]: x', z

    def advance(self, projected: Tensor, x: Tensor | None, state: State) -> tuple[Tensor, State]:
        return self.cell._advance(projected, x, state, self.A)
