"""`--tensorboard`: refused up front without the extra; with it, every record's numbers as scalars."""

from __future__ import annotations

import sys

import pytest

from helpers import assert_one_line_error, cli, records


def test_without_tensorboard_the_run_is_refused_before_it_starts(sink_train, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # `import tensorboard` now raises ImportError
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    run = tmp_path / "run"
    result = cli(*sink_train(run, epochs=1, tensorboard=True))
    assert_one_line_error(result, "--tensorboard", "-e '.[tensorboard]'")
    assert not run.exists()

    cli(*sink_train(run, epochs=1), check_code=0)  # the same run without it trains
    before = (run / "metrics.jsonl").read_text(encoding="utf-8")
    assert_one_line_error(cli("train", "--resume", run, "--epochs", "2", "--tensorboard"), "-e '.[tensorboard]'")
    assert (run / "metrics.jsonl").read_text(encoding="utf-8") == before and not (run / "tensorboard").exists()


def test_tensorboard_scalars_match_the_metrics(sink_train, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    cli(*sink_train(run, epochs=2, tensorboard=True, test_every_epoch=True), check_code=0)
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
