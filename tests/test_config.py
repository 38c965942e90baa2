"""Settings dataclasses: bounds named by field in Python and by flag on the command line, strict
reading of config files, every field an option whose help shows the dataclass default."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import typing

import pytest
import torch

import charlm
from charlm.config import TrainConfig
from charlm.config_inference import DynamicOptions, EvalConfig, SampleConfig, ScoreConfig
from charlm.config_tools import BenchmarkConfig, DemoConfig
from charlm.settings import validate
from charlm.errors import CharlmError, ConfigError
from helpers import assert_one_line_error, cli, prepare_tiny_corpus

NAN, INF = float("nan"), float("inf")


# --- bounds ----------------------------------------------------------------------------------------


def test_defaults_are_valid():
    TrainConfig().validate()
    DynamicOptions().validate()
    DynamicOptions(method="rms").validate()
    for config in (SampleConfig(), EvalConfig(), ScoreConfig(), BenchmarkConfig(), DemoConfig()):
        validate(config)
    assert DynamicOptions().lr == 0.01 and DynamicOptions(method="rms").lr == 1e-4


@pytest.mark.parametrize(
    "settings, field, message",
    [
        (TrainConfig(layers=0), "layers", "layers must be in [1, 1024], not 0"),
        (TrainConfig(hidden_size=0), "hidden_size", "hidden_size must be in [1, 1048576]"),
        (TrainConfig(embed_size=-1), "embed_size", "embed_size must be in [0, 1048576]"),
        (TrainConfig(dropout=1.0), "dropout", "dropout must be in [0, 1), not 1.0"),
        (TrainConfig(dropout=NAN), "dropout", "dropout must be in [0, 1), not nan"),
        (TrainConfig(batch_size=0), "batch_size", "batch_size must be at least 1"),
        (TrainConfig(bptt=0), "bptt", "bptt must be at least 1"),
        (TrainConfig(lr=0.0), "lr", "lr must be in (0, 1000], not 0.0"),
        (TrainConfig(lr=-1e-3), "lr", "lr must be in (0, 1000]"),
        (TrainConfig(lr=NAN), "lr", "lr must be in (0, 1000], not nan"),
        (TrainConfig(lr_decay=0.0), "lr_decay", "lr_decay must be positive"),
        (TrainConfig(epochs=0), "epochs", "epochs must be at least 1"),
        (TrainConfig(patience=0), "patience", "patience must be at least 1"),
        (TrainConfig(clip=-1.0), "clip", "clip must be zero or positive"),
        (TrainConfig(clip=NAN), "clip", "clip must be zero or positive, not nan"),
        (TrainConfig(train_fraction=0.0), "train_fraction", "train_fraction must be in (0, 1]"),
        (TrainConfig(train_fraction=1.5), "train_fraction", "train_fraction must be in (0, 1]"),
        (TrainConfig(eval_batch_size=0), "eval_batch_size", "eval_batch_size must be at least 1"),
        (TrainConfig(eval_every=-1), "eval_every", "eval_every must be zero or positive"),
        (TrainConfig(log_every=0), "log_every", "log_every must be at least 1"),
        (TrainConfig(max_minutes=0.0), "max_minutes", "max_minutes must be positive"),
        (TrainConfig(max_minutes=NAN), "max_minutes", "max_minutes must be positive"),
        (TrainConfig(device="tpu"), "device", "device must be auto, cpu, cuda, cuda:N or mps, not 'tpu'"),
        (TrainConfig(hidden_size=8, params="1M"), "hidden_size", "hidden_size and --params are exclusive"),
        (TrainConfig(layers="2"), "layers", "layers must be a number, not '2'"),
        (SampleConfig(temperature=-1.0), "temperature", "temperature must be zero or positive"),
        (SampleConfig(top_p=0.0), "top_p", "top_p must be in (0, 1]"),
        (SampleConfig(top_p=NAN), "top_p", "top_p must be in (0, 1], not nan"),
        (SampleConfig(length=-1), "length", "length must be in [0, 1000000000]"),
        (SampleConfig(num_samples=0), "num_samples", "num_samples must be at least 1"),
        (EvalConfig(split="train"), "split", "split must be one of valid, test, not 'train'"),
        (ScoreConfig(unknown="drop"), "unknown", "unknown must be one of error, skip, unk"),
        (DynamicOptions(lr=NAN), "lr", "lr must be in [0, 100], not nan"),
        (DynamicOptions(lr=INF), "lr", "lr must be in [0, 100], not inf"),
        (DynamicOptions(decay=1.5), "decay", "decay must be in [0, 1]"),
        (DynamicOptions(eps=0.0), "eps", "eps must be positive"),
        (DynamicOptions(segment=0), "segment", "segment must be at least 1"),
        (DynamicOptions(method="adam"), "method", "method must be one of sgd, rms"),
        (BenchmarkConfig(vocab_size=1), "vocab_size", "vocab_size must be at least 2"),
    ],
)
def test_bounds_name_the_field(settings, field, message):
    with pytest.raises(ConfigError) as caught:
        settings.validate() if hasattr(settings, "validate") else validate(settings)
    assert caught.value.field == field and caught.value.owner is type(settings)
    assert str(caught.value).startswith(message)


def test_from_dict_is_strict():
    config = TrainConfig.from_dict(
        {"layers": 2, "lr": 1, "params": 1000000, "hidden_size": None, "cell_options": {"a": 1}}
    )
    assert (config.layers, config.lr, config.params, config.hidden_size) == (2, 1.0, "1000000", None)
    assert TrainConfig.from_dict({"hidden": 64}).hidden_size == 64  # the name in files written before 0.4
    assert isinstance(config.lr, float)
    assert TrainConfig.from_dict(TrainConfig(cell="gru", hidden_size=64).to_dict()) == TrainConfig(
        cell="gru", hidden_size=64
    )
    with pytest.raises(CharlmError, match="unknown TrainConfig settings: 'bogus', 'warp'"):
        TrainConfig.from_dict({"bogus": 1, "warp": 2, "layers": 1})
    for values, message in [
        ({"layers": "x"}, "layers must be an integer, not 'x'"),
        ({"layers": 1.5}, "layers must be an integer, not 1.5"),
        ({"layers": True}, "layers must be an integer, not True"),
        ({"lr": True}, "lr must be a number, not True"),
        ({"lr": "fast"}, "lr must be a number, not 'fast'"),
        ({"hidden_size": "wide"}, "hidden_size must be an integer, not 'wide'"),
        ({"cell": 3.5}, None),  # a number for a text field is taken as text
        ({"cell_options": ["a"]}, "cell_options must be an object, not ['a']"),
        ({"tensorboard": "yes"}, "tensorboard must be true or false, not 'yes'"),
        ({"corpus": None}, "corpus must be text, not None"),
        ({"lr": 10**400}, "lr must be a finite number, not " + "1" + "0" * 36 + "..."),  # a config file's huge integer
        ({"layers": None}, "layers must be an integer, not None"),
    ]:
        if message is None:
            assert TrainConfig.from_dict(values).cell == "3.5"
            continue
        with pytest.raises(ConfigError) as caught:
            TrainConfig.from_dict(values)
        assert str(caught.value) == message and caught.value.field == next(iter(values))


# --- the command line prints the flag --------------------------------------------------------------


@pytest.mark.parametrize(
    "args, fragments",
    [
        (("train", "--lr", "0"), ["--lr must be in (0, 1000], not 0.0"]),
        (("train", "--lr-decay", "nan"), ["--lr-decay must be positive, not nan"]),
        (("train", "--dropout", "1"), ["--dropout must be in [0, 1)"]),
        (("train", "--train-fraction", "0"), ["--train-fraction must be in (0, 1]"]),
        (("train", "--max-minutes", "0"), ["--max-minutes must be positive"]),
        (("train", "--hidden", "8", "--params", "1M"), ["--hidden and --params are exclusive"]),
        (("train", "--layers", "0"), ["--layers", "1"]),  # a closed bound: checked by the option itself
        (("train", "--batch-size", "many"), ["--batch-size", "integer"]),
        (("train", "--tensorboard", "--layers", "0"), ["--layers"]),
    ],
)
def test_command_line_names_the_flag(args, fragments, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert_one_line_error(cli(*args), *fragments)
    assert list(tmp_path.iterdir()) == []  # refused before anything was written


def test_config_file_values_are_checked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "cfg.json"
    config.write_text(json.dumps({"layers": "x"}), encoding="utf-8")
    assert_one_line_error(cli("train", "--config", config), "--layers must be an integer, not 'x'")
    config.write_text(json.dumps({"lr": True}), encoding="utf-8")
    assert_one_line_error(cli("train", "--config", config), "--lr must be a number, not True")
    config.write_text(json.dumps({"learning_rate": 0.1}), encoding="utf-8")
    assert_one_line_error(cli("train", "--config", config), "unknown TrainConfig setting: 'learning_rate'")
    config.write_text(json.dumps({"lr": 0}), encoding="utf-8")
    assert_one_line_error(cli("train", "--config", config), "--lr must be in (0, 1000]")
    config.write_text("[1, 2]", encoding="utf-8")
    assert_one_line_error(cli("train", "--config", config), "must hold a JSON object")
    config.write_text("{lr: 1}", encoding="utf-8")
    assert_one_line_error(cli("train", "--config", config), "not valid JSON")
    config.write_text('{"lr": ' + "[" * 100_000 + "]" * 100_000 + "}", encoding="utf-8")
    assert_one_line_error(cli("train", "--config", config), "not valid JSON: its values are nested too deeply")
    config.write_text('{"hidden": ' + "9" * 5000 + "}", encoding="utf-8")  # more digits than Python converts
    assert_one_line_error(cli("train", "--config", config), "not valid JSON: Exceeds the limit (4300 digits)")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["cfg.json"]


def test_other_commands_name_their_flags(trained_run, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("The cat sat on the mat.", encoding="utf-8")
    assert_one_line_error(cli("sample", trained_run, "--temperature", "-1"), "--temperature must be zero or positive")
    assert_one_line_error(cli("sample", trained_run, "--top-p", "0"), "--top-p must be in (0, 1], not 0.0")
    assert_one_line_error(cli("sample", trained_run, "--top-p", "nan"), "--top-p")
    assert_one_line_error(
        cli("score", trained_run, text, "--dynamic", "sgd", "--dyn-lr", "inf"), "--dyn-lr must be in [0, 100], not inf"
    )
    assert_one_line_error(
        cli("score", trained_run, text, "--dynamic", "rms", "--dyn-eps", "0"), "--dyn-eps must be positive"
    )
    assert_one_line_error(cli("eval", trained_run, "--split", "train"), "--split", "train")


# --- every setting is an option, with the dataclass's default in its help --------------------------

COMMANDS = [
    ("train", TrainConfig, ()),
    ("sample", SampleConfig, ()),
    ("eval", DynamicOptions, ()),
    ("eval", EvalConfig, ("batch_size",)),
    ("score", DynamicOptions, ()),
    ("score", ScoreConfig, ()),
    ("bench", BenchmarkConfig, ()),
    ("demo", DemoConfig, ()),
]


def shown_default(field: dataclasses.Field) -> str:
    if field.metadata.get("show_default") is not None:
        return field.metadata["show_default"]
    value = field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default
    if value is None:
        return "none"
    return str(value).lower() if isinstance(value, bool) else str(value)


def help_rows(command: str, monkeypatch) -> dict[str, str]:
    """Option flag → its help row (box characters dropped, whitespace normalised)."""
    monkeypatch.setenv("COLUMNS", "400")
    monkeypatch.setenv("TERMINAL_WIDTH", "400")
    result = cli(command, "--help", check_code=0)
    rows, current = {}, None
    for line in result.stdout.splitlines():
        text = " ".join(line.replace("│", " ").replace("╭", " ").replace("╰", " ").split())
        match = re.match(r"(--[a-z][a-z0-9-]*)", text)
        if match and current and match.group(1) == f"--no-{current[2:]}":  # a switch's other name, on its own line
            rows[current] += " " + text
        elif match:
            current = match.group(1)
            rows[current] = text
        elif current and text and not text.startswith("─"):
            rows[current] += " " + text  # a wrapped help line
    return rows


@pytest.mark.parametrize("command, owner, excluded", COMMANDS, ids=[f"{c}-{o.__name__}" for c, o, _ in COMMANDS])
def test_every_setting_is_an_option_with_its_default(command, owner, excluded, monkeypatch):
    rows = help_rows(command, monkeypatch)
    fields = [f for f in dataclasses.fields(owner) if f.metadata.get("cli", True) and f.name not in excluded]
    assert fields
    for field in fields:
        flag = field.metadata.get("flag") or "--" + field.name.replace("_", "-")
        assert flag in rows, f"{flag} missing from `charlm {command} --help`"
        assert f"(default: {shown_default(field)})" in rows[flag], rows[flag]
        assert " ".join(field.metadata["help"].split()) in rows[flag]
        if typing.get_type_hints(owner)[field.name] is bool:
            assert f"--no-{flag[2:]}" in rows[flag]
    hidden = [f for f in dataclasses.fields(owner) if not f.metadata.get("cli", True)]
    for field in hidden:
        assert "--" + field.name.replace("_", "-") not in rows or owner is DynamicOptions


def test_shell_completion_and_version():
    result = cli("--help", check_code=0)
    assert "--install-completion" in result.stdout and "--show-completion" in result.stdout
    assert cli("--version", check_code=0).stdout.strip() == f"charlm {charlm.__version__}"


# --- resuming ------------------------------------------------------------------------------------


@pytest.fixture
def small_run(tmp_path):
    data_dir = tmp_path / "data"
    prepare_tiny_corpus(data_dir, characters=6_000)
    run = tmp_path / "run"
    charlm.train(
        TrainConfig(
            corpus="tiny",
            cell="lru",
            hidden_size=12,
            batch_size=8,
            bptt=16,
            eval_batch_size=4,
            epochs=1,
            data_dir=str(data_dir),
            run_dir=str(run),
        )
    )
    return run


def test_resume_accepts_only_run_independent_settings(small_run):
    before = (small_run / "last.pt").read_bytes()
    result = cli("train", "--resume", small_run, "--lr", "0.1")
    assert_one_line_error(result, "--lr cannot change a run being resumed", "--epochs")
    assert_one_line_error(cli("train", "--resume", small_run, "--hidden", "64"), "--hidden cannot change")
    assert_one_line_error(cli("train", "--resume", small_run, "--cell-opt", "a=1"), "--cell-opt cannot change")
    assert (small_run / "last.pt").read_bytes() == before

    result = cli(
        "train", "--resume", small_run, "--epochs", "2", "--max-minutes", "10", "--patience", "5", check_code=0
    )
    assert re.search(r"^epochs\s+2$", result.stdout, re.M), result.stdout
    resumed = charlm.Checkpoint.load(small_run, prefer="last")
    assert resumed.training.progress["epoch"] == 2
    assert resumed.train_config.patience == 5 and resumed.train_config.lr == TrainConfig.lr
    assert resumed.train_config.max_minutes == 10


# --- devices ---------------------------------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_unavailable_and_unknown_devices(trained_run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert_one_line_error(
        cli("train", "--device", "cuda", "--corpus", "tiny", "--run-dir", tmp_path / "run"),
        "device 'cuda' is not available",
    )
    assert_one_line_error(cli("sample", trained_run, "--device", "cuda:1"), "not available")
    assert_one_line_error(cli("train", "--device", "tpu"), "--device must be auto, cpu, cuda, cuda:N or mps, not 'tpu'")
    assert_one_line_error(cli("eval", trained_run, "--device", "tpu"), "unknown device 'tpu'")
    with pytest.raises(CharlmError, match="not available"):
        charlm.load(trained_run, device="cuda")
    assert list(tmp_path.iterdir()) == []
    assert math.isfinite(charlm.load(trained_run, device="cpu").score("The cat.").bpc)


def test_a_budget_named_after_a_reference_model_sizes_every_cell_to_it():
    """Issue 22: ``--params lstm@100`` is the count of an LSTM of 100 units on the same vocabulary (the
    Delta-RNN paper's Table 2 sizing); every cell gets the hidden size whose count is closest."""
    from charlm.cells import CELLS
    from charlm.model import LanguageModel, ModelConfig, count_parameters
    from charlm.sizing import budget_of
    from charlm.training.setup import model_config_for

    base = ModelConfig("rnn", vocab_size=2404, hidden_size=1, embed_size=0)
    assert budget_of("lstm[peephole=full]@100", base) == 1_274_804
    assert budget_of("lstm@100", base) == 1_244_804
    budget = budget_of("lstm@50", dataclasses.replace(base, vocab_size=60))
    for name in ("rnn", "gru", "delta-rnn", "mgu", "scrn", "mi-rnn", "lstm"):
        config = TrainConfig(corpus="x", cell=name, params="lstm@50", embed_size=0)
        model_config = model_config_for(config, 60, CELLS.get(name))

        def count(hidden):
            return count_parameters(LanguageModel(dataclasses.replace(model_config, hidden_size=hidden)))

        chosen = abs(count(model_config.hidden_size) - budget)
        assert chosen <= abs(count(model_config.hidden_size - 1) - budget), name
        assert chosen <= abs(count(model_config.hidden_size + 1) - budget), name


@pytest.mark.parametrize(
    "params, message",
    [
        ("lstm@0", "parameter budget 'lstm@0': the reference model needs at least one hidden unit"),
        ("nope@100", "unknown cell 'nope'"),
        ("lstm[nope=1]@100", "cell 'lstm' has no option 'nope'"),
    ],
)
def test_a_bad_reference_budget_is_one_line(params, message, tiny_corpus):
    from helpers import assert_one_line_error, cli

    assert_one_line_error(
        cli("train", "--corpus", "tiny", "--data-dir", str(tiny_corpus), "--params", params, "--epochs", "1"), message
    )
