"""xLSTM's mLSTM and sLSTM (Beck et al. 2024) beyond the generic cell tests: the chunkwise-parallel
memory against its step loop in float64 (values, gradients, carried state, windows that are not a
multiple of the chunk), both cells against float64 implementations of the paper's unstabilised
equations written here, the stabiliser keeping float32 finite, the heads kept apart, and the
published initialisation."""

import math

import pytest
import torch
import torch.nn.functional as F

from cell_cases import randomise
from charlm.cells import CELLS, parse_cell_options
from charlm.cells.matrix_memory import memory_chunked, memory_step
from charlm.errors import CharlmError
from charlm.model import LanguageModel, ModelConfig

B, H, DK, DV = 2, 3, 4, 5


def memory_inputs(steps, scale=1.0, seed=0, gate="sigmoid"):
    generator = torch.Generator().manual_seed(seed)

    def draw(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    pre_f = 2 * draw(B, H, steps)
    log_f = F.logsigmoid(pre_f) if gate == "sigmoid" else pre_f
    tensors = (draw(B, H, steps, DK), draw(B, H, steps, DK), draw(B, H, steps, DV), scale * draw(B, H, steps), log_f)
    return tuple(t.requires_grad_() for t in tensors)


def memory_state(seed=1):
    generator = torch.Generator().manual_seed(seed)
    shapes = ((B, H, DV, DK), (B, H, DK), (B, H))
    return tuple(torch.randn(*shape, generator=generator, dtype=torch.float64).requires_grad_() for shape in shapes)


def memory_loop(q, k, v, log_i, log_f, state):
    outputs = []
    for t in range(q.shape[2]):
        h, state = memory_step(q[:, :, t], k[:, :, t], v[:, :, t], log_i[:, :, t], log_f[:, :, t], state)
        outputs.append(h)
    return torch.stack(outputs, 2), state


@pytest.mark.parametrize("gate", ["sigmoid", "exp"])
@pytest.mark.parametrize("steps, chunk", [(1, 64), (13, 4), (13, 13), (13, 64), (16, 4), (7, 1)])
def test_chunked_memory_is_the_step_loop_in_value_gradient_and_state(steps, chunk, gate):
    inputs, state = memory_inputs(steps, scale=3.0, gate=gate), memory_state()
    fast, fast_state = memory_chunked(*inputs, state, chunk)
    slow, slow_state = memory_loop(*inputs, state)
    torch.testing.assert_close(fast, slow, rtol=1e-10, atol=1e-10)
    for a, b in zip(fast_state, slow_state):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    weights = torch.randn_like(fast)
    wrt = [*inputs, *state]
    fast_grads = torch.autograd.grad((fast * weights).sum() + sum(s.sum() for s in fast_state), wrt)
    slow_grads = torch.autograd.grad((slow * weights).sum() + sum(s.sum() for s in slow_state), wrt)
    for a, b in zip(fast_grads, slow_grads):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


def test_chunked_memory_carried_over_two_windows_is_one_window():
    inputs = memory_inputs(21, scale=3.0)
    zeros = tuple(torch.zeros_like(t) for t in memory_state())
    whole, whole_state = memory_chunked(*inputs, zeros, 4)
    first, carried = memory_chunked(*(t[:, :, :9] for t in inputs), zeros, 4)
    second, final = memory_chunked(*(t[:, :, 9:] for t in inputs), carried, 4)
    torch.testing.assert_close(torch.cat([first, second], 2), whole, rtol=1e-10, atol=1e-10)
    for a, b in zip(final, whole_state):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_stabiliser_keeps_float32_finite_where_the_paper_overflows():
    """ĩ up to 150: exp(ĩ) overflows float32 (and the unstabilised C*, n*), the stabilised memory does not."""
    q, k, v, log_i, log_f = (t.detach() for t in memory_inputs(40, scale=60.0))
    log_i = log_i.abs() + 30
    reference, _ = memory_chunked(q, k, v, log_i, log_f, tuple(torch.zeros_like(t) for t in memory_state()), 8)
    low = tuple(t.float() for t in (q, k, v, log_i, log_f))
    zeros = tuple(torch.zeros_like(t).float() for t in memory_state())
    assert torch.exp(low[3]).isinf().any()
    for chunked in (True, False):
        h, state = memory_chunked(*low, zeros, 8) if chunked else memory_loop(*low, zeros)
        assert all(t.isfinite().all() for t in (h, *state))
        torch.testing.assert_close(h.double(), reference, rtol=1e-4, atol=1e-4)


def build(name, hidden=8, input_size=None, **options):
    torch.manual_seed(0)
    cell_class = CELLS.get(name)
    cell = cell_class(input_size or hidden, hidden, parse_cell_options(cell_class, options)).double()
    randomise(cell)
    return cell


def causal_conv_reference(inputs, weight, bias):
    """Depthwise causal convolution from a zero history: y_t = b + Σ_j w[:, j] x_{t−j}."""
    out = []
    for t in range(inputs.shape[0]):
        out.append(bias + sum(weight[:, j] * inputs[t - j] for j in range(weight.shape[1]) if t - j >= 0))
    return torch.stack(out)


def block_diagonal(blocks):
    return torch.block_diag(*blocks)


def group_norm(h, gain, heads):
    parts = h.unflatten(-1, (heads, -1))
    mean = parts.mean(-1, keepdim=True)
    variance = parts.var(-1, unbiased=False, keepdim=True)
    return ((parts - mean) / torch.sqrt(variance + 1e-5)).flatten(-2) * gain


def paper_mlstm(cell, inputs):
    """The mLSTM layer from a zero state, unstabilised: C* = f C* + i v kᵀ, n* = f n* + i k,
    h̃ = C* q / max(|n*ᵀ q|, 1), in its post-up-projection block."""
    m, heads = cell.inner, cell.heads
    d = m // heads
    up = inputs @ cell.weight_up.T
    x_hat, z = up[..., :m], up[..., m:]
    a = F.silu(causal_conv_reference(x_hat, cell.conv_weight, cell.conv_bias))
    W_q, W_k, W_v = (block_diagonal(w) for w in (cell.weight_q, cell.weight_k, cell.weight_v))
    C = torch.zeros(inputs.shape[1], heads, d, d, dtype=torch.float64)
    n = torch.zeros(inputs.shape[1], heads, d, dtype=torch.float64)
    outputs = []
    for t in range(inputs.shape[0]):
        q, k, v = a[t] @ W_q.T, a[t] @ W_k.T, x_hat[t] @ W_v.T
        gates = torch.cat([q, k, v], -1) @ cell.gate_weight.T + cell.gate_bias  # the gates read [q; k; v]
        i, f = torch.exp(gates[:, :heads]), torch.sigmoid(gates[:, heads:])
        q, k, v = q.view(-1, heads, d), k.view(-1, heads, d) / math.sqrt(d), v.view(-1, heads, d)
        C = f[..., None, None] * C + i[..., None, None] * torch.einsum("bhv,bhk->bhvk", v, k)
        n = f[..., None] * n + i[..., None] * k
        h = torch.einsum("bhvk,bhk->bhv", C, q) / torch.clamp((n * q).sum(-1).abs(), min=1)[..., None]
        y = (group_norm(h.flatten(1), cell.norm_weight, heads) + cell.skip * a[t]) * F.silu(z[t])
        outputs.append(y @ cell.weight_down.T)
    return torch.stack(outputs)


def paper_slstm(cell, inputs):
    """The sLSTM layer from a zero state, unstabilised: c* = f c* + i z, n* = f n* + i, h = o c*/n*."""
    heads = cell.heads
    u = F.silu(causal_conv_reference(inputs, cell.conv_weight, cell.conv_bias))
    W = [block_diagonal(w) for w in cell.weight_input]
    R = [block_diagonal(r) for r in cell.recurrent_weight]
    b = cell.bias
    h = c = n = torch.zeros(inputs.shape[1], cell.hidden_size, dtype=torch.float64)
    outputs = []
    for t in range(inputs.shape[0]):
        x = inputs[t]
        i = torch.exp(u[t] @ W[0].T + h @ R[0].T + b[0])
        f = torch.sigmoid(u[t] @ W[1].T + h @ R[1].T + b[1])
        z = torch.tanh(x @ W[2].T + h @ R[2].T + b[2])
        o = torch.sigmoid(x @ W[3].T + h @ R[3].T + b[3])
        c, n = f * c + i * z, f * n + i
        h = o * c / n
        outputs.append(group_norm(h, cell.norm_weight, heads))
    return torch.stack(outputs)


@pytest.mark.parametrize(
    "name, paper, options", [("mlstm", paper_mlstm, {"chunk_size": 3}), ("slstm", paper_slstm, {})]
)
def test_window_and_step_are_the_papers_unstabilised_equations(name, paper, options):
    cell = build(name, heads=2, **options)
    inputs = torch.randn(11, 3, 8, dtype=torch.float64)
    expected = paper(cell, inputs)
    outputs, _ = cell(inputs, cell.initial_state(3))
    torch.testing.assert_close(outputs, expected)
    state, stepped = cell.initial_state(3), []
    for x in inputs:
        y, state = cell.step(x, state)
        stepped.append(y)
    torch.testing.assert_close(torch.stack(stepped), expected)


def test_slstm_heads_do_not_mix():
    """Block-diagonal W and R: a change to one head's inputs leaves every other head's outputs as they were."""
    cell = build("slstm", heads=2, conv_width=0)
    inputs = torch.randn(9, 2, 8, dtype=torch.float64)
    changed = inputs.clone()
    changed[..., :4] += torch.randn(9, 2, 4, dtype=torch.float64)
    before, _ = cell(inputs, cell.initial_state(2))
    after, _ = cell(changed, cell.initial_state(2))
    torch.testing.assert_close(after[..., 4:], before[..., 4:])
    assert not torch.allclose(after[..., :4], before[..., :4])


def test_mlstm_published_initialisation():
    torch.manual_seed(0)
    layers = CELLS.get("mlstm").make_stack(64, 64, 2, parse_cell_options(CELLS.get("mlstm"), {}))
    cell = layers[0]
    assert cell.inner == 128 and cell.head_size == 32
    assert cell.weight_q.shape == (32, 4, 4)  # blocks of 4
    assert cell.gate_weight.abs().max() == 0 and cell.skip.eq(1).all() and cell.norm_weight.eq(1).all()
    torch.testing.assert_close(cell.gate_bias[4:], torch.tensor([3.0, 4.0, 5.0, 6.0]))
    assert cell.gate_bias[:4].abs().max() < 0.5
    assert abs(cell.weight_up.std().item() - math.sqrt(2 / (5 * 64))) < 0.01
    assert abs(cell.weight_down.std().item() - 2 / 2 / math.sqrt(64)) < 0.01  # 2 / (layers √n)


def test_slstm_published_initialisation():
    torch.manual_seed(0)
    bottom, top = CELLS.get("slstm").make_stack(16, 16, 2, parse_cell_options(CELLS.get("slstm"), {}))
    for cell in (bottom, top):
        assert cell.recurrent_weight.abs().max() == 0
        assert cell.bias[[0, 2, 3]].abs().max() == 0
        forget = cell.bias[1].view(4, 4)
        assert (forget == forget[0]).all()  # the same over every head
    torch.testing.assert_close(bottom.bias[1][:4], 5 - 12 * torch.tensor([0.0, 1 / 3, 2 / 3, 1.0]) ** 0.3)
    torch.testing.assert_close(top.bias[1][:4], 5 - 12 * torch.tensor([0.0, 1 / 3, 2 / 3, 1.0]) ** 1.6)


def test_mlstm_and_slstm_in_their_published_blocks_carry_state():
    """mLSTM: x + y(norm(x)), no MLP; sLSTM: the same and a gated MLP of 4/3 n. Two windows are one."""
    for cell, expansion in (("mlstm", 0.0), ("slstm", 1.333)):
        torch.manual_seed(0)
        config = ModelConfig(cell, 7, 8, layers=2, wiring="block", block_conv=0, block_expansion=expansion)
        model = LanguageModel(config).double()
        tokens = torch.randint(7, (2, 12))
        whole, _ = model(tokens, model.initial_state(2))
        first, carried = model(tokens[:, :5], model.initial_state(2))
        second, _ = model(tokens[:, 5:], carried)
        torch.testing.assert_close(torch.cat([first, second], 1), whole)


def test_options_and_sizes_are_validated_in_one_line():
    with pytest.raises(CharlmError, match="forget_gate must be one of sigmoid, exp"):
        parse_cell_options(CELLS.get("mlstm"), {"forget_gate": "tanh"})
    with pytest.raises(CharlmError, match="chunk_size must be at least 1"):
        parse_cell_options(CELLS.get("mlstm"), {"chunk_size": "0"})
    with pytest.raises(CharlmError, match="make the hidden size a multiple of 2"):
        LanguageModel(ModelConfig("mlstm", 7, 7))
    with pytest.raises(CharlmError, match="hidden size 6 is not divisible by heads=4"):
        LanguageModel(ModelConfig("slstm", 7, 6))
