"""A cell of one's own on ScanCell, the example docs/parallel-cells.md prints (taken from it verbatim): its window
(the bottom layer's coefficients over the vocabulary, every form of the scan) and its sampling step are its step."""

import re

import pytest
import torch

from cell_cases import randomise
from charlm.cells import CELLS
from charlm.cells.scan import SCAN_METHODS
from charlm.cells.scan_cell import ScanInference
from charlm.model import InferenceModel, LanguageModel, ModelConfig
from helpers import REPO


@pytest.fixture
def forget_gate(tmp_path, monkeypatch):
    page = (REPO / "docs" / "parallel-cells.md").read_text(encoding="utf-8")
    match = re.search(r"```python\n# scancells.py\n(.*?)```", page, re.S)
    assert match, "docs/parallel-cells.md lost its ScanCell example"
    (tmp_path / "scancells.py").write_text(match.group(1), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    return "scancells:ForgetGate"


@pytest.mark.parametrize("embed_size", [None, 0], ids=["embedding", "one-hot"])
@pytest.mark.parametrize("method", SCAN_METHODS)
def test_the_docs_scan_cell_runs_its_step(forget_gate, method, embed_size, double_precision):
    torch.manual_seed(0)
    config = ModelConfig(
        forget_gate, vocab_size=4, hidden_size=6, layers=2, embed_size=embed_size, cell_options={"scan": method}
    )
    model = LanguageModel(config)
    randomise(model)
    tokens = torch.randint(4, (3, 7))  # 21 positions > 4 symbols: the bottom layer's coefficients are gathered
    state = [tuple(0.5 * torch.randn_like(t) for t in layer) for layer in model.initial_state(3)]
    if method == "log":  # a > 0, b of either sign: the form splits b; the state may be of any sign
        state = [tuple(-t for t in layer) for layer in state]

    logits, new_state = model(tokens, state)
    reference, reference_state = [], state
    for column in tokens.T:
        step_logits, reference_state = model.step(column, reference_state)
        reference.append(step_logits)
    reference = torch.stack(reference, dim=1)
    torch.testing.assert_close(logits, reference)
    for window_layer, step_layer in zip(new_state, reference_state):
        torch.testing.assert_close(window_layer, step_layer)
    weights = torch.randn_like(logits)
    window_grads = torch.autograd.grad((logits * weights).sum(), list(model.parameters()))
    step_grads = torch.autograd.grad((reference * weights).sum(), list(model.parameters()))
    for window_grad, step_grad in zip(window_grads, step_grads):
        torch.testing.assert_close(window_grad, step_grad)

    with torch.inference_mode():
        sampling = InferenceModel(model.eval())
        assert all(isinstance(layer, ScanInference) for layer in sampling.layers)
        sampled_state = reference_state = state
        for column in tokens.T:
            sampled, sampled_state = sampling.step(column, sampled_state)
            expected, reference_state = model.step(column, reference_state)
            torch.testing.assert_close(sampled, expected)


def test_the_docs_scan_cell_is_a_cell_with_a_scan_option(forget_gate):
    cell = CELLS.get(forget_gate)
    assert cell.name == "forget-gate" and cell.parallel_form == "scan" and cell.Config().scan == "auto"
