"""The checkpoint reader takes a file as untrusted input: each damaged copy of a tiny real
checkpoint below is refused in one line that names the file, exit code 2, within seconds, with
nothing written and nothing built first; a run directory's files must agree with each other; the
memory a model asks for is estimated before it is allocated."""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import math
import shutil
import time
from pathlib import Path

import pytest
import torch

import charlm
import charlm.runtime.memory as memory
from charlm.checkpoint import Checkpoint
from charlm.model import LanguageModel, ModelConfig
from charlm.training.trainer import Trainer
from helpers import assert_one_line_error, cli, tiny_config, tiny_train

SECONDS = 10  # "within seconds": a refusal never waits on an allocation, a sizing search or a training


def _drop_symbol(payload):  # the vocabulary one entry short, vocab_size with it: the output layer has a row more
    del payload["tokenizer"]["vocab"][1]
    payload["model_config"]["vocab_size"] -= 1


def _set(part, key, value):
    return lambda payload: payload[part].__setitem__(key, value)


def _vocab(change):
    return lambda payload: payload["tokenizer"].__setitem__("vocab", change(payload["tokenizer"]["vocab"]))


def _reshape(name, shape):
    return lambda payload: payload["weights"].__setitem__(name, torch.zeros(shape))


SYMBOLS = 92  # the tiny corpus's vocabulary (checked in test_the_table_is_of_the_tiny_run)
DAMAGE = [  # (what, damage to the payload, what the one line says after the file's name)
    (
        "vocabulary shorter than the output layer",
        _drop_symbol,
        f"its vocabulary has {SYMBOLS - 1} entries, but its output layer (head.weight) has {SYMBOLS} rows",
    ),
    (
        "vocabulary shorter than vocab_size",
        _vocab(lambda vocab: vocab[:-2] + vocab[-1:]),
        f"its settings say vocab_size {SYMBOLS}, but its vocabulary has {SYMBOLS - 1} entries",
    ),
    ("duplicate entries", _vocab(lambda vocab: [vocab[0], vocab[0], *vocab[2:]]), "its vocabulary holds '\\n' twice"),
    (
        "a multi-character entry in a character vocabulary",
        _vocab(lambda vocab: [vocab[0], "ab", *vocab[2:]]),
        "its char vocabulary holds 'ab', not one character",
    ),
    (
        "the vocabulary as a tensor",
        _vocab(lambda vocab: torch.arange(len(vocab))),
        "its vocabulary is a tensor, not a list",
    ),
    ("the vocabulary as numbers", _vocab(lambda vocab: [0, *vocab[1:]]), "its vocabulary holds a number (0)"),
    ("an empty entry", _vocab(lambda vocab: ["", *vocab[1:]]), "its vocabulary holds an empty entry"),
    (
        "no unknown-symbol entry of its own",
        _set("tokenizer", "unk", "<nope>"),
        "lacks its own unknown-symbol entry '<nope>'",
    ),
    (
        "vocab_size 10**9",
        _set("model_config", "vocab_size", 10**9),
        f"its settings say vocab_size 1,000,000,000, but its vocabulary has {SYMBOLS} entries",
    ),
    ("hidden 2.5", _set("model_config", "hidden_size", 2.5), "hidden_size must be an integer, not 2.5"),
    (
        "layers -1",
        _set("model_config", "layers", -1),
        "holds a setting out of its bounds: layers must be in [1, 1024], not -1",
    ),
    ("dropout 1", _set("model_config", "dropout", 1.0), "dropout must be in [0, 1), not 1.0"),
    ("a training setting out of bounds", _set("train_config", "bptt", 0), "bptt must be at least 1, not 0"),
    (
        "more layers than its weights",
        _set("model_config", "layers", 2),
        "its weights lack layers.1.",
    ),
    (
        "a weight of the wrong shape",
        _reshape("layers.0.gate_weight", (3, 5)),
        "its weight layers.0.gate_weight has shape [3, 5], the model it describes needs [128, 64]",
    ),
    (
        "a missing weight",
        lambda payload: payload["weights"].pop("layers.0.gate_bias"),
        "its weights lack layers.0.gate_bias, which the model it describes has",
    ),
    (
        "weights of a layer too many",
        _reshape("layers.1.gate_bias", (128,)),
        "its weights hold layers.1.gate_bias, which the model it describes has no place for",
    ),
    (
        "a weight too many",
        _reshape("head.extra", (2,)),
        "its weights hold head.extra, which the model it describes has no place for",
    ),
    (
        "a weight that is no tensor",
        _set("weights", "head.bias", [0.0] * SYMBOLS),
        "its weight 'head.bias' is a list, not a tensor",
    ),
    (
        "integer weights",
        lambda payload: payload["weights"].__setitem__("head.bias", torch.zeros(SYMBOLS, dtype=torch.long)),
        "its weight head.bias holds torch.int64, not floating-point numbers",
    ),
    (
        "weights that are a list",
        lambda payload: payload.__setitem__("weights", []),
        "its weights is a list, not a mapping",
    ),
    (
        "a sparse weight",
        lambda payload: payload["weights"].__setitem__("head.bias", payload["weights"]["head.bias"].to_sparse()),
        "its weight head.bias is a sparse coo tensor, not a dense one",
    ),
    (
        "a nested weight",
        lambda payload: payload["weights"].__setitem__(
            "head.bias", torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)])
        ),
        "its weight head.bias is a nested tensor, not a dense one",
    ),
    (
        "a weight without data",
        lambda payload: payload["weights"].__setitem__("head.bias", torch.empty(SYMBOLS, device="meta")),
        "its weight head.bias is a tensor without data (on the meta device)",
    ),
    (
        "a symbol no output can print",
        _vocab(lambda vocab: ["\ud800", *vocab[1:]]),
        "its vocabulary holds '\\ud800', which is not Unicode text (a lone surrogate)",
    ),
    (
        "a subword model that is a number",
        lambda payload: payload["tokenizer"].update(kind="subword", model=10**10),
        "its subword model is a number, not the bytes of a sentencepiece model",
    ),
    ("a cell no charlm has", _set("model_config", "cell", "nope"), "unknown cell 'nope'"),
]


@pytest.fixture(scope="module")
def best_payload(trained_run):
    return torch.load(trained_run / "best.pt", weights_only=True)


def test_the_table_is_of_the_tiny_run(best_payload):
    assert len(best_payload["tokenizer"]["vocab"]) == SYMBOLS and best_payload["tokenizer"]["vocab"][0] == "\n"
    assert best_payload["model_config"]["hidden_size"] == 32 and best_payload["tokenizer"]["unk"] == "<unk>"


def _snapshot(root: Path) -> dict[str, int]:
    return {str(path): path.stat().st_size for path in sorted(root.rglob("*")) if path.is_file()}


def refused(root: Path, *args, fragment: str, name: Path):
    """``charlm ARGS`` is one line naming ``name`` and saying ``fragment``, exit 2, within seconds, writing nothing."""
    before = _snapshot(root)
    started = time.monotonic()
    result = cli(*args)
    assert time.monotonic() - started < SECONDS
    assert_one_line_error(result, str(name), fragment)
    assert result.stdout == "" and _snapshot(root) == before
    return result


@pytest.mark.parametrize("what, damage, fragment", DAMAGE, ids=[row[0] for row in DAMAGE])
def test_a_damaged_checkpoint_is_refused_in_one_line(best_payload, tmp_path, monkeypatch, what, damage, fragment):
    payload = copy.deepcopy(best_payload)
    damage(payload)
    path = tmp_path / "damaged.pt"
    torch.save(payload, path)
    built = []
    monkeypatch.setattr(LanguageModel, "__init__", _counting(LanguageModel.__init__, built))
    for command in (("sample", path, "--length", "5"), ("eval", path), ("export", path, tmp_path / "out.pt")):
        refused(tmp_path, *command, fragment=fragment, name=path)
    assert not any(device != "meta" for device in built)  # nothing was built for real before the refusal
    with pytest.raises(charlm.CharlmError, match=str(path)):
        charlm.load(path, device="cpu")


def _counting(init, built):
    def counted(self, *args, **kwargs):
        built.append(str(torch.empty(0).device))  # under `with torch.device("meta")` a tensor is made there
        return init(self, *args, **kwargs)

    return counted


# --- a run directory: its last.pt, config.json and best.pt ----------------------------------------


@pytest.fixture
def run_copy(trained_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    return run


def _tamper_last(run: Path, change) -> None:
    payload = torch.load(run / "last.pt", weights_only=True)
    change(payload)
    torch.save(payload, run / "last.pt")


def _wrong_moment(payload):
    state = payload["training"]["optimizer"]["state"]
    state[0]["exp_avg"] = torch.zeros(7, 3)


def _another_cell(payload):
    """A last.pt of a GRU of the same vocabulary dropped into the LRU's run."""
    config = ModelConfig(**{**payload["model_config"], "cell": "gru"})
    payload["model_config"] = config.to_dict()
    payload["weights"] = LanguageModel(config).state_dict()


def _two_groups(payload):
    group = payload["training"]["optimizer"]["param_groups"][0]
    payload["training"]["optimizer"]["param_groups"] = [
        {**group, "params": group["params"][:3]},
        {**group, "params": group["params"][3:]},
    ]


def _half_state(payload):
    model = LanguageModel(ModelConfig(**payload["model_config"]))
    payload["training"]["hidden"] = [
        [tensor.half() for tensor in layer] for layer in model.initial_state(payload["train_config"]["batch_size"])
    ]


OPTIMIZER = "its optimizer state does not fit this run"
RESUME_DAMAGE = [  # what torch refuses as the state is put back, or charlm's own checks before it
    ("an optimizer state of the wrong shape", _wrong_moment, OPTIMIZER),
    (
        "a moment that is one number",
        lambda payload: payload["training"]["optimizer"]["state"][0].__setitem__("exp_avg", torch.tensor(0.5)),
        OPTIMIZER,
    ),
    (
        "an optimizer state for fewer parameters",
        lambda payload: payload["training"]["optimizer"]["param_groups"][0]["params"].pop(),
        OPTIMIZER,
    ),
    ("last.pt of another cell", _another_cell, "is not a checkpoint of the run in"),
    (
        "a carried state of the wrong shape",
        lambda payload: payload["training"].__setitem__("hidden", [[torch.zeros(3, 5)]]),
        "its carried state does not fit this run",
    ),
    (
        "progress that is text",
        lambda payload: payload["training"]["progress"].__setitem__("step", "many"),
        "its training progress is damaged (step must be an integer",
    ),
    (
        "a damaged random-number state",
        lambda payload: payload["training"]["rng"].__setitem__("torch", [1, 2]),
        "its random-number state does not fit this run",
    ),
    (
        "a random-number state no generator takes",
        lambda payload: payload["training"]["rng"]["ranks"][0].__setitem__(
            "torch", torch.full((5056,), 7, dtype=torch.uint8)
        ),
        "its random-number state does not fit this run",
    ),
    ("its parameters in two groups", _two_groups, OPTIMIZER),
    (
        "progress before the first window",
        lambda payload: payload["training"]["progress"].__setitem__("window", -1),
        "its training progress is damaged (window must be a count, not -1)",
    ),
    (
        "progress with a NaN time",
        lambda payload: payload["training"]["progress"]["wall_seconds"].__setitem__("train", math.nan),
        "its training progress is damaged (wall_seconds must map names to finite numbers, zero or more)",
    ),
    ("a carried state in half precision", _half_state, "its carried state does not fit this run"),
]


@pytest.mark.parametrize("what, damage, fragment", RESUME_DAMAGE, ids=[row[0] for row in RESUME_DAMAGE])
def test_resuming_from_a_damaged_last_checkpoint_is_refused(run_copy, what, damage, fragment):
    _tamper_last(run_copy, damage)
    result = refused(
        run_copy, "train", "--resume", run_copy, "--epochs", "3", fragment=fragment, name=run_copy / "last.pt"
    )
    if what == "last.pt of another cell":
        assert "cell 'lru' in config.json, 'gru' in last.pt" in result.stderr
        assert str(run_copy / "config.json") in result.stderr


CONFIG_DAMAGE = [  # a run stopped before its first checkpoint starts again from config.json's settings: damaged ones
    ("settings that are a list", [1], "config.json: train must be an object, not a list"),
    (
        "a setting of the wrong type",
        {"bptt": "x"},
        "config.json holds a setting out of its bounds: bptt must be an integer, not 'x'",
    ),
    (
        "a setting out of bounds",
        {"hidden_size": 10**9},
        "config.json holds a setting out of its bounds: hidden_size must be in [1, 1048576], not",
    ),
    (
        "an unknown setting",
        {"bogus": 1},
        "config.json holds settings this charlm cannot read (unknown TrainConfig setting: 'bogus')",
    ),
]


@pytest.mark.parametrize("what, train, fragment", CONFIG_DAMAGE, ids=[row[0] for row in CONFIG_DAMAGE])
def test_a_run_without_checkpoints_and_damaged_settings_is_not_started_again(run_copy, what, train, fragment):
    for checkpoint in run_copy.glob("*.pt"):
        checkpoint.unlink()
    config = json.loads((run_copy / "config.json").read_text(encoding="utf-8"))
    config["train"] = {**config["train"], **train} if isinstance(train, dict) else train
    (run_copy / "config.json").write_text(json.dumps(config), encoding="utf-8")
    refused(run_copy, "train", "--resume", run_copy, "--epochs", "3", fragment=fragment, name=run_copy / "config.json")


def test_bench_refuses_a_budget_no_machine_holds_before_building_a_model(monkeypatch):
    import charlm.tools.benchmark as benchmark

    def never(*args, **kwargs):
        raise AssertionError("a model was about to be built")

    monkeypatch.setattr(benchmark, "benchmark_cells", never)  # what builds the models, on the device
    import charlm.tools.benchmark_memory as benchmark_memory

    for module in (memory, benchmark_memory):  # the benchmark's check holds its own name for it once imported
        monkeypatch.setattr(module, "available_memory", lambda device: 8 * 1024**3)
    started = time.monotonic()
    assert_one_line_error(
        cli("bench", "--params", "1e23"),
        "a budget of 99,999,999,999,999,991,611,392 parameters needs at least",
        "8.0 GiB free: use a smaller --params",
    )
    # a budget that fits, with a vocabulary that does not: 16 bytes for each of 2 × 1e8 × (8 + 1) parameters
    assert_one_line_error(
        cli("bench", "--cells", "lstm", "--params", "1000", "--vocab-size", "100000000"), "a smaller --vocab-size"
    )
    assert time.monotonic() - started < SECONDS


@pytest.mark.parametrize(
    "options, named",
    [
        (
            ["--embed-size", "50000", "--hidden", "8"],
            "use a smaller --embed-size (most of its size comes from it), or a smaller --hidden",
        ),
        (
            ["--layers", "8", "--hidden", "64"],
            "use fewer --layers (most of its size comes from it), or a smaller --hidden",
        ),
        (["--hidden", "300"], "but cpu has 1 KiB free: use a smaller --hidden or --params, or a smaller --batch-size"),
    ],
)
def test_the_advice_for_an_oversized_model_names_the_options_at_fault(
    tiny_corpus, tmp_path, monkeypatch, options, named
):
    monkeypatch.setattr(memory, "available_memory", lambda device: 1024)
    result = cli(*tiny_train(tiny_corpus, tmp_path / "run", *options, device="cpu"))
    assert_one_line_error(result, named)
    assert not (tmp_path / "run").exists()


# --- best.pt older than what the run says is best --------------------------------------------------


class Killed(BaseException):
    """In place of the save of best.pt at the second epoch's end: the run dies between its commit and it."""


@pytest.fixture
def killed_before_best(tiny_corpus, tmp_path, monkeypatch):
    run = tmp_path / "run"
    save, saves = Checkpoint.save, []

    def dies_at_the_second_best(checkpoint, path):
        if Path(path).name == "best.pt":
            saves.append(path)
            if len(saves) == 2:
                raise Killed
        return save(checkpoint, path)

    monkeypatch.setattr(Checkpoint, "save", dies_at_the_second_best)
    config = tiny_config(
        tiny_corpus, run, cell="gru", hidden_size=8, bptt=32, eval_batch_size=16, train_fraction=0.05, log_every=1000
    )  # two epochs, both best so far (as in test_crash_consistency)
    with pytest.raises(Killed):
        Trainer(config).fit()
    monkeypatch.undo()
    last, best = Checkpoint.load(run / "last.pt"), Checkpoint.load(run / "best.pt", prefer="last")
    assert last.training.progress["best_epoch"] == last.scores["epoch"] == 2 and best.scores["epoch"] == 1
    return run


def _listen(caplog):
    logger = logging.getLogger("charlm")  # it does not propagate once the CLI has run: listen on it
    logger.addHandler(caplog.handler)
    return logger


def test_eval_of_a_run_killed_before_its_best_was_copied_scores_the_best_epoch(killed_before_best, tiny_corpus, caplog):
    run = killed_before_best
    logger = _listen(caplog)
    try:
        with caplog.at_level(logging.WARNING, logger="charlm"):
            model = charlm.load(run, device="cpu")
            scored = cli("eval", run, "--data-dir", tiny_corpus, check_code=0)
    finally:
        logger.removeHandler(caplog.handler)
    assert model.checkpoint.scores["epoch"] == 2
    last = Checkpoint.load(run / "last.pt")
    assert all(torch.equal(model.network.state_dict()[name], tensor) for name, tensor in last.weights.items())
    assert f"{run / 'best.pt'} holds the weights of epoch 1, but the run's best is epoch 2" in caplog.text
    direct = cli("eval", run / "last.pt", "--data-dir", tiny_corpus, check_code=0)
    assert scored.stdout == direct.stdout  # the same weights, the same figure


def test_eval_says_which_epoch_it_scores_when_no_checkpoint_holds_the_best(killed_before_best, tiny_corpus, caplog):
    run = killed_before_best
    (run / "last.pt").unlink()  # previous.pt is older still: the best epoch's weights are nowhere
    logger = _listen(caplog)
    try:
        with caplog.at_level(logging.WARNING, logger="charlm"):
            cli("eval", run, "--data-dir", tiny_corpus, check_code=0)
    finally:
        logger.removeHandler(caplog.handler)
    assert (
        f"using the weights of epoch 1 ({run / 'best.pt'}): the run's records call epoch 2 best, but no checkpoint "
        "holds its weights"
    ) in caplog.text


def test_a_consistent_run_is_read_without_a_word(trained_run, caplog):
    logger = _listen(caplog)
    try:
        with caplog.at_level(logging.WARNING, logger="charlm"):
            model = charlm.load(trained_run, device="cpu")
    finally:
        logger.removeHandler(caplog.handler)
    assert "warning" not in caplog.text
    assert model.checkpoint.path == trained_run / "best.pt"


def test_a_resumed_run_with_its_own_last_checkpoint_is_not_refused(run_copy):
    recorded = json.loads((run_copy / "config.json").read_text(encoding="utf-8"))
    assert recorded["model"] == dataclasses.asdict(Checkpoint.load(run_copy / "last.pt").model_config)
    trainer = Trainer.resume(run_copy, epochs=3)
    trainer.run.release()
    assert trainer.progress.epoch == 2
