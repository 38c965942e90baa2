"""The selective scan of Mamba (Gu & Dao 2023): a diagonal linear recurrence per channel over N states.

For every stream and channel d, with input-dependent step Δ_t, input matrix B_t and output matrix C_t
(each of the N states of the channel has its own decay A_{d,n} < 0)::

    h_t = exp(Δ_t A) ⊙ h_{t−1} + (Δ_t x_t) B_t        h_t ∈ R^N per channel (zero-order hold on A; B̄_t ≈ Δ_t B_t)
    y_t = C_t · h_t

Shapes are time-major: Δ and x ``[T, B, e]``, A ``[e, N]``, B and C ``[T, B, N]``, the state ``[B, e, N]``.
Three ways to compute it, held to each other in float64 by the tests:

- :func:`selective_scan_loop`, the reference: the equations one step at a time, autograd through them.
- :func:`selective_scan_chunked`, the whole-window form for training: the window in tiles of ``chunk``
  steps and, on the CPU, of as many streams as keep a tile's tensors within ``TILE`` numbers; within a
  tile the coefficients exp(Δ_t A) and Δ_t x_t B_t of all its steps are formed at once and the recurrence
  runs in place over them; only the state entering each chunk is kept for the backward pass, which forms
  a tile again, runs the adjoint recurrence backwards through it and sums the gradients of Δ, A, B, C
  and x from it (as the authors' CUDA kernel recomputes its states). Nothing of size T × B × e × N is
  kept, and no autograd graph is built over the steps.

Measured on the CPU (2-core Intel Xeon, one thread, forward and backward of T × B × e × N = 256 × 32 ×
758 × 16, the 1M-parameter model's, CPU seconds, best of 3 on a busy machine): the autograd loop 1.46;
chunks of 16 steps over all streams 0.99; tiles of 16 steps × 5 streams (``TILE`` = 2^20) 0.66; other
tiles of 2 to 32 steps and 2^18 to 2^21 numbers 0.66–0.80.
- :func:`selective_scan_linear`: the coefficients of the whole window formed at once, and the state's e·N
  numbers run through any form of :func:`charlm.cells.scan.linear_scan`, autograd through it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from charlm.cells.scan import linear_scan

CHUNK = 16  # steps a tile
TILE = 2**20  # on the CPU, the numbers of the state a tile holds at most (4 MiB in float32)


def selective_scan_loop(delta: Tensor, A: Tensor, B: Tensor, C: Tensor, x: Tensor, h0: Tensor) -> tuple[Tensor, Tensor]:
    """The reference: ``(y, h_T)``, every ``y_t = C_t · h_t`` ``[T, B, e]`` and the last state ``[B, e, N]``."""
    h, outputs = h0, []
    for delta_t, B_t, C_t, x_t in zip(delta, B, C, x):
        decay = torch.exp(delta_t[:, :, None] * A)  # Ā_t = exp(Δ_t A)
        h = decay * h + (delta_t * x_t)[:, :, None] * B_t[:, None, :]  # h_t = Ā_t h_{t−1} + Δ_t B_t x_t
        outputs.append((h * C_t[:, None, :]).sum(-1))  # y_t = C_t h_t
    return torch.stack(outputs), h


def selective_scan_chunked(
    delta: Tensor, A: Tensor, B: Tensor, C: Tensor, x: Tensor, h0: Tensor, chunk: int = CHUNK
) -> tuple[Tensor, Tensor]:
    """:func:`selective_scan_loop` in chunks, with the gradients written by hand (see the module)."""
    return _ChunkedSelectiveScan.apply(delta, A, B, C, x, h0, chunk)


def selective_scan_linear(
    delta: Tensor, A: Tensor, B: Tensor, C: Tensor, x: Tensor, h0: Tensor, method: str = "auto"
) -> tuple[Tensor, Tensor]:
    """The recurrence as ``h_t = a_t ⊙ h_{t−1} + b_t`` over the e·N numbers of the state, its coefficients
    exp(Δ_t A) and Δ_t x_t B_t formed for the whole window, through :func:`charlm.cells.scan.linear_scan`."""
    decays = torch.exp(delta.unsqueeze(-1) * A)
    inputs = (delta * x).unsqueeze(-1) * B.unsqueeze(-2)
    states = linear_scan(decays.flatten(2), inputs.flatten(2), h0.flatten(1), method).view(decays.shape)
    return torch.einsum("tben,tbn->tbe", states, C), states[-1]


def _chunk_states(delta: Tensor, A: Tensor, B: Tensor, u: Tensor, h: Tensor, space: dict) -> tuple[Tensor, Tensor]:
    """The states ``[L, b, e, N]`` of a tile of L steps and b streams entered with state ``h``, and its decays
    exp(Δ_t A) (``u = Δ ⊙ x``), in buffers of ``space`` that the next tile of the same shape reuses."""
    shape = (*delta.shape, A.shape[-1])
    decays = torch.mul(delta.unsqueeze(-1), A, out=_buffer(space, "decays", shape, delta)).exp_()
    states = torch.mul(u.unsqueeze(-1), B.unsqueeze(-2), out=_buffer(space, "states", shape, delta))  # Δ_t x_t B_t
    previous = h
    for decay, state in zip(decays, states):
        state.addcmul_(decay, previous)  # h_t = Ā_t h_{t−1} + Δ_t x_t B_t, in place
        previous = state
    return states, decays


def _buffer(space: dict, name: str, shape: tuple, like: Tensor) -> Tensor:
    """A tensor of ``shape`` kept in ``space``: the same memory for every tile of that shape (a fresh allocation
    of this size a tile measured slower on the CPU, each one's pages faulted in anew)."""
    if (name, shape) not in space:
        space[name, shape] = like.new_empty(shape)
    return space[name, shape]


def _tiles(shape: tuple, chunk: int, on_cpu: bool) -> list[tuple[int, slice, slice]]:
    """The window ``[T, B, e, N]`` in tiles of ``chunk`` steps and, on the CPU, as many streams as keep a tile
    within ``TILE`` numbers (measured: tiles whose tensors stay near the core run faster than whole chunks);
    elsewhere all streams (fewer, larger operations; not measured). ``(chunk index, steps, streams)``, the
    steps of each slice of streams in order."""
    steps, batch, inner, states = shape
    streams = max(1, TILE // (chunk * inner * states)) if on_cpu else batch
    return [
        (index, slice(start, min(start + chunk, steps)), slice(first, min(first + streams, batch)))
        for first in range(0, batch, streams)
        for index, start in enumerate(range(0, steps, chunk))
    ]


class _ChunkedSelectiveScan(torch.autograd.Function):
    @staticmethod
    def forward(ctx, delta, A, B, C, x, h0, chunk):
        u = delta * x
        outputs, last = torch.empty_like(delta), torch.empty_like(h0)
        tiles = _tiles((*delta.shape, A.shape[-1]), chunk, delta.device.type == "cpu")
        entering = h0.new_empty(tiles[-1][0] + 1, *h0.shape)  # the state entering each chunk
        space, h = {}, None
        for index, steps, streams in tiles:
            h = h0[streams] if index == 0 else h
            entering[index, streams] = h
            states, _ = _chunk_states(delta[steps, streams], A, B[steps, streams], u[steps, streams], h, space)
            outputs[steps, streams] = (states @ C[steps, streams].unsqueeze(-1)).squeeze(-1)
            last[streams] = states[-1]
            h = last[streams]  # not states[-1]: the next tile's states are formed in the same memory
        ctx.save_for_backward(delta, A, B, C, x, entering)
        ctx.chunk = chunk
        return outputs, last

    @staticmethod
    def backward(ctx, grad_outputs, grad_h):
        delta, A, B, C, x, entering = ctx.saved_tensors
        u = delta * x
        grad_delta, grad_x, grad_h0 = torch.empty_like(delta), torch.empty_like(x), torch.empty_like(grad_h)
        grad_B, grad_C, grad_A = torch.empty_like(B), torch.empty_like(C), torch.zeros_like(A)
        space, carried = {}, None
        for index, steps, streams in reversed(
            _tiles((*delta.shape, A.shape[-1]), ctx.chunk, delta.device.type == "cpu")
        ):
            tile = (steps, streams)
            if steps.stop == delta.shape[0]:
                carried = grad_h[streams]  # ∂L/∂h_t from the steps after t, starting at the window's end
            states, decays = _chunk_states(delta[tile], A, B[tile], u[tile], entering[index, streams], space)
            grad_y, C_tile = grad_outputs[tile], C[tile]
            grad_C[tile] = (grad_y.unsqueeze(-2) @ states).squeeze(-2)  # Σ_d ∂L/∂y_t,d h_t,d
            grads = _buffer(space, "grads", states.shape, states)
            for step in range(len(states) - 1, -1, -1):
                # ∂L/∂h_t = C_t ∂L/∂y_t + Ā_{t+1} ⊙ ∂L/∂h_{t+1}; then Ā_t ⊙ ∂L/∂h_t, in place of Ā_t
                torch.addcmul(carried, grad_y[step].unsqueeze(-1), C_tile[step].unsqueeze(-2), out=grads[step])
                carried = decays[step].mul_(grads[step])
            carried = carried.clone()  # ∂L/∂h entering the chunk, before the decays' rows are reused:
            through_decay = decays  # ∂L/∂(Δ_t A) = ∂L/∂h_t ⊙ Ā_t ⊙ h_{t−1}
            through_decay[1:].mul_(states[:-1])
            through_decay[0].mul_(entering[index, streams])
            grad_u = (grads @ B[tile].unsqueeze(-1)).squeeze(-1)  # Σ_n ∂L/∂h_t,n B_t,n
            grad_delta[tile] = torch.einsum("tben,en->tbe", through_decay, A) + grad_u * x[tile]
            grad_A += through_decay.mul_(delta[tile].unsqueeze(-1)).sum((0, 1))
            grad_x[tile] = grad_u * delta[tile]
            grad_B[tile] = (u[tile].unsqueeze(-2) @ grads).squeeze(-2)
            if index == 0:
                grad_h0[streams] = carried
        return grad_delta, grad_A, grad_B, grad_C, grad_x, grad_h0, None
