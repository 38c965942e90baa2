"""Grid LSTM and high-order gating beyond the generic cell tests (cells.md, grid-lstm, ho-lstm, ho-gru)."""

import dataclasses

import pytest
import torch

from cell_cases import randomise
from charlm.cells import CELLS, parse_cell_options, parse_key_values
from charlm.cells.grid_lstm import GridLSTM, GridLSTMConfig
from charlm.cells.gru import GRU
from charlm.cells.high_order import HighOrderGRU, HighOrderLSTM, HighOrderLSTMConfig
from charlm.cells.lstm import LSTM
from charlm.errors import CharlmError
from charlm.model import LanguageModel, ModelConfig, count_parameters
from charlm.sizing import size_for_budget


def meta_count(config: ModelConfig) -> int:
    with torch.device("meta"):
        return count_parameters(LanguageModel(config))


# --- Grid LSTM: parameter counts -------------------------------------------------------------


@pytest.mark.parametrize("layers", [1, 2, 3, 6])
def test_grid_lstm_paper_enwik8_model_has_16_83M_parameters(layers):
    V, n = 205, 1000
    expected = 2 * V * n + (16 * n * n + 8 * n) + (2 * n + 1) * V  # projections + one tied block + softmax
    count = meta_count(ModelConfig("grid-lstm", vocab_size=V, hidden_size=n, layers=layers))
    assert count == expected == 16_828_205
    assert count == pytest.approx(16.83e6, rel=1e-3)


def test_grid_lstm_tied_count_is_independent_of_depth_untied_grows_per_layer():
    V, n = 11, 8
    outside = 2 * V * n + (2 * n + 1) * V
    block = 16 * n * n + 8 * n
    for layers in (1, 2, 4):
        tied = meta_count(ModelConfig("grid-lstm", vocab_size=V, hidden_size=n, layers=layers))
        untied = meta_count(
            ModelConfig("grid-lstm", vocab_size=V, hidden_size=n, layers=layers, cell_options={"tied": False})
        )
        assert tied == outside + block
        assert untied == outside + layers * block


def test_tied_stack_is_one_block_and_one_gradient_group():
    model = LanguageModel(ModelConfig("grid-lstm", vocab_size=11, hidden_size=8, layers=3))
    assert model.layers[0] is model.layers[1] is model.layers[2]
    assert [name for name in model.layer_groups() if name.startswith("layer")] == ["layer0"]
    untied_config = ModelConfig("grid-lstm", vocab_size=11, hidden_size=8, layers=3, cell_options={"tied": False})
    untied = LanguageModel(untied_config)
    assert len({id(layer) for layer in untied.layers}) == 3


@pytest.mark.parametrize("tied", [True, False])
def test_size_for_budget_grid_lstm_1M(tied):
    config = ModelConfig("grid-lstm", vocab_size=50, hidden_size=1, layers=3, cell_options={"tied": tied})
    hidden, count = size_for_budget(config, 1_000_000)
    assert abs(count - 1_000_000) / 1_000_000 < 0.03
    assert count == meta_count(dataclasses.replace(config, hidden_size=hidden))


# --- Grid LSTM: the function it computes -----------------------------------------------------


def hand_lstm_transform(W, b, H, m, output):
    """One LSTM transform of the Grid LSTM paper, gate by gate (rows u, f, o, c)."""
    n = m.shape[-1]

    def gate(k):
        return H @ W[k * n : (k + 1) * n].T + b[k * n : (k + 1) * n]

    g_u, g_f, g_o, g_c = torch.sigmoid(gate(0)), torch.sigmoid(gate(1)), torch.sigmoid(gate(2)), torch.tanh(gate(3))
    m_new = g_f * m + g_u * g_c
    h_new = torch.tanh(g_o * m_new) if output == "paper" else g_o * torch.tanh(m_new)
    return h_new, m_new


@pytest.mark.parametrize("output", ["paper", "standard"])
def test_grid_lstm_priority_to_depth_matches_a_hand_written_two_step_computation(output):
    torch.manual_seed(0)
    n, B = 4, 2
    cell = GridLSTM(2 * n, n, GridLSTMConfig(output=output))
    randomise(cell)
    inputs = torch.randn(2, B, 2 * n)
    h_start, m_start = torch.randn(B, n), torch.randn(B, n)
    outputs, (h_out, m_out) = cell(inputs, (h_start, m_start))

    Wt, bt, Wd, bd = cell.time_weight, cell.time_bias, cell.depth_weight, cell.depth_bias
    h_time, m_time = h_start, m_start
    for t in range(2):
        h_depth, m_depth = inputs[t, :, :n], inputs[t, :, n:]
        h_time, m_time = hand_lstm_transform(Wt, bt, torch.cat([h_time, h_depth], 1), m_time, output)  # time first
        h_depth_new, m_depth_new = hand_lstm_transform(Wd, bd, torch.cat([h_time, h_depth], 1), m_depth, output)
        torch.testing.assert_close(outputs[t], torch.cat([h_depth_new, m_depth_new], 1))
    torch.testing.assert_close(h_out, h_time)
    torch.testing.assert_close(m_out, m_time)

    # The ordering matters: a depth transform fed the old time hidden would give something else.
    h_depth, m_depth = inputs[0, :, :n], inputs[0, :, n:]
    stale = hand_lstm_transform(Wd, bd, torch.cat([h_start, h_depth], 1), m_depth, output)
    assert not torch.allclose(torch.cat(stale, 1), outputs[0], atol=1e-4)


def test_grid_lstm_output_standard_and_paper_differ_on_the_same_weights():
    torch.manual_seed(0)
    paper = GridLSTM(8, 4, GridLSTMConfig(output="paper"))
    standard = GridLSTM(8, 4, GridLSTMConfig(output="standard"))
    randomise(paper)
    standard.load_state_dict(paper.state_dict())
    inputs = torch.randn(5, 2, 8)
    a, _ = paper(inputs, paper.initial_state(2))
    b, _ = standard(inputs, standard.initial_state(2))
    assert not torch.allclose(a, b, atol=1e-3)


@pytest.mark.parametrize("depth", ["tanh", "identity"])
@pytest.mark.parametrize("tied", [True, False])
def test_grid_lstm_plain_depth_variants_build_and_run_in_a_two_layer_model(depth, tied):
    torch.manual_seed(0)
    V, n = 11, 6
    model = LanguageModel(
        ModelConfig("grid-lstm", vocab_size=V, hidden_size=n, layers=2, cell_options={"depth": depth, "tied": tied})
    )
    assert model.embedding.embedding_dim == n  # no depth memory: the depth stream is h_depth alone
    assert model.head.in_features == n
    assert all(layer.output_size == n for layer in model.layers)
    logits, state = model(torch.randint(0, V, (3, 7)), model.initial_state(3))
    assert logits.shape == (3, 7, V)
    assert torch.isfinite(logits).all()
    assert [tuple(t.shape) for t in state[1]] == [(3, n), (3, n)]

    # The depth output is act(V H′ + b) on H′ = [h_time′; h_depth].
    cell = model.layers[0]
    x, state0 = torch.randn(3, n), (torch.randn(3, n), torch.randn(3, n))
    output, (h_time, _) = cell.step(x, state0)
    pre = torch.cat([h_time, x], 1) @ cell.depth_weight.T + cell.depth_bias
    torch.testing.assert_close(output, torch.tanh(pre) if depth == "tanh" else pre)


def test_grid_lstm_forget_biases_start_at_one():
    n = 5
    cell = GridLSTM(2 * n, n)
    for bias in (cell.time_bias, cell.depth_bias):
        assert torch.equal(bias[n : 2 * n], torch.ones(n))
        assert torch.count_nonzero(bias) == n


def test_grid_lstm_rejects_a_mismatched_embedding():
    with pytest.raises(CharlmError, match="embed-size 16"):
        LanguageModel(ModelConfig("grid-lstm", vocab_size=11, hidden_size=8, embed_size=8))
    with pytest.raises(CharlmError):
        LanguageModel(ModelConfig("grid-lstm", vocab_size=11, hidden_size=8, embed_size=0))
    with pytest.raises(ValueError, match="input size must be 16"):
        GridLSTM(8, 8)


# --- High-order gating -----------------------------------------------------------------------


@pytest.mark.parametrize("form", ["factored", "symmetric"])
@pytest.mark.parametrize("cells", [(HighOrderLSTM, LSTM), (HighOrderGRU, GRU)], ids=["lstm", "gru"])
def test_high_order_cell_with_zero_mixing_is_the_plain_cell(cells, form):
    high_order_class, plain_class = cells
    torch.manual_seed(0)
    n = 6
    high_order = high_order_class(n, n, high_order_class.Config(ho_form=form, ho_kernels=3, ho_rank=2))
    randomise(high_order)
    plain = plain_class(n, n)
    plain.load_state_dict({k: v for k, v in high_order.state_dict().items() if not k.startswith("second_order.")})
    inputs, state = torch.randn(5, 2, n), plain.initial_state(2)
    state = tuple(torch.randn_like(t) for t in state)
    with torch.no_grad():
        different, _ = high_order(inputs, state)
        high_order.second_order.mixing.zero_()
    expected, expected_state = plain(inputs, state)
    for run in (high_order, lambda xs, s: _run_steps(high_order, xs, s)):
        got, got_state = run(inputs, state)
        torch.testing.assert_close(got, expected)
        for a, b in zip(got_state, expected_state):
            torch.testing.assert_close(a, b)
    assert not torch.allclose(different, expected, atol=1e-4)


def _run_steps(cell, inputs, state):
    outputs = []
    for x in inputs:
        output, state = cell.step(x, state)
        outputs.append(output)
    return torch.stack(outputs), state


@pytest.mark.parametrize("cell", ["ho-lstm", "ho-gru"])
def test_symmetric_form_needs_input_size_equal_to_hidden_size(cell):
    with pytest.raises(CharlmError, match="embed-size 8"):
        LanguageModel(
            ModelConfig(cell, vocab_size=11, hidden_size=8, embed_size=5, cell_options={"ho_form": "symmetric"})
        )
    model = LanguageModel(ModelConfig(cell, vocab_size=11, hidden_size=8, cell_options={"ho_form": "symmetric"}))
    assert model.embedding.embedding_dim == 8
    factored = LanguageModel(ModelConfig(cell, vocab_size=11, hidden_size=8, embed_size=5))
    assert factored.layers[0].input_size == 5
    with pytest.raises(ValueError, match="input size = hidden size"):
        CELLS.get(cell)(5, 8, parse_cell_options(CELLS.get(cell), {"ho_form": "symmetric"}))


def test_high_order_parameter_counts_for_other_kernel_numbers():
    d, n, m = 5, 7, 8
    lstm = HighOrderLSTM(d, n, HighOrderLSTMConfig(ho_kernels=m))
    assert count_parameters(lstm) == 4 * (d * n + n * n + n) + 3 * m * (d + 2 * n)
    gru = HighOrderGRU(d, n, parse_cell_options(HighOrderGRU, {"ho_kernels": "8"}))
    assert count_parameters(gru) == 3 * (d * n + n * n + n) + 2 * m * (d + 2 * n)


# --- Options from strings --------------------------------------------------------------------


def test_options_parse_from_command_line_strings():
    options = parse_key_values(["ho_kernels=8", "ho-form=symmetric", "ho_rank=2"])
    config = parse_cell_options(CELLS.get("ho-lstm"), options)
    assert (config.ho_kernels, config.ho_form, config.ho_rank) == (8, "symmetric", 2)
    options = parse_key_values(["tied=false", "output=standard", "depth=tanh"])
    config = parse_cell_options(CELLS.get("grid-lstm"), options)
    assert (config.tied, config.output, config.depth) == (False, "standard", "tanh")
    assert parse_cell_options(CELLS.get("grid-lstm"), {}) == GridLSTMConfig(tied=True, output="paper", depth="lstm")


@pytest.mark.parametrize(
    "cell, options",
    [
        ("ho-lstm", {"ho_kernels": "0"}),
        ("ho-lstm", {"ho_kernels": "many"}),
        ("ho-gru", {"ho_rank": "-2"}),
        ("ho-gru", {"ho_form": "cubic"}),
        ("ho-lstm", {"peephole": "true"}),  # the base cell's options are fixed off, not options here
        ("ho-gru", {"reset_after": "true"}),
        ("grid-lstm", {"tied": "maybe"}),
        ("grid-lstm", {"output": "fancy"}),
        ("grid-lstm", {"depth": "relu"}),
    ],
)
def test_bad_option_values_give_charlm_errors(cell, options):
    with pytest.raises(CharlmError):
        parse_cell_options(CELLS.get(cell), options)
