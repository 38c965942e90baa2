"""What every registered cell must satisfy (cells.md, "Tests every cell must pass").

Each cell's ``step`` is its equations written one time step at a time; ``forward`` is the path
training uses. These tests hold the two to the same function, check the parameter count against
the spec's formula, check that carrying state across windows equals one long run, that a tiny
model overfits a short string, and that save → load gives identical outputs.
"""

import pytest
import torch

from cell_cases import CASES, loss_after_overfitting, randomise, reloaded, tiny_model
from charlm.cells import CELLS, parse_cell_options
from charlm.model import LanguageModel, ModelConfig, count_parameters


def make_cell(case, input_size=5, hidden=6):
    cell_class = CELLS.get(case.cell)
    config = parse_cell_options(cell_class, case.options)
    if case.input_size is not None:
        input_size = case.input_size(hidden)
    stack = cell_class.make_stack(input_size, hidden, 1, config)
    return stack[0], input_size


def random_state(cell, batch):
    generator = torch.Generator().manual_seed(1)
    return tuple(0.5 * torch.randn(t.shape, generator=generator, dtype=t.dtype) for t in cell.initial_state(batch))


@pytest.fixture(params=CASES, ids=lambda case: case.id)
def case(request):
    return request.param


def test_every_registered_cell_has_a_case():
    assert {c.name for c in CELLS} <= {case.cell for case in CASES}


def _accepts_one_hot(case) -> bool:
    cell_class = CELLS.get(case.cell)
    return cell_class.required_input_size(6, parse_cell_options(cell_class, case.options)) is None


FOLDED_CASES = [(case, None) for case in CASES] + [(case, 0) for case in CASES if _accepts_one_hot(case)]


@pytest.mark.parametrize(
    "case, embed_size",
    FOLDED_CASES,
    ids=[f"{case.id}-{'one-hot' if size == 0 else 'embedding'}" for case, size in FOLDED_CASES],
)
def test_folded_embedding_agrees_with_reference_step(case, embed_size, double_precision, cell_device):
    """The bottom layer's input product taken over the embedding table and gathered (the model's
    window path) is the reference step run on the embedded symbols, in value and gradient."""
    torch.manual_seed(0)
    model = LanguageModel(
        ModelConfig(case.cell, vocab_size=4, hidden_size=6, layers=2, embed_size=embed_size, cell_options=case.options)
    )
    randomise(model)
    model.to(cell_device)
    tokens = torch.randint(4, (3, 7)).to(cell_device)  # 21 positions > 4 symbols: the folded path is taken
    state = [tuple(0.5 * torch.randn_like(t) for t in layer_state) for layer_state in model.initial_state(3)]
    assert model.fold_embedding and 21 > model.config.vocab_size

    logits, new_state = model(tokens, state)
    reference, ref_state = [], state
    for t in range(tokens.shape[1]):
        step_logits, ref_state = model.step(tokens[:, t], ref_state)
        reference.append(step_logits)
    reference = torch.stack(reference, dim=1)
    torch.testing.assert_close(logits, reference)
    for a, b in zip(new_state, ref_state):
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y)
    with torch.inference_mode():  # evaluation's path, which some cells take through their sampling step
        inferred, inferred_state = model(tokens, state)
    torch.testing.assert_close(inferred, reference.detach())
    for a, b in zip(inferred_state, ref_state):
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y.detach())

    weights = torch.randn_like(logits)
    fast = torch.autograd.grad((logits * weights).sum(), list(model.parameters()))
    slow = torch.autograd.grad((reference * weights).sum(), list(model.parameters()))
    for a, b in zip(fast, slow):
        torch.testing.assert_close(a, b)


def test_forward_agrees_with_reference_step_and_gradients(case, double_precision, cell_device):
    torch.manual_seed(0)
    cell, d = make_cell(case)
    randomise(cell)
    inputs = torch.randn(7, 3, d).to(cell_device).requires_grad_()
    state = tuple(tensor.to(cell_device) for tensor in random_state(cell, 3))
    cell.to(cell_device)

    fast, fast_state = cell(inputs, state)
    reference, ref_state = [], state
    for x in inputs:
        output, ref_state = cell.step(x, ref_state)
        reference.append(output)
    reference = torch.stack(reference)
    torch.testing.assert_close(fast, reference)
    for a, b in zip(fast_state, ref_state):
        torch.testing.assert_close(a, b)

    weights = torch.randn_like(fast)
    fast_grads = torch.autograd.grad(
        (fast * weights).sum() + sum(s.sum() for s in fast_state), [inputs, *cell.parameters()]
    )
    ref_grads = torch.autograd.grad(
        (reference * weights).sum() + sum(s.sum() for s in ref_state), [inputs, *cell.parameters()]
    )
    for a, b in zip(fast_grads, ref_grads):
        torch.testing.assert_close(a, b)


def test_inference_path_agrees_with_training_path(case, double_precision, cell_device):
    """Cells may run a different loop when nothing needs a gradient (evaluation, sampling)."""
    torch.manual_seed(0)
    cell, d = make_cell(case)
    randomise(cell)
    inputs, state = (
        torch.randn(6, 3, d).to(cell_device),
        tuple(tensor.to(cell_device) for tensor in random_state(cell, 3)),
    )
    cell.to(cell_device)
    trained, trained_state = cell(inputs, state)
    with torch.inference_mode():
        inferred, inferred_state = cell(inputs, state)
    torch.testing.assert_close(inferred, trained.detach())
    for a, b in zip(inferred_state, trained_state):
        torch.testing.assert_close(a, b.detach())


def test_parameter_count_matches_spec_formula(case):
    for d, n in [(5, 6), (7, 16)]:
        cell, d_used = make_cell(case, input_size=d, hidden=n)
        assert count_parameters(cell) == case.params(d_used, n)


def test_carried_state_equals_one_long_run(case, double_precision):
    torch.manual_seed(0)
    cell, d = make_cell(case)
    randomise(cell)
    inputs = torch.randn(10, 2, d)
    state = cell.initial_state(2)
    whole, whole_state = cell(inputs, state)
    first, carried = cell(inputs[:4], state)
    second, final_state = cell(inputs[4:], tuple(t.detach() for t in carried))
    torch.testing.assert_close(torch.cat([first, second]), whole)
    for a, b in zip(final_state, whole_state):
        torch.testing.assert_close(a, b)


# every cell learns in the default run; its option variants (whose equations the float64 checks above
# cover) learn in `pytest -m slow`: about 5 s each on 2 cores
OVERFIT_CASES = [pytest.param(case, id=case.id, marks=[pytest.mark.slow] if case.options else []) for case in CASES]


@pytest.mark.parametrize("overfit_case", OVERFIT_CASES)
def test_tiny_model_overfits_a_short_string(overfit_case):
    loss = loss_after_overfitting(overfit_case, steps=overfit_case.overfit_steps, target=0.15)
    assert loss < 0.15, f"{overfit_case.id} reached only {loss:.3f} nats"


def test_save_load_gives_identical_outputs(case, double_precision):
    torch.manual_seed(0)
    model = tiny_model(case, vocab_size=11)
    randomise(model)
    clone = reloaded(model)
    tokens = torch.randint(0, 11, (2, 9))
    a, _ = model(tokens, model.initial_state(2))
    b, _ = clone(tokens, clone.initial_state(2))
    torch.testing.assert_close(a, b, rtol=0, atol=0)
