"""A run directory agrees with itself after a kill at any instant: a fault-injection hook stops the
training at its k-th write (each checkpoint save, each rename of the rotation, each record), for
every k, and the resumed run must end as the straight one did, with best.pt, the records and the
rotation consistent. Not by timing: the kill falls exactly between two writes."""

from __future__ import annotations

import logging

import os
import types

import pytest

import charlm.runs.directory as directory
from charlm.checkpoint import Checkpoint
from charlm.runs.directory import Run
from charlm.runs.history import RunHistory
from charlm.runs.records import new_record
from charlm.training.control import TimeBudget
from charlm.training.trainer import Trainer
from helpers import assert_same_run_end, assert_same_weights, tiny_config


class Killed(BaseException):
    """What the hook raises in place of a write: nothing of it reaches the disk, nothing after it runs."""


class WriteKiller:
    """Counts the run directory's writes (checkpoint saves, the renames of save_last, records) and
    raises ``Killed`` in place of the ``kill_at``-th (None: count only). ``names``: what each was."""

    def __init__(self, monkeypatch, kill_at: int | None = None):
        self.kill_at, self.names = kill_at, []
        save, record = Checkpoint.save, Run.record

        def counted_save(checkpoint, path):
            self.tick(f"save {os.path.basename(path)}")
            return save(checkpoint, path)

        def counted_record(run, event, **fields):
            self.tick(f"record {event}")
            return record(run, event, **fields)

        def counted_replace(source, target):
            self.tick(f"rename {os.path.basename(source)} -> {os.path.basename(target)}")
            return os.replace(source, target)

        monkeypatch.setattr(Checkpoint, "save", counted_save)
        monkeypatch.setattr(Run, "record", counted_record)
        monkeypatch.setattr(directory, "os", types.SimpleNamespace(**{**vars(os), "replace": counted_replace}))

    def tick(self, name: str) -> None:
        self.names.append(name)
        if len(self.names) == self.kill_at:
            raise Killed(name)


WRITES = 22  # the straight run's writes (test_the_protocol_...): one test kills at each


def settings(corpus, run, **overrides):
    """Two epochs, both best so far, a save inside an epoch, an epoch checkpoint kept: every kind of
    write of the protocol, the rotation after a previous.pt exists included, in about a second."""
    values = dict(
        cell="gru",
        hidden_size=8,
        bptt=32,
        eval_batch_size=16,
        train_fraction=0.05,
        log_every=1000,
        save_every="10",
        keep_checkpoints=1,
    )
    return tiny_config(corpus, run, **{**values, **overrides})


@pytest.fixture(scope="module")
def straight(tiny_corpus, tmp_path_factory):
    """The uninterrupted run, and the names of its writes in order."""
    run = tmp_path_factory.mktemp("straight") / "run"
    patch = pytest.MonkeyPatch()
    try:
        counter = WriteKiller(patch)
        Trainer(settings(tiny_corpus, run)).fit()
    finally:
        patch.undo()
    return run, counter.names


def assert_consistent(run, straight_run):
    """What a reader of the run directory sees agrees: records, best.pt, the rotation, the end."""
    history = RunHistory.read(run / "metrics.jsonl")
    assert [record.epoch for record in history.full_epochs] == [1, 2]  # each epoch counted once
    assert len(history.of("checkpoint")) == len(RunHistory.read(straight_run / "metrics.jsonl").of("checkpoint"))
    best, held = history.best, Checkpoint.load(run / "best.pt")
    assert (held.scores["epoch"], held.scores["valid_bpc"]) == (best.epoch, best.valid_bpc)
    assert held.scores["test_bpc"] == history.test_bpc_at_best
    assert_same_weights(held.weights, Checkpoint.load(straight_run / "best.pt").weights)
    last = Checkpoint.load(run / "last.pt").training.progress
    assert (last["best_epoch"], last["best_valid_bpc"]) == (best.epoch, best.valid_bpc)
    assert not os.path.samefile(run / "last.pt", run / "previous.pt")
    assert sorted(path.name for path in run.glob("epoch*.pt")) == sorted(
        path.name for path in straight_run.glob("epoch*.pt")
    )
    assert not list(run.glob(".*.tmp"))
    assert Run(run).summary()["epochs"] == 2 and Run(run).status() == "finished"
    assert_same_run_end(straight_run, run)


def test_the_protocol_writes_best_after_its_commit_and_records_before_it(straight):
    straight_run, names = straight
    assert len(names) == WRITES
    epoch_file = next(path.name for path in straight_run.glob("epoch02-*.pt"))
    end = len(names) - 1 - names[::-1].index("record epoch")  # the second epoch's end
    assert names[end : end + 6] == [
        "record epoch",
        f"save {epoch_file}",  # before the commit: a resume supersedes them
        "save .last.pt.pending.tmp",
        "rename last.pt -> previous.pt",  # never a link
        "rename .last.pt.pending.tmp -> last.pt",  # the commit
        "save best.pt",
    ]  # after it: a resume restores it from last.pt
    saves = [index for index, name in enumerate(names) if name == "record checkpoint"]
    assert saves and all(names[index + 1] == "save .last.pt.pending.tmp" for index in saves)


@pytest.mark.parametrize("k", range(2, WRITES + 1))  # the first write is the start record: nothing to resume yet
def test_a_kill_at_every_write_resumes_to_a_consistent_run(k, tiny_corpus, tmp_path, straight, monkeypatch):
    straight_run, names = straight
    run = tmp_path / "killed"
    WriteKiller(monkeypatch, kill_at=k)
    with pytest.raises(Killed, match=names[k - 1]):
        Trainer(settings(tiny_corpus, run)).fit()
    monkeypatch.undo()
    if (run / "last.pt").exists() and (run / "previous.pt").exists():  # (between the renames: previous.pt alone)
        assert not os.path.samefile(run / "last.pt", run / "previous.pt")
    Trainer.resume(run).fit()
    assert_consistent(run, straight_run)


def test_a_kill_between_last_and_best_is_repaired_on_resume(tiny_corpus, tmp_path, straight, monkeypatch, caplog):
    """The resumed run's best.pt holds the epoch its last.pt calls best, before it trains a step."""
    straight_run, names = straight
    run = tmp_path / "run"
    WriteKiller(monkeypatch, kill_at=names.index("save best.pt") + 1)
    with pytest.raises(Killed):
        Trainer(settings(tiny_corpus, run)).fit()
    monkeypatch.undo()
    assert not (run / "best.pt").exists()  # the first epoch's end was committed, its best.pt not written
    logger = logging.getLogger("charlm")  # charlm's logger does not propagate once the CLI has run: listen on it
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO, logger="charlm"):
            Trainer.resume(run)
    finally:
        logger.removeHandler(caplog.handler)
    assert "did not hold the best epoch (1)" in caplog.text
    held = Checkpoint.load(run / "best.pt")
    assert held.scores["epoch"] == 1 and held.training.optimizer is None
    assert_same_weights(held.weights, Checkpoint.load(run / "last.pt").weights)


def test_records_past_a_resumed_position_are_superseded():
    """By hand: a session wrote steps 5..8 and epoch 1 (at step 8), was killed before saving, and
    the next one resumed from the save at step 4."""
    rows = [("start", dict(parameters=1, resumed_at={"epoch": 0, "window": 0, "step": 0}))]
    rows += [("checkpoint", dict(epoch=1, window=4, step=4))]
    rows += [("step", dict(epoch=1, step=step, loss=1.0)) for step in (5, 8)]
    rows += [
        ("epoch", dict(epoch=1, step=8, valid_bpc=2.0, train_seconds=3.0)),
        ("eval", dict(split="valid", mode="static")),
    ]
    rows += [("start", dict(parameters=1, resumed_at={"epoch": 0, "window": 4, "step": 4}))]
    rows += [
        ("step", dict(epoch=1, step=8, loss=1.0)),
        ("epoch", dict(epoch=1, step=8, valid_bpc=2.0, train_seconds=3.0)),
    ]
    history = RunHistory([new_record(event, 0.0, fields) for event, fields in rows])
    assert [record.event for record in history.records] == ["start", "checkpoint", "eval", "start", "step", "epoch"]
    assert history.superseded == 3 and len(history.full_epochs) == 1 and history.train_seconds == 3.0
    # a resume at the end of the epoch, from a save at the same step, still supersedes the epoch's record
    rows[-3] = ("start", dict(parameters=1, resumed_at={"epoch": 0, "window": 9, "step": 8}))
    history = RunHistory([new_record(event, 0.0, fields) for event, fields in rows])
    assert [record.event for record in history.records] == [
        "start",
        "checkpoint",
        "step",
        "step",
        "eval",
        "start",
        "step",
        "epoch",
    ]
    # records of a release that did not write the step of resumed_at are read as written
    legacy = [new_record("start", 0.0, dict(parameters=1, resumed_at={"epoch": 0, "window": 4}))] * 2
    assert len(RunHistory(legacy).records) == 2


def test_the_time_budget_counts_the_sessions_before(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr("charlm.training.control.time.monotonic", lambda: clock[0])
    budget = TimeBudget(1.0, spent=50.0)  # one minute, fifty seconds of it spent before this session
    clock[0] += 9.0
    assert budget.spent() == 59.0 and not budget.is_up()
    clock[0] += 2.0
    assert budget.is_up()
    assert not TimeBudget(None, spent=1e9).is_up()


def test_a_resume_does_not_restart_the_time_budget(tiny_corpus, tmp_path):
    run = tmp_path / "run"
    Trainer(settings(tiny_corpus, run, epochs=1, save_every="4")).fit()
    last = Checkpoint.load(run / "last.pt")
    assert 0 < last.training.progress["budget_seconds"]  # counted even without a budget
    last.training.progress["budget_seconds"] = 600.0  # ten minutes already trained
    last.save(run / "last.pt")
    summary = Trainer.resume(run, epochs=2, max_minutes=5).fit()  # a budget used up before it began
    progress = Checkpoint.load(run / "last.pt").training.progress
    assert summary["stopped_by"] == "time" and progress["epoch"] == 1 and progress["window"] > 0
    assert progress["budget_seconds"] >= 600.0
    steps = progress["step"]
    # resumed again with the same budget: nothing is trained, the run says why
    summary = Trainer.resume(run, max_minutes=5).fit()
    assert Checkpoint.load(run / "last.pt").training.progress["step"] == steps and summary["stopped_by"] == "time"
    assert RunHistory.read(run / "metrics.jsonl").ended
