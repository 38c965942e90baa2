"""A run directory and checkpoints written by charlm 0.2.0 before the package layout change
(tests/fixtures/release-0.2.0) load, sample, score, list and resume as that release did, and a
fixed-seed training gives the losses it gave."""

import json
import shutil
from pathlib import Path

import pytest
import torch

import charlm
from charlm.config import TrainConfig
from charlm.runs.directory import Run
from charlm.api import train
from charlm.training.trainer import Trainer

FIXTURE = Path(__file__).parent / "fixtures" / "release-0.2.0"
EXPECTED = json.loads((FIXTURE / "expected.json").read_text(encoding="utf-8"))
CLOSE = dict(rel=1e-5, abs=1e-7)  # the figures were taken on this kind of CPU; another vector unit may round otherwise


def test_an_old_checkpoint_samples_and_scores_as_it_did(tiny_corpus, tmp_path):
    shutil.copytree(FIXTURE / "run", tmp_path / "run")  # evaluating appends a record to the run's metrics
    model = charlm.load(tmp_path / "run" / "best.pt", device="cpu")
    stored = torch.load(FIXTURE / "run" / "best.pt", map_location="cpu", weights_only=True)
    assert model.parameters_count == EXPECTED["summary"]["parameters"]
    assert model.sample("The ", length=60, temperature=0.8, seed=3) == EXPECTED["sample"]
    assert model.score("The quick brown fox jumps over the lazy dog.\n").bpc == pytest.approx(
        EXPECTED["score_bpc"], **CLOSE
    )
    assert model.evaluate("test", data_dir=str(tiny_corpus)).bpc == pytest.approx(EXPECTED["test_bpc"], **CLOSE)
    for name, tensor in model.network.state_dict().items():
        assert torch.equal(tensor, stored["weights"][name]), name


def test_an_old_run_directory_is_listed_as_it_was():
    summary = Run(FIXTURE / "run").summary()
    for key, value in EXPECTED["runs_summary"].items():
        assert summary[key] == (pytest.approx(value) if isinstance(value, float) else value), key


def test_an_old_run_resumes_where_it_stopped(tiny_corpus, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(FIXTURE / "run", run)
    Trainer.resume(run, epochs=3, data_dir=str(tiny_corpus)).fit()
    history = Run(run).history()
    epoch = history.epochs[-1]
    assert [record.schema for record in history.records][-3:] == [2, 2, 2]  # new records carry the schema
    for key, value in EXPECTED["resumed_epoch3"].items():
        assert getattr(epoch, key) == pytest.approx(value, **CLOSE), key


def test_a_fixed_seed_run_gives_the_losses_it_gave(tiny_corpus, tmp_path):
    train(
        TrainConfig(
            corpus="tiny",
            cell="lru",
            hidden_size=16,
            batch_size=8,
            bptt=20,
            epochs=2,
            lr=3e-3,
            eval_batch_size=4,
            data_dir=str(tiny_corpus),
            run_dir=str(tmp_path / "lru"),
            seed=7,
            log_every=5,
        )
    )
    history = Run(tmp_path / "lru").history()
    steps = [record.loss for record in history.steps]
    assert steps == pytest.approx([row["loss"] for row in EXPECTED["steps"]], **CLOSE)
    for record, expected in zip(history.epochs, EXPECTED["epochs"], strict=True):
        for key, value in expected.items():
            assert getattr(record, key) == pytest.approx(value, **CLOSE), key


@pytest.mark.parametrize("cell", ["gru", "lstm", "rhn"])
def test_two_layers_with_dropout_give_the_losses_they_gave(tiny_corpus, tmp_path, cell):
    run = tmp_path / cell
    train(
        TrainConfig(
            corpus="tiny",
            cell=cell,
            hidden_size=16,
            layers=2,
            dropout=0.2,
            batch_size=8,
            bptt=20,
            epochs=1,
            train_fraction=0.5,
            lr=3e-3,
            eval_batch_size=4,
            data_dir=str(tiny_corpus),
            run_dir=str(run),
            seed=11,
            log_every=10,
        )
    )
    history = Run(run).history()
    expected = EXPECTED["fixed_seed_2layer_dropout"][cell]
    assert [record.loss for record in history.steps] == pytest.approx(expected["steps"], **CLOSE)
    assert [record.valid_bpc for record in history.epochs] == pytest.approx(expected["valid_bpc"], **CLOSE)
