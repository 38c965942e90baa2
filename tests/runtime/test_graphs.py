"""``--cuda-graph``: the training window replayed from captured CUDA graphs, checked on the CPU.

No GPU runs the suite, so ``make_graphed_callables`` is replaced by :func:`replayed_by_calling`,
which keeps its contract (the inputs copied into static tensors, the outputs written into the
same static tensors at every call, the parameters' gradients handed back through an autograd
``Function``) and computes by calling the module. What is checked is charlm's side: the state
flattened and carried, the static outputs used before they are overwritten, the shorter last
window run eagerly, the fallback and the errors.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import charlm.runtime.cuda_graphs
import charlm.runtime.training_graphs
import charlm.training.setup
from charlm.runtime.training_graphs import GraphedWindow, graphed_window
from charlm.model import LanguageModel, ModelConfig
from charlm.training.trainer import Trainer
from helpers import assert_one_line_error, assert_same_weights, cli, records, tiny_config, tiny_train, weights


def replayed_by_calling(module, sample_args, allow_unused_input=False):
    """``torch.cuda.make_graphed_callables(module, sample_args)`` done by calling ``module``."""
    static_inputs = [arg.clone() for arg in sample_args]
    parameters = tuple(module.parameters())
    static_outputs = []
    replayed_by_calling.captures.append([tuple(arg.shape) for arg in sample_args])

    class Replay(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *inputs):
            for static, given in zip(static_inputs, inputs):
                static.copy_(given)
            with torch.enable_grad():
                ctx.outputs = module(*static_inputs)
            if not static_outputs:
                static_outputs.extend(output.detach().clone() for output in ctx.outputs)
            for static, output in zip(static_outputs, ctx.outputs):
                static.copy_(output.detach())
            return tuple(static.detach() for static in static_outputs)

        @staticmethod
        def backward(ctx, *grads):
            pairs = [(output, grad) for output, grad in zip(ctx.outputs, grads) if output.requires_grad]
            grads = torch.autograd.grad(
                [output for output, _ in pairs],
                parameters,
                [grad for _, grad in pairs],
                allow_unused=allow_unused_input,
            )
            return (None,) * len(static_inputs) + grads

    return lambda *inputs: Replay.apply(*inputs, *parameters)


replayed_by_calling.captures = []


def graph_on_the_cpu(monkeypatch, capture=replayed_by_calling):
    """Let ``--cuda-graph`` run on the CPU, capturing with ``capture``."""
    replayed_by_calling.captures.clear()
    monkeypatch.setattr(charlm.training.setup, "check_cuda_graph", lambda wanted, device: None)
    monkeypatch.setattr(charlm.runtime.training_graphs, "make_graphed_callables", capture)


@pytest.fixture
def warnings(monkeypatch) -> list[str]:
    """The warnings the CUDA-graph modules log, as a list."""
    messages = []

    class Recorder:
        def warning(self, message):
            messages.append(message)

    monkeypatch.setattr(charlm.runtime.cuda_graphs, "get_logger", Recorder)
    monkeypatch.setattr(charlm.runtime.training_graphs, "get_logger", Recorder)
    return messages


def test_graphed_training_gives_the_eager_weights(tiny_corpus, tmp_path, monkeypatch):
    """Two layers with dropout (its random draws happen in the replay too) and a two-tensor state:
    after an epoch the weights are bit for bit those of eager training."""
    settings = dict(epochs=1, cell="lstm", layers=2, dropout=0.2)
    Trainer(tiny_config(tiny_corpus, tmp_path / "eager", **settings)).fit()
    graph_on_the_cpu(monkeypatch)
    trainer = Trainer(tiny_config(tiny_corpus, tmp_path / "graphed", cuda_graph=True, **settings))
    assert isinstance(trainer.step.forward, GraphedWindow)
    trainer.fit()
    assert_same_weights(weights(tmp_path / "eager"), weights(tmp_path / "graphed"))
    # captured once, for the first window: tokens [B, T] and the four state tensors [B, n]
    assert replayed_by_calling.captures == [[(8, 16)] + [(8, 24)] * 4]
    (record,) = records(tmp_path / "graphed", "cuda_graph")
    assert record["active"] and record["failure"] is None


def test_a_failed_capture_falls_back_in_one_line_and_trains_the_same(tiny_corpus, tmp_path, monkeypatch):
    def capture_fails(module, sample_args, allow_unused_input=False):
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

    Trainer(tiny_config(tiny_corpus, tmp_path / "eager", epochs=1, cell="gru")).fit()
    graph_on_the_cpu(monkeypatch, capture_fails)
    result = cli(*tiny_train(tiny_corpus, tmp_path / "graphed", "--cuda-graph", epochs=1, cell="gru"))
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "--cuda-graph" in line]
    assert warnings == [
        "warning: --cuda-graph: capturing the training window failed (RuntimeError: CUDA error: "
        "operation not permitted when stream is capturing); trying once more",
        "warning: --cuda-graph: the training window's graphs are not used (RuntimeError: CUDA error: "
        "operation not permitted when stream is capturing); training continues without them (the same "
        "results at eager speed)",
    ]
    assert_same_weights(weights(tmp_path / "eager"), weights(tmp_path / "graphed"))
    (record,) = records(tmp_path / "graphed", "cuda_graph")
    assert not record["active"] and "not permitted" in record["failure"]


def test_a_capture_that_fails_once_is_tried_again_and_used(tiny_corpus, tmp_path, monkeypatch):
    """On the first GPU run one cell's first capture failed where the next cell's passed: a second
    attempt is made before training falls back."""
    attempts = []

    def fails_the_first_time(module, sample_args, allow_unused_input=False):
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError("CUDA error: operation failed due to a previous error during capture")
        return replayed_by_calling(module, sample_args, allow_unused_input)

    Trainer(tiny_config(tiny_corpus, tmp_path / "eager", epochs=1, cell="gru")).fit()
    graph_on_the_cpu(monkeypatch, fails_the_first_time)
    Trainer(tiny_config(tiny_corpus, tmp_path / "graphed", epochs=1, cell="gru", cuda_graph=True)).fit()
    assert len(attempts) == 2
    (record,) = records(tmp_path / "graphed", "cuda_graph")
    assert record["active"] and record["checked"] and record["failure"] is None
    assert_same_weights(weights(tmp_path / "eager"), weights(tmp_path / "graphed"))


def test_a_failed_capture_puts_the_random_generator_back(monkeypatch):
    """A capture that fails midway leaves CUDA's generator marked as capturing (every later draw
    fails); the state copied before is set back in its place, and only after a failure."""
    calls = []

    class Generator:
        def clone_state(self):
            calls.append("clone")
            return "saved"

        def graphsafe_set_state(self, state):
            calls.append(("set", state))

    monkeypatch.setattr(charlm.runtime.cuda_graphs, "default_generator", lambda device: Generator())
    with charlm.runtime.cuda_graphs.generator_kept_on_failure(torch.device("cuda")):
        pass
    assert calls == ["clone"]
    with pytest.raises(RuntimeError, match="capture"):
        with charlm.runtime.cuda_graphs.generator_kept_on_failure(torch.device("cuda")):
            raise RuntimeError("capture invalidated")
    assert calls == ["clone", "clone", ("set", "saved")]


def test_the_capture_runs_with_autocast_caching_off():
    """make_graphed_callables refuses autocast's weight cache; the window is captured without it,
    and a window of another shape runs eagerly."""
    seen = []

    def capture(module, sample_args, allow_unused_input=False):
        seen.append((torch.is_autocast_enabled("cpu"), torch.is_autocast_cache_enabled()))
        return replayed_by_calling(module, sample_args, allow_unused_input)

    model = LanguageModel(ModelConfig("gru", vocab_size=13, hidden_size=8))
    window = GraphedWindow(model, torch.device("cpu"), graph_callables=capture)
    reference = window._outputs_and_gradients

    def eager_reference(call, tokens, flat):  # the eager run the graphs are checked against, then the replay
        seen.append(("reference", torch.is_autocast_enabled("cpu"), torch.is_autocast_cache_enabled()))
        return reference(call, tokens, flat)

    window._outputs_and_gradients = eager_reference
    tokens = torch.randint(13, (3, 5))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, state = window(tokens, model.initial_state(3))
        assert logits.shape == (3, 5, 13) and state[0][0].shape == (3, 8)
        window(tokens[:, :2], state)  # the shorter last window of an epoch
    # A cached cast keeps its weight's autograd node alive from the eager run into the capture (on a
    # GPU, from the default stream: the capture was invalidated), so the eager reference caches nothing either.
    assert seen[:2] == [("reference", True, False), (True, False)]  # then the replay's own check
    assert len(seen) == 3


def test_torchrun_trains_eagerly_with_a_warning(warnings):
    model = LanguageModel(ModelConfig("gru", vocab_size=13, hidden_size=8))
    assert graphed_window(model, torch.device("cuda"), distributed=True) is model
    assert warnings == [
        "warning: --cuda-graph is not used under torchrun (DistributedDataParallel's gradient hooks "
        "cannot run inside a captured backward); training eagerly"
    ]


def test_cuda_graph_errors(tiny_corpus):
    small = dict(cell="gru", hidden_size=8, epochs=1, cuda_graph=True)
    assert_one_line_error(
        cli(*tiny_train(tiny_corpus, device="cpu", **small)), "--cuda-graph needs a CUDA device, not cpu"
    )
    assert_one_line_error(
        cli(*tiny_train(tiny_corpus, compile=True, **small)), "--cuda-graph and --compile are exclusive"
    )
    assert_one_line_error(
        cli("bench", "--cells", "gru", "--device", "cpu", "--cuda-graph"), "--cuda-graph needs a CUDA device, not cpu"
    )


def test_bench_trains_every_cell_through_the_graphs_and_reports_the_capture(monkeypatch):
    graph_on_the_cpu(monkeypatch)
    result = cli(
        "bench",
        "--cells",
        "gru,rhn",
        "--params",
        "20k",
        "--batch-size",
        "4",
        "--bptt",
        "6",
        "--steps",
        "1",
        "--repeat",
        "1",
        "--sample-length",
        "3",
        "--device",
        "cpu",
        "--cuda-graph",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["settings"]["cuda_graph"]
    baseline, *cells = report["results"]
    assert "capture_seconds" not in baseline  # the fused baseline stays eager
    assert [cell["name"] for cell in cells] == ["gru", "rhn"] and all(cell["capture_seconds"] > 0 for cell in cells)
    assert len(replayed_by_calling.captures) == 2
    assert baseline["train_path"] == "eager" and all(cell["train_path"] == "cuda graph" for cell in cells)


def scoring_through(monkeypatch, graph_factory):
    """Make ``score_tokens`` build its ``ScoringForward`` with the graph ``graph_factory()`` gives."""
    import charlm.inference.scoring

    built = []

    def forward(model, device, windows, enabled=True):
        built.append(
            charlm.runtime.cuda_graphs.ScoringForward(model, device, windows, graph=graph_factory(), enabled=enabled)
        )
        return built[-1]

    monkeypatch.setattr(charlm.inference.scoring, "ScoringForward", forward)
    return built


def test_scoring_through_the_graph_gives_the_eager_score(monkeypatch):
    """Full windows replayed from the graph, the shorter last one called: the same nats per token."""
    from charlm.inference.scoring import score_tokens
    from charlm.runtime.cuda_graphs import ReplayByCalling

    torch.manual_seed(0)
    model = LanguageModel(ModelConfig("lstm", vocab_size=13, hidden_size=8, layers=2))
    tokens = torch.randint(13, (3 * 7 * 9 + 5,)).numpy()  # 3 streams: 9 windows of 7, and a short one
    eager = score_tokens(model, tokens, batch_size=3, bptt=7, device="cpu", per_token=True)
    built = scoring_through(monkeypatch, ReplayByCalling)
    replayed = score_tokens(model, tokens, batch_size=3, bptt=7, device="cpu", per_token=True)
    assert built[0]._graphed is not None
    assert replayed.nats == pytest.approx(eager.nats, rel=1e-12)
    np.testing.assert_array_equal(replayed.token_nats, eager.token_nats)
    few = score_tokens(model, tokens[: 3 * 7 * 4], batch_size=3, bptt=7, device="cpu")  # 4 windows: not worth a graph
    assert built[1]._graphed is None and few.tokens == 3 * 7 * 4 - 1


def test_scoring_falls_back_with_a_warning_where_capture_fails(monkeypatch, warnings):
    from charlm.inference.scoring import score_tokens

    class CaptureFails:
        def capture(self, function):
            raise RuntimeError("operation not permitted when stream is capturing")

    model = LanguageModel(ModelConfig("gru", vocab_size=13, hidden_size=8))
    tokens = torch.randint(13, (2 * 5 * 10,)).numpy()
    eager = score_tokens(model, tokens, batch_size=2, bptt=5, device="cpu")
    scoring_through(monkeypatch, CaptureFails)
    assert score_tokens(model, tokens, batch_size=2, bptt=5, device="cpu").nats == eager.nats
    assert warnings == [
        "warning: scoring without a CUDA graph (RuntimeError: operation not permitted when stream is capturing)"
    ]


def handing_on(tokens, state):
    """A cell whose new state hands one input state on into another slot: h′ = h + g/2 + 1, g′ = h."""
    ((h, g),) = state
    return h.sum(dim=-1, keepdim=True), [(h + g / 2 + 1, h)]


def test_a_state_handed_on_to_another_slot_replays_as_it_runs_eagerly():
    from charlm.runtime.cuda_graphs import GraphedCall, ReplayByCalling

    tokens, state = torch.zeros(1, 1, dtype=torch.long), [(torch.zeros(1, 1), torch.zeros(1, 1))]
    graphed = GraphedCall(handing_on, tokens, state, graph=ReplayByCalling())
    eager_state, replayed_state, eager_h, replayed_h = state, state, [], []
    for _ in range(4):
        _, eager_state = handing_on(tokens, eager_state)
        _, replayed_state = graphed(tokens, replayed_state)
        eager_h.append(eager_state[0][0].item())
        replayed_h.append(replayed_state[0][0].item())
    assert eager_h == [1.0, 2.0, 3.5, 5.5]
    assert replayed_h == eager_h  # with g′ the graph's own input h, copying slot by slot gave 1, 2.5, 4.75, 8.125


def test_the_training_window_gives_the_graph_outputs_of_their_own():
    from charlm.runtime.training_graphs import FlatWindow

    h, g = torch.ones(2, 3), torch.zeros(2, 3)
    logits, new_h, new_g = FlatWindow(lambda tokens, state: handing_on(tokens, state), [2])(torch.zeros(2, 1), h, g)
    assert torch.equal(new_g, h) and new_g.untyped_storage().data_ptr() != h.untyped_storage().data_ptr()


def test_a_shorter_first_window_runs_eagerly_and_the_graph_is_captured_at_the_full_window():
    """A run resumed at an epoch's shorter last window: that window runs eagerly, the capture waits for
    the first full one, and until then nothing claims the graph is in use."""
    replayed_by_calling.captures.clear()
    model = LanguageModel(ModelConfig("gru", vocab_size=11, hidden_size=8))
    graphed = GraphedWindow(model, torch.device("cpu"), graph_callables=replayed_by_calling, window_shape=(3, 6))
    state = model.initial_state(3)
    short = torch.randint(11, (3, 4))
    torch.testing.assert_close(graphed(short, state)[0], model(short, state)[0])
    assert not graphed.settled and replayed_by_calling.captures == []
    full = torch.randint(11, (3, 6))
    torch.testing.assert_close(graphed(full, state)[0], model(full, state)[0])
    assert graphed.settled and graphed.active and replayed_by_calling.captures == [[(3, 6), (3, 8)]]


def test_the_trainer_captures_and_compiles_at_its_full_window(tiny_corpus, tmp_path, monkeypatch):
    graph_on_the_cpu(monkeypatch)
    trainer = Trainer(tiny_config(tiny_corpus, tmp_path / "run", cuda_graph=True, batch_size=8, bptt=16))
    assert trainer.step.forward.window_shape == (8, 16)
    trainer.run.release()
