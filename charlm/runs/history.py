"""Reading a run's records back: ``RunHistory``, the one reader of ``metrics.jsonl``, and what it
tells (epochs, the best one, the test score at it, the status), less the records a resume redid.

    history = RunHistory.read("runs/wp-lru/metrics.jsonl")   # or Run(path).history()
    [(e.epoch, e.valid_bpc) for e in history.epochs], history.best.epoch, history.status
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from charlm.errors import CharlmError
from charlm.files import RECORDS_LIMIT, read_own_file
from charlm.runs.records import Record, record_from_dict, record_type_problem


REDONE_ON_RESUME = ("step", "valid", "epoch", "checkpoint")  # the training's records a resume writes again


def committed(records) -> list[Record]:
    """``records`` without those a resume superseded. A kill can fall after a record was appended
    but before the checkpoint that commits its work was saved; the resumed run then trains that part
    again and appends its records again. Each resumed session's ``start`` record names the position
    it began at (``resumed_at``: ``epoch`` completed, ``step``): the step, valid, epoch and checkpoint
    records written before it past that position (a later ``step``, or a full epoch beyond ``epoch``)
    are work the resume redid, and are left out. Runs written before ``resumed_at`` had a ``step``
    are read as written."""
    kept = []
    for record in records:
        at = getattr(record, "resumed_at", None) if record.event == "start" else None
        if isinstance(at, dict) and _is_count(at.get("step")) and _is_count(at.get("epoch")):
            kept = [earlier for earlier in kept if not _past(earlier, at["epoch"], at["step"])]
        kept.append(record)
    return kept


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _past(record: Record, epoch: int, step: int) -> bool:
    """Whether ``record`` is of work after the position (``epoch`` completed, ``step``) a resume began at."""
    if record.event not in REDONE_ON_RESUME:
        return False
    if _is_count(record.step) and record.step > step:
        return True
    return record.event == "epoch" and not record.partial and _is_count(record.epoch) and record.epoch > epoch


class RunHistory:
    """A run's records, in the order they were written (less those a resume superseded:
    ``committed``), and what is read from them."""

    def __init__(self, records):
        """``records`` as written; ``self.records`` keeps those a later resume did not supersede
        (``committed``), ``self.superseded`` counts the others."""
        written = tuple(records)
        self.records: tuple[Record, ...] = tuple(committed(written))
        self.superseded = len(written) - len(self.records)

    @classmethod
    def read(cls, path: str | Path) -> "RunHistory":
        """The records of a metrics.jsonl (none when it is missing); a line cut short by a crash, or
        one that is not a JSON object, is skipped. A record whose event is not a string, or with a
        field of the wrong type (a string where a number belongs), is damage, not a crash: a
        ``CharlmError`` names the file and the line."""
        if not os.path.lexists(path):
            return cls(())
        text = read_own_file(path, "run record file", RECORDS_LIMIT).decode("utf-8", errors="replace")
        records = []
        for number, line in enumerate(text.splitlines(), start=1):
            try:
                row = json.loads(line)
            except (ValueError, RecursionError):  # RecursionError: arrays nested thousands deep
                continue
            if isinstance(row, dict):
                problem = record_type_problem(row)
                if problem:
                    raise CharlmError(f"{path} line {number}: {problem}")
                records.append(record_from_dict(row))
        return cls(records)

    def of(self, *events: str) -> list[Record]:
        """The records of these events, in order."""
        return [record for record in self.records if record.event in events]

    @property
    def starts(self) -> list[Record]:
        return self.of("start")

    @property
    def parameters(self) -> int | None:
        """The model's parameter count (its last ``start`` record)."""
        starts = self.starts
        return starts[-1].parameters if starts else None

    @property
    def epoch_records(self) -> list[Record]:
        """Every ``epoch`` record as written: a partial epoch and its completion both appear."""
        return self.of("epoch")

    @property
    def epochs(self) -> list[Record]:
        """The last record written for each epoch, in epoch order."""
        latest = {record.epoch: record for record in self.epoch_records if isinstance(record.epoch, int)}
        return [latest[epoch] for epoch in sorted(latest)]

    @property
    def full_epochs(self) -> list[Record]:
        return [record for record in self.epoch_records if not record.partial]

    @property
    def best(self) -> Record | None:
        """The epoch record of the best validation score (the last one flagged best)."""
        flagged = [record for record in self.epoch_records if record.best and isinstance(record.epoch, int)]
        return flagged[-1] if flagged else None

    @property
    def best_test(self) -> Record | None:
        """The record holding the test score of the best-validation weights (its ``test_*`` fields):
        the best epoch's own (``test_every_epoch``), else the ``test`` record scored for that epoch."""
        best = self.best
        if best is None or best.test_bpc is not None:
            return best
        tests = [record for record in self.of("test") if record.epoch == best.epoch]
        return tests[-1] if tests else None

    @property
    def test_bpc_at_best(self) -> float | None:
        return None if self.best_test is None else self.best_test.test_bpc

    @property
    def test_loss_at_best(self) -> float | None:
        return None if self.best_test is None else self.best_test.test_loss

    @property
    def steps(self) -> list[Record]:
        return self.of("step")

    @property
    def evaluations(self) -> list[Record]:
        return self.of("eval")

    @property
    def status(self) -> str:
        """created, finished, diverged or interrupted, from the records after the last ``start``
        (whether a process is training now is the run directory's lock to tell)."""
        starts = [index for index, record in enumerate(self.records) if record.event == "start"]
        if not starts:
            return "created"
        after = {record.event for record in self.records[starts[-1] :]}
        if "end" in after or "task_end" in after:
            return "finished"
        if "diverged" in after:
            return "diverged"
        return "interrupted"

    @property
    def ended(self) -> bool:
        """The last record is an ``end``: nothing was left undone."""
        return bool(self.records) and self.records[-1].event in ("end", "task_end")

    @property
    def train_seconds(self) -> float:
        """Training time: the full epochs', and the last epoch's when it was partial."""
        seconds = sum(record.train_seconds or 0.0 for record in self.full_epochs)
        epochs = self.epoch_records
        if epochs and epochs[-1].partial:
            seconds += epochs[-1].train_seconds or 0.0
        return seconds
