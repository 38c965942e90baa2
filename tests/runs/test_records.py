"""metrics.jsonl records: one writer (Run.record) and one reader (RunHistory), every event typed and
versioned; files written before records carried a version read as version 1."""

import dataclasses
import json
import math
from pathlib import Path

import pytest

from charlm.runs.directory import Run
from charlm.runs.history import RunHistory
from charlm.runs.records import RECORDS, SCHEMA_VERSION, EpochRecord, OtherRecord, record_from_dict

OLD_RUN = Path(__file__).parents[1] / "fixtures" / "release-0.2.0" / "run"

SCORE = dict(loss=2.5, bits_per_token=3.6, bpc=3.6, perplexity=12.2, tokens=400)
WRITTEN = {  # one record of every event, with the fields charlm's writers give it
    "start": dict(parameters=6204, hidden_size=16, device="cpu", resumed_at={"epoch": 0, "window": 0}),
    "step": dict(epoch=1, step=5, loss=3.1, bpc=4.4, lr=0.003, grad_norm={"embedding": 0.1, "layer0": 0.7}),
    "valid": dict(epoch=1, step=10, **{f"valid_{k}": v for k, v in SCORE.items()}),
    "epoch": dict(
        epoch=1,
        partial=False,
        lr=0.003,
        train_loss=3.0,
        train_bits=4.3,
        train_bpc=4.3,
        **{f"valid_{k}": v for k, v in SCORE.items()},
        grad_norm={"layer0": 0.5},
        chars_per_second=30000.0,
        train_seconds=1.5,
        step=20,
        best=True,
    ),
    "checkpoint": dict(epoch=1, window=12, step=12),
    "interrupted": dict(epoch=2, window=3, step=23),
    "diverged": dict(epoch=2, step=24, loss=float("inf")),
    "test": dict(epoch=1, **{f"test_{k}": v for k, v in SCORE.items()}),
    "end": dict(
        run_dir="runs/x",
        epochs=1,
        partial_epoch=False,
        best_epoch=1,
        best_valid_bpc=3.6,
        test_bpc_at_best=None,
        parameters=6204,
        hidden_size=16,
        wall_seconds={"train": 1.5, "valid": 0.2, "test": 0.1},
    ),
    "compile": dict(active=False, seconds=0.5, backend="inductor", failure="RuntimeError: no compiler"),
    "cuda_graph": dict(
        active=True, seconds=0.2, failure=None, checked=True, max_difference=3e-7, tolerance=1e-4, check_seconds=0.05
    ),
    "fast_path": dict(
        path="scoring graph",
        active=False,
        failure="FastPathMismatch: it differs from eager by 0.3",
        checked=True,
        max_difference=0.3,
        tolerance=1e-4,
        check_seconds=0.01,
    ),
    "eval": dict(
        checkpoint="runs/x/best.pt",
        split="test",
        mode="static",
        **SCORE,
        chars_per_s=90000.0,
        fast_path={"path": "scoring graph", "active": True, "checked": True},
    ),
    "task_eval": dict(
        samples=3000, steps=200, train_loss=0.3, loss=0.25, accuracy=0.89, sequence_accuracy=0.72, seconds=9.5
    ),
    "task_end": dict(
        samples=3000,
        stopped_by="samples",
        reached={"0.5": 1005, "0.8": 2010},
        accuracy=0.89,
        sequence_accuracy=0.72,
        parameters=17285,
        seconds=9.5,
        run_dir="runs/t",
    ),
}


def test_every_event_is_written_and_read_back_as_it_was_given(tmp_path):
    assert set(WRITTEN) == set(RECORDS)
    run = Run(tmp_path)
    for event, fields in WRITTEN.items():
        run.record(event, **fields)
    history = run.history()
    assert [record.event for record in history.records] == list(WRITTEN)
    for record, (event, fields) in zip(history.records, WRITTEN.items()):
        assert record == RECORDS[event](time=record.time, schema=SCHEMA_VERSION, **fields)
        assert record_from_dict(record.to_dict()) == record
        row = record.to_dict()
        assert list(row) == ["event", "time", "schema", *fields]  # the order written
        assert {name: row[name] for name in fields} == fields
    lines = run.metrics.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["schema"] for line in lines] == [SCHEMA_VERSION] * len(WRITTEN)


def test_a_record_reads_back_to_the_same_json():
    history = RunHistory.read(OLD_RUN / "metrics.jsonl")
    lines = (OLD_RUN / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(history.records) == len(lines)
    for record, line in zip(history.records, lines):
        assert json.dumps(record.to_dict()) == json.dumps(json.loads(line))


def test_a_file_from_before_versions_reads_as_version_1():
    history = RunHistory.read(OLD_RUN / "metrics.jsonl")
    assert {record.schema for record in history.records} == {1}
    assert [record.epoch for record in history.epochs] == [1, 2] and all(
        isinstance(r, EpochRecord) for r in history.epochs
    )
    assert history.best.epoch == 2 and history.best.valid_bpc == pytest.approx(4.012109790990014)
    assert history.test_bpc_at_best == pytest.approx(3.9679005416415967)  # from its ``test`` record
    assert history.test_loss_at_best == pytest.approx(2.7503390731811526) and history.best_test.event == "test"
    assert history.train_seconds == pytest.approx(sum(epoch.train_seconds for epoch in history.epochs))
    assert history.status == "finished" and history.parameters == 6204
    assert history.evaluations[-1].mode == "static" and not history.ended  # an evaluation came after the end
    assert len(history.steps) == 90 and history.steps[0].step == 5 and history.steps[-1].step == 450


def test_events_and_fields_of_a_newer_release_are_kept(tmp_path):
    rows = [
        {"event": "start", "time": 1.0, "schema": 3, "parameters": 10, "accelerator": "tpu"},
        {"event": "warmup", "time": 2.0, "schema": 3, "steps": 100},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    history = Run(tmp_path).history()
    start, warmup = history.records
    assert start.parameters == 10 and start.extra == {"accelerator": "tpu"} and start.schema == 3
    assert isinstance(warmup, OtherRecord) and warmup.event == "warmup" and warmup.extra == {"steps": 100}
    assert [record.to_dict() for record in history.records] == rows
    assert history.of("warmup") == [warmup]


def test_a_line_cut_short_and_a_line_that_is_no_object_are_skipped(tmp_path):
    nested = "[" * 100_000 + "]" * 100_000  # JSON, but nested deeper than Python's parser goes
    (tmp_path / "metrics.jsonl").write_text(
        '{"event": "start", "parameters": 3}\n[1, 2]\n' + nested + '\n{"event": "ep', encoding="utf-8"
    )
    history = Run(tmp_path).history()
    assert [record.event for record in history.records] == ["start"] and history.status == "interrupted"


def test_a_time_that_is_nan_is_damage_and_a_loss_that_is_nan_is_a_record(tmp_path):
    """A diverged run records its loss as NaN; no run records a duration as NaN or infinite (`charlm
    runs` could not show it): that record is damage, a one-line error naming the file and the line."""
    from charlm.errors import CharlmError

    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(
        '{"event": "start", "parameters": 3}\n{"event": "diverged", "epoch": 1, "step": 2, "loss": NaN}\n',
        encoding="utf-8",
    )
    assert math.isnan(Run(tmp_path).history().of("diverged")[0].loss)
    with metrics.open("a", encoding="utf-8") as file:
        file.write('{"event": "epoch", "epoch": 1, "valid_bpc": 2.0, "train_seconds": Infinity}\n')
    with pytest.raises(
        CharlmError, match=f"{metrics} line 3: the epoch record's train_seconds must be a finite number, not inf"
    ):
        Run(tmp_path).history()


def test_the_writer_refuses_an_event_or_a_field_it_does_not_know_of(tmp_path):
    run = Run(tmp_path)
    with pytest.raises(ValueError, match="no event 'epoc'"):
        run.record("epoc", epoch=1)
    with pytest.raises(ValueError, match="needs valid_bpc"):
        run.record("epoch", epoch=1)
    assert not run.metrics.exists()  # nothing half-written


def _epoch(epoch, valid_bpc, best, partial=False, **fields):
    return dict(epoch=epoch, partial=partial, valid_bpc=valid_bpc, best=best, train_seconds=10.0, **fields)


def test_epochs_best_test_score_and_status_of_a_run_resumed_after_a_partial_epoch(tmp_path):
    run = Run(tmp_path)
    run.record("start", parameters=100)
    run.record("epoch", **_epoch(1, 3.0, True, test_bpc=3.2, test_loss=2.2))  # --test-every-epoch
    run.record("epoch", **_epoch(2, 3.5, False, partial=True))  # the time budget ran out
    run.record("end", epochs=1, best_epoch=1)
    assert Run(tmp_path).history().ended
    run.record("start", parameters=100, resumed_at={"epoch": 1, "window": 4})
    run.record("epoch", **_epoch(2, 2.9, True))  # the same epoch, completed
    run.record("test", epoch=2, test_bpc=3.1, test_loss=2.1)
    history = run.history()
    assert [(epoch.epoch, epoch.valid_bpc) for epoch in history.epochs] == [(1, 3.0), (2, 2.9)]
    assert [epoch.epoch for epoch in history.full_epochs] == [1, 2] and len(history.of("epoch")) == 3
    assert history.best.epoch == 2 and (history.test_bpc_at_best, history.test_loss_at_best) == (3.1, 2.1)
    assert history.train_seconds == 20.0 and len(history.starts) == 2
    assert history.status == "interrupted" and not history.ended  # the second session has no end
    assert RunHistory(history.records[:4]).test_bpc_at_best == 3.2  # in the best epoch's own record
    assert RunHistory(history.records[:3]).train_seconds == 20.0  # the partial epoch counts while it is the last
    run.record("diverged", epoch=3, step=30, loss=float("nan"))
    assert run.history().status == "diverged"


def test_a_changed_record_writes_its_new_fields():
    written = record_from_dict({"event": "epoch", "time": 1.0, "epoch": 1, "valid_bpc": 2.0})
    changed = dataclasses.replace(written, test_bpc=2.5)
    assert changed.to_dict() == {"event": "epoch", "time": 1.0, "epoch": 1, "valid_bpc": 2.0, "test_bpc": 2.5}
    assert EpochRecord(epoch=3, valid_bpc=2.0).to_dict() == {"event": "epoch", "epoch": 3, "valid_bpc": 2.0}
