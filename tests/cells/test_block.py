"""The block wiring (``--wiring block``): the block's equations, its state across windows, its size,
and a run through the command line."""

import io

import pytest
import torch
import torch.nn.functional as F

from charlm.cells import CELLS, parse_cell_options
from charlm.cells.block import Block, block_parameters
from charlm.model import LanguageModel, ModelConfig, count_parameters
from charlm.sizing import size_for_budget
from helpers import assert_drops_its_embedding_alone, assert_one_line_error, cli, tiny_train

CELLS_IN_BLOCKS = ["lstm", "gru", "mingru", "qrnn", "hgrn", "linear-ru"]


def block_model(cell, conv=4, expansion=2.0, layers=2, hidden=6, vocab=7):
    config = ModelConfig(
        cell, vocab_size=vocab, hidden_size=hidden, layers=layers, wiring="block", block_conv=conv,
        block_expansion=expansion,
    )  # fmt: skip
    return LanguageModel(config)


def spread(model, seed=0):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.3 * torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype))


def random_state(model, batch):
    generator = torch.Generator().manual_seed(1)
    return [
        tuple(0.5 * torch.randn(t.shape, generator=generator, dtype=t.dtype) for t in layer)
        for layer in model.initial_state(batch)
    ]


def by_the_equations(block: Block, inputs, state):
    """The block written from its docstring, one step at a time, with the cell's own ``step``."""
    cell_parts = len(block.cell.initial_state(1))
    cell_state, past = state[:cell_parts], state[cell_parts:]
    k, n = block.conv_width, block.input_size
    history = [] if not past else list(past[0].view(len(inputs[0]), k - 1, n).unbind(1))  # oldest first
    outputs = []
    for x in inputs:
        u = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + torch.finfo(x.dtype).eps) * block.norm.weight
        seen = history + [u]
        v = u if k == 0 else block.conv_bias + sum(block.conv_weight[:, j] * seen[-1 - j] for j in range(k))
        history = seen[1:] if k > 1 else []
        y, cell_state = block.cell.step(v, cell_state)
        r = x + y
        if block.mlp is not None:
            mlp = block.mlp
            z = r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + torch.finfo(r.dtype).eps) * mlp.norm.weight
            r = r + (F.silu(z @ mlp.gate.weight.T) * (z @ mlp.up.weight.T)) @ mlp.down.weight.T
        outputs.append(r)
    new_past = (torch.stack(history, 1).flatten(1),) if k > 1 else ()
    return torch.stack(outputs), (*cell_state, *new_past)


@pytest.mark.parametrize("cell", CELLS_IN_BLOCKS)
@pytest.mark.parametrize("conv, expansion", [(0, 0.0), (1, 1.0), (4, 2.0)])
def test_a_block_computes_its_equations_in_value_and_gradient(cell, conv, expansion):
    torch.manual_seed(0)
    cell_class = CELLS.get(cell)
    inner = cell_class.make_stack(6, 6, 1, parse_cell_options(cell_class, {}))[0]
    block = Block(inner, conv, expansion).double()
    spread(block)
    inputs = torch.randn(9, 3, 6, dtype=torch.float64, requires_grad=True)
    state = tuple(0.5 * torch.randn_like(t) for t in block.initial_state(3))
    output, new_state = block(inputs, state)
    expected, expected_state = by_the_equations(block, inputs, state)
    assert torch.allclose(output, expected, atol=1e-10)
    assert all(torch.allclose(a, b, atol=1e-10) for a, b in zip(new_state, expected_state))
    fast = torch.autograd.grad(output.square().sum(), [inputs, *block.parameters()], allow_unused=True)
    slow = torch.autograd.grad(expected.square().sum(), [inputs, *block.parameters()], allow_unused=True)
    assert all(
        (a is None and b is None) or torch.allclose(a, b, atol=1e-9) for a, b in zip(fast, slow)
    )  # fmt: skip


@pytest.mark.parametrize("cell", ["lstm", "mingru"])
def test_the_state_carried_across_windows_equals_one_long_window(cell):
    torch.manual_seed(0)
    model = block_model(cell).double()
    spread(model)
    tokens = torch.randint(7, (3, 12))
    state = random_state(model, 3)
    whole, _ = model(tokens, state)
    first, carried = model(tokens[:, :5], state)
    second, _ = model(tokens[:, 5:], carried)
    assert torch.allclose(torch.cat([first, second], 1), whole, atol=1e-12)
    stepped, stepped_state = [], state
    for t in range(12):
        logits, stepped_state = model.step(tokens[:, t], stepped_state)
        stepped.append(logits)
    assert torch.allclose(torch.stack(stepped, 1), whole, atol=1e-12)
    with torch.inference_mode():
        sampler, sampled_state, sampled = model.eval().for_sampling(), state, []
        for t in range(12):
            logits, sampled_state = sampler.step(tokens[:, t], sampled_state)
            sampled.append(logits)
    assert torch.allclose(torch.stack(sampled, 1), whole, atol=1e-12)


@pytest.mark.parametrize("cell", ["lstm", "mingru", "hgrn"])
def test_the_parameter_count_is_the_cells_plus_the_blocks(cell):
    n, k, expansion, layers = 6, 4, 2.0, 2
    stacked = count_parameters(LanguageModel(ModelConfig(cell, vocab_size=7, hidden_size=n, layers=layers)))
    wired = count_parameters(block_model(cell, k, expansion, layers, n))
    embedding_then = stacked - count_parameters(LanguageModel(ModelConfig(cell, 7, n, layers, embed_size=n)))
    assert wired == stacked - embedding_then + layers * block_parameters(n, k, expansion) + n  # + the final norm


def test_an_lstm_and_a_mingru_in_blocks_are_sized_to_one_budget():
    for cell in ("lstm", "mingru"):
        config = ModelConfig(cell, vocab_size=50, hidden_size=1, layers=2, wiring="block")
        hidden, total = size_for_budget(config, 200_000)
        assert abs(total - 200_000) < 0.02 * 200_000, (cell, hidden, total)


def test_a_block_model_saves_and_loads_and_old_settings_read_as_stacked():
    model = block_model("mingru")
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    again = LanguageModel(ModelConfig.from_dict(model.config.to_dict()))
    again.load_state_dict(torch.load(io.BytesIO(buffer.getvalue()), weights_only=True))
    tokens = torch.randint(7, (2, 9))
    assert torch.equal(model(tokens, model.initial_state(2))[0], again(tokens, again.initial_state(2))[0])
    old = {k: v for k, v in model.config.to_dict().items() if k not in ("wiring", "block_conv", "block_expansion")}
    assert ModelConfig.from_dict(old).wiring == "stacked"


def test_a_cell_whose_output_is_wider_than_its_input_is_refused_in_one_line(tiny_corpus, tmp_path):
    assert_one_line_error(
        cli(*tiny_train(tiny_corpus, tmp_path / "run", cell="grid-lstm", wiring="block", hidden_size=8)),
        "cell 'grid-lstm' cannot be wired in blocks: its input must be 16 wide, not the hidden size 8",
    )
    assert_one_line_error(
        cli(*tiny_train(tiny_corpus, block_conv=2)),
        "--block-conv needs --wiring block",
    )
    assert not (tmp_path / "run").exists()


def test_a_block_model_trains_evaluates_samples_and_exports_from_the_command_line(tiny_corpus, tmp_path):
    run = tmp_path / "run"
    settings = dict(cell="mingru", wiring="block", block_conv=3, hidden_size=16, epochs=1, train_fraction=0.1)
    cli(*tiny_train(tiny_corpus, run, **settings), check_code=0)
    assert "bpc" in cli("eval", run, "--data-dir", tiny_corpus, check_code=0).stdout
    assert cli("sample", run, "--length", "20", check_code=0).stdout
    exported = cli("export", run, tmp_path / "step.ts", "--format", "torchscript", check_code=0).stdout
    assert "max difference from charlm's step" in exported
    assert torch.load(run / "best.pt", weights_only=True)["model_config"]["block_conv"] == 3


@pytest.mark.parametrize("settings", [{"cell": "gru", "wiring": "block"}, {"cell": "mamba"}], ids=["block", "mamba"])
def test_a_residual_blocks_dropout_drops_its_branches_never_the_stream(settings):
    """--dropout in a stack of residual blocks: the model drops the embedding once, each block its branches
    before they join the stream. Each branch dropped whole (p = 1), every block passes its stream on as it
    came, so in training mode the model is softmax(norm(D(embedding))): no mask between blocks or at the top."""
    model = LanguageModel(ModelConfig(vocab_size=11, hidden_size=16, layers=2, dropout=0.5, **settings)).train()
    assert [layer.dropout for layer in model.layers] == [0.5, 0.5]
    for layer in model.layers:
        layer.dropout = 1.0
    assert_drops_its_embedding_alone(model, 0.5)
    tokens = torch.randint(11, (2, 7), generator=torch.Generator().manual_seed(3))
    model.eval()
    evaluated, _ = model(tokens, model.initial_state(2))
    for layer in model.layers:
        layer.dropout = 0.0
    torch.testing.assert_close(model(tokens, model.initial_state(2))[0], evaluated)
