"""Sampling's fast path: every cell's InferenceStep, and the model built from them, compute the
reference ``step`` (float64, several steps, 1 and 2 layers); the draw is multinomial's."""

import pytest
import torch

from cell_cases import CASES
from charlm.cells import CELLS, parse_cell_options
from charlm.cells.base import InferenceStep
from charlm.config_inference import SampleConfig
from charlm.errors import CharlmError
from charlm.model import InferenceModel, LanguageModel, ModelConfig
from charlm.inference.sampling import draw, generate
from helpers import assert_replays_the_step


def _accepts_one_hot(case) -> bool:
    cell_class = CELLS.get(case.cell)
    return cell_class.required_input_size(6, parse_cell_options(cell_class, case.options)) is None


VARIANTS = [(case, layers, None) for case in CASES for layers in (1, 2)]
VARIANTS += [(case, 2, 0) for case in CASES if _accepts_one_hot(case)]


def randomised_model(case, layers, embed_size=None):
    torch.manual_seed(0)
    config = ModelConfig(
        case.cell, vocab_size=5, hidden_size=6, layers=layers, embed_size=embed_size, cell_options=dict(case.options)
    )
    model = LanguageModel(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))  # zero-initialised terms matter too
    return model


@pytest.mark.parametrize(
    "case, layers, embed_size",
    VARIANTS,
    ids=[f"{case.id}-{layers}layer{'-one-hot' if size == 0 else ''}" for case, layers, size in VARIANTS],
)
def test_inference_model_computes_the_reference_step(case, layers, embed_size, double_precision):
    model = randomised_model(case, layers, embed_size)
    tokens = torch.randint(5, (2, 6))
    with torch.inference_mode():
        fast = model.for_sampling()
        assert isinstance(fast, InferenceModel)
        reference_state = [tuple(0.5 * torch.randn_like(t) for t in layer) for layer in model.initial_state(2)]
        fast_state = reference_state
        for t in range(tokens.shape[1]):
            reference_logits, reference_state = model.step(tokens[:, t], reference_state)
            logits, fast_state = fast.step(tokens[:, t], fast_state)
            torch.testing.assert_close(logits, reference_logits)
            for reference_layer, layer in zip(reference_state, fast_state):
                assert len(layer) == len(reference_layer)
                for a, b in zip(layer, reference_layer):
                    torch.testing.assert_close(a, b)


def test_every_registered_cell_has_its_own_inference_step():
    for case in CASES:
        model = randomised_model(case, 1)
        with torch.no_grad():
            assert type(model.layers[0].inference_step()) is not InferenceStep, case.id


def test_a_cell_without_its_own_inference_step_samples_through_its_step():
    """The default InferenceStep calls the cell's ``step`` (a user's cell)."""
    case = CASES[0]
    model = randomised_model(case, 2)
    layers = model.layers
    for layer in layers:
        layer.inference_step = lambda layer=layer: InferenceStep(layer)
    config = SampleConfig(length=20, seed=2)
    drawn = list(generate(model, [1, 2], config))
    for layer in layers:
        del layer.inference_step
    assert drawn == list(generate(model, [1, 2], config))


def test_a_subclass_with_its_own_step_samples_through_that_step():
    from charlm.cells.lstm import LSTM

    class Variant(LSTM):
        def step(self, x, state):
            h, c = super().step(x, state)[1]
            return 2 * h, (2 * h, c)

    with torch.no_grad():
        assert type(Variant(3, 4).inference_step()) is InferenceStep
        assert type(LSTM(3, 4).inference_step()) is not InferenceStep


def test_training_mode_samples_through_the_model_itself():
    model = randomised_model(CASES[0], 2)
    assert model.train().for_sampling() is model


@pytest.mark.parametrize("cell", ["lstm", "rhn", "grid-lstm", "ho-gru"])
def test_sampling_draws_the_same_text_as_the_reference_step(cell, monkeypatch):
    model = LanguageModel(ModelConfig(cell, vocab_size=13, hidden_size=8, layers=2)).eval()
    config = SampleConfig(length=60, seed=7, temperature=0.8)
    fast = list(generate(model, [1, 2, 3], config))
    monkeypatch.setattr(LanguageModel, "for_sampling", lambda self: self)
    assert list(generate(model, [1, 2, 3], config)) == fast


@pytest.mark.parametrize("cell", ["rhn", "lru", "grid-lstm", "scrn"])
def test_graphed_inference_model_replays_what_it_computes(cell):
    """What sampling hands the CUDA-graph path is capturable as the model's step is: the same
    buffers, with the stand-in that replays by calling, give the eager logits and state."""
    from charlm.runtime.cuda_graphs import GraphedStep, ReplayByCalling

    model = randomised_model(CASES[[case.cell for case in CASES].index(cell)], 2)
    tokens = torch.randint(5, (1, 8))
    with torch.inference_mode():
        _, state = model(tokens[:, :3], model.initial_state(1))
        fast = model.for_sampling()
        assert_replays_the_step(fast.step, GraphedStep(fast, state, graph=ReplayByCalling()), tokens, state, start=3)


def test_probabilities_that_are_not_numbers_are_an_error():
    model = randomised_model(CASES[0], 1)
    with torch.no_grad():
        model.head.bias[2] = float("nan")
    with pytest.raises(CharlmError, match="not numbers"):
        list(generate(model, [1], SampleConfig(length=3, seed=0)))


def test_draw_is_multinomial():
    for seed in range(50):
        logits = 3 * torch.randn(30, generator=torch.Generator().manual_seed(seed))
        logits[seed % 7 : seed % 7 + 10] = float("-inf")
        probabilities = torch.softmax(logits, dim=-1)
        ours, torchs = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        for _ in range(4):
            assert draw(probabilities, ours).tolist() == torch.multinomial(probabilities, 1, generator=torchs).tolist()


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_evaluation_window_runs_under_bfloat16_autocast(case):
    """Scoring under ``--precision bf16`` (found on the first GPU run: ho-lstm and ho-gru added
    their second-order terms in place, which autocast does not cast) agrees with float32."""
    model = randomised_model(case, 2)
    tokens = torch.randint(5, (3, 8))
    with torch.inference_mode():
        reference, _ = model(tokens, model.initial_state(3))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits, _ = model(tokens, model.initial_state(3))
    torch.testing.assert_close(logits.float(), reference, atol=0.1, rtol=0.05)
