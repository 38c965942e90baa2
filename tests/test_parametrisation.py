"""The parametrisation the reference implementations have: the softmax tied to the embedding (every cell,
both wirings, through a projection where the widths differ), the softmax without a bias, the Transformer
without biases (tests/cells/test_transformer.py), Adam's betas and weight decay on matrices only."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import charlm
from cell_cases import randomise, reloaded
from charlm.cells import CELLS, parse_cell_options
from charlm.checkpoint import Checkpoint
from charlm.config import TrainConfig
from charlm.errors import CharlmError
from charlm.model import LanguageModel, ModelConfig, count_parameters
from charlm.sizing import size_for_budget
from charlm.training.setup import optimizer_and_schedule
from charlm.training.trainer import Trainer
from helpers import assert_one_line_error, assert_same_run_end, cli, tiny_config, tiny_train

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")

VOCAB = 7


def model_config(cell: str, wiring: str = "stacked", embed_size: int | None = None, **settings) -> ModelConfig:
    """Two layers of ``cell`` at the smallest width it is built at from 8 up."""
    cell_class = CELLS.get(cell)
    multiple = cell_class.hidden_size_multiple(parse_cell_options(cell_class, {}))
    hidden = -(-8 // multiple) * multiple
    return ModelConfig(
        cell, vocab_size=VOCAB, hidden_size=hidden, layers=2, embed_size=embed_size, wiring=wiring, **settings
    )


def buildable(config: ModelConfig) -> bool:
    try:
        with torch.device("meta"):
            LanguageModel(config)
    except CharlmError:  # a cell that needs its own embedding width, or cannot be wired in blocks
        return False
    return True


# Every registered cell in both wirings, with the embedding as wide as it needs to be (most often the top
# layer's output: tied directly) and, where the cell takes any width, narrower (tied through a projection).
COMBINATIONS = [
    (cell, wiring, embed_size)
    for cell in CELLS.names()
    for wiring in ("stacked", "block")
    for embed_size in (None, 5)
    if buildable(model_config(cell, wiring, embed_size))
]


@pytest.mark.parametrize(
    "cell, wiring, embed_size", COMBINATIONS, ids=[f"{c}-{w}-{e or 'own'}" for c, w, e in COMBINATIONS]
)
def test_the_softmax_is_the_embedding_table_with_every_cell_and_wiring(cell, wiring, embed_size, double_precision):
    torch.manual_seed(0)
    config = model_config(cell, wiring, embed_size, tie_weights=True)
    model = LanguageModel(config).eval()
    untied = LanguageModel(dataclasses.replace(config, tie_weights=False))
    table, top = model.embedding.weight, model.layers[-1].output_size
    width = table.shape[1]
    assert model.head.weight is table and sum(parameter is table for parameter in model.parameters()) == 1
    projection = model.head_projection
    assert isinstance(projection, nn.Linear) == (top != width)
    if top != width:
        assert projection.weight.shape == (width, top) and projection.bias is None
    assert count_parameters(model) == count_parameters(untied) - VOCAB * top + (top * width if top != width else 0)

    randomise(model)
    seen = []
    projection.register_forward_hook(lambda module, inputs, output: seen.append(inputs[0]))
    tokens = torch.randint(VOCAB, (3, 12))  # more positions than symbols: the bottom layer's folded embedding
    logits, _ = model(tokens, model.initial_state(3))
    features = seen[0] if top == width else F.linear(seen[0], projection.weight)
    torch.testing.assert_close(logits, (features @ table.T + model.head.bias).transpose(0, 1))

    with torch.no_grad():  # sampling's arrangement of the weights, one symbol at a time
        sampling, state, sampled = model.for_sampling(), model.initial_state(3), []
        for t in range(tokens.shape[1]):
            step_logits, state = sampling.step(tokens[:, t], state)
            sampled.append(step_logits)
    torch.testing.assert_close(torch.stack(sampled, dim=1), logits.detach())

    clone = reloaded(model).eval()
    assert clone.config.tie_weights and clone.head.weight is clone.embedding.weight
    torch.testing.assert_close(clone(tokens, clone.initial_state(3))[0], logits)


def test_gradients_of_the_shared_table_add_its_two_uses():
    torch.manual_seed(0)
    model = LanguageModel(model_config("lstm", embed_size=5, tie_weights=True))
    tokens = torch.randint(VOCAB, (2, 12))
    logits, _ = model(tokens, model.initial_state(2))
    logits.square().mean().backward()
    both = model.embedding.weight.grad.clone()
    model.zero_grad()
    table = model.embedding.weight
    with torch.no_grad():  # the same forward, the softmax reading a detached copy of the table
        model.head.weight = nn.Parameter(table.detach().clone())
    logits, _ = model(tokens, model.initial_state(2))
    logits.square().mean().backward()
    torch.testing.assert_close(table.grad + model.head.weight.grad, both)


def test_without_a_head_bias_the_logits_are_the_products_alone():
    torch.manual_seed(0)
    for tie in (False, True):
        config = model_config("gru", tie_weights=tie, head_bias=False)
        model = LanguageModel(config).eval()
        assert model.head.bias is None
        assert (
            count_parameters(model)
            == count_parameters(LanguageModel(dataclasses.replace(config, head_bias=True))) - VOCAB
        )
        tokens = torch.randint(VOCAB, (2, 9))
        with torch.no_grad():
            scored, _ = model(tokens, model.initial_state(2))
            sampling, state = model.for_sampling(), model.initial_state(2)
            for t in range(tokens.shape[1]):
                logits, state = sampling.step(tokens[:, t], state)
                torch.testing.assert_close(logits, scored[:, t])


def test_a_budget_sizes_the_tied_model_by_what_it_allocates():
    for cell in ("lstm", "scrn", "transformer"):  # tied directly; through a projection (n + context wide)
        config = model_config(cell, tie_weights=True)
        hidden, total = size_for_budget(config, 50_000)
        step = CELLS.get(cell).hidden_size_multiple(parse_cell_options(CELLS.get(cell), {}))
        counts = [
            count_parameters(LanguageModel(dataclasses.replace(config, hidden_size=size)))
            for size in (hidden - step, hidden, hidden + step)
        ]
        assert counts[1] == total and all(abs(count - 50_000) >= abs(total - 50_000) for count in counts)


def test_tying_one_hot_input_is_refused_in_one_line(tiny_corpus, tmp_path):
    message = "--tie-weights needs an embedding table to share with the softmax, not --embed-size 0"
    result = cli(*tiny_train(tiny_corpus, tmp_path / "r", tie_weights=True, embed_size=0))
    assert_one_line_error(result, message)
    assert not (tmp_path / "r").exists()
    with pytest.raises(CharlmError, match=message):
        LanguageModel(ModelConfig("lstm", vocab_size=VOCAB, hidden_size=8, embed_size=0, tie_weights=True))


# --- the optimizer ------------------------------------------------------------------------------------------


def names_of(optimizer, model) -> list[set[str]]:
    names = {id(parameter): name for name, parameter in model.named_parameters()}
    return [{names[id(parameter)] for parameter in group["params"]} for group in optimizer.param_groups]


def test_decay_groups_hold_the_parameters_each_setting_names():
    model = LanguageModel(ModelConfig("transformer", vocab_size=VOCAB, hidden_size=8, layers=1, tie_weights=True))
    matrices = {"embedding.weight", *(f"layers.0.{name}.weight" for name in ("qkv", "out", "up", "down"))}
    vectors = {
        "layers.0.norm_attention.weight",
        "layers.0.norm_attention.bias",
        "layers.0.norm_mlp.weight",
        "layers.0.norm_mlp.bias",
        "final_norm.weight",
        "final_norm.bias",
        "head.bias",
        *(f"layers.0.{name}.bias" for name in ("qkv", "out", "up", "down")),
    }
    assert {name for name, _ in model.named_parameters()} == matrices | vectors  # head.weight is the table
    for decay_on, expected in (
        ("matrices", [matrices, vectors]),
        ("matrices-no-embedding", [matrices - {"embedding.weight"}, vectors | {"embedding.weight"}]),
    ):
        config = TrainConfig(optimizer="adamw", weight_decay=0.1, decay_on=decay_on)
        config.validate()
        optimizer, _ = optimizer_and_schedule(model, config)
        assert names_of(optimizer, model) == expected
        assert [group["weight_decay"] for group in optimizer.param_groups] == [0.1, 0.0]
    optimizer, _ = optimizer_and_schedule(model, TrainConfig(optimizer="adamw", weight_decay=0.1))
    assert names_of(optimizer, model) == [matrices | vectors]  # all: one group, as before


@pytest.mark.parametrize("name", ["adam", "adamw", "sgd"])
def test_only_the_decayed_group_decays(name):
    """A step on zero gradients: the matrices shrink by decay (decoupled for adamw, L2 through Adam or SGD
    otherwise), the biases and gains stay where they were."""
    torch.manual_seed(0)
    model = LanguageModel(ModelConfig("lstm", vocab_size=VOCAB, hidden_size=8, layers=1))
    config = TrainConfig(optimizer=name, lr=0.1, weight_decay=0.5, decay_on="matrices")
    config.validate()
    optimizer, _ = optimizer_and_schedule(model, config)
    before = {name: parameter.detach().clone() for name, parameter in model.named_parameters()}
    for parameter in model.parameters():
        parameter.grad = torch.zeros_like(parameter)
    optimizer.step()
    for parameter_name, parameter in model.named_parameters():
        if parameter.dim() < 2:
            assert torch.equal(parameter, before[parameter_name]), parameter_name
        elif name == "adamw":
            torch.testing.assert_close(parameter.detach(), before[parameter_name] * (1 - 0.1 * 0.5))
        else:
            assert not torch.equal(parameter, before[parameter_name]), parameter_name


def test_adam_betas_reach_the_optimizer():
    model = LanguageModel(ModelConfig("lstm", vocab_size=VOCAB, hidden_size=8))
    for name, betas, expected in (
        ("adam", None, (0.9, 0.999)),
        ("adamw", "0.9,0.99", (0.9, 0.99)),
        ("adam", "0, 0.5", (0.0, 0.5)),
    ):
        config = TrainConfig(optimizer=name, adam_betas=betas, weight_decay=0.1, decay_on="matrices")
        config.validate()
        optimizer, _ = optimizer_and_schedule(model, config)
        assert [group["betas"] for group in optimizer.param_groups] == [expected, expected]


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            ["--optimizer", "sgd", "--adam-betas", "0.9,0.99"],
            "--adam-betas applies to --optimizer adam and adamw only, not sgd",
        ),
        (["--adam-betas", "0.9"], "--adam-betas must be two numbers in [0, 1) such as 0.9,0.99, not '0.9'"),
        (["--adam-betas", "0.9,1"], "--adam-betas must be two numbers in [0, 1) such as 0.9,0.99, not '0.9,1'"),
        (["--decay-on", "matrices"], "--decay-on matrices needs a positive --weight-decay"),
        (
            ["--decay-on", "rows", "--weight-decay", "0.1"],
            "--decay-on must be one of all, matrices, matrices-no-embedding",
        ),
    ],
)
def test_bad_betas_and_decay_settings_are_one_line_errors(tiny_corpus, tmp_path, extra, message):
    result = cli(*tiny_train(tiny_corpus, tmp_path / "r", *extra))
    assert_one_line_error(result, message)
    assert not (tmp_path / "r").exists()


# --- whole runs ---------------------------------------------------------------------------------------------

REFERENCE_LIKE = dict(
    cell="gru",
    hidden_size=16,
    embed_size=12,
    tie_weights=True,
    head_bias=False,
    optimizer="adamw",
    weight_decay=0.1,
    decay_on="matrices",
    adam_betas="0.9,0.99",
    train_fraction=0.3,
)


def test_a_resumed_run_with_two_decay_groups_ends_as_a_straight_one(tiny_corpus, tmp_path):
    straight = tmp_path / "straight"
    Trainer(tiny_config(tiny_corpus, straight, **REFERENCE_LIKE)).fit()
    split = tmp_path / "split"
    Trainer(tiny_config(tiny_corpus, split, epochs=1, **REFERENCE_LIKE)).fit()
    Trainer.resume(str(split), epochs=2).fit()
    assert_same_run_end(straight, split)
    saved = Checkpoint.load(split / "last.pt")
    groups = saved.training.optimizer["param_groups"]
    assert [group["lr"] for group in groups] == pytest.approx([1e-3 * 0.9**2] * 2)  # the schedule sets both
    assert [group["weight_decay"] for group in groups] == [0.1, 0.0]
    assert [tuple(group["betas"]) for group in groups] == [(0.9, 0.99)] * 2
    assert saved.model_config.tie_weights and not saved.model_config.head_bias
    assert torch.equal(saved.weights["head.weight"], saved.weights["embedding.weight"])


def test_a_tied_run_evaluates_samples_and_exports(tiny_corpus, tmp_path):
    run = tmp_path / "run"
    tied = dict(hidden_size=16, embed_size=12, tie_weights=True, head_bias=False, batch_size=4, max_tokens=1280)
    cli(*tiny_train(tiny_corpus, run, **tied), check_code=0)
    assert "bpc" in cli("eval", run, "--split", "valid", check_code=0).stdout
    cli("sample", run, "--prime", "The ", "--length", "12", "--seed", "1", check_code=0)
    model = charlm.load(run, device="cpu")
    assert model.network.head.weight is model.network.embedding.weight
    cli("export", run, tmp_path / "step.pt", "--format", "torchscript", check_code=0)  # checked against charlm's step
    pytest.importorskip("safetensors")
    cli("export", run, tmp_path / "model.safetensors", check_code=0)
    exported = charlm.load(tmp_path / "model.safetensors", device="cpu")
    assert exported.network.head.weight is exported.network.embedding.weight
    assert exported.score("The value of").nats == model.score("The value of").nats


def test_the_new_settings_define_the_run(trained_run):
    for extra in (["--tie-weights"], ["--no-head-bias"], ["--adam-betas", "0.9,0.99"], ["--decay-on", "matrices"]):
        assert_one_line_error(
            cli("train", "--resume", trained_run, *extra),
            f"{extra[0].replace('--no-', '--')} cannot change a run being resumed",
        )
