"""The working memory of scoring and of dynamic evaluation is estimated from the model's sizes and
checked before the first window (``charlm.runtime.memory.estimate_evaluation_memory``): what
would not fit is refused in one line naming the options to change, not killed by the kernel."""

from __future__ import annotations

import pytest
import torch

import charlm
from charlm.cells import CELLS
from charlm.config import DynamicOptions
from charlm.inference.dynamic_protocol import NoProgress
from charlm.model import LanguageModel, ModelConfig, count_parameters
from charlm.runtime import memory
from charlm.runtime.memory import WORKSPACE_BYTES, check_evaluation_fits, estimate_evaluation_memory, scored_window
from helpers import assert_one_line_error, cli, pydoc_text

# 1,000 parameters, activation factor 15, 2 layers of 8, vocabulary 10, embedding 8; a window of 4 × 5 = 20 positions
SIZES = dict(hidden_size=8, layers=2, vocab_size=10, embed_size=8, streams=4, steps=5)
STARVED = 1024**2  # bytes "free": the trained run's weights fit (74 KB), a window of 16 × 25 positions does not


def test_scoring_counts_one_layer_the_embedded_window_and_three_copies_of_the_logits():
    estimate = estimate_evaluation_memory(1000, 15, **SIZES)
    # 20 positions × (8 × 15 of one layer + 8 embedded + 3 × 10: logits, their row-major copy, log-softmax) × 4 bytes
    assert estimate.activation_bytes == 20 * (8 * 15 + 8 + 3 * 10) * 4 == 12_640
    assert estimate.copies == estimate.copy_bytes == estimate.graph_bytes == estimate.workspace_bytes == 0
    assert estimate.total_bytes == 12_640


def test_dynamic_evaluation_counts_every_layer_the_gradients_and_the_updates_copies():
    sgd = estimate_evaluation_memory(1000, 15, **SIZES, method="sgd")
    # 20 positions × (2 layers × 8 × 15 + 8 embedded + 4 × 10: logits, log-softmax and their gradients) × 4 bytes
    assert sgd.activation_bytes == 20 * (2 * 8 * 15 + 8 + 4 * 10) * 4 == 23_040
    assert sgd.copies == 1 and sgd.copy_bytes == 4_000 and sgd.total_bytes == 27_040  # the gradient
    rms = estimate_evaluation_memory(1000, 15, **SIZES, method="rms", restore_copy=True)
    # gradient, √MS, 1/(√MS + ε), λ·decay, θ₀, the step being formed; and the weights put back afterwards
    assert rms.copies == 7 and rms.total_bytes == 23_040 + 7 * 4_000


def test_on_a_gpu_scoring_counts_the_graph_pool_and_the_workspaces():
    graphed = estimate_evaluation_memory(1000, 15, **SIZES, device_type="cuda", cuda_graph=True)
    assert graphed.graph_bytes == 12_640 and graphed.workspace_bytes == WORKSPACE_BYTES + 1_264
    assert graphed.total_bytes == 2 * 12_640 + WORKSPACE_BYTES + 1_264
    adapting = estimate_evaluation_memory(1000, 15, **SIZES, method="sgd", device_type="cuda", cuda_graph=True)
    assert adapting.graph_bytes == 0 and adapting.workspace_bytes == WORKSPACE_BYTES + 2_304  # no graph for a backward


def test_the_window_counted_is_the_one_the_streams_cut():
    assert scored_window(10, 4, 100) == (4, 3)  # 10 predictions in 4 padded streams: never longer than the text
    assert scored_window(10, 4, 2) == (4, 2)
    assert scored_window(10, 4, 100, cover_all=False) == (4, 2)  # training batches drop the remainder


def test_the_check_counts_the_model_it_is_given_and_the_larger_rms_window():
    model = LanguageModel(ModelConfig("lstm", vocab_size=10, hidden_size=8, layers=2))
    factor, parameters = CELLS.get("lstm").activation_factor, count_parameters(model)
    needed = estimate_evaluation_memory(parameters, factor, 8, 2, 10, 8, 1, 5, method="rms").total_bytes
    options = dict(predictions=50, batch_size=1, bptt=5, method="rms", advice="use less")
    check_evaluation_fits(model, torch.device("cpu"), **options, available=needed)  # just fits
    with pytest.raises(charlm.CharlmError) as refused:
        check_evaluation_fits(model, torch.device("cpu"), **options, available=needed - 1)
    assert str(refused.value).endswith(f"but cpu has {memory._gib(needed - 1)} free: use less")
    # the statistics' window: 100 streams (1,001 training tokens hold 166 of 5 + 1) × 5 steps, the larger
    with pytest.raises(
        charlm.CharlmError,
        match=f"for a window of 100 streams × 5 steps, .* for 6 float32 copies of "
        f"the model's {parameters:,} parameters",
    ):
        check_evaluation_fits(
            model, torch.device("cpu"), **options, stat_batch_size=100, train_predictions=1000, available=needed
        )


@pytest.fixture
def starved_model(trained_run, monkeypatch):
    """The session's trained run (LRU, 32 units), loaded, then left with 1 MiB free."""
    model = charlm.load(trained_run, device="cpu")
    monkeypatch.setattr(memory, "available_memory", lambda device: STARVED)
    return model


class Stages(NoProgress):
    def __init__(self):
        self.entered = []

    def stage(self, label, total):
        self.entered.append(label)
        return super().stage(label, total)


def test_evaluate_refuses_a_window_that_does_not_fit_naming_batch_size_and_bptt(starved_model):
    with pytest.raises(
        charlm.CharlmError,
        match=r"^scoring needs about 2 MiB \(2 MiB for a window of 16 streams × "
        r"25 steps\) but cpu has 1 MiB free: use a smaller --batch-size or --bptt$",
    ):
        starved_model.evaluate("test", batch_size=16, record=False)
    assert starved_model.evaluate("test", batch_size=1, record=False).tokens == 2000  # a smaller window fits


def test_score_refuses_a_window_that_does_not_fit_naming_batch_size(starved_model):
    text = pydoc_text(1000)
    with pytest.raises(
        charlm.CharlmError,
        match=r"window of 16 streams × 25 steps.*use a smaller --batch-size "
        r"\(the windows are the training bptt, 25 steps\)$",
    ):
        starved_model.score(text, batch_size=16)
    assert starved_model.score(text).tokens == 999


def test_dynamic_scoring_refuses_before_adapting(starved_model):
    text = pydoc_text(1000)
    before = {name: tensor.clone() for name, tensor in starved_model.network.state_dict().items()}
    with pytest.raises(
        charlm.CharlmError,
        match=r"^dynamic evaluation \(sgd\) needs about .* 2 float32 copies of the "
        r"model's 18,460 parameters\) .*: use a smaller --batch-size or --segment$",
    ):
        starved_model.score(text, dynamic="sgd", batch_size=16)
    assert all(torch.equal(before[name], tensor) for name, tensor in starved_model.network.state_dict().items())
    assert starved_model.score(text, dynamic="sgd").tokens == 999


def test_dynamic_evaluation_refuses_the_statistics_window_before_anything_is_scored(starved_model):
    stages = Stages()
    with pytest.raises(
        charlm.CharlmError,
        match=r"^dynamic evaluation \(rms\) needs about 12 MiB \(12 MiB for a window "
        r"of 100 streams × 20 steps.*--segment, or a smaller --dyn-stat-batch-size$",
    ):
        starved_model.evaluate("test", dynamic="rms", progress=stages, record=False)
    assert stages.entered == []
    options = DynamicOptions(method="rms", stat_batch_size=1, stat_batches=2)
    report = starved_model.evaluate("test", dynamic=options, progress=stages, record=False)
    assert report.dynamic.tokens == 2000 and stages.entered[0] == "static test"


def test_the_cli_refuses_in_one_line_and_writes_nothing(trained_run, tmp_path, monkeypatch):
    monkeypatch.setattr(memory, "available_memory", lambda device: STARVED)
    metrics = (trained_run / "metrics.jsonl").read_bytes()
    assert_one_line_error(
        cli("eval", trained_run, "--batch-size", "16"),
        "scoring needs about 2 MiB",
        "use a smaller --batch-size or --bptt",
    )
    text = tmp_path / "text.txt"
    text.write_text(pydoc_text(1000), encoding="utf-8")
    result = cli("score", trained_run, text, "--dynamic", "rms")
    assert_one_line_error(result, "dynamic evaluation (rms) needs about", "a smaller --dyn-stat-batch-size")
    assert result.stdout == ""
    assert (trained_run / "metrics.jsonl").read_bytes() == metrics
