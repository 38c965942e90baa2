"""The `mamba` cell against a float64 Mamba block written here from the paper and its reference code (torch's
conv1d, the selective scan's loop), the chunked selective scan against its loop (values, gradients, carried
state, odd lengths, tiles of streams), the published initialisation, and the command line."""

import math

import pytest
import torch
import torch.nn.functional as F

from cell_cases import randomise
from charlm.cells import CELLS, parse_cell_options
from charlm.cells import selective_scan
from charlm.cells.mamba import MAMBA_SCANS
from charlm.cells.selective_scan import selective_scan_chunked, selective_scan_linear, selective_scan_loop
from charlm.errors import CharlmError
from charlm.model import LanguageModel, ModelConfig, count_parameters
from helpers import assert_one_line_error, cli, tiny_train

STEPS, STREAMS, INNER, STATES = 13, 3, 5, 4


def block(n=8, layers=1, **options):
    cell_class = CELLS.get("mamba")
    stack = cell_class.make_stack(n, n, layers, parse_cell_options(cell_class, options))
    for cell in stack:
        randomise(cell)
    return stack[0]


def paper_block(cell, inputs, h, past):
    """The block over ``inputs`` ``[T, B, n]`` from the SSM state ``h`` ``[B, e, N]`` and the last k − 1
    inputs of the convolution ``past`` ``[k − 1, B, e]``: mamba_ssm's slow path, time-major."""
    e, k = cell.inner, cell.config.conv_width
    u = inputs * torch.rsqrt(inputs.pow(2).mean(-1, keepdim=True) + 1e-5) * cell.norm.weight
    x, z = (u @ cell.in_proj.weight.T).chunk(2, dim=-1)
    sequence = torch.cat([past, x])  # conv1d without padding over [past; window]: one output a position
    x = F.silu(F.conv1d(sequence.permute(1, 2, 0), cell.conv_weight[:, None, :], cell.conv_bias, groups=e))
    x = x.permute(2, 0, 1)
    dt, B, C = (x @ cell.x_proj.weight.T).split([cell.rank, cell.states, cell.states], dim=-1)
    delta = F.softplus(dt @ cell.dt_proj.weight.T + cell.dt_proj.bias)
    A = -torch.exp(cell.A_log)
    ys = []
    for t in range(inputs.shape[0]):
        deltaA = torch.exp(torch.einsum("bd,dn->bdn", delta[t], A))
        deltaB_u = torch.einsum("bd,bn,bd->bdn", delta[t], B[t], x[t])
        h = deltaA * h + deltaB_u
        ys.append(torch.einsum("bdn,bn->bd", h, C[t]))
    y = (torch.stack(ys) + x * cell.D) * F.silu(z)
    return inputs + y @ cell.out_proj.weight.T, h, sequence[sequence.shape[0] - (k - 1) :]


@pytest.mark.parametrize("scan", MAMBA_SCANS)
def test_windows_carrying_the_state_are_the_papers_block_over_the_sequence(scan, double_precision):
    torch.manual_seed(0)
    cell = block(8, scan=scan, chunk=3, state_size=4)
    e, N = cell.inner, cell.states
    inputs = torch.randn(17, 2, 8)
    h0, past0 = 0.5 * torch.randn(2, e, N), 0.5 * torch.randn(3, 2, e)
    expected, h_end, past_end = paper_block(cell, inputs, h0, past0)
    state, outputs, start = (h0.flatten(1), past0.transpose(0, 1).flatten(1)), [], 0
    for length in (5, 1, 2, 7, 2):  # shorter and longer than the convolution and the chunks, odd
        output, state = cell(inputs[start : start + length], state)
        outputs.append(output)
        start += length
    torch.testing.assert_close(torch.cat(outputs), expected)
    torch.testing.assert_close(state[0], h_end.flatten(1))
    torch.testing.assert_close(state[1], past_end.transpose(0, 1).flatten(1))  # the last k − 1 inputs, oldest first


def scan_inputs(steps=STEPS, streams=STREAMS, seed=0):
    generator = torch.Generator().manual_seed(seed)

    def draw(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    delta = F.softplus(draw(steps, streams, INNER))
    A = -torch.exp(draw(INNER, STATES))
    return [t.requires_grad_() for t in (delta, A, draw(steps, streams, STATES), draw(steps, streams, STATES))] + [
        draw(steps, streams, INNER).requires_grad_(),
        draw(streams, INNER, STATES).requires_grad_(),
    ]


def values_and_gradients(scan, inputs):
    y, h = scan(*inputs)
    generator = torch.Generator().manual_seed(9)
    loss = (y * torch.randn(y.shape, generator=generator, dtype=y.dtype)).sum() + (
        h * torch.randn(h.shape, generator=generator, dtype=h.dtype)
    ).sum()
    return [y, h, *torch.autograd.grad(loss, inputs)]


@pytest.mark.parametrize("chunk", [1, 4, 5, 13, 16])
@pytest.mark.parametrize("streams_a_tile", [None, 2])
def test_the_chunked_scan_is_the_loop_in_value_and_gradient(chunk, streams_a_tile, monkeypatch):
    """Odd lengths (13 steps in chunks of 4 and 5 end on a shorter chunk), and tiles of 2 of the 3 streams."""
    if streams_a_tile:
        monkeypatch.setattr(selective_scan, "TILE", streams_a_tile * chunk * INNER * STATES)
    inputs = scan_inputs()
    expected = values_and_gradients(selective_scan_loop, inputs)
    found = values_and_gradients(lambda *a: selective_scan_chunked(*a, chunk=chunk), inputs)
    for a, b in zip(found, expected):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("method", ["auto", "loop", "log", "doubling", "chunked"])
def test_the_linear_scan_forms_are_the_loop_in_value_and_gradient(method):
    inputs = scan_inputs(seed=1)
    expected = values_and_gradients(selective_scan_loop, inputs)
    found = values_and_gradients(lambda *a: selective_scan_linear(*a, method=method), inputs)
    for a, b in zip(found, expected):
        torch.testing.assert_close(a, b)


def test_two_windows_of_the_chunked_scan_are_one_long_window():
    delta, A, B, C, x, h0 = scan_inputs(steps=11)
    y, h = selective_scan_chunked(delta, A, B, C, x, h0, chunk=4)
    first, h_mid = selective_scan_chunked(delta[:6], A, B[:6], C[:6], x[:6], h0, chunk=4)
    second, h_end = selective_scan_chunked(delta[6:], A, B[6:], C[6:], x[6:], h_mid, chunk=4)
    torch.testing.assert_close(torch.cat([first, second]), y)
    torch.testing.assert_close(h_end, h)


def test_the_chunked_scans_gradients_pass_gradcheck():
    inputs = scan_inputs(steps=6, streams=2)
    assert torch.autograd.gradcheck(lambda *a: selective_scan_chunked(*a, chunk=4), inputs)


def test_initialisation_is_the_published_one():
    torch.manual_seed(0)
    cell_class = CELLS.get("mamba")
    layers = cell_class.make_stack(64, 64, 4, parse_cell_options(cell_class, {}))
    cell = layers[0]
    e, N, R = 128, 16, 4  # e = 2n, R = ⌈64/16⌉
    assert (cell.inner, cell.states, cell.rank) == (e, N, R)
    torch.testing.assert_close(cell.A_log, torch.log(torch.arange(1.0, N + 1)).expand(e, N))
    torch.testing.assert_close(cell.D, torch.ones(e))
    dt = F.softplus(cell.dt_proj.bias)
    assert dt.min() >= 0.001 * (1 - 1e-5) and dt.max() <= 0.1 * (1 + 1e-5)
    assert dt.log().std() > 0.5  # log-uniform over two decades (std of log Δ₀ ≈ 1.33)
    assert cell.dt_proj.weight.abs().max() <= R**-0.5
    assert cell.conv_weight.abs().max() <= 1 / math.sqrt(4) and cell.conv_bias.abs().max() <= 0.5
    assert cell.in_proj.weight.abs().max() <= 1 / math.sqrt(64)
    assert cell.out_proj.weight.abs().max() <= 1 / math.sqrt(e) / math.sqrt(4)  # W_out / √L for L = 4 blocks
    assert cell.out_proj.weight.abs().max() > 0.8 / math.sqrt(e) / math.sqrt(4)
    torch.testing.assert_close(cell.norm.weight, torch.ones(64))


def test_a_layer_of_mamba_130m_has_its_parameters():
    """mamba-130m: d_model 768, dt_rank 48, 24 layers; its layers hold 24 × 3,771,648 parameters."""
    cell_class = CELLS.get("mamba")
    with torch.device("meta"):
        (cell,) = cell_class.make_stack(768, 768, 1, parse_cell_options(cell_class, {}))
    assert cell.rank == 48
    assert count_parameters(cell) == 3_771_648 == 6 * 768**2 + 4 * 768 * 48 + 111 * 768


def test_the_model_ends_in_an_rms_norm(double_precision):
    model = LanguageModel(ModelConfig("mamba", vocab_size=7, hidden_size=8, layers=2))
    x = torch.randn(3, 8)
    torch.testing.assert_close(model.final_norm(x), x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))
    assert count_parameters(model.final_norm) == 8


def test_the_mixer_alone_in_charlms_block(double_precision):
    """residual=false, --wiring block, --block-conv 0: charlm's RMSNorm and residual around the mixer, then
    the gated MLP; the block's state is the mixer's."""
    config = ModelConfig(
        "mamba", vocab_size=7, hidden_size=8, layers=2, wiring="block", block_conv=0, cell_options={"residual": False}
    )
    model = LanguageModel(config)
    mixer = model.layers[0].cell
    assert mixer.norm is None and [t.shape for t in model.initial_state(3)[0]] == [(3, 16 * 16), (3, 3 * 16)]
    randomise(model)
    tokens = torch.randint(7, (3, 9))
    logits, _ = model(tokens, model.initial_state(3))
    state, stepped = model.initial_state(3), []
    for t in range(9):
        step_logits, state = model.step(tokens[:, t], state)
        stepped.append(step_logits)
    torch.testing.assert_close(torch.stack(stepped, 1), logits)


@pytest.mark.parametrize(
    "option, message",
    [
        ("scan=fast", "scan must be one of selective, auto, loop, log, doubling, chunked"),
        ("state_size=0", "state_size must be at least 1"),
        ("dt_min=0.5", "need dt_min ≤ dt_max"),
    ],
)
def test_bad_options_are_refused_in_one_line(option, message):
    with pytest.raises(CharlmError, match=message):
        parse_cell_options(CELLS.get("mamba"), dict([option.split("=")]))


def test_trains_evaluates_samples_and_exports_from_the_command_line(tiny_corpus, tmp_path):
    run = tmp_path / "run"
    small = dict(cell="mamba", hidden_size=16, layers=2, batch_size=4, bptt=16, max_tokens=1280)
    cli(*tiny_train(tiny_corpus, run, "--cell-opt", "state_size=4", **small), check_code=0)
    assert "bpc" in cli("eval", run, "--split", "valid", check_code=0).stdout
    sampled = cli("sample", run, "--prime", "The ", "--length", "12", "--seed", "1", check_code=0).stdout
    assert sampled.startswith("The ")
    cli("export", run, tmp_path / "step.pt", "--format", "torchscript", check_code=0)
    assert (tmp_path / "step.pt").exists()
    refused = cli(*tiny_train(tiny_corpus, tmp_path / "narrow", embed_size=5, **small))
    assert_one_line_error(refused, "mamba", "--embed-size 16")


def test_the_bottom_block_reads_the_dropped_embedding_when_dropout_is_on():
    """Mamba takes its bottom input product over the table's V rows (folds the embedding); with --dropout
    the embedding is dropped first, so the folded form would skip the mask: training with dropout reads
    the dropped vectors, the same with folding allowed or not."""
    model = LanguageModel(ModelConfig("mamba", vocab_size=11, hidden_size=16, layers=2, dropout=0.5)).train()
    for layer in model.layers:
        layer.dropout = 0.0  # the branches kept whole: only the embedding is dropped
    tokens = torch.randint(11, (2, 7), generator=torch.Generator().manual_seed(3))  # 14 positions > 11 symbols
    logits = []
    for folds in (True, False):
        model.fold_embedding = folds
        torch.manual_seed(4)
        logits.append(model(tokens, model.initial_state(2))[0])
    torch.testing.assert_close(logits[0], logits[1])
