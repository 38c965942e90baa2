"""``--compile``: the training forward pass through torch.compile, with a fallback to eager.

The default suite traces with TorchDynamo's ``eager`` backend (no code generation, seconds); the
real C++ compilation of inductor takes tens of seconds on a 2-core CPU and is marked slow.
"""

from __future__ import annotations


import pytest
import torch

import charlm.runtime.compiling
from charlm.checkpoint import Checkpoint
from charlm.runtime.compiling import CompiledForward
from charlm.model import LanguageModel, ModelConfig
from charlm.training.trainer import Trainer
from helpers import assert_same_weights, cli, records, tiny_config, tiny_train, weights


def test_compiled_training_gives_the_eager_weights(tiny_corpus, tmp_path, monkeypatch):
    """The traced forward computes what the model computes: after an epoch, the same weights."""
    monkeypatch.setattr(charlm.runtime.compiling, "BACKEND", "eager")
    Trainer(tiny_config(tiny_corpus, tmp_path / "eager", epochs=1, cell="gru")).fit()
    Trainer(tiny_config(tiny_corpus, tmp_path / "compiled", epochs=1, cell="gru", compile=True)).fit()
    assert_same_weights(weights(tmp_path / "eager"), weights(tmp_path / "compiled"))
    (record,) = records(tmp_path / "compiled", "compile")
    assert record["active"] and record["backend"] == "eager" and record["seconds"] > 0
    (end,) = records(tmp_path / "compiled", "end")
    wall = end["wall_seconds"]  # the probe before training is its own part; the first step is training time
    assert 0 < wall["compile"] < record["seconds"] <= wall["compile"] + wall["train"]
    assert "compile" not in records(tmp_path / "eager", "end")[0]["wall_seconds"]


def test_no_compiler_falls_back_in_one_line_and_trains_the_same(tiny_corpus, tmp_path, monkeypatch):
    def missing_toolchain(graph, example_inputs):
        raise RuntimeError("no working C++ compiler found in PATH")

    monkeypatch.setattr(charlm.runtime.compiling, "BACKEND", missing_toolchain)
    Trainer(tiny_config(tiny_corpus, tmp_path / "eager", epochs=1)).fit()
    result = cli(*tiny_train(tiny_corpus, tmp_path / "compiled", "--compile", epochs=1))
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "--compile" in line]
    assert len(warnings) == 1
    assert warnings[0] == (
        "warning: --compile: torch.compile does not work here (RuntimeError: no working C++ compiler "
        "found in PATH); training continues without it (the same results at eager speed)"
    )
    assert_same_weights(weights(tmp_path / "eager"), weights(tmp_path / "compiled"))
    (record,) = records(tmp_path / "compiled", "compile")
    assert not record["active"] and "no working C++ compiler" in record["failure"]


def test_a_model_that_fails_to_compile_runs_eagerly(monkeypatch):
    """A failure on the model's own first call (after the probe passed) also falls back."""
    calls = []

    def fails_on_the_model(graph, example_inputs):
        calls.append(len(graph.graph.nodes))
        if len(calls) > 1:  # the probe compiled; the model does not
            raise RuntimeError("unsupported operator")
        return graph.forward

    monkeypatch.setattr(charlm.runtime.compiling, "BACKEND", fails_on_the_model)
    model = LanguageModel(ModelConfig("gru", vocab_size=11, hidden_size=8))
    tokens, state = torch.randint(11, (3, 5)), model.initial_state(3)
    forward = CompiledForward(model, torch.device("cpu"))
    assert forward.active
    logits, _ = forward(tokens, state)
    assert not forward.active and "unsupported operator" in forward.failure
    torch.testing.assert_close(logits, model(tokens, state)[0])


def test_a_shorter_first_window_is_not_compiled_for(monkeypatch):
    monkeypatch.setattr(charlm.runtime.compiling, "BACKEND", "eager")
    model = LanguageModel(ModelConfig("lru", vocab_size=11, hidden_size=8))
    forward = CompiledForward(model, torch.device("cpu"), window_shape=(3, 6))
    state = model.initial_state(3)
    for length in (4, 6, 6):  # resumed at an epoch's shorter last window, then full ones
        tokens = torch.randint(11, (3, length))
        torch.testing.assert_close(forward(tokens, state)[0], model(tokens, state)[0])
        assert forward.settled == (length == 6)
    assert forward.active and tuple(forward._shape) == (3, 6)


def test_windows_of_another_shape_run_eagerly(monkeypatch):
    monkeypatch.setattr(charlm.runtime.compiling, "BACKEND", "eager")
    model = LanguageModel(ModelConfig("lru", vocab_size=11, hidden_size=8))
    forward = CompiledForward(model, torch.device("cpu"))
    state = model.initial_state(3)
    for length in (6, 6, 4):  # full windows, then an epoch's shorter last one
        tokens = torch.randint(11, (3, length))
        torch.testing.assert_close(forward(tokens, state)[0], model(tokens, state)[0])
    assert forward.active and tuple(forward._shape) == (3, 6)


@pytest.mark.slow
def test_inductor_compiles_a_cell_and_agrees_with_eager(tiny_corpus, tmp_path):
    """The real code generator (a C++ compiler on the CPU): about 40 s per model on 2 cores."""
    Trainer(tiny_config(tiny_corpus, tmp_path / "eager", epochs=1, cell="lru")).fit()
    Trainer(tiny_config(tiny_corpus, tmp_path / "compiled", epochs=1, cell="lru", compile=True)).fit()
    eager, compiled = weights(tmp_path / "eager"), weights(tmp_path / "compiled")
    for key in eager:
        torch.testing.assert_close(compiled[key], eager[key], rtol=1e-4, atol=1e-5)
    (record,) = records(tmp_path / "compiled", "compile")
    assert record["active"] and record["backend"] == "inductor"
    assert Checkpoint.load(tmp_path / "compiled" / "last.pt").train_config.compile
