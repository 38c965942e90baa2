"""`--tensorboard`: refused up front without the extra; with it, every record's numbers as scalars."""

from __future__ import annotations

import sys

import pytest

from helpers import assert_one_line_error, cli, prepare_tiny_corpus, records


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    data = tmp_path_factory.mktemp("tensorboard-data") / "data"
    prepare_tiny_corpus(data, characters=8_000)
    return data


def train_args(data_dir, run, *extra):
    return (
        "train",
        "--corpus",
        "tiny",
        "--data-dir",
        data_dir,
        "--run-dir",
        run,
        "--cell",
        "lru",
        "--hidden",
        "16",
        "--batch-size",
        "8",
        "--bptt",
        "16",
        "--eval-batch-size",
        "4",
        "--log-every",
        "10",
        *extra,
    )


def test_without_tensorboard_the_run_is_refused_before_it_starts(data_dir, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # `import tensorboard` now raises ImportError
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    run = tmp_path / "run"
    result = cli(*train_args(data_dir, run, "--epochs", "1", "--tensorboard"))
    assert_one_line_error(result, "--tensorboard", "-e '.[tensorboard]'")
    assert not run.exists()

    cli(*train_args(data_dir, run, "--epochs", "1"), check_code=0)  # the same run without it trains
    before = (run / "metrics.jsonl").read_text(encoding="utf-8")
    assert_one_line_error(cli("train", "--resume", run, "--epochs", "2", "--tensorboard"), "-e '.[tensorboard]'")
    assert (run / "metrics.jsonl").read_text(encoding="utf-8") == before and not (run / "tensorboard").exists()


def test_tensorboard_scalars_match_the_metrics(data_dir, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    cli(*train_args(data_dir, run, "--epochs", "2", "--tensorboard", "--test-every-epoch"), check_code=0)
    event_files = list((run / "tensorboard").glob("events.out.tfevents.*"))
    assert event_files, list(run.iterdir())

    accumulator = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    accumulator.Reload()
    tags = set(accumulator.Tags()["scalars"])
    assert {
        "epoch/valid_bpc",
        "epoch/test_bpc",
        "epoch/train_bpc",
        "epoch/lr",
        "step/bpc",
        "start/parameters",
        "epoch/grad_norm/layer0",
    } <= tags
    assert not any(tag.endswith(("/best", "/partial", "/time")) for tag in tags)  # flags and clocks are not scalars

    epochs = records(run, "epoch")
    assert len(epochs) == 2
    for tag, key in (("epoch/valid_bpc", "valid_bpc"), ("epoch/test_bpc", "test_bpc"), ("epoch/lr", "lr")):
        scalars = accumulator.Scalars(tag)
        assert [scalar.step for scalar in scalars] == [row["step"] for row in epochs]
        assert [scalar.value for scalar in scalars] == pytest.approx([row[key] for row in epochs], rel=1e-6)
    layer = accumulator.Scalars("epoch/grad_norm/layer0")
    assert [scalar.value for scalar in layer] == pytest.approx([row["grad_norm"]["layer0"] for row in epochs], rel=1e-6)
    steps = records(run, "step")
    assert [scalar.step for scalar in accumulator.Scalars("step/bpc")] == [row["step"] for row in steps]
