"""QRNN, SRU and IndRNN against float64 implementations written from their papers (not from the
cells' ``step``), their published initialisations, IndRNN's bound on |u| and QRNN's causality."""

import math

import pytest
import torch
import torch.nn.functional as F

from charlm.cells import CELLS, parse_cell_options
from charlm.cells.indrnn import _ReluRecurrence
from charlm.cells.sru import _ForgetRecurrence
from charlm.errors import CharlmError


def build(name, d, n, **options):
    cell_class = CELLS.get(name)
    return cell_class(d, n, parse_cell_options(cell_class, options)).double()


def perturbed(cell, seed=0):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in cell.parameters():
            parameter.add_(0.3 * torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype))
    return cell


def window(T, B, d, seed=1):
    return torch.randn(T, B, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


# --- QRNN -------------------------------------------------------------------------------------------


def qrnn_reference(x, c0, x_prev, weight, bias, width, pooling):
    """Z, F, O from a masked convolution (conv1d over the window, padded on the left with the
    carried input), then f- or fo-pooling one step at a time."""
    T, B, d = x.shape
    gates = 3 if pooling == "fo" else 2
    rows = gates * c0.shape[1]
    # conv1d's kernel [out, in, k]: tap 0 reads x_{t−k+1}, the last tap x_t
    taps = [weight[rows:], weight[:rows]] if width == 2 else [weight]
    kernel = torch.stack(taps, dim=-1)
    sequence = x.permute(1, 2, 0)  # [B, d, T]
    if width == 2:
        sequence = torch.cat([x_prev.unsqueeze(-1), sequence], dim=-1)
    pre = F.conv1d(sequence, kernel, bias).permute(2, 0, 1)  # [T, B, g·n]
    Z, Fg = torch.tanh(pre.chunk(gates, -1)[0]), torch.sigmoid(pre.chunk(gates, -1)[1])
    Og = torch.sigmoid(pre.chunk(gates, -1)[2]) if gates == 3 else None
    c, outputs = c0, []
    for t in range(T):
        c = Fg[t] * c + (1 - Fg[t]) * Z[t]
        outputs.append(Og[t] * c if Og is not None else c)
    return torch.stack(outputs), c


@pytest.mark.parametrize("width", [1, 2])
@pytest.mark.parametrize("pooling", ["fo", "f"])
def test_qrnn_is_a_masked_convolution_then_pooling(width, pooling):
    d, n, B, T = 4, 5, 3, 9
    cell = perturbed(build("qrnn", d, n, width=width, pooling=pooling))
    x = window(T, B, d)
    c0, x_prev = 0.5 * window(1, B, n, seed=2)[0], window(1, B, d, seed=3)[0]
    state = (c0, x_prev) if width == 2 else (c0,)
    outputs, new_state = cell(x, state)
    expected, c_T = qrnn_reference(x, c0, x_prev, cell.weight.detach(), cell.bias.detach(), width, pooling)
    torch.testing.assert_close(outputs, expected)
    torch.testing.assert_close(new_state[0], c_T)
    if width == 2:
        torch.testing.assert_close(new_state[1], x[-1])  # the next window's x_{t−1}
    assert len(cell.initial_state(2)) == (2 if width == 2 else 1)


@pytest.mark.parametrize("width", [1, 2])
def test_qrnn_output_at_t_does_not_depend_on_later_inputs(width):
    d, n, B, T = 3, 4, 2, 8
    cell = perturbed(build("qrnn", d, n, width=width))
    x = window(T, B, d).requires_grad_()
    outputs, _ = cell(x, cell.initial_state(B, dtype=torch.float64))
    for t in range(T):
        (grad,) = torch.autograd.grad(outputs[t].sum(), x, retain_graph=True)
        assert torch.all(grad[t + 1 :] == 0), f"output {t} depends on a later input"
        assert grad[t].abs().sum() > 0
        if width == 2 and t > 0:
            assert grad[t - 1].abs().sum() > 0  # the filter reaches back one step
    changed = x.detach().clone()
    changed[5:] += 1.0
    again, _ = cell(changed, cell.initial_state(B, dtype=torch.float64))
    torch.testing.assert_close(again[:5], outputs[:5].detach())


def test_qrnn_initialisation_is_the_authors_linear_layer():
    d, n = 64, 128
    for width in (1, 2):
        cell = build("qrnn", d, n, width=width)
        bound = 1 / math.sqrt(width * d)
        for parameter in (cell.weight, cell.bias):
            assert parameter.abs().max() <= bound
            assert parameter.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.1)
    assert build("qrnn", d, n).weight.shape == (2 * 3 * n, d)
    assert build("qrnn", d, n, pooling="f").weight.shape == (2 * 2 * n, d)


@pytest.mark.parametrize(
    "options", [{"width": 3}, {"pooling": "ifo"}, {"scan": "fast"}], ids=["width", "pooling", "scan"]
)
def test_qrnn_refuses_unknown_options(options):
    with pytest.raises(CharlmError):
        parse_cell_options(CELLS.get("qrnn"), options)


def test_qrnn_scan_option_takes_every_scan_method():
    from charlm.cells.scan import SCAN_METHODS

    x = window(6, 2, 3)
    outputs = []
    for method in SCAN_METHODS:
        torch.manual_seed(0)
        cell = build("qrnn", 3, 4, scan=method)
        outputs.append(cell(x, cell.initial_state(2, dtype=torch.float64))[0])
    for other in outputs[1:]:
        torch.testing.assert_close(other, outputs[0])


# --- SRU --------------------------------------------------------------------------------------------


def sru_reference(x, c0, weight, v, bias, alpha, projected):
    """The paper's equations, one step at a time, with the skip α·x_t (or W′ x_t when d ≠ n)."""
    n = c0.shape[1]
    W, W_f, W_r = weight[:n], weight[n : 2 * n], weight[2 * n : 3 * n]
    v_f, v_r, b_f, b_r = v[:n], v[n:], bias[:n], bias[n:]
    c, outputs = c0, []
    for x_t in x:
        f = torch.sigmoid(W_f @ x_t.T + (v_f * c).T + b_f[:, None]).T
        r = torch.sigmoid(W_r @ x_t.T + (v_r * c).T + b_r[:, None]).T
        c_new = f * c + (1 - f) * (W @ x_t.T).T
        skip = (weight[3 * n :] @ x_t.T).T if projected else alpha * x_t
        outputs.append(r * c_new + (1 - r) * skip)
        c = c_new
    return torch.stack(outputs), c


@pytest.mark.parametrize("d", [6, 4], ids=["d=n", "d!=n"])
@pytest.mark.parametrize("options", [{}, {"highway_bias": -1.5}, {"rescale": False}], ids=["default", "bias", "plain"])
def test_sru_follows_the_paper(d, options):
    n, B, T = 6, 3, 10
    cell = perturbed(build("sru", d, n, **options))
    x = window(T, B, d)
    c0 = 0.5 * window(1, B, n, seed=2)[0]
    outputs, (c_T,) = cell(x, (c0,))
    b_r = options.get("highway_bias", 0.0)
    alpha = math.sqrt(1 + 2 * math.exp(b_r)) if options.get("rescale", True) else 1.0
    assert cell.alpha == pytest.approx(alpha)
    expected, expected_c = sru_reference(
        x, c0, cell.weight.detach(), cell.v.detach(), cell.bias.detach(), alpha, projected=d != n
    )
    torch.testing.assert_close(outputs, expected)
    torch.testing.assert_close(c_T, expected_c)


def test_sru_default_alpha_is_root_three():
    assert build("sru", 8, 8).alpha == pytest.approx(math.sqrt(3))


def test_sru_initialisation_is_published():
    d, n = 256, 256
    torch.manual_seed(0)
    cell = build("sru", d, n)
    weight = cell.weight.detach()
    assert weight[:n].var().item() == pytest.approx(1 / d, rel=0.05)  # W: variance 1/d
    assert weight[n : 3 * n].var().item() == pytest.approx(0.5 / d, rel=0.05)  # gates: scaled by √½
    assert cell.v.var().item() == pytest.approx(0.5, rel=0.15)  # v: variance ½
    assert torch.all(cell.bias == 0)
    biased = build("sru", d, n, highway_bias=-2.0)
    assert torch.all(biased.bias[:n] == 0) and torch.all(biased.bias[n:] == -2.0)
    projected = build("sru", 128, n)  # d ≠ n: W′ x_t carries α
    assert projected.weight.shape == (4 * n, 128)
    assert projected.weight[3 * n :].var().item() == pytest.approx(3 / 128, rel=0.05)


def test_sru_recurrence_gradients():
    generator = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64, requires_grad=True)

    assert torch.autograd.gradcheck(_ForgetRecurrence.apply, (rand(5, 2, 3), rand(5, 2, 3), rand(3), rand(2, 3)))


# --- IndRNN -----------------------------------------------------------------------------------------


def indrnn_reference(x, h0, W, u, b, bound):
    h, outputs = h0, []
    u = torch.where(u.abs() > bound, bound * torch.sign(u), u)
    for x_t in x:
        h = torch.relu(x_t @ W.T + u * h + b)
        outputs.append(h)
    return torch.stack(outputs), h


@pytest.mark.parametrize("options", [{}, {"gamma": 10.0, "horizon": 3}], ids=["default", "loose"])
def test_indrnn_follows_the_paper(options):
    d, n, B, T = 4, 5, 3, 12
    cell = perturbed(build("indrnn", d, n, **options))
    x = window(T, B, d)
    h0 = window(1, B, n, seed=2)[0].abs()
    outputs, (h_T,) = cell(x, (h0,))
    bound = options.get("gamma", 2.0) ** (1 / options.get("horizon", 50))
    expected, expected_h = indrnn_reference(x, h0, cell.weight_input.detach(), cell.u.detach(), cell.bias, bound)
    torch.testing.assert_close(outputs, expected)
    torch.testing.assert_close(h_T, expected_h)


def test_indrnn_bounds_u_in_the_forward():
    d, n, B, T = 3, 4, 2, 6
    cell = build("indrnn", d, n)
    bound = 2 ** (1 / 50)
    assert cell.config.bound == pytest.approx(bound)
    with torch.no_grad():
        cell.u.copy_(torch.tensor([5.0, -5.0, 0.5, -0.3], dtype=torch.float64))
    torch.testing.assert_close(cell.bounded_u(), torch.tensor([bound, -bound, 0.5, -0.3], dtype=torch.float64))
    x = window(T, B, d)
    h0 = torch.ones(B, n, dtype=torch.float64)
    outputs, _ = cell(x, (h0,))
    expected, _ = indrnn_reference(x, h0, cell.weight_input.detach(), cell.u.detach(), cell.bias.detach(), bound)
    torch.testing.assert_close(outputs, expected)
    (grad_u,) = torch.autograd.grad(outputs.sum(), cell.u)
    assert grad_u[0] == 0 and grad_u[1] == 0  # beyond the bound: clamped, no gradient
    assert cell.step(x[0], (h0,))[0].shape == (B, n)
    # a gradient through the bounded recurrence stays within γ = 2 over T steps: ∂h_T/∂h_0 ≤ γ
    with torch.no_grad():
        cell.u.fill_(5.0)
        cell.weight_input.zero_()
        cell.bias.fill_(1.0)
    h0 = torch.ones(1, n, dtype=torch.float64, requires_grad=True)
    hidden, _ = cell(torch.zeros(50, 1, d, dtype=torch.float64), (h0,))
    (grad_h0,) = torch.autograd.grad(hidden[-1].sum(), h0)
    torch.testing.assert_close(grad_h0, torch.full((1, n), 2.0, dtype=torch.float64))


def test_indrnn_initialisation_is_published():
    d, n = 200, 400
    torch.manual_seed(0)
    cell = build("indrnn", d, n)
    assert torch.all((cell.u >= 0) & (cell.u < 1))
    assert cell.u.mean().item() == pytest.approx(0.5, abs=0.05)
    assert torch.all(cell.bias == 0)
    bound = math.sqrt(1.2 / d)  # Kaiming uniform for a leaky ReLU of slope 2
    assert cell.weight_input.abs().max() <= bound
    assert cell.weight_input.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.05)


@pytest.mark.parametrize("options", [{"gamma": 0.0}, {"horizon": 0}], ids=["gamma", "horizon"])
def test_indrnn_refuses_bad_bounds(options):
    with pytest.raises(CharlmError):
        parse_cell_options(CELLS.get("indrnn"), options)


def test_indrnn_recurrence_gradients():
    generator = torch.Generator().manual_seed(0)
    pre = torch.randn(6, 2, 3, generator=generator, dtype=torch.float64, requires_grad=True)
    u = torch.rand(3, generator=generator, dtype=torch.float64, requires_grad=True)
    h0 = torch.rand(2, 3, generator=generator, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(_ReluRecurrence.apply, (pre, u, h0))
