"""Every numeric option of every command at its type's edges, on the command line and from Python.

The options are collected from the typer application itself (and the Python facade's signatures),
so an option added later is tried too. Each value is either refused before anything runs (one
line on stderr naming the option, exit code 2, nothing written) or accepted and then does what it
says: a real run where that is cheap, else the command is stopped where its work would begin
(``STOP_AT``), which shows that every check has passed. Which values are refused is worked out
here from the type alone (an integer option takes no 2**63, no 1e308; a number option no inf or
nan) and from the bounds the option's setting declares.
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

from charlm import config as configs
from charlm.cli.app import app
from charlm.tasks.training import TaskConfig
from helpers import assert_one_line_error, cli

EDGES = ("0", "-1", str(2**31), str(2**63), str(2**64), "1e308", "inf", "nan")
INT64 = (-(2**63), 2**63 - 1)

# How each command is run: its arguments before the option tried (DATA, RUN, TEXT and NEW stand
# for a prepared corpus, a copy of a trained run, a text file and a directory not yet made).
COMMANDS = {
    "": ["cells"],  # the options of `charlm` itself go before a command
    "train": [
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
    ],
    "sample": ["sample", "RUN", "--length", "3", "--seed", "1"],
    "eval": ["eval", "RUN", "--data-dir", "DATA"],
    "score": ["score", "RUN", "TEXT"],
    "runs": ["runs", "RUN", "--prune", "--dry-run"],
    "bench": [
        "bench",
        "--cells",
        "rnn",
        "--params",
        "1k",
        "--batch-size",
        "2",
        "--bptt",
        "2",
        "--steps",
        "1",
        "--repeat",
        "1",
        "--sample-length",
        "1",
        "--device",
        "cpu",
    ],
    "serve": ["serve", "RUN"],
    "demo": ["demo", "--data-dir", "NEW", "--run-dir", "NEW"],
    "prepare": ["prepare", "pydoc", "--data-dir", "NEW", "--quiet"],
    "check": ["check", "--full", "--device", "cpu", "--cells", "rnn", "--out", "NEW"],
    "task": [
        "task",
        "parity",
        "--bits",
        "4",
        "--hidden",
        "4",
        "--max-samples",
        "20",
        "--eval-every",
        "20",
        "--eval-samples",
        "4",
        "--run-dir",
        "NEW",
        "--device",
        "cpu",
    ],
}
# Options that only apply together with others.
CONTEXT = {
    ("eval", "--search-prefix"): ["--dynamic", "sgd", "--dyn-search"],
    **{("eval", flag): ["--dynamic", "sgd"] for flag in ("--dyn-lr", "--segment")},
    **{
        ("eval", flag): ["--dynamic", "rms"]
        for flag in ("--dyn-decay", "--dyn-eps", "--dyn-stat-batch-size", "--dyn-stat-batches")
    },
    **{("score", flag): ["--dynamic", "sgd"] for flag in ("--dyn-lr", "--segment")},
    **{
        ("score", flag): ["--dynamic", "rms"]
        for flag in ("--dyn-decay", "--dyn-eps", "--dyn-stat-batch-size", "--dyn-stat-batches")
    },
    ("sample", "--length-penalty"): ["--beam", "2", "--stop", "e"],
    ("sample", "--seed"): ["--num-samples", "2"],
    ("prepare", "--vocab-size"): ["--subword", "bpe"],
    ("train", "--momentum"): ["--optimizer", "sgd"],
    ("train", "--plateau-factor"): ["--schedule", "plateau-halving"],
}
# Where the work of a command begins: an accepted value stops there (every check has passed) instead
# of running for as long as it asks (--length 2**31, --minutes 1e308) or serving for ever.
STOP_AT = {
    "serve": "charlm.cli.serve._listen",
    "demo": "charlm.tools.demo.run_demo",
    "prepare": "charlm.corpora.prepare.prepare_corpus",
    # after the settings, the task and its memory estimate are checked
    "task": "charlm.tasks.training.build_task_model",
    "bench": "charlm.tools.benchmark.benchmark_cells",  # after its memory estimate
    "check": "charlm.tools.full_check.FullCheck.run",
    "eval": "charlm.cli.evaluate.load_model",
    "score": "charlm.cli.score.load_model",
    **{("sample", flag): "charlm.cli.sample.load_model" for flag in ("--length", "--num-samples", "--beam")},
}
REAL = {("eval", "--bptt"), ("score", "--batch-size")}  # run for real although their command stops early
SETTINGS = [
    configs.TrainConfig,
    configs.SampleConfig,
    configs.EvalConfig,
    configs.ScoreConfig,
    configs.DynamicOptions,
    configs.ServeConfig,
    configs.BenchmarkConfig,
    configs.DemoConfig,
    configs.PrepareConfig,
]
OWNERS = {
    "train": [configs.TrainConfig],
    "sample": [configs.SampleConfig],
    "eval": [configs.EvalConfig, configs.DynamicOptions],
    "score": [configs.ScoreConfig, configs.DynamicOptions],
    "serve": [configs.ServeConfig],
    "bench": [configs.BenchmarkConfig],
    "demo": [configs.DemoConfig],
    "prepare": [configs.PrepareConfig],
    "task": [TaskConfig],
}


class Started(BaseException):
    """Raised where a command's work would begin (not an Exception: the command line lets it through)."""


def numeric_options() -> list[tuple[str, str, type]]:
    """(command, flag, int or float) for every numeric option of every command, from the typer app."""
    group = typer.main.get_command(app)
    found = []
    for name, command in [("", group), *sorted(group.commands.items())]:
        for param in command.params:
            hint = param.type_descriptor.annotation
            kinds = [kind for kind in (typing.get_args(hint) or (hint,)) if kind is not type(None)]
            if kinds and kinds[0] in (int, float) and param.param_type_name == "option":
                found.append((name, param.opts[0], kinds[0]))
    return found


OPTIONS = numeric_options()
CASES = [(command, flag, kind, value) for command, flag, kind in OPTIONS for value in EDGES]


def setting_of(command: str, flag: str):
    """The settings field behind a command's option, or None for an option of the command's own."""
    from charlm.settings import flag_of

    for owner in OWNERS.get(command, []):
        for field in dataclasses.fields(owner):
            if field.metadata.get("cli", True) and flag_of(owner, field.name) == flag:
                return field
    return None


def refused_by_type(kind: type, text: str) -> bool:
    """What the type alone refuses: not an integer, beyond 64 bits, or not a finite number."""
    if kind is int:
        try:
            return not INT64[0] <= int(text) <= INT64[1]
        except ValueError:
            return True
    return not math.isfinite(float(text))


def refused_by_bounds(field, kind: type, text: str) -> bool:
    meta = field.metadata
    value = kind(float(text)) if kind is float else int(text)
    low, high = meta.get("min"), meta.get("max")
    if low is not None and (value <= low if meta["min_open"] else value < low):
        return True
    if meta.get("limit") is not None and value > meta["limit"]:  # --layers 2**31: beyond any model
        return True
    return high is not None and (value >= high if meta["max_open"] else value > high)


@pytest.fixture(scope="module")
def places(trained_run, tiny_corpus, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("edges")
    run = root / "run"
    shutil.copytree(trained_run, run)  # eval appends its record: never to the shared run
    (root / "text.txt").write_text("The quick brown fox jumps over the lazy dog. " * 4, encoding="utf-8")
    return {"DATA": tiny_corpus, "RUN": run, "TEXT": root / "text.txt"}


def test_every_command_with_a_numeric_option_has_a_way_to_run():
    assert {command for command, _, _ in OPTIONS} <= set(COMMANDS), "add the command to COMMANDS"
    assert len(OPTIONS) >= 70 and ("train", "--seed", int) in OPTIONS and ("", "--threads", int) in OPTIONS


@pytest.mark.parametrize("command, flag, kind, value", CASES, ids=[f"{c or 'charlm'} {f} {v}" for c, f, _, v in CASES])
def test_option_at_its_edge(command, flag, kind, value, places, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    new = tmp_path / "new"
    words = [*COMMANDS[command], *CONTEXT.get((command, flag), [])]
    args = [str(new) if word == "NEW" else str(places.get(word, word)) for word in words]
    args = [flag, value, *args] if command == "" else [*args, flag, value]
    stop = None if (command, flag) in REAL else STOP_AT.get((command, flag)) or STOP_AT.get(command)
    if stop:
        monkeypatch.setattr(stop, _started)
    before = _snapshot(tmp_path, places["RUN"])
    field = setting_of(command, flag)
    expected_refusal = refused_by_type(kind, value) or (field is not None and refused_by_bounds(field, kind, value))
    try:
        result = cli(*args)
    except Started:
        assert not expected_refusal, f"{flag} {value} was not refused"
        return
    if expected_refusal or result.returncode == 2:  # refused now, or later by a check of its own (a model too big)
        assert_one_line_error(result, code=2)
        assert result.stdout == "" and _snapshot(tmp_path, places["RUN"]) == before and not new.exists()
        if expected_refusal:
            assert flag in result.stderr
        return
    if command == "train" and result.returncode == 3:  # diverged at --lr 1e308: stopped, as documented
        assert_one_line_error(result, "training stopped: loss became", code=3)
        return
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stderr}"


def _started(*args, **kwargs):
    raise Started()


def _snapshot(*roots: Path) -> dict[str, int]:
    return {str(path): path.stat().st_size for root in roots for path in sorted(root.rglob("*")) if path.is_file()}


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
        assert_one_line_error(cli(*command), f"CHARLM_DATA must be a directory: {a_file} is a regular file", code=2)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["notes.txt"]


# --- the Python facade: the same checks, named by the setting -----------------------------------------


def python_value(kind: type, text: str):
    return (
        int(text)
        if kind is int and text.lstrip("-").isdigit()
        else float(text)
        if "." in text or text.isalpha() or "e" in text
        else int(text)
    )


TRAIN_FIELDS = [
    (field.name, kind)
    for field in dataclasses.fields(configs.TrainConfig)
    for kind in [typing.get_type_hints(configs.TrainConfig).get(field.name)]
    if {int, float} & set(typing.get_args(kind) or (kind,))
]


def refused_in_python(kind: type, value, field) -> bool:
    if kind is int and not isinstance(value, int):
        return True
    if refused_by_type(kind, str(value)):
        return True
    return field is not None and refused_by_bounds(field, kind, str(value))


@pytest.mark.parametrize("name", [name for name, _ in TRAIN_FIELDS])
def test_train_from_python_takes_the_same_checks(name, tmp_path, monkeypatch, tiny_corpus):
    import charlm
    import charlm.training.trainer as trainer

    monkeypatch.chdir(tmp_path)
    received = []
    monkeypatch.setattr(trainer, "Trainer", lambda config: received.append(config) or _started())  # the work
    field = {f.name: f for f in dataclasses.fields(configs.TrainConfig)}[name]
    kind = next(
        k
        for k in (typing.get_args(typing.get_type_hints(configs.TrainConfig)[name]) or ())
        + (typing.get_type_hints(configs.TrainConfig)[name],)
        if k in (int, float)
    )
    for text in EDGES:
        value = python_value(kind, text)
        try:
            charlm.train(
                corpus="tiny",
                data_dir=str(tiny_corpus),
                run_dir=str(tmp_path / "new"),
                **({"optimizer": "sgd"} if name == "momentum" else {}),
                **{name: value},
            )
        except charlm.CharlmError as error:
            assert refused_in_python(kind, value, field), f"{name}={value!r} refused: {error}"
            assert str(error).startswith(f"{name} must be") and getattr(error, "field", name) == name, str(error)
        except Started:
            assert not refused_in_python(kind, value, field), f"{name}={value!r} was not refused"
            assert getattr(received[-1], name) == value
        assert list(tmp_path.iterdir()) == []


API_OWNERS = {"stream": configs.SampleConfig, "score": configs.ScoreConfig, "evaluate": configs.EvalConfig}
API_CALLS = {
    "stream": dict(prime="The"),
    "score": dict(text="The quick brown fox. " * 3),
    "evaluate": {},
    ("stream", "length_penalty"): dict(prime="The", beam=2),
    ("evaluate", "search_prefix"): dict(dynamic="sgd"),
}


def api_parameters():
    from charlm.api import Model

    found = []
    for method in API_OWNERS:
        hints = typing.get_type_hints(getattr(Model, method))
        for name in inspect.signature(getattr(Model, method)).parameters:
            kinds = [
                kind for kind in (typing.get_args(hints.get(name)) or (hints.get(name),)) if kind is not type(None)
            ]
            if kinds and kinds[0] in (int, float):
                found.append((method, name, kinds[0]))
    return found


@pytest.mark.parametrize("method, name, kind", api_parameters(), ids=[f"{m} {n}" for m, n, _ in api_parameters()])
def test_model_methods_take_the_same_checks(method, name, kind, places, tmp_path, monkeypatch):
    import charlm
    import charlm.api as api
    import charlm.inference.dynamic_protocol as protocol

    for target, work in ((api, "generate"), (api, "beam_generation"), (api, "score_split"), (protocol, "score_tokens")):
        monkeypatch.setattr(target, work, _started)  # where the work begins: every check has passed
    model = charlm.load(places["RUN"], device="cpu")
    field = {f.name: f for f in dataclasses.fields(API_OWNERS[method])}.get(name)
    for text in EDGES:
        value = python_value(kind, text)
        refused = refused_in_python(kind, value, field) or (
            name == "search_prefix" and refused_by_type(int, text) is False and value < 2
        )
        try:
            result = getattr(model, method)(**API_CALLS.get((method, name), API_CALLS[method]), **{name: value})
        except charlm.CharlmError as error:  # refused by its type or bounds, or later by a check of its own
            assert refused or "more streams than the" in str(error), f"{method}({name}={value!r}) refused: {error}"
            assert name.replace("_", "-") in str(error) or name in str(error) or not refused, str(error)
            continue
        except Started:
            result = None
        assert not refused, f"{method}({name}={value!r}) was not refused"
        if method == "score":
            assert (
                result.tokens == len("The quick brown fox. " * 3) - 1
            )  # every symbol after the first, whatever the streams


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


def test_the_largest_seed_samples_and_the_next_sample_goes_past_it(places):
    import charlm

    model = charlm.load(places["RUN"], device="cpu")
    result = cli(
        "sample", places["RUN"], "--prime", "The", "--length", "8", "--seed", str(2**63 - 2), "--num-samples", "2"
    )
    assert result.returncode == 0, result.stderr
    first, second = (model.sample("The", length=8, seed=seed) for seed in (2**63 - 2, 2**63 - 1))
    assert result.stdout == f"{first}\n\n{second}\n"  # sample i uses seed + i
    result = cli("sample", places["RUN"], "--prime", "The", "--seed", str(2**63 - 1), "--num-samples", "2")
    assert_one_line_error(result, f"--seed must be at most {2**63 - 2} for 2 samples (sample i uses seed + i)")
    assert result.stdout == ""


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
