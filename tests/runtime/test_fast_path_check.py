"""Every fast path checks itself against the eager code on first use (issue 21).

No GPU runs the suite, so the graphs are stand-ins with the faults a review found in the CUDA
path: a capture recorded on another device's stream (its replay runs nothing), a capture that
fails halfway, a replay that computes something else. Each must be caught by the first-use check,
said in one line, and scored, sampled or trained eagerly with the eager results.
"""

from __future__ import annotations

import contextlib
import math
import warnings as python_warnings

import numpy as np
import pytest
import torch

import charlm.inference.scoring
import charlm.runtime.compiling
import charlm.runtime.cuda_graphs
import charlm.runtime.training_graphs
from charlm.inference.sampling import generate
from charlm.inference.scoring import score_tokens
from charlm.config_inference import SampleConfig
from charlm.model import LanguageModel, ModelConfig
from charlm.runtime.compiling import CompiledForward
from charlm.runtime.cuda_graphs import CudaGraph, GraphedCall, ReplayByCalling, ScoringForward, graphed_step
from charlm.runtime.training_graphs import GraphedWindow, graphed_window
from charlm.runtime.fast_path_check import (
    ENVIRONMENT_SWITCH,
    FastPathCheck,
    FastPathMismatch,
    largest_difference,
    tolerance_for,
)
from charlm.training.trainer import Trainer
from helpers import assert_same_weights, cli, records, tiny_config, weights
from runtime.test_graphs import graph_on_the_cpu, replayed_by_calling


class ReplaysNothing(ReplayByCalling):
    """A capture recorded on another device's stream: the graph is empty, a replay does nothing."""

    def replay(self) -> None:
        pass


class ReplaysSomethingElse(ReplayByCalling):
    """A replay whose results are off by a little more than float32 rounding."""

    def replay(self) -> None:
        for static, fresh in zip(self.outputs, self.function()):
            static.copy_(fresh * 1.01 if static.is_floating_point() else fresh)


def replays_nothing(module, sample_args, allow_unused_input=False):
    """``make_graphed_callables`` captured on another device's stream: its forward and backward
    graphs are empty, so every call hands back the static outputs as they were after the warm-up,
    and every backward the static gradients as they were (zero)."""
    with torch.no_grad():
        static_outputs = [output.detach().clone() for output in module(*sample_args)]
    parameters = tuple(module.parameters())

    class Empty(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *inputs):
            return tuple(output.detach() for output in static_outputs)

        @staticmethod
        def backward(ctx, *grads):
            return (None,) * len(sample_args) + tuple(torch.zeros_like(parameter) for parameter in parameters)

    return lambda *inputs: Empty.apply(*inputs, *parameters)


@pytest.fixture
def warnings(monkeypatch) -> list[str]:
    messages = []

    class Recorder:
        def warning(self, message):
            messages.append(message)

    monkeypatch.setattr(charlm.runtime.cuda_graphs, "get_logger", Recorder)
    monkeypatch.setattr(charlm.runtime.training_graphs, "get_logger", Recorder)
    monkeypatch.setattr(charlm.runtime.compiling, "get_logger", Recorder)
    return messages


def tiny_model(cell="lstm", layers=2, **options):
    torch.manual_seed(0)
    return LanguageModel(ModelConfig(cell, vocab_size=13, hidden_size=8, layers=layers, **options)).eval()


# --- the comparison ------------------------------------------------------------------------------------
def test_a_nan_left_by_an_empty_replay_is_an_infinite_difference():
    eager = [torch.tensor([1.0, -2.0]), torch.tensor([0.5])]
    assert largest_difference([t.clone() for t in eager], eager) == 0.0
    assert largest_difference([torch.tensor([1.0, math.nan]), eager[1]], eager) == math.inf
    assert largest_difference([torch.tensor([1.0, -2.0, 3.0]), eager[1]], eager) == math.inf
    assert largest_difference([torch.tensor([1.0, -2.2]), eager[1]], eager) == pytest.approx(0.2 / 3)


def test_the_tolerance_follows_the_precision_the_products_run_in():
    cpu = torch.device("cpu")
    assert tolerance_for(cpu) == 1e-4
    assert tolerance_for(cpu, torch.float64) == 1e-9
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert tolerance_for(cpu) == 5e-2


# --- scoring -------------------------------------------------------------------------------------------
def scoring_with(monkeypatch, graph_class):
    built = []

    def forward(model, device, windows, enabled=True):
        built.append(ScoringForward(model, device, windows, graph=graph_class(), enabled=enabled))
        return built[-1]

    monkeypatch.setattr(charlm.inference.scoring, "ScoringForward", forward)
    return built


TOKENS = np.random.default_rng(0).integers(13, size=3 * 7 * 9 + 5)


def test_a_graph_that_replays_nothing_is_caught_and_scoring_gives_the_eager_score(monkeypatch, warnings):
    """The stand-in of defect 1 (``--device cuda:1`` captured on cuda:0's stream): before the check,
    every window after the first reused the first window's logits."""
    model = tiny_model()
    eager = score_tokens(model, TOKENS, batch_size=3, bptt=7, device="cpu")
    built = scoring_with(monkeypatch, ReplaysNothing)
    score = score_tokens(model, TOKENS, batch_size=3, bptt=7, device="cpu")
    assert score.nats == eager.nats
    check = score.fast_path
    assert check.checked and not check.active and check.max_difference == math.inf
    assert built[0]._graphed is None
    assert warnings == [
        "warning: scoring without a CUDA graph (FastPathMismatch: its outputs are not the eager outputs "
        "(NaN left by a replay that ran nothing, or another shape))"
    ]


def test_a_replay_off_by_more_than_the_tolerance_is_dropped(monkeypatch, warnings):
    model = tiny_model()
    eager = score_tokens(model, TOKENS, batch_size=3, bptt=7, device="cpu")
    scoring_with(monkeypatch, ReplaysSomethingElse)
    score = score_tokens(model, TOKENS, batch_size=3, bptt=7, device="cpu")
    assert score.nats == eager.nats and not score.fast_path.active
    assert 1e-4 < score.fast_path.max_difference < 0.02
    assert warnings[0].startswith("warning: scoring without a CUDA graph (FastPathMismatch: it differs from eager by ")


def test_a_faithful_graph_passes_its_check(monkeypatch, warnings):
    model = tiny_model()
    scoring_with(monkeypatch, ReplayByCalling)
    check = score_tokens(model, TOKENS, batch_size=3, bptt=7, device="cpu").fast_path
    assert check.checked and check.active and check.max_difference == 0.0 and check.tolerance == 1e-4
    assert check.seconds > 0 and warnings == []
    assert check.summary() == "scoring graph: in use (checked against eager: 0 ≤ 0.0001)"


def test_no_cuda_graph_and_the_environment_switch_turn_scoring_graphs_off(monkeypatch):
    model = tiny_model()
    built = scoring_with(monkeypatch, ReplayByCalling)
    assert score_tokens(model, TOKENS, batch_size=3, bptt=7, device="cpu", cuda_graph=False).fast_path is None
    monkeypatch.setenv(ENVIRONMENT_SWITCH, "1")
    assert score_tokens(model, TOKENS, batch_size=3, bptt=7, device="cpu").fast_path is None
    assert [forward._graphed for forward in built] == [None, None]
    monkeypatch.setenv(ENVIRONMENT_SWITCH, "0")
    assert score_tokens(model, TOKENS, batch_size=3, bptt=7, device="cpu").fast_path.active


def test_the_api_and_the_cli_pass_no_cuda_graph_on(monkeypatch, trained_run):
    import charlm

    built = scoring_with(monkeypatch, ReplayByCalling)
    model = charlm.load(trained_run, device="cpu", cuda_graphs=False)
    model.evaluate("valid", record=False, batch_size=2)
    text = "the quick brown fox jumps over the lazy dog " * 20
    model.score(text, batch_size=2)
    assert built and not any(forward.wanted or forward._graphed for forward in built)
    with_graphs = charlm.load(trained_run, device="cpu")
    with_graphs.evaluate("valid", record=False, batch_size=2)
    assert with_graphs.last_fast_path.active
    for command in (
        ("eval", str(trained_run), "--split", "valid", "--batch-size", "2"),
        ("sample", str(trained_run), "--length", "5"),
    ):
        result = cli(*command, "--device", "cpu", "--no-cuda-graph")
        assert result.returncode == 0, result.stderr


def test_eval_prints_and_records_the_check(monkeypatch, trained_run):
    scoring_with(monkeypatch, ReplayByCalling)
    result = cli("eval", str(trained_run), "--split", "valid", "--batch-size", "2", "--device", "cpu")
    assert result.returncode == 0, result.stderr
    assert "fast path       scoring graph: in use (checked against eager: 0 ≤ 0.0001)" in result.stdout
    (record,) = [row for row in records(trained_run, "eval") if row["split"] == "valid"][-1:]
    assert record["fast_path"]["checked"] and record["fast_path"]["active"]


# --- sampling ------------------------------------------------------------------------------------------
def test_sampling_through_a_graph_that_replays_nothing_draws_the_eager_text(warnings):
    """Before the check, the empty replay handed back the same logits for every symbol."""
    model = tiny_model("gru", layers=1)
    config = SampleConfig(length=30, seed=3)
    eager = list(generate(model, [1, 2, 3], config))
    sampling = model.for_sampling()
    assert graphed_step(sampling, model.initial_state(1), graph=ReplaysNothing()) == sampling.step
    assert warnings[-1].startswith("warning: sampling without a CUDA graph (FastPathMismatch")
    import charlm.inference.sampling

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            charlm.inference.sampling,
            "graphed_step",
            lambda m, s, enabled=True: graphed_step(m, s, enabled, graph=ReplaysNothing()),
        )
        assert list(generate(model, [1, 2, 3], config)) == eager


def test_sampling_graphs_are_off_when_asked(monkeypatch):
    network = tiny_model("gru", layers=1)
    model, state = network.for_sampling(), network.initial_state(1)
    assert isinstance(graphed_step(model, state, graph=ReplayByCalling()), GraphedCall)
    assert graphed_step(model, state, enabled=False, graph=ReplayByCalling()) == model.step
    monkeypatch.setenv(ENVIRONMENT_SWITCH, "yes")
    assert graphed_step(model, state, graph=ReplayByCalling()) == model.step


# --- training ------------------------------------------------------------------------------------------
def test_a_training_graph_that_replays_nothing_is_caught_and_the_run_trains_eagerly(
    tiny_corpus, tmp_path, monkeypatch, warnings
):
    """Dropout on: the check draws the eager window's masks again, so a faithful graph compares equal
    and the run stays bit for bit the eager run; an empty one is dropped before the first update."""
    settings = dict(epochs=1, cell="lstm", layers=2, dropout=0.2)
    Trainer(tiny_config(tiny_corpus, tmp_path / "eager", **settings)).fit()
    graph_on_the_cpu(monkeypatch, replays_nothing)
    Trainer(tiny_config(tiny_corpus, tmp_path / "empty", cuda_graph=True, **settings)).fit()
    assert_same_weights(weights(tmp_path / "eager"), weights(tmp_path / "empty"))
    (record,) = records(tmp_path / "empty", "cuda_graph")
    assert not record["active"] and record["checked"] and record["max_difference"] is None
    assert "FastPathMismatch" in record["failure"]
    assert warnings == [
        "warning: --cuda-graph: the training window's graphs are not used (FastPathMismatch: its "
        "outputs are not the eager outputs (NaN left by a replay that ran nothing, or another shape)); "
        "training continues without them (the same results at eager speed)"
    ]


def test_a_faithful_training_graph_records_its_check_in_metrics_and_provenance(tiny_corpus, tmp_path, monkeypatch):
    import json

    graph_on_the_cpu(monkeypatch)
    Trainer(tiny_config(tiny_corpus, tmp_path / "run", epochs=1, cuda_graph=True, dropout=0.1)).fit()
    (record,) = records(tmp_path / "run", "cuda_graph")
    assert record["active"] and record["checked"] and record["max_difference"] == 0.0 and record["tolerance"] == 1e-4
    assert record["check_seconds"] > 0
    provenance = json.loads((tmp_path / "run" / "provenance.json").read_text())
    assert provenance["fast_paths"]["training graph"]["active"]


def test_the_environment_switch_turns_training_graphs_off(monkeypatch, warnings):
    monkeypatch.setenv(ENVIRONMENT_SWITCH, "1")
    model = tiny_model()
    assert graphed_window(model, torch.device("cuda"), distributed=False) is model
    assert warnings == ["warning: --cuda-graph is turned off by CHARLM_NO_CUDA_GRAPHS; training eagerly"]


def test_a_cell_that_reads_a_value_back_fails_before_the_capture():
    """Defect 4: the eager window runs first (with synchronisation errors on, on a GPU); a cell that
    raises there is never captured, and the window's result is the eager one."""
    captures = []

    class ReadsBackUnderTheCheck(torch.nn.Module):
        """Raises where synchronising is an error (the first, checked run), runs otherwise."""

        def __init__(self):
            super().__init__()
            self.weight, self.calls = torch.nn.Parameter(torch.ones(1)), 0

        def forward(self, tokens, state):
            self.calls += 1
            if self.calls == 1:
                raise RuntimeError("called a synchronizing CUDA operation")
            return tokens * self.weight, state

    def capture(*args, **kwargs):
        captures.append(args)
        return replayed_by_calling(*args, **kwargs)

    window = GraphedWindow(ReadsBackUnderTheCheck(), torch.device("cpu"), graph_callables=capture)
    tokens = torch.ones(2, 3)
    logits, _ = window(tokens, [(torch.zeros(2, 1),)])
    assert torch.equal(logits, tokens) and captures == []
    assert not window.active and window.settled and "synchronizing" in window.failure


# --- the capture itself (defects 1 and 4) ----------------------------------------------------------------
class RecordedCuda:
    """What ``CudaGraph`` asks of CUDA, recorded: the streams it switches to and back, the graph's
    capture, the synchronisations and the memory released."""

    def __init__(self, fail_capture_end=False):
        self.calls, self.stream, self.fail_capture_end = [], "main", fail_capture_end

    def side_stream(self):
        self.calls.append("side stream")
        return "side"

    @contextlib.contextmanager
    def on(self, stream):
        before, self.stream = self.stream, stream
        try:
            yield
        finally:
            self.stream = before

    def join(self, stream):
        self.calls.append("join")

    def new_graph(self):
        cuda = self

        class Graph:
            def capture_begin(self):
                cuda.calls.append(f"capture begin on {cuda.stream}")

            def capture_end(self):
                cuda.calls.append("capture end")
                if cuda.fail_capture_end:
                    raise RuntimeError("operation failed due to a previous error during capture")

            def replay(self):
                cuda.calls.append("replay")

        return Graph()

    def synchronize(self):
        self.calls.append("synchronize")

    def release(self):
        self.calls.append("release")


def test_a_capture_that_fails_halfway_ends_the_capture_and_restores_the_stream():
    cuda = RecordedCuda(fail_capture_end=True)
    calls = []

    def function():
        calls.append(cuda.stream)
        if len(calls) > 2:  # the warm-up passes; the capture does not
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
        return [torch.zeros(1)]

    graph = CudaGraph(torch.device("cpu"), warmup=2, cuda=cuda)
    with pytest.raises(RuntimeError, match="not permitted when stream is capturing"):  # the cause, not capture_end's
        graph.capture(function)
    assert calls == ["side", "side", "side"]  # warm-up and capture on the side stream
    assert cuda.stream == "main" and graph.graph is None
    assert cuda.calls == [
        "side stream",
        "join",
        "synchronize",
        "capture begin on side",
        "capture end",
        "synchronize",
        "release",
    ]


def test_a_capture_runs_on_a_side_stream_and_hands_back_its_outputs():
    cuda = RecordedCuda()
    graph = CudaGraph(torch.device("cpu"), warmup=1, cuda=cuda)
    outputs = graph.capture(lambda: [torch.ones(2)])
    graph.replay()
    assert torch.equal(outputs[0], torch.ones(2)) and cuda.stream == "main"
    assert cuda.calls == [
        "side stream",
        "join",
        "synchronize",
        "capture begin on side",
        "capture end",
        "join",
        "replay",
    ]


def test_an_indexed_cuda_device_is_made_current(monkeypatch):
    """Defect 1: ``--device cuda:1`` in one process makes cuda:1 the current device, so a capture on
    the current device's stream records the model's kernels."""
    import charlm.runtime.devices as devices

    made_current = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: made_current.append(str(device)))
    assert devices.resolve_device("cuda:1") == torch.device("cuda:1")
    assert devices.resolve_device("cuda") == torch.device("cuda")
    assert made_current == ["cuda:1"]


# --- compiled steps ----------------------------------------------------------------------------------------
def test_a_compiled_step_that_computes_something_else_falls_back(monkeypatch, warnings):
    def off_by_a_little(graph, example_inputs):
        def run(*args):
            return [
                output * 1.01 if isinstance(output, torch.Tensor) and output.is_floating_point() else output
                for output in graph.forward(*args)
            ]

        return run

    model = tiny_model("gru", layers=1).train()
    tokens, state = torch.randint(13, (3, 5)), model.initial_state(3)
    monkeypatch.setattr(charlm.runtime.compiling, "_probe", lambda device, backend: None)
    forward = CompiledForward(model, torch.device("cpu"), backend=off_by_a_little)
    logits, _ = forward(tokens, state)
    torch.testing.assert_close(logits, model(tokens, state)[0], rtol=0, atol=0)
    assert not forward.active and forward.check.checked and forward.check.max_difference > 1e-4
    assert warnings and "FastPathMismatch: it differs from eager by" in warnings[0]


def test_a_faithful_compiled_step_passes_and_dropout_is_said_to_be_unchecked(monkeypatch):
    monkeypatch.setattr(charlm.runtime.compiling, "BACKEND", "eager")
    model = tiny_model("gru", layers=1).train()
    tokens, state = torch.randint(13, (3, 5)), model.initial_state(3)
    forward = CompiledForward(model, torch.device("cpu"))
    forward(tokens, state)
    assert forward.active and forward.check.checked and forward.check.max_difference == 0.0
    dropping = tiny_model("gru", layers=2, dropout=0.3).train()
    forward = CompiledForward(dropping, torch.device("cpu"))
    forward(tokens, dropping.initial_state(3))
    assert forward.active and not forward.check.checked and "dropout" in forward.check.failure


def test_a_mismatch_names_the_difference_and_the_tolerance():
    check = FastPathCheck("compiled step")
    assert not check.passed(0.25, 1e-4)
    assert str(check.mismatch()) == "it differs from eager by 0.25 (tolerance 0.0001)"
    assert isinstance(check.mismatch(), FastPathMismatch)
    assert check.fields()["max_difference"] == 0.25


def test_a_capture_keeps_autograds_warning_about_its_side_stream_to_itself():
    """Autograd warns once a run that a backward on the side stream meets gradients of the main one
    (seen on an H200, torch 2.11); a capture expects that and keeps it out of the run's output."""

    def function():
        python_warnings.warn("The AccumulateGrad node's stream does not match the stream of the node that produced it")
        return [torch.ones(1)]

    with python_warnings.catch_warnings():
        python_warnings.simplefilter("error")
        CudaGraph(torch.device("cpu"), warmup=1, cuda=RecordedCuda()).capture(function)
        with pytest.raises(UserWarning, match="something else"):
            CudaGraph(torch.device("cpu"), warmup=1, cuda=RecordedCuda()).capture(
                lambda: python_warnings.warn("something else")
            )
