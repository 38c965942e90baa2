"""linear-ru (Orvieto et al.'s Linear Recurrent Unit) and hgrn (Qin et al.'s HGRN) against independent
float64 implementations written from the papers, their published initialisation, and HGRN's lower bounds."""

import math

import pytest
import torch
import torch.nn.functional as F

from cell_cases import randomise, reloaded
from charlm.cells import CELLS, parse_cell_options
from charlm.errors import CharlmError
from charlm.model import LanguageModel, ModelConfig, count_parameters


def linear_ru(options=None, n=6, N=0):
    cell_class = CELLS.get("linear-ru")
    config = parse_cell_options(cell_class, {**(options or {}), "state_size": N})
    return cell_class.make_stack(n, n, 1, config)[0]


def lru_from_the_paper(cell, u, x0):
    """x_k = Λ x_{k−1} + γ ⊙ (B u_k), y_k = Re(C x_k) + D ⊙ u_k in complex128, then the activation."""
    lam = torch.exp(torch.complex(-torch.exp(cell.nu_log), torch.exp(cell.theta_log)))
    B = torch.complex(cell.B_re, cell.B_im) * torch.exp(cell.gamma_log).unsqueeze(-1)
    C = torch.complex(cell.C_re, cell.C_im)
    x = x0
    outputs = []
    for u_k in u:
        x = lam * x + u_k.to(torch.complex128) @ B.T
        outputs.append((x @ C.T).real + cell.D * u_k)
    y = torch.stack(outputs)
    activation = {"gelu": F.gelu, "identity": lambda v: v}[cell.config.activation]
    return activation(y), x


@pytest.mark.parametrize("scan", ["loop", "doubling", "chunked"])
@pytest.mark.parametrize("activation", ["gelu", "identity"])
def test_linear_ru_is_the_papers_complex_recurrence(scan, activation, double_precision):
    torch.manual_seed(0)
    cell = linear_ru({"scan": scan, "activation": activation}, n=6, N=5)
    randomise(cell)
    u = torch.randn(37, 3, 6)  # 37 steps: several chunks of 16, the last one short
    x0 = torch.complex(torch.randn(3, 5), torch.randn(3, 5))
    expected, expected_state = lru_from_the_paper(cell, u, x0)
    y, (x_re, x_im) = cell(u, (x0.real.clone(), x0.imag.clone()))
    torch.testing.assert_close(y, expected)
    torch.testing.assert_close(torch.complex(x_re, x_im), expected_state)
    stepped, state = [], (x0.real.clone(), x0.imag.clone())
    for u_k in u:
        output, state = cell.step(u_k, state)
        stepped.append(output)
    torch.testing.assert_close(torch.stack(stepped), expected)


def test_linear_ru_scans_agree_in_value_and_gradient(double_precision):
    torch.manual_seed(1)
    cell = linear_ru({}, n=5, N=7)
    randomise(cell)
    u = torch.randn(40, 2, 5, requires_grad=True)
    state = (torch.randn(2, 7), torch.randn(2, 7))
    results = {}
    for scan in ("loop", "doubling", "chunked"):
        cell.config.scan = scan
        y, _ = cell(u, state)
        results[scan] = (y, torch.autograd.grad(y.square().sum(), [u, *cell.parameters()]))
    for scan in ("doubling", "chunked"):
        torch.testing.assert_close(results[scan][0], results["loop"][0])
        for a, b in zip(results[scan][1], results["loop"][1]):
            torch.testing.assert_close(a, b)


def test_linear_ru_initialisation_is_the_published_ring():
    torch.manual_seed(0)
    r_min, r_max, max_phase = 0.5, 0.95, math.pi / 10
    cell = linear_ru({"r_min": r_min, "r_max": r_max, "max_phase": max_phase}, n=8, N=20000)
    with torch.no_grad():
        modulus = torch.exp(-torch.exp(cell.nu_log.double()))
        phase = torch.exp(cell.theta_log.double())
        gamma = torch.exp(cell.gamma_log.double())
    assert modulus.min() >= r_min - 1e-6 and modulus.max() <= r_max + 1e-6
    assert phase.min() >= 0 and phase.max() <= max_phase + 1e-6
    # uniform on the ring: |λ|² uniform on [r_min², r_max²], so its mean is their midpoint
    assert abs(modulus.square().mean().item() - (r_min**2 + r_max**2) / 2) < 0.01
    assert abs(phase.mean().item() - max_phase / 2) < 0.01
    torch.testing.assert_close(gamma, torch.sqrt(1 - modulus.square()), rtol=1e-5, atol=1e-6)
    re, im = cell.lambda_pair()
    torch.testing.assert_close(torch.complex(re, im).abs().double(), modulus, rtol=1e-5, atol=1e-6)
    # B's parts N(0, 1/(2d)), C's N(0, 1/N)
    assert abs(cell.B_re.std().item() - 1 / math.sqrt(2 * 8)) < 0.01
    assert abs(cell.C_im.std().item() - 1 / math.sqrt(20000)) < 0.001


def test_linear_ru_defaults_and_options_refused():
    cell = linear_ru(n=4)
    assert cell.state_size == 4 and cell.config.r_min == 0.9 and cell.config.r_max == 0.999
    assert cell.config.max_phase == pytest.approx(2 * math.pi)
    cell_class = CELLS.get("linear-ru")
    for options in ({"scan": "log"}, {"r_min": 0.9, "r_max": 0.5}, {"activation": "relu"}, {"state_size": -1}):
        with pytest.raises(CharlmError):
            parse_cell_options(cell_class, options)
    with pytest.raises(CharlmError, match="embed-size"):
        LanguageModel(ModelConfig("linear-ru", vocab_size=5, hidden_size=6, embed_size=3))


def test_linear_ru_runs_under_bfloat16_autocast():
    torch.manual_seed(0)
    model = LanguageModel(ModelConfig("linear-ru", vocab_size=7, hidden_size=8, layers=2))
    tokens = torch.randint(7, (2, 30))
    reference, _ = model(tokens, model.initial_state(2))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, state = model(tokens, model.initial_state(2))
    logits.float().sum().backward()
    assert state[0][0].dtype == torch.float32
    torch.testing.assert_close(logits.float(), reference, atol=0.1, rtol=0.05)


# --- hgrn -------------------------------------------------------------------------------------------


def hgrn_layer_from_the_paper(layer, gamma, x, h):
    """One HGRU layer, real form, step by step: f, i, g, h, o from the paper's equations."""
    W_f, W_i, W_g = layer.weight_input.chunk(3)
    b_f, b_i, b_g = layer.bias_input.chunk(3)
    bound = gamma[layer.layer_index] if gamma is not None else 0.0
    outputs = []
    for x_t in x:
        f = bound + (1 - bound) * torch.sigmoid(x_t @ W_f.T + b_f)
        i = x_t @ W_i.T + b_i
        i = i * torch.sigmoid(i)  # SiLU
        g = torch.sigmoid(x_t @ W_g.T + b_g)
        h = f * h + (1 - f) * i
        z = h * g
        mean, var = z.mean(-1, keepdim=True), z.var(-1, unbiased=False, keepdim=True)
        normed = (z - mean) / torch.sqrt(var + 1e-5) * layer.norm_weight + layer.norm_bias
        outputs.append(normed @ layer.weight_output.T + layer.bias_output)
    return torch.stack(outputs), h


def paper_bounds(Gamma):
    """γ = cumsum(softmax(Γ, over the layers)) with the first layer's bound taken to 0."""
    weights = torch.exp(Gamma) / torch.exp(Gamma).sum(0)
    return torch.cumsum(weights, 0) - weights[0]


@pytest.mark.parametrize("lower_bound", [True, False])
def test_hgrn_stack_is_the_papers_layers(lower_bound, double_precision):
    torch.manual_seed(0)
    cell_class = CELLS.get("hgrn")
    config = parse_cell_options(cell_class, {"lower_bound": lower_bound})
    layers = cell_class.make_stack(5, 6, 3, config)
    for layer in layers:
        randomise(layer, seed=layer.layer_index)
    gamma = paper_bounds(layers[0].lower_bounds.logits) if lower_bound else None
    x = torch.randn(9, 2, 5)
    for layer in layers:
        h0 = torch.randn(2, 6)
        expected, expected_h = hgrn_layer_from_the_paper(layer, gamma, x, h0)
        output, (h,) = layer(x, (h0,))
        torch.testing.assert_close(output, expected)
        torch.testing.assert_close(h, expected_h)
        x = output


def test_hgrn_lower_bounds_rise_with_depth_and_are_shared():
    torch.manual_seed(0)
    model = LanguageModel(ModelConfig("hgrn", vocab_size=7, hidden_size=8, layers=4))
    shared = model.layers[0].lower_bounds
    assert all(layer.lower_bounds is shared for layer in model.layers)
    assert [layer.layer_index for layer in model.layers] == [0, 1, 2, 3]
    for randomised in (False, True):
        if randomised:
            randomise(shared)
        bounds = torch.stack([torch.as_tensor(layer.lower_bound()) * torch.ones(8) for layer in model.layers])
        assert torch.all(bounds[0] == 0)
        assert torch.all(bounds[1:] > bounds[:-1]) and torch.all(bounds < 1)
        torch.testing.assert_close(bounds, paper_bounds(shared.logits).detach(), check_dtype=False)
        if not randomised:  # Γ = 0: evenly spaced, (k − 1)/L for layer k
            torch.testing.assert_close(bounds[:, 0], torch.tensor([0.0, 0.25, 0.5, 0.75]))
    # every layer's gate gets its bound: a gradient reaches Γ
    tokens = torch.randint(7, (2, 5))
    logits, _ = model(tokens, model.initial_state(2))
    logits.sum().backward()
    assert shared.logits.grad is not None and shared.logits.grad.abs().sum() > 0


def test_hgrn_parameters_count_and_load_once():
    torch.manual_seed(0)
    d = n = 8
    model = LanguageModel(ModelConfig("hgrn", vocab_size=7, hidden_size=n, layers=3))
    per_layer = 3 * d * n + n * n + 7 * n  # with its row of Γ (L × n in all)
    assert count_parameters(model) == 3 * per_layer + 7 * d + (n * 7 + 7)
    randomise(model)
    clone = reloaded(model)
    assert all(layer.lower_bounds is clone.layers[0].lower_bounds for layer in clone.layers)
    torch.testing.assert_close(clone.layers[0].lower_bounds.logits, model.layers[0].lower_bounds.logits)
    tokens = torch.randint(7, (2, 6))
    torch.testing.assert_close(
        clone(tokens, clone.initial_state(2))[0], model(tokens, model.initial_state(2))[0], rtol=0, atol=0
    )


def test_hgrn_scan_option_is_checked():
    with pytest.raises(CharlmError, match="scan"):
        parse_cell_options(CELLS.get("hgrn"), {"scan": "sideways"})
