"""A user's own cell, named module:Class, trains, evaluates and samples without editing charlm.

The cell is the example printed in README.md, taken from it verbatim, so the README stays true.
"""

import pytest

from charlm.cells import CELLS, RecurrentCell
from charlm.errors import CharlmError
from helpers import assert_one_line_error, cli, prepare_tiny_corpus, readme_cell_source, run_cli, tiny_train


def test_readme_cell_trains_evaluates_and_samples(tmp_path, monkeypatch):
    (tmp_path / "mycells.py").write_text(readme_cell_source(), encoding="utf-8")
    data_dir = tmp_path / "data"
    prepare_tiny_corpus(data_dir, characters=12_000)
    env = {"PYTHONPATH": str(tmp_path)}
    run = tmp_path / "run"
    settings = dict(cell="mycells:LeakyTanh", hidden_size=16, epochs=1)
    result = run_cli(*tiny_train(data_dir, run, "--cell-opt", "leak=0.3", **settings), env=env, check_code=0)
    assert "best valid bpc" in result.stdout
    # loading imports the checkpoint's module:Class only when the cell is named (or --trust-code)
    assert_one_line_error(cli("eval", run), "asks to import module 'mycells'", "--cell mycells:LeakyTanh")
    monkeypatch.syspath_prepend(str(tmp_path))  # the training above was a real process; these run in this one
    cli("eval", run, "--cell", "mycells:LeakyTanh", "--data-dir", data_dir, check_code=0)
    sample = cli("sample", run, "--cell", "mycells:LeakyTanh", "--length", "20", "--seed", "1", check_code=0)
    assert len(sample.stdout) == 1 + 20 + 1  # default prime "\n", 20 symbols, final newline


def test_registry_resolves_module_class(tmp_path, monkeypatch):
    (tmp_path / "mycells.py").write_text(readme_cell_source(), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    cell = CELLS.get("mycells:LeakyTanh")
    assert issubclass(cell, RecurrentCell) and cell.name == "leaky-tanh"
    with pytest.raises(CharlmError, match="no class 'Missing'"):
        CELLS.get("mycells:Missing")


def test_unknown_cell_lists_the_registry(tmp_path):
    result = cli("train", "--cell", "lsmt", "--corpus", "pydoc", "--data-dir", tmp_path)
    assert_one_line_error(result, "unknown cell 'lsmt'", "lstm", "module:Class")


@pytest.mark.parametrize(
    "options, message",
    [
        ({"depth": 2.5}, "option depth=2.5 must be a whole number"),
        ({"depth": True}, "option depth=True must be a whole number"),
        ({"gate_bias": float("inf")}, "option gate_bias=inf must be a finite number"),
        ({"gate_bias": "nan"}, "option gate_bias=nan must be a finite number"),
        ({"gate_bias": [1]}, "option gate_bias=[1] must be a number"),
    ],
)
def test_cell_options_from_files_are_checked_against_their_types(options, message):
    """A config file or plan gives typed values, the command line text: both are held to the option's type."""
    from charlm.cells.registry import parse_cell_options

    with pytest.raises(CharlmError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_cell_options(CELLS.get("rhn"), options)
    assert parse_cell_options(CELLS.get("rhn"), {"depth": 3, "gate_bias": -4}).gate_bias == -4.0
