"""The real CUDA path: CUDA graphs captured by torch, cuDNN, bf16 on a GPU. Marked ``cuda``: skipped
where torch sees no CUDA device (the default suite's machines), run on a GPU with ``pytest -m cuda``
(or with the rest of the suite). The CPU stand-ins of these paths are in test_graphs.py and
test_fast_path_check.py; these hold the real thing to the same results."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from charlm.cells import CELLS
from charlm.inference.scoring import score_tokens
from charlm.model import LanguageModel, ModelConfig
from charlm.runtime.cuda_graphs import ScoringForward
from charlm.runtime.training_graphs import GraphedWindow
from charlm.runtime.precision import layer_output_dtypes, wrong_layer_dtypes
from charlm.tools.selfcheck import run_checks

pytestmark = pytest.mark.cuda


def test_charlm_check_passes_on_this_gpu():
    rows = run_checks(torch.device("cuda"), CELLS.names())
    assert [row for row in rows if row.failed] == []


def test_scoring_replays_a_checked_graph_and_gives_the_eager_score():
    torch.manual_seed(0)
    model = LanguageModel(ModelConfig("lstm", vocab_size=13, hidden_size=32, layers=2)).cuda()
    tokens = np.random.default_rng(0).integers(13, size=4 * 10 * 12 + 7)
    eager = score_tokens(model, tokens, batch_size=4, bptt=10, device="cuda", cuda_graph=False)
    graphed = score_tokens(model, tokens, batch_size=4, bptt=10, device="cuda")
    assert graphed.fast_path is not None and graphed.fast_path.active and graphed.fast_path.checked
    assert graphed.nats == pytest.approx(eager.nats, rel=1e-5)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_a_graph_on_the_second_device_records_its_kernels():
    """Defect 1: with cuda:0 current, a graph of a model on cuda:1 must still replay its work."""
    torch.cuda.set_device(0)
    from charlm.runtime.devices import resolve_device

    device = resolve_device("cuda:1")
    model = LanguageModel(ModelConfig("gru", vocab_size=13, hidden_size=16)).to(device)
    tokens = np.random.default_rng(1).integers(13, size=2 * 5 * 10)
    forward_check = score_tokens(model, tokens, batch_size=2, bptt=5, device=device).fast_path
    assert forward_check.active and forward_check.max_difference < 1e-4


def test_the_training_window_graph_gives_the_eager_gradients():
    torch.manual_seed(0)
    model = LanguageModel(ModelConfig("gru", vocab_size=13, hidden_size=32, layers=2)).cuda().train()
    graphed = GraphedWindow(model, torch.device("cuda"), window_shape=(4, 10))
    tokens = torch.randint(13, (4, 10), device="cuda")
    state = model.initial_state(4, device="cuda")
    logits, _ = graphed(tokens, state)
    assert graphed.active and graphed.check.checked and graphed.check.max_difference <= graphed.check.tolerance
    eager, _ = model(tokens, state)
    torch.testing.assert_close(logits, eager, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn"])
def test_bf16_runs_the_cudnn_cells_in_bf16_never_fp16(cell):
    if not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bfloat16")
    options = {"reset_after": True} if cell == "gru" else {}
    model = LanguageModel(ModelConfig(cell, vocab_size=13, hidden_size=16, layers=2, cell_options=options)).cuda()
    dtypes = layer_output_dtypes(model, "bf16", torch.device("cuda"))
    assert wrong_layer_dtypes(dtypes, "bf16") == [] and torch.bfloat16 in dtypes


def test_scoring_forward_is_off_with_no_cuda_graph():
    model = LanguageModel(ModelConfig("gru", vocab_size=13, hidden_size=8)).cuda()
    assert not ScoringForward(model, torch.device("cuda"), 100, enabled=False).wanted
