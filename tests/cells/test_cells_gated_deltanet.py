"""Gated DeltaNet (Yang, Kautz & Hatamizadeh 2025) beyond the generic cell tests: the layer against a float64
implementation written here in the paper's notation (S ∈ R^{d_v×d_k}, explicit identity), the chunked WY form
against the step loop (values, gradients, carried state, windows of any length, fast decays), the published
initialisation, the block wiring, and the options' errors."""

import math

import pytest
import torch
import torch.nn.functional as F

from cell_cases import randomise
from charlm.cells import CELLS, parse_cell_options
from charlm.cells.delta_rule import UnitLowerInverse, delta_rule_chunked, delta_rule_loop
from charlm.tools.selfcheck import paths_against_step
from helpers import assert_one_line_error, cli, tiny_train

D, N = 5, 8


def build(input_size=D, hidden=N, **options):
    torch.manual_seed(0)
    cell_class = CELLS.get("gated-deltanet")
    cell = cell_class(input_size, hidden, parse_cell_options(cell_class, options)).double()
    randomise(cell)
    return cell


def random_state(cell, batch):
    generator = torch.Generator().manual_seed(1)
    return tuple(0.5 * torch.randn(t.shape, generator=generator, dtype=t.dtype) for t in cell.initial_state(batch))


def paper_layer(cell, inputs, state):
    """The layer from the paper's equations, position by position, in float64: S_t = S_{t−1}(α_t(I − β_t k_t k_tᵀ))
    + β_t v_t k_tᵀ with S_t of d_v × d_k, o_t = S_t q_t (the cell keeps S transposed, flattened)."""
    H, dk, dv, n = cell.heads, cell.key_size, cell.value_size, cell.hidden_size
    width, channels = cell.config.conv, 2 * n + H * dv
    W_q, W_k, W_v, W_g, w_a, w_b = cell.weight_in.split([n, n, H * dv, H * dv, H, H])
    S = [state[0].view(-1, H, dk, dv)[:, h].transpose(1, 2) for h in range(H)]  # each [B, d_v, d_k]
    history = list(state[1].view(-1, width - 1, channels).unbind(1)) if width > 1 else []
    identity = torch.eye(dk, dtype=torch.float64)
    outputs = []
    for x in inputs:
        u = torch.cat([x @ W_q.T, x @ W_k.T, x @ W_v.T], -1)
        history.append(u)
        if width:
            u = sum(cell.conv_weight[:, j] * history[-1 - j] for j in range(width))
        history = history[-(width - 1) :] if width > 1 else []
        q, k, v = (u * torch.sigmoid(u)).split([n, n, H * dv], -1)
        g = x @ w_a.T + cell.time_step_bias
        alpha = torch.exp(-torch.exp(cell.log_decay_rate) * torch.log1p(torch.exp(g)))
        beta = 1 / (1 + torch.exp(-(x @ w_b.T)))
        heads = []
        for h in range(H):
            q_h, k_h, v_h = q[:, h * dk : (h + 1) * dk], k[:, h * dk : (h + 1) * dk], v[:, h * dv : (h + 1) * dv]
            q_h = q_h / torch.sqrt((q_h**2).sum(-1, keepdim=True) + 1e-6) / math.sqrt(dk)
            k_h = k_h / torch.sqrt((k_h**2).sum(-1, keepdim=True) + 1e-6)
            a, b = alpha[:, h, None, None], beta[:, h, None, None]
            outer_kk = k_h[:, :, None] * k_h[:, None, :]  # k_t k_tᵀ
            S[h] = S[h] @ (a * (identity - b * outer_kk)) + b * v_h[:, :, None] * k_h[:, None, :]
            o = (S[h] @ q_h[:, :, None])[:, :, 0]  # o_t = S_t q_t
            normed = o / torch.sqrt((o**2).mean(-1, keepdim=True) + 1e-6) * cell.norm_weight
            gate = x @ W_g[h * dv : (h + 1) * dv].T
            heads.append(normed * gate * torch.sigmoid(gate))
        outputs.append(torch.cat(heads, -1) @ cell.weight_out.T)
    matrices = torch.stack([s.transpose(1, 2) for s in S], 1).flatten(1)
    return torch.stack(outputs), (matrices, *([torch.stack(history, 1).flatten(1)] if width > 1 else []))


OPTIONS = [
    {"heads": 2, "chunk": 4},
    {"heads": 1, "chunk": 64},
    {"heads": 2, "conv": 0, "chunk": 3},
    {"heads": 4, "conv": 2, "expand_v": 1, "chunk": 5},
]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda options: ",".join(f"{k}={v}" for k, v in options.items()))
@pytest.mark.parametrize("steps", [1, 9, 12])
def test_window_and_step_are_the_papers_equations_with_a_carried_state(options, steps):
    cell = build(**options)
    inputs = torch.randn(steps, 3, D, dtype=torch.float64)
    for state in (cell.initial_state(3), random_state(cell, 3)):
        expected, expected_state = paper_layer(cell, inputs, state)
        window, window_state = cell(inputs, state)
        torch.testing.assert_close(window, expected)
        stepped = []
        for x in inputs:
            output, state = cell.step(x, state)
            stepped.append(output)
        torch.testing.assert_close(torch.stack(stepped), expected)
        for a, b, c in zip(window_state, state, expected_state, strict=True):
            torch.testing.assert_close(a, c)
            torch.testing.assert_close(b, c)


def rule_inputs(steps, batch=2, heads=3, key_size=4, value_size=6, decay=3.0, seed=0):
    generator = torch.Generator().manual_seed(seed)

    def draw(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    q = F.normalize(draw(batch, heads, steps, key_size), dim=-1)
    k = F.normalize(draw(batch, heads, steps, key_size), dim=-1)
    v = draw(batch, heads, steps, value_size)
    log_alpha = -decay * torch.rand(batch, heads, steps, generator=generator, dtype=torch.float64)
    beta = torch.rand(batch, heads, steps, generator=generator, dtype=torch.float64)
    state = draw(batch, heads, key_size, value_size)
    return [tensor.requires_grad_() for tensor in (q, k, v, log_alpha, beta, state)]


@pytest.mark.parametrize("chunk", [1, 4, 16, 64])
@pytest.mark.parametrize("steps", [1, 5, 16, 23])
def test_chunked_form_is_the_step_loop_in_value_and_gradient(steps, chunk):
    tensors = rule_inputs(steps)
    loop, loop_state = delta_rule_loop(*tensors)
    chunked, chunked_state = delta_rule_chunked(*tensors, chunk)
    torch.testing.assert_close(chunked, loop)
    torch.testing.assert_close(chunked_state, loop_state)
    weights, state_weights = torch.randn_like(loop), torch.randn_like(loop_state)
    expected = torch.autograd.grad((loop * weights).sum() + (loop_state * state_weights).sum(), tensors)
    found = torch.autograd.grad((chunked * weights).sum() + (chunked_state * state_weights).sum(), tensors)
    for a, b in zip(found, expected, strict=True):
        torch.testing.assert_close(a, b)


def test_two_chunked_windows_are_one_long_window():
    q, k, v, log_alpha, beta, state = (tensor.detach() for tensor in rule_inputs(21))
    whole, whole_state = delta_rule_chunked(q, k, v, log_alpha, beta, state, 8)
    first, carried = delta_rule_chunked(
        q[:, :, :13], k[:, :, :13], v[:, :, :13], log_alpha[..., :13], beta[..., :13], state, 8
    )
    second, final = delta_rule_chunked(
        q[:, :, 13:], k[:, :, 13:], v[:, :, 13:], log_alpha[..., 13:], beta[..., 13:], carried, 8
    )
    torch.testing.assert_close(torch.cat([first, second], 2), whole)
    torch.testing.assert_close(final, whole_state)


def test_gates_that_forget_at_once_stay_finite_and_agree_with_the_loop():
    """log α ≈ −200 a step: within a chunk γ underflows to 0; no ratio γ_r/γ_i may overflow (nor 0 · ∞)."""
    tensors = rule_inputs(19, decay=400.0)
    loop, loop_state = delta_rule_loop(*tensors)
    chunked, chunked_state = delta_rule_chunked(*tensors, 8)
    torch.testing.assert_close(chunked, loop)
    torch.testing.assert_close(chunked_state, loop_state)
    gradients = torch.autograd.grad(chunked.sum() + chunked_state.sum(), tensors)
    assert all(bool(torch.isfinite(gradient).all()) for gradient in gradients)


def test_unit_lower_inverse_and_its_gradient():
    torch.manual_seed(0)
    lower = (0.5 * torch.randn(2, 3, 6, 6, dtype=torch.float64)).tril(-1).requires_grad_()
    inverse = UnitLowerInverse.apply(lower)
    identity = torch.eye(6, dtype=torch.float64)
    torch.testing.assert_close(inverse @ (identity + lower), identity.expand(2, 3, 6, 6))
    assert torch.autograd.gradcheck(lambda a: UnitLowerInverse.apply(a.tril(-1)), (lower,))


@pytest.mark.parametrize("init", ["fan_in", "normal"])
def test_published_initialisation(init):
    torch.manual_seed(0)
    cell_class = CELLS.get("gated-deltanet")
    cell = cell_class(64, 64, parse_cell_options(cell_class, {"heads": 4, "init": init}))
    for weight in (cell.weight_in, cell.weight_out, cell.conv_weight):
        if init == "normal":
            assert abs(weight.std().item() - 0.02) < 0.002 and abs(weight.mean().item()) < 0.002
        else:
            bound = 1 / math.sqrt(weight.shape[1])
            assert weight.abs().max() <= bound and weight.abs().max() > 0.95 * bound
    rate = cell.log_decay_rate.exp()  # A ~ U(0, 16)
    assert bool(((rate > 0) & (rate < 16)).all())
    dt = F.softplus(cell.time_step_bias)  # log-uniform in [0.001, 0.1]
    assert bool(((dt >= 0.001 - 1e-9) & (dt <= 0.1 + 1e-9)).all())
    assert bool((cell.norm_weight == 1).all())


def test_in_the_published_block_window_and_step_agree():
    """--wiring block --block-conv 0: pre-RMSNorm, residual and SwiGLU MLP around the layer (its block)."""
    row = paths_against_step("gated-deltanet", torch.device("cpu"), wiring="block", block_conv=0)
    assert row.result == "pass", row.figure


def test_under_bf16_autocast_the_state_stays_float32():
    cell_class = CELLS.get("gated-deltanet")
    cell = cell_class(N, N, parse_cell_options(cell_class, {"heads": 2, "chunk": 4}))
    inputs, state = torch.randn(7, 2, N), cell.initial_state(2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        output, new_state = cell(inputs, state)
    assert output.dtype == torch.bfloat16
    assert [tensor.dtype for tensor in new_state] == [torch.float32, torch.float32]
    reference, _ = cell(inputs, state)
    torch.testing.assert_close(output.float(), reference, atol=0.05, rtol=0.05)


@pytest.mark.parametrize(
    "options, message",
    [
        (["heads=3"], "cannot build cell 'gated-deltanet': the hidden size 16 is not divisible by heads=3"),
        (["chunk=0"], "bad option for cell 'gated-deltanet': chunk must be at least 1, not 0"),
        (["init=xavier"], "bad option for cell 'gated-deltanet': init must be one of fan_in, normal, not 'xavier'"),
    ],
)
def test_options_that_do_not_fit_are_refused_in_one_line(tiny_corpus, tmp_path, options, message):
    cell_options = [arg for option in options for arg in ("--cell-opt", option)]
    result = cli(*tiny_train(tiny_corpus, tmp_path / "run", *cell_options, cell="gated-deltanet", hidden_size=16))
    assert_one_line_error(result, message)
