"""Cell-specific checks for rnn, mgu, mi-rnn, scrn, rhn and delta-rnn, where an equation is easy to
get subtly wrong. The generic checks (tests/test_cells.py) already run every case in cell_cases.py.
"""

import math
import warnings

import pytest
import torch

import test_cells as generic
from cell_cases import CellCase, loss_after_overfitting, randomise
from charlm.cells import CELLS, parse_cell_options, parse_key_values
from charlm.cells.base import library_rnn
from charlm.cells.delta_rnn import DeltaRNN, DeltaRNNConfig
from charlm.cells.elman import Elman, ElmanConfig
from charlm.cells.mgu import MinimalGatedUnit
from charlm.cells.multiplicative import MultiplicativeIntegration, MultiplicativeRNN
from charlm.cells.rhn import HighwayWindow, RecurrentHighwayNetwork, RHNConfig
from charlm.cells.scrn import SCRN, SCRNConfig
from charlm.errors import CharlmError
from charlm.model import LanguageModel, ModelConfig, OneHot, count_parameters


def sigmoid(v):
    return 1.0 / (1.0 + math.exp(-v))


def set_(parameter, values):
    with torch.no_grad():
        parameter.copy_(torch.as_tensor(values, dtype=parameter.dtype).reshape(parameter.shape))


def both_paths(cell, x, state):
    """(step output, step state, forward output, forward state) for one step ``x`` of shape [B, d]."""
    step_out, step_state = cell.step(x, state)
    fwd_out, fwd_state = cell(x.unsqueeze(0), state)
    return step_out, step_state, fwd_out[0], fwd_state


def test_all_baselines_are_registered():
    assert {"rnn", "mgu", "mi-rnn", "scrn", "rhn", "delta-rnn"} <= set(CELLS.names())


# --- rhn ---------------------------------------------------------------------------------------


def test_rhn_two_micro_layers_by_hand():
    """n = d = 1, L = 2: the coupled carry gate, and x entering micro-layer 1 only."""
    cell = RecurrentHighwayNetwork(1, 1, RHNConfig(depth=2))
    set_(cell.weight_input, [0.5, -0.3])  # W_H, W_T
    set_(cell.weight_hidden, [[0.2, 0.4], [-0.7, 0.6]])  # (R_H,1, R_T,1), (R_H,2, R_T,2)
    set_(cell.bias, [[0.1, -2.0], [0.05, -1.0]])  # (b_H,1, b_T,1), (b_H,2, b_T,2)
    x, s0 = 1.5, 0.3
    h1 = math.tanh(0.5 * x + 0.2 * s0 + 0.1)
    t1 = sigmoid(-0.3 * x + 0.4 * s0 - 2.0)
    s1 = h1 * t1 + s0 * (1 - t1)
    h2 = math.tanh(-0.7 * s1 + 0.05)
    t2 = sigmoid(0.6 * s1 - 1.0)
    s2 = h2 * t2 + s1 * (1 - t2)
    for output in both_paths(cell, torch.tensor([[x]]), (torch.tensor([[s0]]),)):
        value = output[0] if isinstance(output, tuple) else output
        assert value.item() == pytest.approx(s2, rel=1e-6)


def test_rhn_init_gate_bias_and_parameter_shapes():
    cell = RecurrentHighwayNetwork(3, 4, RHNConfig(depth=3, gate_bias=-4.0))
    assert torch.equal(cell.bias[:, 4:], torch.full((3, 4), -4.0))
    assert torch.equal(cell.bias[:, :4], torch.zeros(3, 4))
    assert count_parameters(cell) == 2 * 3 * 4 + 2 * 3 * 16 + 2 * 3 * 4


# --- scrn --------------------------------------------------------------------------------------


def test_rhn_hand_written_backward_passes_gradcheck(double_precision):
    """HighwayWindow's backward against finite differences, every input including s₀ and the
    gradient arriving through the returned state."""
    torch.manual_seed(0)
    T, B, n, L = 4, 3, 5, 3
    arguments = [torch.randn(T, B, 2 * n), torch.randn(B, n), 0.5 * torch.randn(L, 2 * n, n), torch.randn(L, 2 * n)]
    arguments = [argument.requires_grad_() for argument in arguments]
    assert torch.autograd.gradcheck(HighwayWindow.apply, arguments)


def test_rhn_uses_its_hand_written_backward_only_where_it_applies():
    cell = RecurrentHighwayNetwork(4, 5, RHNConfig(depth=2))
    inputs, state = torch.randn(3, 2, 4), cell.initial_state(2)
    outputs, _ = cell(inputs, state)
    assert type(outputs.grad_fn).__name__ == "HighwayWindowBackward"
    with torch.autocast("cpu", dtype=torch.bfloat16):
        outputs, _ = cell(inputs, state)
    assert type(outputs.grad_fn).__name__ != "HighwayWindowBackward"


def test_scrn_context_update_with_fixed_alpha():
    torch.manual_seed(0)
    cell = SCRN(3, 5, SCRNConfig(context_size=2))
    assert not any(name == "alpha" for name, _ in cell.named_parameters())
    x, h0, s0 = torch.randn(4, 3), torch.randn(4, 5), torch.randn(4, 2)
    s1 = 0.05 * x @ cell.B.T + 0.95 * s0
    h1 = torch.sigmoid(s1 @ cell.P.T + x @ cell.A.T + h0 @ cell.R.T)
    step_out, (h, s), fwd_out, _ = both_paths(cell, x, (h0, s0))
    torch.testing.assert_close(s, s1)
    torch.testing.assert_close(h, h1)
    for output in (step_out, fwd_out):  # the depth output is [h_t; s_t]
        torch.testing.assert_close(output, torch.cat([h1, s1], dim=-1))


def test_scrn_learnable_alpha_is_per_unit_and_learns():
    torch.manual_seed(0)
    cell = SCRN(3, 5, SCRNConfig(context_size=3, learnable_alpha=True, alpha=0.9))
    assert torch.equal(cell.alpha.detach(), torch.full((3,), 0.9))
    set_(cell.alpha, [0.0, 0.5, 1.0])
    x, s0 = torch.randn(2, 3), torch.randn(2, 3)
    _, (_, s), _, (_, s_fwd) = both_paths(cell, x, (torch.zeros(2, 5), s0))
    drive = x @ cell.B.T
    expected = torch.stack([drive[:, 0], 0.5 * drive[:, 1] + 0.5 * s0[:, 1], s0[:, 2]], dim=-1)
    torch.testing.assert_close(s, expected)
    torch.testing.assert_close(s_fwd, expected)
    s.sum().backward()
    assert cell.alpha.grad is not None and cell.alpha.grad.abs().sum() > 0


def test_scrn_default_context_size_and_stacked_widths():
    assert SCRN(4, 25).context_size == 2
    assert SCRN(4, 5).context_size == 1
    model = LanguageModel(ModelConfig("scrn", vocab_size=7, hidden_size=20, layers=2))
    assert [layer.output_size for layer in model.layers] == [22, 22]
    assert model.layers[1].input_size == 22
    assert model.head.in_features == 22


def test_scrn_bias_option():
    cell = SCRN(3, 5, SCRNConfig(bias=True))
    assert cell.bias.shape == (5,) and count_parameters(cell) == count_parameters(SCRN(3, 5)) + 5


# --- mi-rnn ------------------------------------------------------------------------------------


def test_mi_rnn_initial_values_and_reduction_to_a_tanh_rnn():
    torch.manual_seed(0)
    cell = MultiplicativeRNN(3, 4)
    mi = cell.integration
    for parameter in (mi.alpha, mi.beta_hidden, mi.beta_input):
        assert torch.equal(parameter.detach(), torch.ones(4))
    assert torch.equal(mi.bias.detach(), torch.zeros(4))
    set_(mi.alpha, torch.zeros(4))  # α = 0, β₁ = β₂ = 1: a plain tanh RNN
    set_(mi.bias, torch.randn(4))
    x, h0 = torch.randn(2, 3), torch.randn(2, 4)
    expected = torch.tanh(x @ cell.weight_input.T + h0 @ cell.weight_hidden.T + mi.bias)
    for output in both_paths(cell, x, (h0,))[::2]:
        torch.testing.assert_close(output, expected)


def test_mi_block_matches_its_equation_and_fast_form():
    torch.manual_seed(0)
    block = MultiplicativeIntegration(4, alpha_init=2.0)
    randomise(block)
    a, u = torch.randn(3, 4), torch.randn(3, 4)
    expected = torch.tanh(block.alpha * a * u + block.beta_hidden * u + block.beta_input * a + block.bias)
    torch.testing.assert_close(block(a, u), expected)
    torch.testing.assert_close(block.combine(u, block.prepare(a)), expected)


# --- delta-rnn ---------------------------------------------------------------------------------


def test_delta_rnn_second_order_uses_the_mi_block_with_alpha_two():
    cell = DeltaRNN(3, 4)
    assert isinstance(cell.inner, MultiplicativeIntegration)
    assert torch.equal(cell.inner.alpha.detach(), torch.full((4,), 2.0))
    assert torch.equal(cell.gate_bias.detach(), torch.zeros(4))


@pytest.mark.parametrize("outer", ["identity", "tanh"])
def test_delta_rnn_first_order_inner_and_outer_function(outer):
    torch.manual_seed(0)
    cell = DeltaRNN(3, 4, DeltaRNNConfig(inner="first", outer=outer))
    randomise(cell)
    x, h0 = torch.randn(2, 3), torch.randn(2, 4)
    a, u = x @ cell.weight_input.T, h0 @ cell.weight_hidden.T
    z = torch.tanh(u + a + cell.inner.bias)
    r = torch.sigmoid(a + cell.gate_bias)  # the gate reuses a = W x
    mixed = (1 - r) * z + r * h0
    expected = torch.tanh(mixed) if outer == "tanh" else mixed
    step_out, (step_h,), fwd_out, (fwd_h,) = both_paths(cell, x, (h0,))
    for value in (step_out, step_h, fwd_out, fwd_h):
        torch.testing.assert_close(value, expected)


def test_delta_rnn_dropout_only_in_training_with_inverted_scaling():
    torch.manual_seed(0)
    p = 0.25
    cell = DeltaRNN(3, 64, DeltaRNNConfig(dropout=p))
    set_(cell.gate_bias, torch.full((64,), -1e4))  # r = 0, Φ = identity: h_t = dropout(z_t)
    inputs, h0 = torch.randn(1, 200, 3), torch.randn(200, 64)

    cell.eval()
    clean, _ = cell(inputs, (h0,))
    again, _ = cell(inputs, (h0,))
    torch.testing.assert_close(clean, again)
    torch.testing.assert_close(clean[0], cell.step(inputs[0], (h0,))[0])

    cell.train()
    for dropped in (cell(inputs, (h0,))[0][0], cell.step(inputs[0], (h0,))[0]):
        kept = dropped != 0
        torch.testing.assert_close(dropped[kept], clean[0][kept] / (1 - p))
        assert abs((~kept).float().mean().item() - p) < 0.03


def test_delta_rnn_one_hot_model_builds_and_trains_a_step():
    torch.manual_seed(0)
    vocab, n = 7, 8
    model = LanguageModel(ModelConfig("delta-rnn", vocab_size=vocab, hidden_size=n, embed_size=0))
    assert isinstance(model.embedding, OneHot)
    assert model.layers[0].input_size == vocab
    assert count_parameters(model) == (vocab * n + n * n + 5 * n) + (n * vocab + vocab)
    tokens = torch.randint(0, vocab, (2, 12))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    losses = []
    for _ in range(2):
        logits, _ = model(tokens[:, :-1], model.initial_state(2))
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert math.isfinite(losses[0]) and losses[1] < losses[0]


# --- mgu and rnn -------------------------------------------------------------------------------


def test_mgu_gate_convention():
    """f → 1 replaces h by the candidate; f → 0 keeps h (h_t = (1 − f) ⊙ h + f ⊙ ĥ)."""
    torch.manual_seed(0)
    cell = MinimalGatedUnit(3, 4)
    x, h0 = torch.randn(2, 3), torch.randn(2, 4)
    set_(cell.bias, torch.cat([torch.full((4,), -1e4), torch.zeros(4)]))
    torch.testing.assert_close(cell.step(x, (h0,))[0], h0)
    set_(cell.bias, torch.cat([torch.full((4,), 1e4), torch.zeros(4)]))
    W_h, U_h = cell.weight_input[4:], cell.weight_hidden[4:]
    torch.testing.assert_close(cell.step(x, (h0,))[0], torch.tanh(x @ W_h.T + h0 @ U_h.T))


@pytest.mark.parametrize("activation", ["tanh", "sigmoid", "relu"])
def test_elman_step_is_the_equation(activation):
    torch.manual_seed(0)
    cell = Elman(3, 4, ElmanConfig(activation=activation))
    randomise(cell)
    x, h0 = torch.randn(2, 3), torch.randn(2, 4)
    phi = {"tanh": torch.tanh, "sigmoid": torch.sigmoid, "relu": torch.relu}[activation]
    expected = phi(x @ cell.weight_input.T + h0 @ cell.weight_hidden.T + cell.bias)
    for output in both_paths(cell, x, (h0,))[::2]:
        torch.testing.assert_close(output, expected)


SIGMOID_RNN = CellCase("rnn", {"activation": "sigmoid"}, lambda d, n: d * n + n * n + n)


def test_sigmoid_elman_passes_the_generic_checks():
    """Kept out of cell_cases.py only because it needs more than the generic 120 overfit steps."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        generic.test_forward_agrees_with_reference_step_and_gradients(SIGMOID_RNN, None, torch.device("cpu"))
        generic.test_carried_state_equals_one_long_run(SIGMOID_RNN, None)
        generic.test_save_load_gives_identical_outputs(SIGMOID_RNN, None)
    finally:
        torch.set_default_dtype(previous)
    generic.test_parameter_count_matches_spec_formula(SIGMOID_RNN)
    assert loss_after_overfitting(SIGMOID_RNN, steps=160, target=0.15) < 0.15


# --- options from strings ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "cell, pairs, expected",
    [
        ("rnn", ["activation=relu"], {"activation": "relu"}),
        ("rhn", ["depth=3", "gate_bias=-4"], {"depth": 3, "gate_bias": -4.0}),
        (
            "scrn",
            ["context-size=7", "learnable_alpha=yes", "alpha=0.9", "bias=on"],
            {"context_size": 7, "learnable_alpha": True, "alpha": 0.9, "bias": True},
        ),
        ("scrn", ["context_size=none"], {"context_size": None}),
        (
            "delta-rnn",
            ["inner=first", "outer=tanh", "alpha_init=1.5", "dropout=0.1"],
            {"inner": "first", "outer": "tanh", "alpha_init": 1.5, "dropout": 0.1},
        ),
    ],
)
def test_options_parse_from_strings(cell, pairs, expected):
    config = parse_cell_options(CELLS.get(cell), parse_key_values(pairs))
    for key, value in expected.items():
        assert getattr(config, key) == value and type(getattr(config, key)) is type(value)


def test_options_reach_the_cell_through_the_model():
    model = LanguageModel(ModelConfig("rhn", vocab_size=5, hidden_size=4, layers=2, cell_options={"depth": "3"}))
    assert all(layer.weight_hidden.shape[0] == 3 for layer in model.layers)


@pytest.mark.parametrize(
    "cell, pair",
    [
        ("rnn", "activation=softsign"),
        ("rhn", "depth=0"),
        ("rhn", "depth=three"),
        ("rhn", "gate_bias=low"),
        ("scrn", "alpha=1.5"),
        ("scrn", "context_size=0"),
        ("scrn", "learnable_alpha=maybe"),
        ("delta-rnn", "inner=third"),
        ("delta-rnn", "outer=relu"),
        ("delta-rnn", "dropout=1.0"),
        ("mgu", "depth=2"),
        ("mi-rnn", "alpha=2"),
    ],
)
def test_bad_option_values_are_user_errors(cell, pair):
    with pytest.raises(CharlmError):
        parse_cell_options(CELLS.get(cell), parse_key_values([pair]))
    with pytest.raises(CharlmError):
        LanguageModel(ModelConfig(cell, vocab_size=5, hidden_size=4, cell_options=parse_key_values([pair])))


@pytest.mark.parametrize("peephole, expected", [("full", 1_274_804), ("diagonal", 1_245_104), ("none", 1_244_804)])
def test_the_delta_rnn_papers_lstm_count_needs_full_peepholes(peephole, expected):
    """Table 2 of the Delta-RNN paper: an LSTM of 100 units on 2404 PTB subwords (one-hot inputs)
    has 1,274,804 parameters; only full n × n peephole matrices give that count."""
    model = LanguageModel(
        ModelConfig("lstm", vocab_size=2404, hidden_size=100, embed_size=0, cell_options={"peephole": peephole})
    )
    assert count_parameters(model) == expected


def test_peephole_forms_read_from_strings_and_old_booleans():
    from charlm.cells.lstm import LSTMConfig

    assert [LSTMConfig(value).peephole for value in (True, False, "yes", "off", "FULL", "diagonal")] == [
        "diagonal",
        "none",
        "diagonal",
        "none",
        "full",
        "diagonal",
    ]
    with pytest.raises(CharlmError, match="peephole must be one of none, diagonal, full, not 'maybe'"):
        parse_cell_options(CELLS.get("lstm"), {"peephole": "maybe"})


def test_a_fused_rnn_in_bf16_runs_its_weights_in_bf16_without_cudnns_warning_at_every_call():
    """cuDNN warns at every call that bf16 copies of the weights are not one buffer (5,000 lines in a
    run of 5,000 steps, seen on an H200); a stand-in kernel that warns as it does is kept quiet."""
    seen = []

    def kernel(inputs, hidden, weights, *flags):
        seen.append({inputs.dtype, hidden.dtype, *(weight.dtype for weight in weights)})
        warnings.warn("RNN module weights are not part of single contiguous chunk of memory.", UserWarning)
        return inputs, hidden

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            library_rnn(kernel, torch.randn(3, 2, 4), torch.randn(1, 2, 4), [torch.randn(16, 4)], True)
    assert seen == [{torch.bfloat16}]
