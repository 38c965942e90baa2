"""The rendered --help of each command states its defaults (rich markup must not swallow them)."""

import pytest

from charlm.config import TrainConfig
from helpers import cli, run_cli

HELP_ENVIRONMENT = {"COLUMNS": "400", "NO_COLOR": "1"}


def rendered_help(command: str, monkeypatch) -> str:
    """`charlm COMMAND --help` in this process, on a wide terminal, its whitespace collapsed."""
    for key, value in HELP_ENVIRONMENT.items():
        monkeypatch.setenv(key, value)
    result = cli(command, "--help", check_code=0)
    return " ".join(result.stdout.split())


def assert_train_defaults(text: str) -> None:
    defaults = TrainConfig()
    for name in (
        "corpus",
        "cell",
        "layers",
        "batch_size",
        "bptt",
        "lr",
        "lr_decay",
        "epochs",
        "patience",
        "clip",
        "seed",
        "eval_batch_size",
        "log_every",
    ):
        assert f"(default: {getattr(defaults, name)})" in text, name
    assert "(default: $CHARLM_DATA or ./data)" in text
    assert "(default: runs/CORPUS-CELL-TIME)" in text


def test_train_help_shows_every_training_default_in_a_real_process():
    result = run_cli("train", "--help", env=HELP_ENVIRONMENT, check_code=0)
    assert_train_defaults(" ".join(result.stdout.split()))
    assert result.stderr == ""


def test_train_help_shows_every_training_default(monkeypatch):
    assert_train_defaults(rendered_help("train", monkeypatch))


@pytest.mark.parametrize(
    "command, fragment",
    [
        ("sample", "(default: a line break)"),
        ("sample", f"(default: {TrainConfig.device})"),
        ("demo", "(default: runs/pydoc-lru-demo-TIME)"),
        ("prepare", "(default: error; unk for pydoc)"),
    ],
)
def test_other_commands_show_their_defaults(command, fragment, monkeypatch):
    assert fragment in rendered_help(command, monkeypatch)


def test_help_examples_use_values_the_options_take(monkeypatch):
    """Issue 34: train's --cell-opt example said peephole=true (the forms are none, diagonal, full)."""
    text = rendered_help("train", monkeypatch)
    assert "--cell-opt peephole=diagonal" in text and "peephole=true" not in text


def test_threads_option_sets_torch_threads_and_refuses_zero():
    import torch

    from helpers import assert_one_line_error, cli

    before = torch.get_num_threads()
    try:
        cli("--threads", "1", "cells", check_code=0)
        assert torch.get_num_threads() == 1
        assert_one_line_error(cli("--threads", "0", "cells"), "--threads must be at least 1, not 0")
    finally:
        torch.set_num_threads(before)


def test_bare_charlm_shows_the_commands_without_an_error():
    result = cli()
    assert result.returncode == 0 and "error" not in result.stderr
    assert "Commands" in result.stdout and "train" in result.stdout and "task" in result.stdout


def test_train_help_groups_its_options_in_panels_and_states_each_default_once(monkeypatch):
    text = rendered_help("train", monkeypatch)
    for panel in (
        "Model",
        "Data",
        "Optimisation",
        "Schedule and stopping",
        "Evaluation",
        "Saving and logging",
        "Hardware",
    ):
        assert f"╭─ {panel} ─" in text, panel
    assert "[default:" not in text  # the default is said once, in the help text
    assert "[default:" not in rendered_help("sample", monkeypatch)


def test_the_cells_table_reads_at_80_columns(monkeypatch):
    from charlm.cli import output

    monkeypatch.setattr(output.stdout, "width", 80)
    result = cli("cells", check_code=0)
    assert all(len(line) <= 80 for line in result.stdout.splitlines())
    assert "ps-lru" in result.stdout and "options" in result.stdout


def test_no_option_name_is_cut_in_any_help_at_80_columns(monkeypatch):
    """Issue 34: at 80 columns --help wraps help texts and types, never an option's names (it cut
    --no-test-every-epoch to --no-test-every-epo…), and a flag shows no type. This and
    test_task_help_leaves_its_descriptions_room fail when a typer release breaks charlm.cli.app's
    change to typer's help tables."""
    import re

    import typer.main

    from charlm.cli.app import app
    from helpers import assert_fits, terminal_of

    terminal_of(monkeypatch, 80)
    monkeypatch.setenv("NO_COLOR", "1")
    for name, command in typer.main.get_command(app).commands.items():
        text = cli(name, "--help", check_code=0).stdout
        assert_fits(text)
        assert "<bool>" not in text, f"charlm {name} --help labels a flag as taking a value"
        flags = [
            flag
            for parameter in command.params
            if not getattr(parameter, "hidden", False)
            for flag in (*parameter.opts, *parameter.secondary_opts)
            if flag.startswith("-")
        ]
        for flag in flags:
            assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text), f"charlm {name} --help: {flag}"
    assert "--no-test-every-epoch" in cli("train", "--help").stdout
