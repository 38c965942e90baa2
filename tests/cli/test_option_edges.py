"""Every kind of bound a numeric option can have, tried once where it is checked: on the command line and
from Python.

The options themselves are collected from the typer application (and the Python facade's signatures) by
a structural test that reads their declarations and runs nothing: each is backed by a setting whose type
the shared check (``charlm.settings.check_number``: an integer within 64 bits, a finite number) and
whose declared bounds (``min``, ``max``, ``min_open``, ``max_open``) ``validate`` enforces, or it is one
of the few options checked by code of their own, each tried below. So an option added later without a
bound fails a fast test. Each kind of bound is then tried once at its edge: a refused value is one line
on stderr naming the option, exit code 2, nothing written; an accepted one reaches the point where the
work would begin (``Started``).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import shutil
import typing
from pathlib import Path

import pytest
import typer.main

from charlm import config, config_inference, config_tools
from charlm.cli.app import app
from charlm.settings import INT64_MAX, INT64_MIN, number_kind
from charlm.tasks.training import TaskConfig
from helpers import assert_one_line_error, cli

EDGES = ("0", "-1", str(2**31), str(2**63), str(2**64), "1e308", "inf", "nan")

# The settings behind each command's options (an option none of these declares is the command's own).
OWNERS = {
    "train": [config.TrainConfig],
    "sample": [config_inference.SampleConfig],
    "eval": [config_inference.EvalConfig, config_inference.DynamicOptions],
    "score": [config_inference.ScoreConfig, config_inference.DynamicOptions],
    "serve": [config_inference.ServeConfig],
    "bench": [config_tools.BenchmarkConfig],
    "demo": [config_tools.DemoConfig],
    "prepare": [config_tools.PrepareConfig],
    "runs": [config_tools.PruneConfig],
    "task": [TaskConfig],
}
# Options of a command's own that are not settings and have no declared range: checked by code of their
# own, each tried by the test named.
OWN_CHECKS = {
    ("", "--threads"): "test_threads_is_bounded_at_every_edge (charlm.runtime.openmp.set_threads)",
    ("check", "--budget"): "test_refused_on_the_command_line[own number, its own check]",
    ("eval", "--search-prefix"): "test_refused_on_the_command_line[own integer, its own check] "
    "(charlm.inference.dynamic_options.check_protocol)",
}
# Python parameters that are no setting's field, checked by code of their own.
OWN_PARAMETERS = {("evaluate", "search_prefix"): "charlm.inference.dynamic_options.check_protocol"}

# A cheap training run; DATA, RUN, TEXT and NEW stand for a prepared corpus, a copy of a trained run, a
# text file and a directory not yet made.
TRAIN = [
    "train",
    "--corpus",
    "tiny",
    "--data-dir",
    "DATA",
    "--run-dir",
    "NEW",
    "--cell",
    "rnn",
    "--hidden",
    "4",
    "--batch-size",
    "4",
    "--bptt",
    "8",
    "--epochs",
    "1",
    "--max-tokens",
    "32",
    "--eval-batch-size",
    "2",
    "--eval-fraction",
    "0.05",
    "--train-fraction",
    "0.1",
]
# Where the work of a command begins: a value that is not refused stops there (every check has passed).
STOPS = (
    "charlm.training.setup.cell_class_for",  # in the Trainer, once its settings are checked
    "charlm.tools.full_check.FullCheck.run",
    "charlm.cli.serve._listen",
    "charlm.cli.evaluate.load_model",
    "charlm.cli.score.load_model",
)


class Started(BaseException):
    """Raised where a command's work would begin (not an Exception: the command line lets it through)."""


def _started(*args, **kwargs):
    raise Started()


def _snapshot(*roots: Path) -> dict[str, int]:
    return {str(path): path.stat().st_size for root in roots for path in sorted(root.rglob("*")) if path.is_file()}


def numeric_options() -> list[tuple[str, str, type, object]]:
    """(command, flag, int or float, click parameter) for every numeric option of every command, from the typer app."""
    group = typer.main.get_command(app)
    found = []
    for name, command in [("", group), *sorted(group.commands.items())]:
        for param in command.params:
            hint = param.type_descriptor.annotation
            kinds = [kind for kind in (typing.get_args(hint) or (hint,)) if kind is not type(None)]
            if kinds and kinds[0] in (int, float) and param.param_type_name == "option":
                found.append((name, param.opts[0], kinds[0], param))
    return found


def setting_of(command: str, flag: str):
    """(owner, field) of the setting behind a command's option, or None for an option of the command's own."""
    from charlm.settings import flag_of

    for owner in OWNERS.get(command, []):
        for field in dataclasses.fields(owner):
            if field.metadata.get("cli", True) and flag_of(owner, field.name) == flag:
                return owner, field
    return None


# --- the declarations: every numeric option is bounded, read without running anything ------------------


def test_every_numeric_option_is_bounded_by_its_setting_or_its_declaration():
    options = numeric_options()
    assert len(options) >= 70 and ("train", "--seed", int) in [o[:3] for o in options]
    unbounded = []
    for command, flag, kind, param in options:
        found = setting_of(command, flag)
        if (command, flag) in OWN_CHECKS:
            continue
        if found is not None and param.max is None and param.min is None:
            owner, field = found
            # validate() checks the type (number_kind: 64 bits, finite) and then the declared bounds
            assert number_kind(owner, field.name) is kind, f"{command} {flag}: {owner.__name__}.{field.name}"
            meta = field.metadata
            low, high = meta["min"], meta["max"]
            assert low is None or high is None or low < high, f"{command} {flag}: min {low} >= max {high}"
            assert not (meta["min_open"] and low is None) and not (meta["max_open"] and high is None), flag
        else:
            unbounded.append(f"{command or 'charlm'} {flag}")
    assert not unbounded, f"give these a setting or an entry in OWN_CHECKS with a test: {unbounded}"


def api_parameters() -> list[tuple[str, str, type]]:
    from charlm.api import Model

    found = []
    for method in ("stream", "score", "evaluate"):
        hints = typing.get_type_hints(getattr(Model, method))
        for name in inspect.signature(getattr(Model, method)).parameters:
            kinds = [
                kind for kind in (typing.get_args(hints.get(name)) or (hints.get(name),)) if kind is not type(None)
            ]
            if kinds and kinds[0] in (int, float):
                found.append((method, name, kinds[0]))
    return found


def test_every_numeric_parameter_from_python_is_a_bounded_setting():
    """charlm.train takes TrainConfig's fields, each numeric one under the shared check; each numeric
    parameter of a Model method is a field of the settings it validates (or checked by code of its own)."""
    for owner in {owner for owners in OWNERS.values() for owner in owners}:
        hints = typing.get_type_hints(owner)
        for field in dataclasses.fields(owner):
            if {int, float} & set(typing.get_args(hints[field.name]) or (hints[field.name],)):
                # validate() applies the shared check (64 bits, finite) to what number_kind names
                assert number_kind(owner, field.name) is not None, f"{owner.__name__}.{field.name}"
    owners = {
        "stream": [config_inference.SampleConfig],
        "score": [config_inference.ScoreConfig],
        "evaluate": [config_inference.EvalConfig],
    }
    parameters = api_parameters()
    assert len(parameters) >= 10
    for method, name, kind in parameters:
        if (method, name) in OWN_PARAMETERS:
            continue
        owner = next((o for o in owners[method] if name in {f.name for f in dataclasses.fields(o)}), None)
        assert owner is not None and number_kind(owner, name) is kind, f"Model.{method}({name}=...) is not a setting"


# --- the command line: each kind of bound at its edge ---------------------------------------------------


@pytest.fixture(scope="module")
def places(trained_run, tiny_corpus, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("edges")
    run = root / "run"
    shutil.copytree(trained_run, run)  # eval appends its record: never to the shared run
    (root / "text.txt").write_text("The quick brown fox jumps over the lazy dog. " * 4, encoding="utf-8")
    return {"DATA": tiny_corpus, "RUN": run, "TEXT": root / "text.txt"}


def _words(words, places, tmp_path) -> list[str]:
    return [str(tmp_path / "new") if word == "NEW" else str(places.get(word, word)) for word in words]


REFUSED = {
    # an integer option: not an integer, or beyond 64 bits (the shared check, before any bound of its own)
    "integer given a fraction": ([*TRAIN, "--epochs", "1.5"], "--epochs", "integer"),
    "integer given 1e308": ([*TRAIN, "--epochs", "1e308"], "--epochs", "integer"),
    "integer given nan": ([*TRAIN, "--seed", "nan"], "--seed", "integer"),
    "integer beyond 64 bits": ([*TRAIN, "--seed", str(2**63)], "--seed", f"at most {INT64_MAX} (a 64-bit integer)"),
    "integer below 64 bits": ([*TRAIN, "--seed", str(-(2**63) - 1)], "--seed", f"at least {INT64_MIN}"),
    "integer with a minimum beyond 64 bits": ([*TRAIN, "--epochs", str(2**64)], "--epochs", "64-bit integer"),
    "integer of a command's own setting beyond 64 bits": (
        ["runs", "RUN", "--prune", "--dry-run", "--keep", str(2**63)],
        "--keep",
        f"must be at most {INT64_MAX} (a 64-bit integer)",
    ),
    # a number option: finite
    "number given inf": ([*TRAIN, "--clip", "inf"], "--clip", "must be a finite number, not inf"),
    "number given -inf": ([*TRAIN, "--lr", "-inf"], "--lr", "must be in (0, 1000], not -inf"),
    "number given nan": ([*TRAIN, "--clip", "nan"], "--clip", "must be zero or positive, not nan"),
    # the bounds a setting declares
    "closed minimum, below": ([*TRAIN, "--epochs", "0"], "--epochs", "must be at least 1, not 0"),
    "closed minimum 0, below": ([*TRAIN, "--clip", "-1"], "--clip", "must be zero or positive, not -1"),
    "open minimum, at": ([*TRAIN, "--lr-decay", "0"], "--lr-decay", "must be positive, not 0"),
    "closed maximum, above": ([*TRAIN, "--dist-timeout", "10081"], "--dist-timeout", "must be in (0, 10080], not"),
    "open maximum, at": ([*TRAIN, "--dropout", "1"], "--dropout", "must be in [0, 1), not 1"),
    "open minimum and maximum, at the maximum": (
        [*TRAIN, "--schedule", "plateau-halving", "--plateau-factor", "1"],
        "--plateau-factor",
        "must be in (0, 1), not 1",
    ),
    "closed maximum of a size, above": ([*TRAIN, "--layers", str(2**31)], "--layers", "must be in [1, 1024], not"),
    "closed maximum of a rate, above": ([*TRAIN, "--lr", "1e308"], "--lr", "must be in (0, 1000], not 1e+308"),
    # an option of a command's own, checked by its own code
    "own number, its own check": (
        ["check", "--full", "--device", "cpu", "--cells", "rnn", "--out", "NEW", "--budget", "nan"],
        "--budget",
        "--budget is nan minutes",
    ),
    "own integer, its own check": (
        ["eval", "RUN", "--dynamic", "sgd", "--dyn-search", "--search-prefix", str(2**63)],
        "--search-prefix",
        f"from 2 to {INT64_MAX}, not {2**63}",
    ),
}


@pytest.mark.parametrize("kind", REFUSED)
def test_refused_on_the_command_line(kind, places, tmp_path, monkeypatch):
    words, flag, fragment = REFUSED[kind]
    monkeypatch.chdir(tmp_path)
    for target in STOPS:
        monkeypatch.setattr(target, _started)
    before = _snapshot(tmp_path, places["RUN"])
    try:
        result = cli(*_words(words, places, tmp_path))
    except Started:
        pytest.fail(f"{flag} was not refused")
    assert_one_line_error(result, flag, fragment, code=2)
    assert result.stdout == "" and _snapshot(tmp_path, places["RUN"]) == before and not (tmp_path / "new").exists()


def test_accepted_at_every_kind_of_edge_on_the_command_line(places, tmp_path, monkeypatch):
    """The edge values that are allowed, all in one run: it reaches the Trainer with each of them."""
    import charlm.training.setup as setup

    monkeypatch.chdir(tmp_path)
    received = []
    monkeypatch.setattr(setup, "cell_class_for", lambda config, *args: received.append(config) or _started())
    edges = {
        "epochs": 1,  # closed minimum
        "clip": 0.0,  # closed minimum 0
        "lr": 1000.0,  # closed maximum
        "dropout": 0.999,  # below an open maximum
        "dist_timeout": 10080.0,  # closed maximum
        "layers": 1024,  # closed maximum
        "seed": INT64_MAX,  # 64 bits
    }
    flags = [word for name, value in edges.items() for word in ("--" + name.replace("_", "-"), str(value))]
    with pytest.raises(Started):
        cli(*_words([*TRAIN, *flags], places, tmp_path))
    assert {name: getattr(received[-1], name) for name in edges} == edges


def test_threads_is_bounded_at_every_edge(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    for value in EDGES:
        result = cli("--threads", value, "cells")
        assert_one_line_error(result, "--threads", code=2)
        assert result.stdout == "" and list(tmp_path.iterdir()) == []


def test_charlm_threads_from_the_environment_is_bounded_too(monkeypatch):
    for value in EDGES:
        monkeypatch.setenv("CHARLM_THREADS", value)
        assert_one_line_error(cli("cells"), "CHARLM_THREADS", code=2)


def test_charlm_data_that_is_a_file_is_said_as_data_dir_is(monkeypatch, tmp_path):
    """The environment's data root is checked as --data-dir is: one line, exit 2, nothing made."""
    a_file = tmp_path / "notes.txt"
    a_file.write_text("not a directory", encoding="utf-8")
    monkeypatch.setenv("CHARLM_DATA", str(a_file))
    for command in (("corpora",), ("train", "--corpus", "tiny", "--epochs", "1", "--run-dir", str(tmp_path / "run"))):
        assert_one_line_error(cli(*command), f"CHARLM_DATA must be a directory: {a_file} is a file", code=2)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["notes.txt"]


# --- the Python facade: the same checks, named by the setting -----------------------------------------

PYTHON_REFUSED = {
    "integer given a fraction": ("epochs", 1.5, "must be an integer"),
    "integer given true": ("epochs", True, "must be an integer"),
    "integer beyond 64 bits": ("seed", 2**63, "(a 64-bit integer)"),
    "integer below 64 bits": ("seed", -(2**63) - 1, "(a 64-bit integer)"),
    "number given text": ("clip", "5", "must be a number"),
    "number given inf": ("clip", math.inf, "finite"),
    "number given nan": ("lr_decay", math.nan, "must be positive, not nan"),
    "closed minimum, below": ("epochs", 0, "must be at least 1, not 0"),
    "open minimum, at": ("lr_decay", 0.0, "must be positive"),
    "closed maximum, above": ("dist_timeout", 10081.0, "must be in (0, 10080]"),
    "open maximum, at": ("dropout", 1.0, "must be in [0, 1)"),
    "closed maximum of a size, above": ("layers", 2**31, "must be in [1, 1024]"),
    "closed maximum of a rate, above": ("lr", 1e308, "must be in (0, 1000]"),
}


def _train_from_python(tmp_path, tiny_corpus, **settings):
    import charlm

    return charlm.train(corpus="tiny", data_dir=str(tiny_corpus), run_dir=str(tmp_path / "new"), **settings)


@pytest.mark.parametrize("kind", PYTHON_REFUSED)
def test_train_from_python_names_the_setting(kind, tmp_path, monkeypatch, tiny_corpus):
    import charlm
    import charlm.api as api

    name, value, fragment = PYTHON_REFUSED[kind]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(api, "Trainer", _started)  # the work
    with pytest.raises(charlm.CharlmError) as caught:
        _train_from_python(tmp_path, tiny_corpus, **{name: value})
    error = caught.value
    assert str(error).startswith(f"{name} must be") and fragment in str(error), str(error)
    assert getattr(error, "field", name) == name
    assert list(tmp_path.iterdir()) == []


def test_train_from_python_takes_every_kind_of_edge(tmp_path, monkeypatch, tiny_corpus):
    import charlm.api as api

    monkeypatch.chdir(tmp_path)
    received = []
    monkeypatch.setattr(api, "Trainer", lambda config: received.append(config) or _started())
    edges = dict(epochs=1, clip=0.0, lr=1000.0, dropout=0.999, dist_timeout=10080.0, layers=1024, seed=INT64_MAX)
    with pytest.raises(Started):
        _train_from_python(tmp_path, tiny_corpus, **edges)
    assert {name: getattr(received[-1], name) for name in edges} == edges
    assert list(tmp_path.iterdir()) == []


MODEL_REFUSED = {
    "stream: closed minimum, below": ("stream", dict(prime="The", length=-1), "length"),
    "stream: integer limit": ("stream", dict(prime="The", length=10**9 + 1), "length"),
    "stream: number given nan": ("stream", dict(prime="The", temperature=math.nan), "temperature"),
    "stream: closed maximum, above": ("stream", dict(prime="The", top_p=1.5), "top_p"),
    "stream: integer beyond 64 bits": ("stream", dict(prime="The", seed=2**63), "seed"),
    "score: closed minimum, below": ("score", dict(text="The quick brown fox. ", batch_size=0), "batch_size"),
    "score: integer beyond 64 bits": ("score", dict(text="The quick brown fox. ", batch_size=2**64), "batch_size"),
    "evaluate: integer given a fraction": ("evaluate", dict(bptt=1.5), "bptt"),
    "evaluate: closed minimum, below": ("evaluate", dict(batch_size=0), "batch_size"),
    "evaluate: own parameter": ("evaluate", dict(dynamic="sgd", search_prefix=1), "search-prefix"),
}


@pytest.mark.parametrize("kind", MODEL_REFUSED)
def test_model_methods_name_the_setting(kind, places, monkeypatch):
    import charlm
    import charlm.api as api
    import charlm.api_scoring as api_scoring
    import charlm.inference.dynamic_protocol as protocol

    patched = ((api, "generate"), (api, "beam_generation"), (api_scoring, "score_split"), (protocol, "score_tokens"))
    for target, work in patched:
        monkeypatch.setattr(target, work, _started)  # where the work begins: every check has passed
    method, arguments, name = MODEL_REFUSED[kind]
    before = _snapshot(places["RUN"])
    model = charlm.load(places["RUN"], device="cpu")
    with pytest.raises(charlm.CharlmError) as caught:
        getattr(model, method)(**arguments)
    assert name in str(caught.value), str(caught.value)
    assert _snapshot(places["RUN"]) == before


# --- what an accepted extreme does, worked out by hand ---------------------------------------------------


def test_a_huge_temperature_draws_uniformly_over_the_allowed_symbols(places):
    """logits / 1e308 are all 0 (the unknown entry stays banned): each symbol is the one whose
    exponential race time from the seeded generator is smallest, whatever the model says."""
    import charlm
    import torch

    model = charlm.load(places["RUN"], device="cpu")
    vocabulary = model.vocabulary
    banned = [vocabulary.index(model.tokenizer.unk)] if model.tokenizer.unk is not None else []
    generator = torch.Generator().manual_seed(5)
    expected = []
    for _ in range(30):
        race = torch.empty(len(vocabulary)).exponential_(generator=generator)
        race[banned] = math.inf
        expected.append(vocabulary[int(torch.argmin(race))])
    assert model.sample("The", length=30, temperature=1e308, seed=5) == "The" + "".join(expected)
    result = cli("sample", places["RUN"], "--prime", "The", "--length", "30", "--temperature", "1e300", "--seed", "5")
    assert result.returncode == 0 and result.stdout == "The" + "".join(expected) + "\n"


def test_a_tiny_temperature_is_greedy(places):
    import charlm

    model = charlm.load(places["RUN"], device="cpu")
    greedy = model.sample("The", length=25, beam=1)
    assert model.sample("The", length=25, temperature=1e-300, seed=1) == greedy
    assert model.sample("The", length=25, temperature=1e-300, seed=2) == greedy


def test_a_length_penalty_beyond_a_float_scores_every_continuation_zero():
    from charlm.inference.beam import normalised_score

    assert normalised_score(-3.0, 1, 1e308) == -3.0  # 1 ** alpha is 1
    assert normalised_score(-3.0, 5, 1e308) == 0.0 and math.copysign(1, normalised_score(-3.0, 5, 1e308)) == -1
    assert normalised_score(-3.0, 5, 2.0) == -3.0 / 25


def test_the_largest_seeds_sample(places):
    import charlm

    model = charlm.load(places["RUN"], device="cpu")
    result = cli(
        "sample", places["RUN"], "--prime", "The", "--length", "8", "--seed", str(2**63 - 2), "--num-samples", "2"
    )
    assert result.returncode == 0, result.stderr
    first, second = (model.sample("The", length=8, seed=seed) for seed in (2**63 - 2, 2**63 - 1))
    assert result.stdout == f"{first}\n\n{second}\n"  # sample i uses seed + i


# --- exit codes and output -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "error, code",
    [
        (FileNotFoundError(2, "No such file or directory", "in.pt"), 2),
        (IsADirectoryError(21, "Is a directory", "in.pt"), 2),
        (PermissionError(13, "Permission denied", "in.pt"), 2),
        (OSError(5, "Input/output error", "in.pt"), 1),
        (OSError(28, "No space left on device", "in.pt"), 1),
    ],
)
def test_an_oserror_is_bad_input_unless_the_machine_failed(error, code, places, monkeypatch):
    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr("charlm.cli.sample.load_model", fail)
    assert_one_line_error(cli("sample", places["RUN"]), f"cannot access in.pt: {error.strerror}", code=code)


@pytest.mark.parametrize(
    "words",
    [
        ["score", "RUN", "TEXT", "--unknown", "skip"],
        ["runs", "RUN"],
        ["report", "RUN"],
        ["sample", "RUN", "--prime", "The", "--length", "3", "--seed", "1"],
    ],
)
def test_a_stdout_that_cannot_encode_a_character_gets_a_replacement(words, places, tmp_path):
    import contextlib
    import io

    from charlm.cli.app import run

    named = tmp_path / "runé"
    shutil.copytree(places["RUN"], named)
    (tmp_path / "té.txt").write_text("The café", encoding="utf-8")
    buffer = io.BytesIO()
    stream = io.TextIOWrapper(buffer, encoding="ascii", errors="strict")
    with contextlib.redirect_stdout(stream), contextlib.redirect_stderr(io.StringIO()) as errors:
        code = run(
            [str(named) if word == "RUN" else str(tmp_path / "té.txt") if word == "TEXT" else word for word in words]
        )
    stream.flush()
    assert code == 0, errors.getvalue()
    shown = buffer.getvalue().decode("ascii")
    assert "run?" in shown or words[0] == "sample"
    assert shown.startswith("The") or words[0] != "sample"
