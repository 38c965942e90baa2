"""Every registered cell trains, evaluates and samples through the CLI, and sizes to a budget."""

import pytest
import torch

from charlm.cells import CELLS
from charlm.model import LanguageModel, ModelConfig, count_parameters
from charlm.sizing import size_for_budget
from helpers import cli, prepare_tiny_corpus


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("every-cell") / "data"
    prepare_tiny_corpus(data_dir, characters=6_000)
    return data_dir


def invoke(*args):
    """`charlm ARGS` through the CLI's entry point in this process; its stdout."""
    return cli(*args, check_code=0).stdout


@pytest.mark.parametrize("cell", CELLS.names())
def test_cell_trains_evaluates_and_samples(corpus_dir, tmp_path, cell):
    run = tmp_path / "run"
    output = invoke(
        "train",
        "--corpus",
        "tiny",
        "--cell",
        cell,
        "--params",
        "6k",
        "--layers",
        "2",
        "--batch-size",
        "4",
        "--bptt",
        "20",
        "--epochs",
        "1",
        "--data-dir",
        corpus_dir,
        "--run-dir",
        run,
    )
    assert "best valid bpc" in output
    assert "bpc" in invoke("eval", run, "--split", "valid")
    sample = invoke("sample", run, "--prime", "The ", "--length", "15", "--seed", "2")
    assert sample.startswith("The ")


@pytest.mark.parametrize("cell", CELLS.names())
def test_params_budget_lands_close_for_every_cell(cell):
    config = ModelConfig(cell, vocab_size=82, hidden_size=1, layers=2)
    hidden, total = size_for_budget(config, 1_000_000)
    with torch.device("meta"):
        assert count_parameters(LanguageModel(ModelConfig(cell, vocab_size=82, hidden_size=hidden, layers=2))) == total
    assert abs(total - 1_000_000) < 0.02 * 1_000_000


def test_cells_command_lists_the_registry():
    output = invoke("cells")
    for cell in CELLS:
        assert cell.name in output
