"""A pre-norm Transformer block (GPT-2, nanoGPT) as a recurrent cell: its state is a key/value memory."""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from charlm.cells.base import InferenceStep, RecurrentCell, State
from charlm.errors import CharlmError
from charlm.settings import setting

ROPE_BASE = 10000.0
INIT_STD = 0.02  # GPT-2's N(0, 0.02) for every linear weight


class TransformerBlock(RecurrentCell):
    r"""One pre-norm Transformer block of width n (GPT-2's, as nanoGPT writes it), with a memory.

    Each layer is one block; the block's input is n wide (the model's embedding, or the block below)::

        a_t = x_t + drop(W_o Attn_t(LN_1(x)) + b_o)
        y_t = a_t + drop(W_2 GELU(W_1 LN_2(a_t) + b_1) + b_2)    W_1: n → r·n, W_2: r·n → n (mlp_ratio r)

    with ``heads`` heads of width h = n / heads. Head by head, ``q_t, k_t, v_t = W_qkv LN_1(x_t) + b_qkv``
    and position t attends to the M previous positions and itself (those that exist, M = ``memory``)::

        Attn_t = Σ_{s=t−M..t} softmax_s( (R_t q_t) · (R_s k_s) / √h ) v_s

    drop is dropout at the model's ``--dropout`` p, which also drops the attention weights (the softmax_s), as
    GPT-2 and nanoGPT place it; the model drops its embedding with p once and nothing between blocks (in
    evaluation, drop is the identity).

    R_p is the rotary position embedding (RoPE, Su et al. 2021): the pairs (i, i + h/2) of each head
    rotated by the angle p·10000^(−2i/h). A dot product of rotated vectors depends on t − s alone, so
    the positions are relative: a key means the same in the window it came from and in the next one.

    **The attention span is this sliding window in every mode.** The cell's time state is the keys
    and values (before rotation) of the last M positions, with a flag per slot that says whether it
    holds a position of this sequence (the initial state: none, zeros). A window of T positions
    attends to [memory; window] under the mask "t − M ≤ s ≤ t and slot s filled", and hands on the
    last M keys and values of that concatenation. So a window forward, ``step()`` (a window of one
    position, with the bounded M-slot key/value cache) and windows that carry the memory are all the
    same function of the whole sequence. charlm detaches the carried state between windows, so no
    gradient flows into the memory: Transformer-XL's segment recurrence (Dai et al. 2019), with a
    span of M positions.

    The state is three tensors, each ``[batch, width]``: the keys ``[B, M·n]`` and the values
    ``[B, M·n]`` (slot by slot, oldest first, each slot's n = heads × h units), and the slot flags
    ``[B, M]`` (1 filled, 0 empty; a slot counts as filled when its flag is above 1/2). A stream whose
    state is zeroed starts a fresh sequence.

    **memory = 0** is a plain window-by-window Transformer, as nanoGPT trains: each window attends
    causally within itself and nothing is carried (the state is one unused ``[B, 1]`` tensor of zeros).
    Such a model has no cache to compute a symbol from the ones before it, so its ``step()`` (and with
    it sampling, beam search, serving and export) refuses with an error; training, evaluation and
    dynamic evaluation (windows) work. Give it memory ≥ 1 to sample.

    Options: ``heads`` (4; n must be a multiple of 2·heads, the head width even for the rotation),
    ``memory`` (50, charlm's default window ``--bptt``: every position sees the 50 symbols before it,
    wherever it falls in its window; attention costs O(T·(T + M)) a window), ``mlp_ratio`` (4),
    ``bias`` (true; false: no bias in the linear maps and the LayerNorms, the model's final LayerNorm
    included, as nanoGPT's configuration has none).
    The initialisation is GPT-2's: linear weights N(0, 0.02), the two projections into the residual
    stream N(0, 0.02/√(2L)) for a stack of L blocks, biases zero, LayerNorm gains one.
    """

    name = "transformer"
    description = "Pre-norm Transformer block (causal self-attention + MLP) with a sliding key/value memory"
    paper = (
        "Vaswani et al. 2017; GPT-2 (Radford et al. 2019) pre-norm block; Transformer-XL memory (Dai et al. 2019); "
        "rotary positions (Su et al. 2021)"
    )
    formula = "12n² + 13n (d = n; mlp_ratio r: (4 + 2r)n² + (9 + r)n; bias=false: 12n² + 2n)"
    # A count, not a measurement: per position and unit autograd keeps the block's input and LN_1's output,
    # q, k, v and the rotated q and k, the keys and values concatenated with the memory (M + T of them for T
    # queries: about 4 at M = T), the attention output, the residual, LN_2's input and output, and the MLP's
    # r·n pre-activation and GELU output (2r = 8 at r = 4): about 28, rounded up for what attention keeps
    # per query (heads × (T + M) weights, a few per unit at charlm's sizes) to 40.
    activation_factor = 40
    final_layer_norm = True  # GPT-2's ln_f before the softmax
    scaled_by_depth = True
    drops_inside = True

    @dataclasses.dataclass
    class Config:
        heads: int = setting(4, "Attention heads (the hidden size must be a multiple of 2·heads).", min=1)
        memory: int = setting(50, "M, the positions before the window each position attends to (0: none).", min=0)
        mlp_ratio: int = setting(4, "r, the MLP's width as a multiple of n.", min=1)
        bias: bool = setting(True, "Biases in the linear maps and the LayerNorms (false: none, as nanoGPT).")

    def __init__(self, input_size: int, hidden_size: int, config=None):
        super().__init__(input_size, hidden_size, config)
        n, heads, memory = hidden_size, self.config.heads, self.config.memory
        if input_size != n:
            raise ValueError(f"a transformer block's input must be as wide as its output: {input_size} ≠ {n}")
        if n % heads:
            raise ValueError(f"the hidden size {n} is not divisible by heads={heads}")
        if (n // heads) % 2:
            raise ValueError(
                f"the head width {n // heads} (hidden size {n} / heads={heads}) must be even for rotary positions: "
                f"make the hidden size a multiple of {2 * heads}"
            )
        self.heads, self.head_size, self.memory = heads, n // heads, memory
        self.depth = 1  # the stack's, for the residual projections' initialisation (make_stack sets it)
        bias = self.config.bias
        self.norm_attention = nn.LayerNorm(n, bias=bias)
        self.qkv = nn.Linear(n, 3 * n, bias=bias)  # rows: q, k, v
        self.out = nn.Linear(n, n, bias=bias)
        self.norm_mlp = nn.LayerNorm(n, bias=bias)
        self.up = nn.Linear(n, self.config.mlp_ratio * n, bias=bias)
        self.down = nn.Linear(self.config.mlp_ratio * n, n, bias=bias)
        self.reset_parameters()

    @classmethod
    def required_input_size(cls, hidden_size: int, config) -> int | None:
        return hidden_size

    @classmethod
    def hidden_size_multiple(cls, config) -> int:
        return 2 * max(config.heads, 1)

    def reset_parameters(self):
        residual_std = INIT_STD / math.sqrt(2 * self.depth)
        with torch.no_grad():
            for linear, std in ((self.qkv, INIT_STD), (self.out, residual_std), (self.up, INIT_STD)):
                nn.init.normal_(linear.weight, 0.0, std)
            nn.init.normal_(self.down.weight, 0.0, residual_std)
            for norm in (self.norm_attention, self.norm_mlp):
                nn.init.ones_(norm.weight)
            for module in (self.qkv, self.out, self.up, self.down, self.norm_attention, self.norm_mlp):
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    def initial_state(self, batch_size: int, device=None, dtype=None) -> State:
        if not self.memory:
            return (self._zeros(batch_size, device, dtype, width=1),)
        width = self.memory * self.hidden_size
        return (
            self._zeros(batch_size, device, dtype, width=width),  # keys
            self._zeros(batch_size, device, dtype, width=width),  # values
            self._zeros(batch_size, device, dtype, width=self.memory),  # slot flags: none filled
        )

    def step(self, x: Tensor, state: State) -> tuple[Tensor, State]:
        """One position: the window forward of a window of one (attending to the M cached slots)."""
        if not self.memory:
            raise CharlmError(
                "a transformer with memory=0 keeps no keys or values between calls, so it cannot compute one "
                "symbol at a time (sample, beam, serve, export): train it with --cell-opt memory=M, M ≥ 1"
            )
        output, state = self.forward(x[None], state)
        return output[0], state

    def inference_step(self) -> "TransformerInference":
        return TransformerInference(self)

    def forward(self, inputs: Tensor, state: State) -> tuple[Tensor, State]:
        steps, batch, n = inputs.shape
        heads, size, memory = self.heads, self.head_size, self.memory
        p = self.dropout if self.training else 0.0
        q, k, v = self.qkv(self.norm_attention(inputs)).split(n, dim=-1)  # [T, B, n] each
        q, k, v = (z.reshape(steps, -1, heads, size).permute(1, 2, 0, 3) for z in (q, k, v))  # [B, H, T, h]
        if memory:
            past_keys, past_values, flags = state
            carried = past_keys.dtype  # the memory keeps the state's type (float32 under a bf16 autocast)
            past_keys = past_keys.reshape(-1, memory, heads, size).transpose(1, 2).to(k.dtype)  # [B, H, M, h]
            past_values = past_values.reshape(-1, memory, heads, size).transpose(1, 2).to(v.dtype)
            keys, values = torch.cat([past_keys, k], 2), torch.cat([past_values, v], 2)  # [B, H, M + T, h]
            filled = torch.cat([flags > 0.5, torch.ones_like(flags[:, :1], dtype=torch.bool).expand(-1, steps)], 1)
            query = torch.arange(steps, device=inputs.device)[:, None]  # query t is position M + t of [memory; window]
            key = torch.arange(memory + steps, device=inputs.device)[None, :]
            span = (key >= query) & (key <= query + memory)  # t − M ≤ s ≤ t, [T, M + T]
            mask = (span[None] & filled[:, None, :])[:, None]  # [B, 1, T, M + T]
            cos, sin = rotary(memory + steps, size, q.dtype, inputs.device)
            attended = F.scaled_dot_product_attention(
                rotate(q, cos[memory:], sin[memory:]), rotate(keys, cos, sin), values, attn_mask=mask, dropout_p=p
            )
            new_flags = torch.cat([flags, torch.ones_like(flags[:, :1]).expand(-1, steps)], 1)[:, -memory:]
            state = (
                keys[:, :, -memory:].transpose(1, 2).reshape(-1, memory * n).to(carried),
                values[:, :, -memory:].transpose(1, 2).reshape(-1, memory * n).to(carried),
                new_flags,
            )
        else:
            cos, sin = rotary(steps, size, q.dtype, inputs.device)
            attended = F.scaled_dot_product_attention(
                rotate(q, cos, sin), rotate(k, cos, sin), v, is_causal=True, dropout_p=p
            )
        attended = attended.permute(2, 0, 1, 3).reshape(steps, -1, n)  # [T, B, n]
        hidden = inputs + self.dropped(self.out(attended))
        output = hidden + self.dropped(self.down(F.gelu(self.up(self.norm_mlp(hidden)))))
        return output, state


class TransformerInference(InferenceStep):
    """The step for sampling: LN_1 and W_qkv taken ahead (at the bottom layer, once for every symbol), the
    rotations of the M + 1 positions a step sees tabled once, the rest in as few operations as it takes."""

    def __init__(self, cell: TransformerBlock):
        super().__init__(cell)
        self.n, self.heads, self.size, self.memory = cell.hidden_size, cell.heads, cell.head_size, cell.memory
        self.norm_attention, self.norm_mlp = cell.norm_attention, cell.norm_mlp
        self.qkv_weight, self.qkv_bias = cell.qkv.weight.T, cell.qkv.bias
        self.out_weight, self.out_bias = cell.out.weight.T, cell.out.bias
        self.up_weight, self.up_bias = cell.up.weight.T, cell.up.bias
        self.down_weight, self.down_bias = cell.down.weight.T, cell.down.bias
        cos, sin = rotary(self.memory + 1, self.size, cell.qkv.weight.dtype, cell.qkv.weight.device)
        self.cos, self.sin = cos, sin

    def project(self, x: Tensor) -> Tensor:
        return affine(self.norm_attention(x), self.qkv_weight, self.qkv_bias)  # [B, 3n]: q, k, v

    def advance(self, projected: Tensor, x: Tensor | None, state: State) -> tuple[Tensor, State]:
        if not self.memory:
            return self.cell.step(x, state)  # which refuses: nothing is cached
        n, heads, size, memory = self.n, self.heads, self.size, self.memory
        q, k, v = projected.split(n, dim=-1)
        past_keys, past_values, flags = state
        keys = torch.cat([past_keys, k.to(past_keys.dtype)], 1)  # [B, (M + 1)·n]: the slots, then this position
        values = torch.cat([past_values, v.to(past_values.dtype)], 1)
        filled = torch.cat([flags > 0.5, torch.ones_like(flags[:, :1], dtype=torch.bool)], 1)
        attended = F.scaled_dot_product_attention(
            rotate(q.reshape(-1, heads, 1, size), self.cos[memory:], self.sin[memory:]),
            rotate(keys.view(-1, memory + 1, heads, size).transpose(1, 2), self.cos, self.sin),
            values.view(-1, memory + 1, heads, size).transpose(1, 2),
            attn_mask=filled[:, None, None, :],
        ).reshape(-1, n)
        hidden = affine(attended, self.out_weight, self.out_bias).add_(x)
        up = F.gelu(affine(self.norm_mlp(hidden), self.up_weight, self.up_bias))
        output = affine(up, self.down_weight, self.down_bias).add_(hidden)
        new_flags = torch.cat([flags[:, 1:], torch.ones_like(flags[:, :1])], 1)
        return output, (keys[:, n:], values[:, n:], new_flags)


def affine(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """x ``[B, i]`` times ``weight`` ``[i, o]``, plus ``bias`` where there is one (a new tensor)."""
    return x @ weight if bias is None else torch.addmm(bias, x, weight)


def rotary(positions: int, size: int, dtype: torch.dtype, device) -> tuple[Tensor, Tensor]:
    """cos and sin of the angles p·10000^(−2i/h), ``[positions, h/2]`` each, for p = 0 … positions − 1."""
    work = torch.float64 if dtype == torch.float64 else torch.float32
    frequencies = ROPE_BASE ** (-torch.arange(0, size, 2, device=device, dtype=work) / size)
    angles = torch.arange(positions, device=device, dtype=work)[:, None] * frequencies
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x ``[..., P, h]`` with the pairs (i, i + h/2) of position p rotated by its angles (RoPE)."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)
