"""The `transformer` cell against a plain float64 reference: sliding-window attention over the whole
sequence with rotary positions written by hand, the memory carried across windows, sampling one
symbol at a time against scoring the sequence, memory=0 as nanoGPT's window-by-window Transformer."""

import math

import pytest
import torch
import torch.nn.functional as F

from cell_cases import randomise
from charlm.cells import CELLS, parse_cell_options
from charlm.errors import CharlmError
from charlm.model import LanguageModel, ModelConfig, count_parameters
from charlm.sizing import size_for_budget
from helpers import assert_drops_its_embedding_alone, assert_one_line_error, cli, tiny_train

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")


def block(n=8, **options):
    cell_class = CELLS.get("transformer")
    (cell,) = cell_class.make_stack(n, n, 1, parse_cell_options(cell_class, options))
    randomise(cell)
    return cell


def rope(x, positions):
    """x ``[P, h]`` with the pairs (i, i + h/2) of row p turned by p·10000^(−2i/h): a complex product."""
    half = x.shape[-1] // 2
    frequencies = 10000.0 ** (-torch.arange(half, dtype=torch.float64) * 2 / x.shape[-1])
    turn = torch.polar(torch.ones(len(positions), half, dtype=torch.float64), positions[:, None] * frequencies)
    z = torch.complex(x[:, :half], x[:, half:]) * turn
    return torch.cat([z.real, z.imag], dim=-1)


def reference(cell, inputs, span=None, origin=0):
    """The block over a whole sequence ``[N, B, n]``, position by position: position t attends to
    positions max(0, t − span) … t (span None: all before it), with explicit softmax weights.
    ``origin`` shifts every absolute position (rotary positions are relative: it changes nothing)."""
    steps, batch, n = inputs.shape
    heads, size = cell.heads, cell.head_size
    outputs = torch.empty_like(inputs)
    positions = torch.arange(steps, dtype=torch.float64) + origin
    for b in range(batch):
        x = inputs[:, b]
        h = F.layer_norm(x, (n,), cell.norm_attention.weight, cell.norm_attention.bias)
        q, k, v = F.linear(h, cell.qkv.weight, cell.qkv.bias).split(n, dim=-1)
        attended = torch.zeros(steps, n, dtype=torch.float64)
        for head in range(heads):
            part = slice(head * size, (head + 1) * size)
            qh, kh, vh = rope(q[:, part], positions), rope(k[:, part], positions), v[:, part]
            for t in range(steps):
                first = 0 if span is None else max(0, t - span)
                scores = torch.stack([qh[t] @ kh[s] / math.sqrt(size) for s in range(first, t + 1)])
                weights = scores.exp() / scores.exp().sum()
                attended[t, part] = sum(w * vh[s] for w, s in zip(weights, range(first, t + 1)))
        a = x + F.linear(attended, cell.out.weight, cell.out.bias)
        z = F.layer_norm(a, (n,), cell.norm_mlp.weight, cell.norm_mlp.bias)
        outputs[:, b] = a + F.linear(
            F.gelu(F.linear(z, cell.up.weight, cell.up.bias)), cell.down.weight, cell.down.bias
        )
    return outputs


@pytest.mark.parametrize("heads, memory", [(1, 3), (2, 4), (2, 9)])
def test_windows_carrying_the_memory_equal_sliding_window_attention_over_the_sequence(heads, memory, double_precision):
    torch.manual_seed(0)
    cell = block(8, heads=heads, memory=memory)
    inputs = torch.randn(17, 2, 8)
    expected = reference(cell, inputs, span=memory)
    torch.testing.assert_close(reference(cell, inputs, span=memory, origin=7), expected)  # relative positions
    state, outputs, start = cell.initial_state(2), [], 0
    for length in (5, 1, 2, 6, 3):  # shorter and longer than the memory
        output, state = cell(inputs[start : start + length], tuple(t.detach() for t in state))
        outputs.append(output)
        start += length
    torch.testing.assert_close(torch.cat(outputs), expected)
    keys, values, flags = state
    assert keys.shape == values.shape == (2, memory * 8) and flags.shape == (2, memory)
    assert flags.eq(1).all()  # 17 positions fill every slot


def test_without_biases_it_has_none_and_is_still_the_reference(double_precision):
    """bias=false (nanoGPT's configuration): no bias in the linear maps, the LayerNorms or the final
    LayerNorm, 12n² + 2n a block; the windows, the step and sampling are still the reference's."""
    torch.manual_seed(3)
    cell = block(8, heads=2, memory=4, bias=False)
    assert count_parameters(cell) == 12 * 8 * 8 + 2 * 8
    inputs = torch.randn(11, 2, 8)
    expected = reference(cell, inputs, span=4)
    state, outputs = cell.initial_state(2), []
    for start, length in ((0, 6), (6, 5)):
        output, state = cell(inputs[start : start + length], state)
        outputs.append(output)
    torch.testing.assert_close(torch.cat(outputs), expected)
    config = ModelConfig(
        "transformer", vocab_size=7, hidden_size=8, layers=2, cell_options={"heads": 2, "memory": 6, "bias": False}
    )
    model = LanguageModel(config).eval()
    assert not [name for name, _ in model.named_parameters() if "bias" in name.split(".")[-1] and "head" not in name]
    assert model.final_norm.bias is None
    randomise(model)
    tokens = torch.randint(7, (3, 9))
    with torch.no_grad():
        scored, _ = model(tokens, model.initial_state(3))
        sampling, state, sampled = model.for_sampling(), model.initial_state(3), []
        for t in range(tokens.shape[1]):
            logits, state = sampling.step(tokens[:, t], state)
            sampled.append(logits)
    torch.testing.assert_close(torch.stack(sampled, dim=1), scored)


def test_the_step_is_the_window_with_a_bounded_cache(double_precision):
    torch.manual_seed(1)
    cell = block(8, heads=2, memory=3)
    inputs = torch.randn(10, 2, 8)
    state, outputs = cell.initial_state(2), []
    for x in inputs:
        output, state = cell.step(x, state)
        outputs.append(output)
        assert state[0].shape == (2, 3 * 8)  # never more than M keys
    torch.testing.assert_close(torch.stack(outputs), reference(cell, inputs, span=3))


@pytest.mark.parametrize("memory", [5, 30])
def test_sampling_one_symbol_at_a_time_gives_the_distribution_scoring_gives(memory, double_precision):
    torch.manual_seed(0)
    config = ModelConfig(
        "transformer", vocab_size=7, hidden_size=8, layers=2, cell_options={"heads": 2, "memory": memory}
    )
    model = LanguageModel(config).eval()
    randomise(model)
    tokens = torch.randint(7, (3, 20))
    with torch.no_grad():
        scored, _ = model(tokens, model.initial_state(3))
        expected = scored.log_softmax(-1)
        for stepper in (model, model.for_sampling()):
            state, sampled = model.initial_state(3), []
            for t in range(tokens.shape[1]):
                logits, state = stepper.step(tokens[:, t], state)
                sampled.append(logits.log_softmax(-1))
            torch.testing.assert_close(torch.stack(sampled, dim=1), expected)


def test_memory_zero_is_causal_attention_within_each_window(double_precision):
    torch.manual_seed(2)
    cell = block(8, heads=2, memory=0)
    inputs = torch.randn(12, 2, 8)
    state = cell.initial_state(2)
    assert [tuple(t.shape) for t in state] == [(2, 1)]
    first, state = cell(inputs[:5], state)
    second, state = cell(inputs[5:], state)
    torch.testing.assert_close(first, reference(cell, inputs[:5]))  # nanoGPT: each window on its own
    torch.testing.assert_close(second, reference(cell, inputs[5:]))
    assert state[0].eq(0).all()
    with pytest.raises(CharlmError, match="memory=0"):
        cell.step(inputs[0], state)


def test_dropout_is_gpt2s_on_the_embedding_branches_and_attention_weights_never_the_stream():
    """--dropout p drops the embedding once and, in each block, both branches and the attention weights
    (GPT-2, nanoGPT). With both branches zero the blocks are the identity, so in training mode the model
    is softmax(LN_f(D(embedding))): no mask between the blocks or before the softmax."""
    config = ModelConfig(
        "transformer", vocab_size=11, hidden_size=16, layers=3, dropout=0.5, cell_options={"memory": 0}
    )
    model = LanguageModel(config).train()
    assert [layer.dropout for layer in model.layers] == [0.5, 0.5, 0.5]
    with torch.no_grad():
        for layer in model.layers:
            layer.out.weight.zero_()
            layer.down.weight.zero_()
    assert_drops_its_embedding_alone(model, 0.5)


def test_a_blocks_dropout_draws_in_training_and_never_in_evaluation():
    torch.manual_seed(0)
    cell = block(8, heads=2, memory=4)
    inputs, state = torch.randn(5, 2, 8), cell.initial_state(2)
    evaluated, _ = cell.eval()(inputs, state)
    cell.train().dropout = 0.3
    first, _ = cell(inputs, state)
    second, _ = cell(inputs, state)
    assert not torch.allclose(first, evaluated) and not torch.allclose(first, second)
    cell.dropout = 0.0
    torch.testing.assert_close(cell(inputs, state)[0], evaluated)


def test_parameters_and_initialisation_are_gpt2s():
    torch.manual_seed(0)
    for n, ratio in [(16, 4), (24, 2)]:
        cell_class = CELLS.get("transformer")
        (cell,) = cell_class.make_stack(n, n, 1, parse_cell_options(cell_class, {"mlp_ratio": ratio}))
        assert count_parameters(cell) == (4 + 2 * ratio) * n * n + (9 + ratio) * n
    model = LanguageModel(ModelConfig("transformer", vocab_size=10, hidden_size=256, layers=8))
    assert isinstance(model.final_norm, torch.nn.LayerNorm)  # GPT-2's ln_f
    assert count_parameters(model) == 8 * (12 * 256**2 + 13 * 256) + 2 * 256 + 10 * 256 + (10 * 256 + 10)
    layer = model.layers[0]
    assert layer.qkv.weight.std().item() == pytest.approx(0.02, rel=0.05)
    for projection in (layer.out, layer.down):  # into the residual stream: 0.02 / √(2L)
        assert projection.weight.std().item() == pytest.approx(0.02 / math.sqrt(16), rel=0.05)
        assert projection.bias.eq(0).all()


def test_budget_sizes_to_a_multiple_of_twice_the_heads():
    for heads in (1, 4, 6):
        config = ModelConfig("transformer", vocab_size=82, hidden_size=1, layers=3, cell_options={"heads": heads})
        hidden, total = size_for_budget(config, 800_000)
        assert hidden % (2 * heads) == 0 and abs(total - 800_000) < 0.05 * 800_000
        sized = ModelConfig("transformer", vocab_size=82, hidden_size=hidden, layers=3, cell_options={"heads": heads})
        assert count_parameters(LanguageModel(sized)) == total


@pytest.mark.parametrize(
    "hidden, heads, message",
    [
        (30, 4, "the hidden size 30 is not divisible by heads=4"),
        (12, 4, "head width 3 (hidden size 12 / heads=4) must be even for rotary positions"),
    ],
)
def test_heads_that_do_not_fit_the_width_are_refused_in_one_line(tiny_corpus, tmp_path, hidden, heads, message):
    options = ("--cell-opt", f"heads={heads}")
    result = cli(*tiny_train(tiny_corpus, tmp_path / "run", *options, cell="transformer", hidden_size=hidden))
    assert_one_line_error(result, "transformer", message)


def test_trains_evaluates_samples_and_exports_from_the_command_line(tiny_corpus, tmp_path):
    run = tmp_path / "run"
    small = dict(cell="transformer", hidden_size=16, layers=2, batch_size=4, bptt=16)
    options = ("--cell-opt", "heads=2", "--cell-opt", "memory=8")
    cli(*tiny_train(tiny_corpus, run, *options, max_tokens=1280, **small), check_code=0)
    assert "bpc" in cli("eval", run, "--split", "valid", check_code=0).stdout
    assert cli("sample", run, "--prime", "The ", "--length", "12", "--seed", "1", check_code=0).stdout.startswith(
        "The "
    )
    cli("export", run, tmp_path / "step.pt", "--format", "torchscript", check_code=0)
    assert (tmp_path / "step.pt").exists()

    window = tmp_path / "window"  # memory=0: trains and evaluates window by window, refuses to sample
    cli(*tiny_train(tiny_corpus, window, "--cell-opt", "memory=0", max_tokens=640, **small), check_code=0)
    assert "bpc" in cli("eval", window, "--split", "valid", check_code=0).stdout
    assert_one_line_error(cli("sample", window, "--length", "5"), "memory=0")
