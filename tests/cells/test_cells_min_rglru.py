"""minGRU, minLSTM (Feng et al. 2024) and Griffin's RG-LRU (De et al. 2024): the equations against
float64 implementations written here from the papers (not the cells' step), the published
initialisation, every scan form giving the same window, and minGRU's positive state."""

import math

import pytest
import torch
import torch.nn.functional as F

from cell_cases import randomise
from charlm.cells import CELLS, parse_cell_options
from charlm.cells.scan import SCAN_METHODS

T, B, D, N = 9, 3, 5, 4


def build(name, input_size=D, hidden=N, **options):
    torch.manual_seed(0)  # the same weights whatever the options
    cell_class = CELLS.get(name)
    cell = cell_class(input_size, hidden, parse_cell_options(cell_class, options)).double()
    randomise(cell)
    return cell


def paper_g(x):
    return torch.where(x >= 0, x + 0.5, torch.sigmoid(x))


def paper_min_gru(cell, inputs, h):
    """Feng et al. 2024, Algorithm (sequential mode): z = σ(Linear(x)), h̃ = g(Linear(x))."""
    W_z, W_h = cell.weight[:N], cell.weight[N:]
    b_z, b_h = cell.bias[:N], cell.bias[N:]
    outputs = []
    for x in inputs:
        z = 1 / (1 + torch.exp(-(x @ W_z.T + b_z)))
        h = (1 - z) * h + z * paper_g(x @ W_h.T + b_h)
        outputs.append(h)
    return torch.stack(outputs)


def paper_min_lstm(cell, inputs, h):
    """Feng et al. 2024: f, i = σ(Linear(x)); f′ = f/(f + i), i′ = i/(f + i); h̃ = g(Linear(x))."""
    W_f, W_i, W_h = cell.weight[:N], cell.weight[N : 2 * N], cell.weight[2 * N :]
    b_f, b_i, b_h = cell.bias[:N], cell.bias[N : 2 * N], cell.bias[2 * N :]
    outputs = []
    for x in inputs:
        f = 1 / (1 + torch.exp(-(x @ W_f.T + b_f)))
        i = 1 / (1 + torch.exp(-(x @ W_i.T + b_i)))
        h = f / (f + i) * h + i / (f + i) * paper_g(x @ W_h.T + b_h)
        outputs.append(h)
    return torch.stack(outputs)


def paper_rg_lru(cell, inputs, h):
    """De et al. 2024, eqs. (1)–(4) after the block's linear layer: a_t = σ(Λ)^{8 r_t}."""
    W_a, W_x = cell.gate_weight[:N], cell.gate_weight[N:]
    b_a, b_x = cell.gate_bias[:N], cell.gate_bias[N:]
    a = 1 / (1 + torch.exp(-cell.decay))
    outputs = []
    for u in inputs:
        x = u @ cell.weight_in.T + cell.bias_in
        r = 1 / (1 + torch.exp(-(x @ W_a.T + b_a)))
        i = 1 / (1 + torch.exp(-(x @ W_x.T + b_x)))
        a_t = torch.exp(8 * r * torch.log(a))
        h = a_t * h + torch.sqrt(1 - a_t**2) * (i * x)
        outputs.append(h)
    return torch.stack(outputs)


PAPERS = {"mingru": paper_min_gru, "minlstm": paper_min_lstm, "griffin-rglru": paper_rg_lru}


@pytest.mark.parametrize("method", SCAN_METHODS)
@pytest.mark.parametrize("name", PAPERS)
def test_forward_is_the_papers_equations_with_any_carried_state(name, method):
    torch.manual_seed(0)
    cell = build(name, scan=method)
    inputs = torch.randn(T, B, D, dtype=torch.float64)
    for h0 in (torch.randn(B, N, dtype=torch.float64), torch.zeros(B, N, dtype=torch.float64)):
        expected = PAPERS[name](cell, inputs, h0)
        outputs, (h_last,) = cell(inputs, (h0,))
        torch.testing.assert_close(outputs, expected)
        torch.testing.assert_close(h_last, expected[-1])
        step_h, stepped = h0, []
        for x in inputs:
            _, (step_h,) = cell.step(x, (step_h,))
            stepped.append(step_h)
        torch.testing.assert_close(torch.stack(stepped), expected)


@pytest.mark.parametrize("name", PAPERS)
def test_every_scan_method_gives_the_same_window_and_gradients(name):
    torch.manual_seed(0)
    inputs = torch.randn(50, B, D, dtype=torch.float64)
    h0 = torch.randn(B, N, dtype=torch.float64)
    results = {}
    for method in SCAN_METHODS:
        cell = build(name, scan=method)
        outputs, _ = cell(inputs, (h0,))
        grads = torch.autograd.grad(outputs.sum(), list(cell.parameters()))
        results[method] = outputs, grads
    loop_outputs, loop_grads = results["loop"]
    for method, (outputs, grads) in results.items():
        torch.testing.assert_close(outputs, loop_outputs, msg=method)
        for got, expected in zip(grads, loop_grads):
            torch.testing.assert_close(got, expected, msg=method)


@pytest.mark.parametrize("method", SCAN_METHODS)
def test_min_gru_state_stays_positive_from_a_positive_start(method):
    torch.manual_seed(0)
    cell = build("mingru", scan=method)
    with torch.no_grad():
        cell.weight.mul_(10)  # large pre-activations: z near 0 and 1, candidates far below zero
    inputs = torch.randn(200, B, D, dtype=torch.float64)
    for h0 in (torch.rand(B, N, dtype=torch.float64) + 1e-3, torch.zeros(B, N, dtype=torch.float64)):
        outputs, _ = cell(inputs, (h0,))
        assert (outputs > 0).all()


def test_min_cells_published_initialisation():
    """nn.Linear's default, as the paper's code: weights and biases in U(±1/√d)."""
    for name, blocks in (("mingru", 2), ("minlstm", 3)):
        cell = CELLS.get(name)(64, 32)
        bound = 1 / math.sqrt(64)
        assert cell.weight.shape == (blocks * 32, 64) and cell.bias.shape == (blocks * 32,)
        assert cell.weight.abs().max() <= bound and cell.bias.abs().max() <= bound
        assert cell.weight.std() > 0.4 * bound  # spread over the range, not zeros


def test_rg_lru_published_initialisation():
    torch.manual_seed(0)
    cell = CELLS.get("griffin-rglru")(48, 512)
    a = torch.sigmoid(cell.decay)
    assert a.min() >= 0.9 and a.max() <= 0.999
    assert a.min() < 0.91 and a.max() > 0.99  # spread over the interval
    assert cell.bias_in.abs().max() == 0 and cell.gate_bias.abs().max() == 0
    assert abs(cell.weight_in.std().item() - 1 / math.sqrt(48)) < 0.1 / math.sqrt(48)  # LeCun normal
    assert abs(cell.gate_weight.std().item() - 1 / math.sqrt(512)) < 0.1 / math.sqrt(512)
    # a_t = a^{c r_t} with c = 8: the decay at r_t = 1
    x = torch.randn(1, 48)
    r, _ = torch.sigmoid((x @ cell.weight_in.T) @ cell.gate_weight.T).chunk(2, dim=-1)
    a_t, _ = cell.coefficients(x @ cell.weight_in.T)
    torch.testing.assert_close(a_t, a ** (8 * r))


def test_rg_lru_accepts_any_input_width_and_normalises_the_input():
    """With a_t → 1 the input's share √(1 − a_t²) vanishes: a constant state stays put."""
    cell = build("griffin-rglru", input_size=7)
    with torch.no_grad():
        cell.decay.fill_(40.0)  # σ(Λ) = 1 − 4e-18: a_t = 1 in float64
    h0 = torch.randn(B, N, dtype=torch.float64)
    outputs, _ = cell(torch.randn(T, B, 7, dtype=torch.float64), (h0,))
    torch.testing.assert_close(outputs, h0.expand(T, B, N))


def test_scan_option_is_validated():
    from charlm.errors import CharlmError

    for name in PAPERS:
        with pytest.raises(CharlmError, match="scan must be one of"):
            parse_cell_options(CELLS.get(name), {"scan": "parallel"})


def test_log_coefficients_are_the_logs_of_the_coefficients():
    torch.manual_seed(0)
    for name in ("mingru", "minlstm"):
        cell = build(name)
        pre = 4 * torch.randn(T, B, cell.weight.shape[0], dtype=torch.float64)
        a, b = cell.coefficients(pre)
        log_a, log_b = cell.log_coefficients(pre)
        torch.testing.assert_close(log_a, a.log())
        torch.testing.assert_close(log_b, b.log())
        assert (a > 0).all() and (b > 0).all() and (F.relu(a - 1) == 0).all()
