"""The gated delta rule over a window: one step at a time (the reference) and in chunks (the WY form).

Per head, with a state S of d_k × d_v (keys down, values across: the transpose of the paper's
d_v × d_k S), gates α_t = exp(g_t) ∈ (0, 1] and β_t ∈ (0, 1)::

    S_t = α_t (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ          o_t = S_tᵀ q_t

which is the paper's S_t = S_{t−1}(α_t(I − β_t k_t k_tᵀ)) + β_t v_t k_tᵀ, o_t = S_t q_t, transposed.

**The chunked form.** Cut the window into chunks of C positions. Within a chunk, with S_0 the state
it starts from and γ_r = α_1 ⋯ α_r (the decay since the chunk began), the state divided by γ_r
follows the plain delta rule, so (Yang et al. 2024, "Parallelizing linear transformers with the
delta rule over sequence length"; the chunkwise form of Yang, Kautz & Hatamizadeh 2025)::

    S_r = γ_r S_0 + Σ_{i≤r} (γ_r / γ_i) k_i δ_iᵀ
    δ_i = β_i (v_i − γ_i S_0ᵀ k_i − Σ_{j<i} (γ_i / γ_j)(k_iᵀ k_j) δ_j)

The second line is a unit lower-triangular system, (I + A) δ = β ⊙ V − (β γ ⊙ K) S_0 with
A_ij = β_i (γ_i/γ_j) k_iᵀ k_j for j < i. With T = (I + A)⁻¹ (one triangular solve: the UT transform)
it gives the WY representation, δ = U − W S_0 with U = T(β ⊙ V) and W = T(βγ ⊙ K), and U and W depend
on the chunk's inputs alone, so every chunk's are computed at once. What is left to
run chunk after chunk is, per chunk, a few matrix products with the carried state::

    δ = U − W S_0
    o_r = γ_r S_0ᵀ q_r + Σ_{i≤r} (γ_r/γ_i)(q_rᵀ k_i) δ_i
    S_C = γ_C S_0 + Σ_i (γ_C/γ_i) k_i δ_iᵀ

Every ratio γ_r/γ_i taken has i ≤ r, so it is at most 1: nothing overflows however fast the gates
decay. A window whose length is not a multiple of C is padded with positions that leave the state
as it is (k = v = 0, β = 0, α = 1), and their outputs dropped.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

FLUSH_BELOW = -60.0  # decays below e^−60 ≈ 10⁻²⁶ within a chunk are taken as 0 (see decay)


def delta_rule_step(
    state: Tensor, q: Tensor, k: Tensor, v: Tensor, log_alpha: Tensor, beta: Tensor
) -> tuple[Tensor, Tensor]:
    """One step: ``state`` ``[B, H, d_k, d_v]``, ``q``, ``k`` ``[B, H, d_k]``, ``v`` ``[B, H, d_v]``,
    ``log_alpha`` (g_t = log α_t) and ``beta`` ``[B, H]``. Returns o_t ``[B, H, d_v]`` and S_t."""
    alpha, beta = log_alpha.exp()[..., None, None], beta[..., None, None]
    k_column, v_row = k.unsqueeze(-1), v.unsqueeze(-2)
    erased = state - beta * k_column @ (k_column.transpose(-1, -2) @ state)  # (I − β_t k_t k_tᵀ) S_{t−1}
    state = alpha * erased + beta * k_column @ v_row  # S_t = α_t (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ
    output = (q.unsqueeze(-2) @ state).squeeze(-2)  # o_t = S_tᵀ q_t
    return output, state


def delta_rule_loop(
    q: Tensor, k: Tensor, v: Tensor, log_alpha: Tensor, beta: Tensor, state: Tensor
) -> tuple[Tensor, Tensor]:
    """The reference: :func:`delta_rule_step` over the window. ``q``, ``k`` ``[B, H, T, d_k]``, ``v``
    ``[B, H, T, d_v]``, ``log_alpha``, ``beta`` ``[B, H, T]``, ``state`` ``[B, H, d_k, d_v]``; returns
    every o_t, ``[B, H, T, d_v]``, and the last state."""
    outputs = []
    for t in range(q.shape[2]):
        output, state = delta_rule_step(state, q[:, :, t], k[:, :, t], v[:, :, t], log_alpha[:, :, t], beta[:, :, t])
        outputs.append(output)
    return torch.stack(outputs, 2), state


def delta_rule_chunked(
    q: Tensor, k: Tensor, v: Tensor, log_alpha: Tensor, beta: Tensor, state: Tensor, chunk: int
) -> tuple[Tensor, Tensor]:
    """The same function as :func:`delta_rule_loop`, in chunks of ``chunk`` positions (the module's
    docstring): one triangular solve for every chunk at once, then one short loop over the chunks."""
    batch, heads, steps, key_size = k.shape
    value_size = v.shape[-1]
    pad = -steps % chunk
    if pad:  # positions that change nothing: k = v = 0, β = 0, log α = 0
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        log_alpha, beta = F.pad(log_alpha, (0, pad)), F.pad(beta, (0, pad))
    chunks = (steps + pad) // chunk
    q, k, v = (x.reshape(batch, heads, chunks, chunk, -1) for x in (q, k, v))
    log_gamma = log_alpha.reshape(batch, heads, chunks, chunk).cumsum(-1)  # log γ_r within each chunk
    beta = beta.reshape(batch, heads, chunks, chunk, 1)
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    # γ_r / γ_i for i ≤ r, 0 above the diagonal (masked before exp: no overflow, no 0 · ∞)
    ratios = decay(log_gamma[..., :, None] - log_gamma[..., None, :], ~causal)
    gamma = decay(log_gamma).unsqueeze(-1)
    k_beta = beta * k
    lower = (k_beta @ k.transpose(-1, -2) * ratios).tril(-1)  # A_ij = β_i (γ_i/γ_j) k_iᵀ k_j, j < i
    inverse = UnitLowerInverse.apply(lower)  # T = (I + A)⁻¹
    u, w = inverse @ (beta * v), inverse @ (gamma * k_beta)  # U = T(β ⊙ V), W = T(βγ ⊙ K)
    scores = q @ k.transpose(-1, -2) * ratios  # (γ_r/γ_i) q_rᵀ k_i, i ≤ r
    q_decayed = gamma * q  # γ_r q_r
    k_to_end = decay(log_gamma[..., -1:] - log_gamma).unsqueeze(-1) * k  # (γ_C/γ_i) k_i
    chunk_decay = decay(log_gamma[..., -1])[..., None, None]  # γ_C
    outputs = []
    for c in range(chunks):
        delta = u[:, :, c] - w[:, :, c] @ state  # δ = U − W S_0
        outputs.append(q_decayed[:, :, c] @ state + scores[:, :, c] @ delta)
        state = chunk_decay[:, :, c] * state + k_to_end[:, :, c].transpose(-1, -2) @ delta
    output = torch.stack(outputs, 2).reshape(batch, heads, chunks * chunk, value_size)
    return output[:, :, :steps], state


def decay(log_ratio: Tensor, masked: Tensor | None = None) -> Tensor:
    """exp(log_ratio), 0 where ``masked`` and where the ratio is below e^FLUSH_BELOW: products of such
    numbers are denormal, which a CPU computes many times slower (4× a window measured)."""
    flushed = log_ratio < FLUSH_BELOW
    return log_ratio.masked_fill(flushed if masked is None else flushed | masked, float("-inf")).exp()


class UnitLowerInverse(torch.autograd.Function):
    """(I + A)⁻¹ for strictly lower-triangular A ``[..., C, C]`` (what is on and above its diagonal is
    ignored), with the gradient −Tᵀ Ḡ Tᵀ below the diagonal. Autograd's own gradient of a batched
    triangular solve copies matrix by matrix on the CPU, 50× slower than these two products."""

    @staticmethod
    def forward(ctx, lower: Tensor) -> Tensor:
        identity = torch.eye(lower.shape[-1], dtype=lower.dtype, device=lower.device).expand_as(lower)
        inverse = torch.linalg.solve_triangular(lower, identity, upper=False, unitriangular=True)
        ctx.save_for_backward(inverse)
        return inverse

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        (inverse,) = ctx.saved_tensors
        transposed = inverse.transpose(-1, -2)
        return -(transposed @ grad @ transposed).tril(-1)
