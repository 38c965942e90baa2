r"""The mLSTM's matrix memory (Beck et al. 2024, xLSTM) over a window: one step written from the
equations (:func:`memory_step`, the reference) and the chunkwise-parallel form that training runs
(:func:`memory_chunked`); the tests hold the two to the same function in float64.

Per head, with query q_t and key k_t ∈ R^{d_k} (k_t already scaled by 1/√d_k), value v_t ∈ R^{d_v},
the input gate's pre-activation ĩ_t (i_t = exp(ĩ_t)) and log f_t, the stabilised recurrence::

    m_t = max(log f_t + m_{t−1}, ĩ_t)
    C_t = e^{log f_t + m_{t−1} − m_t} C_{t−1} + e^{ĩ_t − m_t} v_t k_tᵀ
    n_t = e^{log f_t + m_{t−1} − m_t} n_{t−1} + e^{ĩ_t − m_t} k_t
    h̃_t = C_t q_t / max(|n_tᵀ q_t|, e^{−m_t})

C_t and n_t are the paper's memory and normaliser (C*_t = f_t C*_{t−1} + i_t v_t k_tᵀ, n*_t = f_t n*_{t−1}
+ i_t k_t) scaled by e^{−m_t}, so no exponential exceeds 1, and h̃_t = C*_t q_t / max(|n*_tᵀ q_t|, 1)
whatever m is: the stabiliser changes the range of the numbers, never the function. (The authors
add ε = 10⁻⁶ to the denominator at the stabilised scale, which makes the output depend on m a
little; charlm does not.)

The chunked form cuts the window into chunks of L positions. Within a chunk, with b_t = Σ_{r≤t} log f_r
(from the chunk's start) and the state (C, n, m) it enters with, position t reads the positions
s ≤ t of its chunk through the weights e^{b_t − b_s + ĩ_s − m_t} (a causal L × L matrix, as attention)
and the state through e^{b_t + m − m_t}, where m_t = max(b_t + m, max_{s≤t}(b_t − b_s + ĩ_s)) is the
recurrence's own m_t. The state at the chunk's end is then computed in one product and handed to the
next chunk: T/L dependent steps instead of T.
"""

from __future__ import annotations

import torch
from torch import Tensor

MemoryState = tuple[Tensor, Tensor, Tensor]  # C [B, H, d_v, d_k], n [B, H, d_k], m [B, H]


def memory_step(
    q: Tensor, k: Tensor, v: Tensor, log_i: Tensor, log_f: Tensor, state: MemoryState
) -> tuple[Tensor, MemoryState]:
    """One position: q, k ``[B, H, d_k]``, v ``[B, H, d_v]``, log_i (ĩ_t) and log_f ``[B, H]``; returns
    h̃_t ``[B, H, d_v]`` and the new state."""
    C, n, m = state
    m_new = torch.maximum(log_f + m, log_i)  # m_t = max(log f_t + m_{t−1}, ĩ_t)
    f = torch.exp(log_f + m - m_new)[..., None]
    i = torch.exp(log_i - m_new)[..., None]
    C = torch.baddbmm(
        (f[..., None] * C).flatten(0, 1), (i * v).flatten(0, 1)[..., None], k.flatten(0, 1)[:, None]
    ).view_as(C)  # C_t = f C_{t−1} + i v_t k_tᵀ
    n = f * n + i * k  # n_t = f n_{t−1} + i k_t
    numerator = (C @ q[..., None])[..., 0]  # C_t q_t
    denominator = torch.maximum((n * q).sum(-1).abs(), torch.exp(-m_new))  # max(|n_tᵀ q_t|, e^{−m_t})
    return numerator / denominator[..., None], (C, n, m_new)


def memory_chunked(
    q: Tensor, k: Tensor, v: Tensor, log_i: Tensor, log_f: Tensor, state: MemoryState, chunk_size: int
) -> tuple[Tensor, MemoryState]:
    """The window at once: q, k ``[B, H, T, d_k]``, v ``[B, H, T, d_v]``, log_i and log_f ``[B, H, T]``;
    returns every h̃_t ``[B, H, T, d_v]`` and the state after the window, as :func:`memory_step` T times."""
    outputs = []
    for chunk in zip(*(x.split(chunk_size, dim=2) for x in (q, k, v, log_i, log_f))):
        output, state = _chunk(*chunk, state)
        outputs.append(output)
    return torch.cat(outputs, dim=2), state


def _chunk(
    q: Tensor, k: Tensor, v: Tensor, log_i: Tensor, log_f: Tensor, state: MemoryState
) -> tuple[Tensor, MemoryState]:
    C, n, m = state
    length = q.shape[2]
    b = log_f.cumsum(-1)  # b_t = Σ_{r≤t} log f_r
    causal = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
    log_weights = (b[..., :, None] - b[..., None, :] + log_i[..., None, :]).masked_fill(~causal, float("-inf"))
    log_carried = b + m[..., None]  # the log-scale of the entering state at t
    m_rows = torch.maximum(log_weights.amax(-1), log_carried)  # m_t
    weights = torch.exp(log_weights - m_rows[..., None])  # e^{b_t − b_s + ĩ_s − m_t}, 0 for s > t
    carried = torch.exp(log_carried - m_rows)[..., None]  # e^{b_t + m − m_t}
    scores = (q @ k.transpose(-1, -2)) * weights  # (k_sᵀ q_t) e^{…}
    numerator = scores @ v + carried * (q @ C.transpose(-1, -2))  # C_t q_t
    normaliser = scores.sum(-1, keepdim=True) + carried * (q @ n[..., None])  # n_tᵀ q_t
    h = numerator / torch.maximum(normaliser.abs(), torch.exp(-m_rows)[..., None])
    m_end = m_rows[..., -1]
    decay = torch.exp(b[..., -1:] + m[..., None] - m_end[..., None])  # e^{b_L + m − m_L}
    inputs = torch.exp(b[..., -1:] - b + log_i - m_end[..., None])[..., None]  # e^{b_L − b_s + ĩ_s − m_L}
    C = decay[..., None] * C + (inputs * v).transpose(-1, -2) @ k
    n = decay * n + (inputs * k).sum(-2)
    return h, (C, n, m_end)
