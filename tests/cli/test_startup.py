"""Start-up: `--version`, every `--help` and shell completion (each Tab press runs charlm anew) import
neither torch nor numpy, and completion offers the registered cells and the corpora."""

import json
import subprocess
import sys

import pytest
import typer

from charlm.cells import CELL_NAMES, CELLS
from charlm.cli.app import app
from charlm.corpora.recipes import RECIPES
from helpers import run_cli

HEAVY = {"torch", "numpy"}


def imported(*args, env=None) -> tuple[set, str]:
    """The top-level packages a real `charlm ARGS` imports (Python's -X importtime), and its stdout."""
    result = run_cli(*args, env={"PYTHONPROFILEIMPORTTIME": "1", **(env or {})}, check_code=0)
    names = {
        line.rpartition("|")[2].strip().split(".")[0]
        for line in result.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert "charlm" in names  # the profile was read
    return names, result.stdout


def complete(words: str, **env) -> list[str]:
    """What bash completion offers for the command line ``words`` (the last word is being typed)."""
    parts = words.split(" ")
    names, out = imported(
        env={"_CHARLM_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": str(len(parts) - 1), **env}
    )
    assert names.isdisjoint(HEAVY), words
    return out.split()


def command_names() -> list[str]:
    return sorted(typer.main.get_command(app).commands)


@pytest.mark.parametrize("args", [("--version",), ("--help",), ()], ids=["version", "help", "bare"])
def test_the_program_starts_without_torch(args):
    names, out = imported(*args)
    assert names.isdisjoint(HEAVY)
    assert "charlm" in out


def test_no_command_help_imports_torch():
    """Every command's --help, one after the other in one fresh process (one process per command is slow)."""
    script = f"""
import contextlib, io, json, sys
from charlm.cli.app import run
codes = {{}}
for command in {command_names()!r}:
    with contextlib.redirect_stdout(io.StringIO()) as out:
        codes[command] = (run([command, "--help"]), "Usage" in out.getvalue())
heavy = sorted(name for name in sys.modules if name.split(".")[0] in {sorted(HEAVY)!r})
print(json.dumps({{"codes": codes, "heavy": heavy}}))
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.splitlines()[-1])
    assert seen["codes"] == {command: [0, True] for command in command_names()}
    assert seen["heavy"] == []


def test_completion_offers_the_registered_cells():
    assert complete("charlm train --cell ") == list(CELL_NAMES)
    assert complete("charlm train --cell l") == ["lstm", "lru", "linear-ru"]
    assert complete("charlm task --cell grid") == ["grid-lstm"]
    assert complete("charlm bench --cells lstm,g") == [
        "lstm,gru",
        "lstm,grid-lstm",
        "lstm,griffin-rglru",
        "lstm,gated-deltanet",
    ]
    assert complete("charlm check --cells ")[0] == "all"


def test_completion_offers_the_corpora_and_those_prepared(tmp_path):
    built_in = [name for name in RECIPES if name != "text"]
    assert complete("charlm train --corpus ") == built_in  # ./data holds none
    for name in ("mine", ".being-written", "not-a-corpus"):
        (tmp_path / "root" / name).mkdir(parents=True)
    (tmp_path / "root" / "mine" / "meta.json").write_text("{}")
    (tmp_path / "root" / ".being-written" / "meta.json").write_text("{}")
    assert complete("charlm train --corpus ", CHARLM_DATA=str(tmp_path / "root")) == [*built_in, "mine"]
    assert complete(f"charlm train --data-dir {tmp_path / 'root'} --corpus m") == ["mine"]
    assert {"ptb", "pydoc"} <= set(complete("charlm train --corpus p"))
    assert sorted(complete("charlm prepare te")) == ["text", "text8"]


def test_completion_offers_a_setting_s_choices():
    assert complete("charlm train --optimizer ") == ["adam", "adamw", "sgd", "rmsprop"]


def test_the_declared_cell_names_are_the_registry_s():
    assert list(CELL_NAMES) == CELLS.names()
