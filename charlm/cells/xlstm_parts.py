"""What xLSTM's two layers (Beck et al. 2024; ``charlm.cells.mlstm``, ``charlm.cells.slstm``) share: the
block-diagonal (head-wise) projections, the head-wise normalisation of the output, the causal
convolution with its history carried from window to window, the forget gate in log space, and the
published initialisers."""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import Tensor

FORGET_GATES = ("sigmoid", "exp")
NORM_EPS = 1e-5  # the published head-wise LayerNorm's


def log_forget(pre: Tensor, gate: str) -> Tensor:
    """log f_t from f̃_t: log σ(f̃_t) for a sigmoid forget gate, f̃_t itself for an exponential one."""
    return F.logsigmoid(pre) if gate == "sigmoid" else pre


def headwise(x: Tensor, weight: Tensor) -> Tensor:
    """``x [..., H·i]`` times a block-diagonal matrix of H blocks ``weight [H, o, i]``: ``[..., H·o]``
    (one batched product over the heads: faster on the CPU than einsum's for blocks of 4)."""
    heads, out, width = weight.shape
    by_head = x.reshape(-1, heads, width).transpose(0, 1)  # [H, N, i]
    product = (by_head @ weight.transpose(1, 2)).transpose(0, 1).flatten(1)  # [N, H·o]
    return product if x.dim() == 2 else product.view(*x.shape[:-1], heads * out)  # a step's batch stays free


def head_norm(h: Tensor, gain: Tensor, head_size: int) -> Tensor:
    """The output normalised head by head (LayerNorm over each head's units, without bias; xLSTM's
    GroupNorm): ``h [..., H, d]`` (d = ``head_size``) → ``[..., H·d]``, times the gain."""
    return F.layer_norm(h, (head_size,), eps=NORM_EPS).flatten(-2) * gain


@contextlib.contextmanager
def in_state_precision(device_type: str):
    """Autocast off: the memory's recurrence runs in its state's type (float32 under a bf16 autocast),
    as the authors' kernels accumulate it."""
    with torch.autocast(device_type, enabled=False):
        yield


def causal_conv(u: Tensor, past: Tensor | None, weight: Tensor, bias: Tensor) -> tuple[Tensor, Tensor | None]:
    """``v_t = b + Σ_{j<k} w_j ⊙ u_{t−j}`` over a window ``u [T, B, c]`` (depthwise, width k = ``weight``'s
    columns, column j multiplying u_{t−j}), from the last k − 1 inputs of the window before (``past``,
    ``[B, (k−1)·c]``, oldest first; None when k = 1). Returns v and the new ``past``."""
    channels, width = weight.shape
    history = width - 1
    if history:
        u = torch.cat([past.view(-1, history, channels).transpose(0, 1), u])
    v = F.conv1d(u.permute(1, 2, 0), weight.flip(1)[:, None, :], bias, groups=channels).permute(2, 0, 1).contiguous()
    return v, (u[-history:].transpose(0, 1).flatten(1) if history else None)


def small_init_(weight: Tensor, width: int) -> Tensor:
    """N(0, √(2 / 5w)) (Nguyen & Salazar 2019), as xLSTM initialises its projections from a width w."""
    with torch.no_grad():
        return weight.normal_(0.0, math.sqrt(2 / (5 * width)))


def conv_init_(weight: Tensor, bias: Tensor) -> None:
    """PyTorch's Conv1d default for a depthwise kernel of width k, as xLSTM leaves it: U(±1/√k)."""
    bound = 1 / math.sqrt(weight.shape[1])
    with torch.no_grad():
        weight.uniform_(-bound, bound)
        bias.uniform_(-bound, bound)
