"""`charlm export --format torchscript|onnx`: the one-symbol step, run outside charlm, computes
charlm's step for every cell; the JSON beside it is enough to score text; bad cases refuse."""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import pytest
import torch

import charlm
from cell_cases import CASES, randomise, tiny_model
from charlm.cells import RecurrentCell
from charlm.errors import CharlmError
from charlm.inference import export_step
from charlm.inference.export_step import StateLayout, write_step
from charlm.model import LanguageModel, ModelConfig
from helpers import assert_one_line_error, cli

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")

VOCAB = 11
TEXT = "The Python language reference describes the syntax.\nIt is terse.\n"


def tiny(case):
    torch.manual_seed(0)
    model = tiny_model(case, VOCAB, hidden=8, layers=2)
    randomise(model)
    return model.eval()


def steps_of_charlm(model, tokens, start):
    """charlm's own logits and flattened state, step after step from ``start`` (nested per layer)."""
    layout, state, results = StateLayout.of(model), start, []
    with torch.no_grad():
        for column in tokens.T:
            logits, state = model.step(column, state)
            results.append((logits, layout.flatten(state)))
    return results


def assert_matches_charlm(model, run, batch=4, steps=4):
    """``run(tokens, flat state) -> (logits, flat state)`` equals ``model.step`` within 1e-5 over
    ``steps`` steps from zeros, each fed the state it returned."""
    tokens = torch.randint(VOCAB, (batch, steps), generator=torch.Generator().manual_seed(5))
    layout = StateLayout.of(model)
    state = layout.flatten(model.initial_state(batch))
    for column, (expected_logits, expected_state) in zip(
        tokens.T, steps_of_charlm(model, tokens, model.initial_state(batch))
    ):
        logits, state = run(column, state)
        assert logits.shape == (batch, VOCAB)
        torch.testing.assert_close(logits, expected_logits, rtol=0, atol=1e-5)
        assert len(state) == len(expected_state)
        for got, expected in zip(state, expected_state):
            torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_torchscript_step_equals_charlms_step(case, tmp_path):
    model = tiny(case)
    path = tmp_path / "step.pt"
    assert write_step(model, path, "torchscript") <= 1e-5
    loaded = torch.jit.load(str(path))  # no charlm object involved from here on

    def run(tokens, state):
        logits, *new_state = loaded(tokens, *state)
        return logits, new_state

    assert_matches_charlm(model, run)


ONNX_CASES = [
    case if "[" not in case.id else pytest.param(case, marks=pytest.mark.slow) for case in CASES
]  # options: slow


@pytest.mark.parametrize("case", ONNX_CASES, ids=[case.id for case in CASES])
def test_onnx_step_equals_charlms_step(case, tmp_path):
    onnxruntime = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    model = tiny(case)
    path = tmp_path / "step.onnx"
    assert write_step(model, path, "onnx") <= 1e-5
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    layout = StateLayout.of(model)
    assert [i.name for i in session.get_inputs()] == ["tokens", *layout.names]
    assert [o.name for o in session.get_outputs()] == ["logits", *layout.output_names]

    def run(tokens, state):
        feeds = {"tokens": tokens.numpy(), **{name: s.numpy() for name, s in zip(layout.names, state)}}
        logits, *new_state = session.run(None, feeds)
        return torch.from_numpy(logits), [torch.from_numpy(s) for s in new_state]

    assert_matches_charlm(model, run)


@pytest.mark.parametrize("cell", ["lstm", "mingru"])
def test_cells_in_blocks_export_to_onnx(cell, tmp_path):
    """--wiring block: its RMSNorms and convolution state go through opset 17 as the bare cells do."""
    onnxruntime = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    torch.manual_seed(0)
    model = LanguageModel(ModelConfig(cell, vocab_size=VOCAB, hidden_size=8, layers=2, wiring="block"))
    randomise(model)
    model.eval()
    path = tmp_path / "step.onnx"
    assert write_step(model, path, "onnx") <= 1e-5
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    layout = StateLayout.of(model)

    def run(tokens, state):
        feeds = {"tokens": tokens.numpy(), **{name: s.numpy() for name, s in zip(layout.names, state)}}
        logits, *new_state = session.run(None, feeds)
        return torch.from_numpy(logits), [torch.from_numpy(s) for s in new_state]

    assert_matches_charlm(model, run)


def test_state_layout_names_every_layers_tensors():
    lstm = tiny(next(case for case in CASES if case.cell == "lstm"))
    layout = StateLayout.of(lstm)
    assert layout.counts == (2, 2) and layout.widths == (8, 8, 8, 8)
    assert layout.names == ("layer0_state0", "layer0_state1", "layer1_state0", "layer1_state1")
    state = lstm.initial_state(3)
    assert [t is u for t, u in zip(layout.flatten(state), (*state[0], *state[1]))] == [True] * 4
    assert [tuple(map(id, layer)) for layer in layout.nest(layout.flatten(state))] == [
        tuple(map(id, layer)) for layer in state
    ]
    scrn = tiny(next(case for case in CASES if case.id == "scrn[context_size=3]"))
    assert StateLayout.of(scrn).widths == (8, 3, 8, 3)  # h, then the context s


def test_a_step_that_differs_is_refused_and_nothing_is_kept(tmp_path, monkeypatch):
    model = tiny(CASES[0])
    real_runner = export_step.runner

    def off_by_a_little(format, path, layout):
        run = real_runner(format, path, layout)

        def shifted(tokens, state):
            logits, new_state = run(tokens, state)
            return logits + 1e-3, new_state

        return shifted

    monkeypatch.setattr(export_step, "runner", off_by_a_little)
    with pytest.raises(CharlmError, match=r"differs from charlm's by 1\.00e-03 \(more than 1e-05\)"):
        write_step(model, tmp_path / "step.pt", "torchscript")


class BesselCell(RecurrentCell):
    """h' = I0(W x) / 10 + h / 10: runs in charlm and in TorchScript; ONNX has no I0."""

    name = "bessel"

    def __init__(self, input_size, hidden_size, config=None):
        super().__init__(input_size, hidden_size, config)
        self.weight = torch.nn.Parameter(torch.full((hidden_size, input_size), 0.1))

    def step(self, x, state):
        h = torch.special.i0(x @ self.weight.T) / 10 + state[0] / 10
        return h, (h,)


class CubeStateCell(BesselCell):
    """A cell whose state is [batch, 2, n]: not one of the [batch, width] tensors an export lists."""

    name = "cube"

    def initial_state(self, batch_size, device=None, dtype=None):
        return (torch.zeros(batch_size, 2, self.hidden_size),)


def test_what_cannot_be_exported_is_refused_in_one_line(tmp_path, capfd):
    cube = LanguageModel(ModelConfig("cube", vocab_size=5, hidden_size=3), CubeStateCell)
    with pytest.raises(
        CharlmError,
        match=r"cannot export cell 'cube': its state tensor 0 of layer 0 is not "
        r"\[batch, width\] but has shape \[1, 2, 3\]",
    ):
        write_step(cube, tmp_path / "cube.pt", "torchscript")
    with pytest.raises(
        CharlmError, match="--format must be one of charlm, safetensors, torchscript, onnx, not 'tflite'"
    ):
        write_step(cube, tmp_path / "cube.tflite", "tflite")
    with pytest.raises(CharlmError, match="the step is written as torchscript or onnx, not safetensors"):
        write_step(cube, tmp_path / "cube.safetensors", "safetensors")

    bessel = LanguageModel(ModelConfig("bessel", vocab_size=5, hidden_size=3), BesselCell)
    assert write_step(bessel, tmp_path / "bessel.pt", "torchscript") == 0.0
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    capfd.readouterr()
    with pytest.raises(CharlmError, match=r"cannot export cell 'bessel' to onnx: Exporting the operator 'aten::i0'"):
        write_step(bessel, tmp_path / "bessel.onnx", "onnx")
    assert capfd.readouterr().out == ""  # not the exporter's dump of the whole graph


def test_a_step_of_another_shape_is_refused(tmp_path, monkeypatch):
    real_runner = export_step.runner
    monkeypatch.setattr(
        export_step, "runner", lambda *args: lambda tokens, state: (real_runner(*args)(tokens, state)[0][:, :-1], state)
    )
    with pytest.raises(CharlmError, match=r"gives shape \[3, 10\] where charlm's gives \[3, 11\]: not written"):
        write_step(tiny(CASES[0]), tmp_path / "step.pt", "torchscript")


# --- the command line on a trained run ------------------------------------------------------------


def onnx_score(onnx_file, text: str) -> float:
    """Nats of ``text`` (every symbol after the first) from the exported file and its JSON alone:
    what a user without charlm does (the example in docs/evaluation.md)."""
    import onnxruntime

    info = json.loads(onnx_file.with_name(onnx_file.name + ".json").read_text(encoding="utf-8"))
    vocabulary = info["vocabulary"]
    session = onnxruntime.InferenceSession(str(onnx_file))
    state = {s["name"]: np.zeros((1, s["shape"][1]), np.float32) for s in info["state"]}
    ids = [vocabulary.index(c) for c in text]
    nats = 0.0
    for token, following in zip(ids, ids[1:]):
        logits, *new_state = session.run(None, {"tokens": np.array([token], np.int64), **state})
        state = {s["name"]: value for s, value in zip(info["state"], new_state)}
        row = logits[0].astype(np.float64)
        nats -= row[following] - (row.max() + math.log(np.exp(row - row.max()).sum()))
    return nats


def test_onnx_export_from_the_command_line_scores_text_as_charlm_does(trained_run, tmp_path):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    output = tmp_path / "model.onnx"
    result = cli("export", trained_run, output, "--format", "onnx", check_code=0)
    assert "max difference from charlm's step" in result.stdout and "over 5 steps" in result.stdout
    difference = float(result.stdout.split("charlm's step ")[1].split()[0])
    assert 0 <= difference <= 1e-5

    model = charlm.load(trained_run, device="cpu")
    info = json.loads((tmp_path / "model.onnx.json").read_text(encoding="utf-8"))
    assert info["vocabulary"] == model.vocabulary and info["file"] == "model.onnx" and info["format"] == "onnx"
    assert info["inputs"] == ["tokens", "layer0_state0"] and info["outputs"] == ["logits", "layer0_state0_out"]
    assert info["state"] == [
        {
            "name": "layer0_state0",
            "output": "layer0_state0_out",
            "dtype": "float32",
            "shape": ["batch", 32],
            "initial": "zeros",
        }
    ]
    assert info["model"]["cell"] == "lru" and info["unit"] == "char" and info["tokenizer"]["unk"] == model.tokenizer.unk
    assert info["normalisation"]["newlines_to_lf"] and info["normalisation"]["strip_leading_bom"]
    assert onnx_score(output, TEXT) == pytest.approx(model.score(TEXT).nats, rel=1e-5)


def test_torchscript_export_from_the_command_line(trained_run, tmp_path):
    output = tmp_path / "step.pt"
    result = cli("export", trained_run, output, "--format", "torchscript", check_code=0)
    assert "(torchscript," in result.stdout and str(tmp_path / "step.pt.json") in result.stdout
    model = charlm.load(trained_run, device="cpu")
    loaded = torch.jit.load(str(output))
    ids = model.tokenizer.encode(TEXT)
    state, nats = [torch.zeros(1, 32)], 0.0
    with torch.no_grad():
        for token, following in zip(ids, ids[1:]):
            logits, *state = loaded(torch.tensor([token]), *state)
            nats -= torch.log_softmax(logits[0].double(), dim=0)[following].item()
    assert nats == pytest.approx(model.score(TEXT).nats, rel=1e-5)


def test_onnx_without_the_extra_says_how_to_install_it(trained_run, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    result = cli("export", trained_run, tmp_path / "model.onnx", "--format", "onnx")
    assert_one_line_error(result, "--format onnx needs", "-e '.[onnx]'")
    assert list(tmp_path.iterdir()) == []


def test_bad_format_and_existing_description_are_refused(trained_run, tmp_path):
    result = cli("export", trained_run, tmp_path / "model.onnx", "--format", "tflite")
    assert result.returncode == 2 and "tflite" in result.stderr and "Traceback" not in result.stderr
    (tmp_path / "step.pt.json").write_text("{}", encoding="utf-8")
    result = cli("export", trained_run, tmp_path / "step.pt", "--format", "torchscript")
    assert_one_line_error(result, "step.pt.json exists", "--force")
    assert not (tmp_path / "step.pt").exists()
    cli("export", trained_run, tmp_path / "step.pt", "--format", "torchscript", "--force", check_code=0)
    assert json.loads((tmp_path / "step.pt.json").read_text(encoding="utf-8"))["format"] == "torchscript"


def test_a_step_that_differs_leaves_no_file_from_the_command_line(trained_run, tmp_path, monkeypatch):
    monkeypatch.setattr(export_step, "TOLERANCE", -1.0)  # every difference, even 0, is too large
    result = cli("export", trained_run, tmp_path / "step.pt", "--format", "torchscript")
    assert_one_line_error(result, "differs from charlm's by 0.00e+00", "not written")
    assert list(tmp_path.iterdir()) == []
