"""charlm from Python: ``charlm.load`` (Model: sample, stream, score, evaluate, export),
``charlm.train`` and ``Trainer.resume``, the `score` and `export` commands, and logging."""

from __future__ import annotations

import logging
import math
import shutil

import numpy as np
import pytest
import torch

import charlm
from charlm.checkpoint import Checkpoint
from charlm.errors import CharlmError
from charlm.inference.scoring import score_tokens
from helpers import assert_one_line_error, cli, prepare_tiny_corpus, pydoc_text, records

TEXT = pydoc_text(3_000)


@pytest.fixture(scope="module")
def model(trained_run):
    return charlm.load(trained_run, device="cpu")


def stdout_field(result, name: str) -> str:
    """The value printed after ``name`` at the start of a line of `charlm eval`/`score` output."""
    lines = [line for line in result.stdout.splitlines() if line.split()[:1] == [name]]
    assert len(lines) == 1, result.stdout
    return lines[0].split(None, 1)[1]


def logits_of(model, text: str) -> torch.Tensor:
    ids = torch.tensor([model.tokenizer.encode(text)])
    with torch.no_grad():
        return model.network(ids, model.network.initial_state(1))[0]


# --- the facade ------------------------------------------------------------------------------------


def test_load_score_sample(model, trained_run):
    assert model.checkpoint.path == trained_run / "best.pt"
    assert model.vocabulary == list(model.corpus().tokenizer.vocab) and "<unk>" in model.vocabulary
    assert model.parameters_count == sum(p.numel() for p in model.network.parameters()) > 0
    assert model.config.cell == "lru" and model.config.hidden_size == 32 and model.unit == "char"
    text = repr(model)
    assert text.startswith("Model(lru") and "1×32" in text and f"{model.parameters_count:,} parameters" in text
    assert f"vocabulary {len(model.vocabulary)}" in text
    assert not model.network.training

    score = model.score("Return the value of the attribute.")
    assert score.tokens == len("Return the value of the attribute.") - 1 == score.characters
    assert 0 < score.bpc < 8 and score.perplexity == pytest.approx(math.exp(score.nats / score.tokens))

    sample = model.sample("The ", 100, seed=3)
    assert sample.startswith("The ") and len(sample) == 4 + 100
    assert set(sample) <= set(model.vocabulary)


def test_sampling_is_seeded_and_streams_the_same_text(model):
    first = model.sample("The ", 80, seed=7)
    assert model.sample("The ", 80, seed=7) == first
    assert model.sample("The ", 80, seed=8) != first
    assert "".join(model.stream("The ", 80, seed=7)) == first[len("The ") :]
    pieces = list(model.stream("The ", 80, seed=7))
    assert len(pieces) == 80  # a character model yields one symbol per piece
    # greedy decoding ignores the seed
    assert model.sample("The ", 40, top_k=1, seed=1) == model.sample("The ", 40, top_k=1, seed=2)
    # no prime: a line break
    assert model.sample(length=10, seed=1).startswith("\n")


def test_sampling_never_draws_the_unknown_entry(model):
    hot = model.sample("a", 1_500, temperature=5.0, seed=0)
    assert "<unk>" not in hot and set(hot) <= set(model.vocabulary) - {"<unk>"}


def test_bad_prime_and_settings_fail_before_any_text(model, trained_run):
    with pytest.raises(CharlmError, match="outside the model's vocabulary: '€', '☃'"):
        model.sample("Price: 5€ ☃", 10)
    with pytest.raises(CharlmError, match="'☃'"):
        model.stream("☃", 10)  # checked when called, not at the first piece
    with pytest.raises(CharlmError, match="temperature must be zero or positive"):
        model.stream("The ", 10, temperature=-1)
    with pytest.raises(CharlmError, match="top_p must be in"):
        model.sample("The ", 10, top_p=1.5)
    result = cli("sample", trained_run, "--prime", "Snow ☃", "--length", "5")
    assert_one_line_error(result, "'☃'")
    assert result.stdout == ""
    assert_one_line_error(cli("sample", trained_run, "--prime", "", "--length", "5"), "prime is empty")


# --- scoring ---------------------------------------------------------------------------------------


def test_score_equals_scoring_the_tokens(model):
    ids = np.asarray(model.tokenizer.encode(TEXT), dtype=np.int64)
    reference = score_tokens(model.network, ids, batch_size=1, bptt=25, device="cpu")
    score = model.score(TEXT)
    assert score.nats == pytest.approx(reference.nats, rel=1e-6)
    assert score.tokens == len(TEXT) - 1 and score.characters == len(TEXT) - 1
    # more streams score the same symbols (state is carried per stream, so only close)
    assert model.score(TEXT, batch_size=4).tokens == score.tokens


def test_score_of_the_test_split_equals_eval(trained_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(trained_run, run)  # eval appends a record to the run's metrics
    model = charlm.load(run)
    corpus = model.corpus()
    text = corpus.tokenizer.decode(corpus.split("test"))
    assert corpus.tokenizer.encode(text) == list(corpus.split("test"))
    (tmp_path / "test.txt").write_text(text, encoding="utf-8")

    score = model.score(text)
    evaluation = model.evaluate("test", batch_size=1, record=False)
    assert score.nats == pytest.approx(evaluation.nats, rel=1e-9) and score.tokens == evaluation.tokens

    scored = cli("score", run, tmp_path / "test.txt", check_code=0)
    evaluated = cli("eval", run, "--split", "test", "--batch-size", "1", check_code=0)
    assert stdout_field(scored, "bpc") == stdout_field(evaluated, "bpc") == f"{score.bpc:.4f} (bits per character)"
    assert stdout_field(scored, "perplexity") == stdout_field(evaluated, "perplexity")
    rows = records(run)
    assert rows[-1]["event"] == "eval" and rows[-1]["bpc"] == pytest.approx(score.bpc, rel=1e-9)


def test_per_char_log_probabilities(model, trained_run, tmp_path):
    text = TEXT[:1_000]
    score = model.score(text, per_char=True)
    assert len(score.log_probs) == len(score.symbols) == score.tokens == len(text) - 1
    assert "".join(score.symbols) == text[1:]
    assert score.log_probs.sum() == pytest.approx(-score.nats, rel=1e-6)
    assert np.all(score.log_probs <= 0)

    (tmp_path / "text.txt").write_text(text, encoding="utf-8")
    tsv = tmp_path / "chars.tsv"
    result = cli("score", trained_run, tmp_path / "text.txt", "--per-char", tsv, check_code=0)
    assert f"{len(text) - 1:,} rows" in result.stdout
    header, *rows = tsv.read_text(encoding="utf-8").splitlines()
    assert header.split("\t") == ["position", "symbol", "logprob", "bits"]
    assert len(rows) == len(text) - 1
    fields = [row.split("\t") for row in rows]
    assert [int(f[0]) for f in fields] == list(range(1, len(text)))
    unescaped = [f[1].replace("\\n", "\n").replace("\\t", "\t") for f in fields]
    assert "".join(unescaped) == text[1:]
    log_probs = np.array([float(f[2]) for f in fields])
    assert log_probs.sum() == pytest.approx(-score.nats, abs=1e-4)
    assert np.allclose([float(f[3]) for f in fields], -log_probs / math.log(2), atol=1e-5)

    to_stdout = cli("score", trained_run, "-", "--per-char", "-", stdin="hello world", check_code=0)
    assert to_stdout.stdout.splitlines()[-10:][0].startswith("1\te\t")
    assert to_stdout.stdout.splitlines()[-1].startswith("10\td\t")


def test_text_is_normalised_as_the_corpus_was(model, trained_run, tmp_path):
    """Issue 24: a BOM and CRLF or CR line ends, which `prepare` normalises, score as the normalised text."""
    assert "\r" not in model.vocabulary and "\ufeff" not in model.vocabulary
    plain = "The first line.\nThe second line.\nAnd a third.\n"
    windows = "\ufeff" + plain.replace("\n", "\r\n")
    expected = model.score(plain)
    for variant in (windows, plain.replace("\n", "\r")):
        got = model.score(variant)
        assert (got.nats, got.tokens, got.characters) == (expected.nats, expected.tokens, expected.characters)
    path = tmp_path / "windows.txt"
    path.write_bytes(windows.encode("utf-8"))
    assert (
        stdout_field(cli("score", trained_run, path, check_code=0), "bpc") == f"{expected.bpc:.4f} (bits per character)"
    )
    assert model.sample("The\r\n", 5, seed=3) == model.sample("The\n", 5, seed=3)


def test_unknown_characters_are_named_with_where_the_first_is(model, trained_run, tmp_path):
    text = "Fine so far.\nStill fine, then a snowman ☃ and a euro € sign."
    with pytest.raises(CharlmError, match=r"'€', '☃' \(the first at line 2, column 28\); pass --unknown skip"):
        model.score(text)


def test_unknown_characters(model, trained_run, tmp_path):
    text = "A snowman ☃ and a euro € sign."
    with pytest.raises(CharlmError, match="'€', '☃'"):
        model.score(text)
    path = tmp_path / "odd.txt"
    path.write_text(text, encoding="utf-8")
    assert_one_line_error(cli("score", trained_run, path), "outside the vocabulary", "'€', '☃'")

    skipped = model.score(text, unknown="skip")
    clean = model.score(text.replace("☃", "").replace("€", ""))
    assert skipped.skipped == 2 and skipped.nats == pytest.approx(clean.nats) and skipped.tokens == clean.tokens
    result = cli("score", trained_run, path, "--unknown", "skip", check_code=0)
    assert "2 characters outside the vocabulary skipped" in result.stdout

    unk = model.score(text, unknown="unk")  # the tiny corpus keeps an <unk> entry
    assert unk.skipped == 0 and unk.tokens == len(text) - 1 and unk.nats != pytest.approx(skipped.nats)
    assert (
        stdout_field(cli("score", trained_run, path, "--unknown", "unk", check_code=0), "bpc")
        == f"{unk.bpc:.4f} (bits per character)"
    )
    with pytest.raises(CharlmError, match="unknown must be one of"):
        model.score(text, unknown="ignore")


def test_score_reads_stdin_and_refuses_non_utf8(trained_run, tmp_path):
    text = TEXT[:500]
    (tmp_path / "text.txt").write_text(text, encoding="utf-8")
    from_file = cli("score", trained_run, tmp_path / "text.txt", check_code=0)
    from_stdin = cli("score", trained_run, "-", stdin=text, check_code=0)
    assert "standard input" in stdout_field(from_stdin, "text")
    assert stdout_field(from_stdin, "nats") == stdout_field(from_file, "nats")

    latin = tmp_path / "latin1.txt"
    latin.write_bytes("caf\u00e9 au lait".encode("latin-1"))
    assert_one_line_error(cli("score", trained_run, latin), "not UTF-8", "byte 3")
    assert_one_line_error(cli("score", trained_run, tmp_path / "absent.txt"), "does not exist")
    assert_one_line_error(cli("score", trained_run, "-", stdin="a"), "too short")


def test_dynamic_scoring_restores_the_weights(model, trained_run, tmp_path):
    text = TEXT[:1_500]
    before = {name: tensor.clone() for name, tensor in model.network.state_dict().items()}
    static = model.score(text)
    adapted = model.score(text, dynamic="sgd")
    assert adapted.tokens == static.tokens and adapted.nats != pytest.approx(static.nats, rel=1e-6)
    assert all(torch.equal(before[name], tensor) for name, tensor in model.network.state_dict().items())
    assert model.score(text).nats == static.nats

    path = tmp_path / "text.txt"
    path.write_text(text, encoding="utf-8")
    result = cli("score", trained_run, path, "--dynamic", "sgd", check_code=0)
    rows = {
        line.split("│")[1].strip(): line.split("│")[2].strip()
        for line in result.stdout.splitlines()
        if line.startswith("│")
    }
    assert rows["static"] == f"{static.bpc:.4f}"
    assert rows["dynamic sgd (η=0.01)"] == f"{adapted.bpc:.4f}"
    assert_one_line_error(cli("score", trained_run, path, "--dyn-lr", "0.1"), "--dyn-lr", "--dynamic")
    assert_one_line_error(cli("score", trained_run, path, "--dynamic", "adam"), "--dynamic must be sgd or rms")


# --- export ----------------------------------------------------------------------------------------


def test_export_is_slim_and_gives_the_same_model(model, trained_run, tmp_path):
    out = tmp_path / "model.pt"
    result = cli("export", trained_run / "best.pt", out, check_code=0)
    size, full = out.stat().st_size, (trained_run / "best.pt").stat().st_size
    assert f"{size:,} bytes" in result.stdout and f"is {full:,} bytes" in result.stdout
    assert size < full

    exported = Checkpoint.load(out)
    assert exported.kind == "export" and exported.training is None
    assert exported.scores == model.checkpoint.scores and exported.provenance == model.checkpoint.provenance

    slim = charlm.load(out)
    text = "Return the value of the named attribute of object."
    assert torch.equal(logits_of(slim, text), logits_of(model, text))
    assert slim.sample("The ", 50, seed=4) == model.sample("The ", 50, seed=4)

    evaluated = cli("eval", out, check_code=0)
    shutil.copy(trained_run / "best.pt", tmp_path / "best.pt")
    assert stdout_field(evaluated, "bpc") == stdout_field(cli("eval", tmp_path / "best.pt", check_code=0), "bpc")
    assert len(cli("sample", out, "--length", "12", "--seed", "1", check_code=0).stdout) == 1 + 12 + 1
    (tmp_path / "text.txt").write_text(text, encoding="utf-8")
    cli("score", out, tmp_path / "text.txt", check_code=0)
    # an export exports again (there is nothing left to strip), and cannot be resumed
    cli("export", out, tmp_path / "again.pt", check_code=0)
    assert Checkpoint.load(tmp_path / "again.pt").kind == "export"


def test_export_refuses_bad_targets(trained_run, tmp_path):
    assert_one_line_error(cli("export", trained_run, tmp_path), "is a directory")
    existing = tmp_path / "kept.pt"
    existing.write_bytes(b"something the user keeps")
    assert_one_line_error(cli("export", trained_run, existing), "kept.pt exists: pass --force to replace it")
    assert existing.read_bytes() == b"something the user keeps"
    cli("export", trained_run, existing, "--force", check_code=0)
    assert Checkpoint.load(existing).kind == "export"
    assert_one_line_error(cli("export", trained_run, trained_run / "best.pt"), "is the checkpoint being exported")
    assert_one_line_error(cli("export", trained_run, tmp_path / "absent" / "model.pt"), "does not exist")
    assert not (tmp_path / "absent").exists()


# --- training from Python --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_data(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("api-data") / "data"
    prepare_tiny_corpus(data_dir, characters=8_000)
    return data_dir


def small_config(data_dir, run_dir, **changes) -> charlm.TrainConfig:
    values = dict(
        corpus="tiny",
        cell="lru",
        hidden_size=16,
        batch_size=8,
        bptt=16,
        eval_batch_size=4,
        epochs=1,
        lr=3e-3,
        data_dir=str(data_dir),
        run_dir=str(run_dir),
    )
    return charlm.TrainConfig(**{**values, **changes})


def test_train_and_resume_from_python(small_data, tmp_path):
    run = tmp_path / "run"
    summary = charlm.train(small_config(small_data, run))
    assert summary["run_dir"] == str(run) and summary["epochs"] == 1 and summary["best_epoch"] == 1
    assert summary["hidden_size"] == 16 and math.isfinite(summary["best_valid_bpc"])
    assert summary["test_bpc_at_best"] == Checkpoint.load(run).scores["test_bpc"]

    trainer = charlm.Trainer.resume(run, epochs=2)
    assert trainer.progress.epoch == 1
    resumed = trainer.fit()
    assert resumed["epochs"] == 2 and resumed["run_dir"] == str(run)
    assert Checkpoint.load(run, prefer="last").training.progress["epoch"] == 2
    starts = records(run, "start")
    assert [row["resumed_at"]["epoch"] for row in starts] == [0, 1]
    with pytest.raises(CharlmError, match="lr is fixed by the run"):
        charlm.Trainer.resume(run, epochs=3, lr=0.1)
    # a finished run asked for no more epochs does nothing
    assert charlm.Trainer.resume(run, epochs=2).fit()["epochs"] == 2


# --- logging ---------------------------------------------------------------------------------------


class ListHandler(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture
def charlm_logger():
    """The "charlm" logger with a handler that keeps its messages; its state restored afterwards."""
    logger = logging.getLogger("charlm")
    saved = (logger.level, list(logger.handlers), logger.propagate)
    handler = ListHandler()
    logger.handlers = [handler]
    logger.setLevel(logging.INFO)
    yield logger, handler
    logger.handlers, logger.propagate = saved[1], saved[2]
    logger.setLevel(saved[0])  # setLevel, not .level: it clears logging's cache of enabled levels


def test_progress_goes_through_the_charlm_logger(small_data, tmp_path, charlm_logger):
    logger, handler = charlm_logger
    charlm.train(small_config(small_data, tmp_path / "loud"))
    epochs = [message for message in handler.messages if message.startswith("epoch")]
    assert len(epochs) == 1 and "valid" in epochs[0] and "bpc" in epochs[0]
    assert any(message.startswith("training lru") for message in handler.messages)
    assert epochs[0] in (tmp_path / "loud" / "train.log").read_text(encoding="utf-8")

    handler.messages.clear()
    logger.setLevel(logging.WARNING)
    charlm.train(small_config(small_data, tmp_path / "quiet"))
    assert handler.messages == []
    assert "epoch" in (tmp_path / "quiet" / "train.log").read_text(encoding="utf-8")  # the run's log is kept


def test_the_api_refuses_what_the_cli_refuses(model):
    """One set of checks (issue 27): bytes are not text, and the training split is not a score."""
    with pytest.raises(CharlmError, match=r"text must be a str, not bytes: decode it first"):
        model.score(b"hello world")
    with pytest.raises(CharlmError, match="text must be a str, not int"):
        model.sample(3, length=5, seed=1)
    with pytest.raises(CharlmError, match="split must be one of valid, test, not 'train'"):
        model.evaluate("train", record=False)


def test_a_length_the_cli_refuses_is_refused_from_python_before_any_text(model, trained_run):
    """Issue 34: Model.sample(prime, 10**13) ran until memory ran out; it takes the bound of `sample --length`."""
    from charlm.config import MAX_SAMPLE_LENGTH

    for call in (model.sample, model.stream):
        with pytest.raises(CharlmError, match=rf"length must be in \[0, {MAX_SAMPLE_LENGTH}\], not 10000000000000"):
            call("The", 10**13)
    assert_one_line_error(
        cli("sample", trained_run, "--length", str(10**13)), f"--length must be in [0, {MAX_SAMPLE_LENGTH}]"
    )


# A value of the wrong type at each parameter: one CharlmError saying what the parameter takes, never
# a TypeError or AttributeError from inside charlm. (call, the start of the message)
WRONG_TYPES = [
    (
        lambda m, run, tmp: charlm.load(None),
        "a checkpoint or run directory must be a path (a str or a pathlib.Path), not None",
    ),
    (lambda m, run, tmp: charlm.load(b"run"), "a checkpoint or run directory must be a path"),
    (lambda m, run, tmp: charlm.load(np.int64(3)), "a checkpoint or run directory must be a path"),
    (lambda m, run, tmp: charlm.load("a\x00b"), "a checkpoint or run directory 'a\\x00b' holds a NUL character"),
    (lambda m, run, tmp: charlm.load(run, prefer="newest"), "prefer must be 'best' or 'last', not 'newest'"),
    (lambda m, run, tmp: charlm.load(run, device="cpu", trust_code="no"), "trust_code must be True or False, not 'no'"),
    (lambda m, run, tmp: charlm.load(run, device="cpu", cuda_graphs=None), "cuda_graphs must be True or False"),
    (lambda m, run, tmp: m.sample("The", length=None), "length must be an integer, not None"),
    (lambda m, run, tmp: m.sample("The", temperature=None), "temperature must be a number, not None"),
    (lambda m, run, tmp: m.sample("The", top_p=None), "top_p must be a number, not None"),
    (lambda m, run, tmp: m.sample("The", stop=1), "stop must be a string or a list of strings, not 1"),
    (lambda m, run, tmp: list(m.stream("The", top_k=None)), "top_k must be an integer, not None"),
    (lambda m, run, tmp: m.score("The cat", batch_size=None), "batch_size must be an integer, not None"),
    (
        lambda m, run, tmp: m.score("The cat", dynamic=1),
        "dynamic must be 'sgd', 'rms' or a charlm.DynamicOptions, not 1",
    ),
    (
        lambda m, run, tmp: m.score("The cat", dynamic="rms", data_dir=3),
        "data_dir must be a path (a str or a pathlib.Path), not 3",
    ),
    (
        lambda m, run, tmp: m.evaluate(dynamic=b"sgd", record=False),
        "dynamic must be 'sgd', 'rms' or a charlm.DynamicOptions",
    ),
    (lambda m, run, tmp: m.evaluate(data_dir=b"data", record=False), "data_dir must be a path"),
    (lambda m, run, tmp: m.evaluate(data_dir=run / "best.pt", record=False), "data_dir must be a directory:"),
    (
        lambda m, run, tmp: m.evaluate(progress="bar", record=False),
        "progress must be a callable, progress(tokens), not 'bar'",
    ),
    (lambda m, run, tmp: m.export(None), "the checkpoint file to write must be a path"),
    (lambda m, run, tmp: m.export("a\x00b.pt"), "the checkpoint file to write 'a\\x00b.pt' holds a NUL character"),
    (lambda m, run, tmp: m.export(""), "the checkpoint file to write is an empty path"),
    (
        lambda m, run, tmp: charlm.train("pydoc"),
        "config must be a charlm.TrainConfig (or give the settings as keywords), not str",
    ),
    (lambda m, run, tmp: charlm.train(charlm.TrainConfig(corpus=b"pydoc")), "corpus must be text, not b'pydoc'"),
    (lambda m, run, tmp: charlm.train(charlm.TrainConfig(layers=None)), "layers must be an integer, not None"),
    (lambda m, run, tmp: charlm.train(charlm.TrainConfig(compile="no")), "compile must be true or false, not 'no'"),
    (lambda m, run, tmp: charlm.train(lr=10**400), "lr must be a finite number, not 1000"),
    (
        lambda m, run, tmp: charlm.train(hidden_size=-(10**400)),
        "hidden_size must be in [1, 1048576], not -1000",
    ),  # math.isinf overflowed
    (
        lambda m, run, tmp: charlm.train(save_every="1" + "0" * 400),
        "save_every must be a number of steps (500) or of minutes",
    ),
    (
        lambda m, run, tmp: charlm.train(seed=10**400),
        "seed must be at most 9223372036854775807 (a 64-bit integer), not 1000",
    ),
    (lambda m, run, tmp: charlm.train(cell_options={1: 2}), "cell_options must be a mapping of option names to values"),
]


@pytest.mark.parametrize("call, message", WRONG_TYPES, ids=range(len(WRONG_TYPES)))
def test_a_wrong_type_is_one_charlm_error(call, message, model, trained_run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CharlmError) as caught:
        call(model, trained_run, tmp_path)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value), str(caught.value)
    assert list(tmp_path.iterdir()) == []


def test_numpy_numbers_and_paths_are_taken_as_plain_values(tmp_path, monkeypatch):
    """charlm.train(seed=np.int64(3), run_dir=Path(...)): what numpy and pathlib give is what a config holds."""
    import charlm.api as api
    from pathlib import Path

    received = []

    class Stop(Exception):
        pass

    monkeypatch.setattr(api, "Trainer", lambda config: received.append(config) or (_ for _ in ()).throw(Stop()))
    with pytest.raises(Stop):
        charlm.train(seed=np.int64(3), lr=np.float32(0.5), run_dir=Path(tmp_path / "run"), hidden_size=8)
    config = received[0]
    assert (type(config.seed), type(config.lr), type(config.run_dir)) == (int, float, str)
    assert (config.seed, config.lr, config.run_dir) == (3, 0.5, str(tmp_path / "run"))


def test_a_checkpoint_with_non_finite_weights_is_refused_in_one_line(trained_run, tmp_path):
    """It used to evaluate to `bpc nan` with exit code 0 and export without a word."""
    checkpoint = Checkpoint.load(trained_run / "best.pt")
    name = next(iter(checkpoint.weights))
    checkpoint.weights[name] = checkpoint.weights[name].clone().fill_(float("nan"))
    checkpoint.save(tmp_path / "nan.pt")
    for command in (
        ["eval", tmp_path / "nan.pt"],
        ["export", tmp_path / "nan.pt", tmp_path / "out.pt"],
        ["sample", tmp_path / "nan.pt", "--length", "5"],
    ):
        assert_one_line_error(cli(*command), f"({name} holds NaN or infinity): it cannot score, sample or export")
    assert not (tmp_path / "out.pt").exists()


@pytest.mark.parametrize(
    "path, said",
    [
        ("a" * 5000, ": File name too long"),
        ("x/" * 3000 + "y", ": File name too long"),
    ],
    ids=["a name of 5,000 bytes", "a path of 6,001 bytes"],
)
def test_a_path_too_long_for_the_system_is_one_charlm_error(path, said, tmp_path):
    """As on the command line: the OSError (ENAMETOOLONG) of the first system call, as one CharlmError."""
    import re

    import charlm

    with pytest.raises(charlm.CharlmError, match=re.escape(said)):
        charlm.load(path)
    with pytest.raises(charlm.CharlmError, match=re.escape(said)):
        charlm.train(corpus="pydoc", data_dir=path, hidden_size=8, run_dir=str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()
