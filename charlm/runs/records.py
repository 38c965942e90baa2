"""The records of a run's ``metrics.jsonl``: one JSON object per line, one typed record per event.

``Run.record(event, **fields)`` is the one writer: it builds the event's record (refusing an event
this schema does not know, or one without a field its event requires: a programming error), stamps
it with the time and ``SCHEMA_VERSION``, and appends it. ``charlm.runs.history.RunHistory`` is the
one reader: ``charlm runs``, ``charlm report``, sweeps, the trainer and the tests all read runs
through it.

Version 1 is what charlm wrote before records carried a version: the same events and fields, no
``schema`` key. A record is read whatever its version; fields this release does not know, and whole
events it does not know, are kept (``extra``, :class:`OtherRecord`), never dropped.

"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import typing
from pathlib import Path
from typing import ClassVar

from charlm.errors import shown

SCHEMA_VERSION = 2
LEGACY_SCHEMA = 1  # a record without a ``schema`` key


@dataclasses.dataclass(frozen=True)
class Record:
    """What every record has; ``extra`` keeps the fields a newer release wrote that this one does not
    know, ``keys`` the order of the object's keys as written (so a record reads back to the same JSON)."""

    event: ClassVar[str] = ""
    required: ClassVar[tuple[str, ...]] = ()  # the fields a writer must give

    time: float | None = None
    schema: int = LEGACY_SCHEMA
    extra: dict = dataclasses.field(default_factory=dict)
    keys: tuple[str, ...] = dataclasses.field(default=(), repr=False, compare=False)

    def to_dict(self) -> dict:
        """The JSON object of this record: the keys as written, in their order, then the fields
        given since (by ``dataclasses.replace`` or the constructor) that differ from their default."""
        fields = [field for field in dataclasses.fields(self) if field.name in _field_names(type(self))]
        values = {field.name: getattr(self, field.name) for field in fields}
        values.update(self.extra)
        given = [field.name for field in fields if _differs(values[field.name], field.default)] + list(self.extra)
        order = [key for key in self.keys if key in values] + [key for key in given if key not in self.keys]
        return {"event": self.event, **{key: values[key] for key in order}}


def _differs(value, default) -> bool:
    return value is not None if default is None else value != default


def _score_fields(prefix: str) -> list[tuple[str, type]]:
    """The fields of a scored split (``Score.as_dict(prefix)``)."""
    return [
        (f"{prefix}loss", float),
        (f"{prefix}bits_per_token", float),
        (f"{prefix}bpc", float),
        (f"{prefix}perplexity", float),
        (f"{prefix}tokens", int),
    ]


def _record_class(name: str, event: str, fields: list[tuple[str, type]], required: tuple[str, ...], doc: str):
    """A frozen dataclass ``name`` for ``event`` with these fields (all optional when read back)."""
    cls = dataclasses.make_dataclass(
        name,
        [(field, kind | None, dataclasses.field(default=None)) for field, kind in fields],
        bases=(Record,),
        frozen=True,
        namespace={"event": event, "required": required, "__doc__": doc},
    )
    cls.__module__ = __name__
    return cls


_SCORE_KEYS = tuple(field for field, _ in _score_fields(""))

StartRecord = _record_class(
    "StartRecord",
    "start",
    [("parameters", int), ("hidden_size", int), ("device", str), ("resumed_at", dict)],
    ("parameters",),
    "A training session began (``resumed_at``: the epoch, window and step it began at).",
)
StepRecord = _record_class(
    "StepRecord",
    "step",
    [
        ("epoch", int),
        ("step", int),
        ("loss", float),
        ("bpc", float),
        ("lr", float),
        ("grad_norm", dict),
        ("tokens", int),
        ("seconds", float),
    ],
    ("epoch", "step", "loss"),
    "Every ``log_every`` steps: the step's loss (nats per token), bpc, lr, per-layer gradient norms before clipping, "
    "and the run's training tokens and training seconds so far (since the release after 0.3.0).",
)
ValidRecord = _record_class(
    "ValidRecord",
    "valid",
    [
        ("epoch", int),
        ("step", int),
        *_score_fields("valid_"),
        ("valid_fraction", float),
        ("tokens", int),
        ("seconds", float),
    ],
    ("epoch", "step", "valid_bpc"),
    "Every ``eval_every`` steps: the validation score, and the run's training tokens and seconds so far.",
)
EpochRecord = _record_class(
    "EpochRecord",
    "epoch",
    [
        ("epoch", int),
        ("partial", bool),
        ("lr", float),
        ("train_loss", float),
        ("train_bits", float),
        ("train_bpc", float),
        *_score_fields("valid_"),
        *_score_fields("test_"),
        ("grad_norm", dict),
        ("chars_per_second", float),
        ("train_seconds", float),
        ("step", int),
        ("best", bool),
        ("tokens_seen", int),
        ("valid_fraction", float),
    ],
    ("epoch", "valid_bpc"),
    "The end of an epoch (``partial``: cut short by the time budget): its training and "
    "validation scores (and test, with ``test_every_epoch``), whether it is the best so far.",
)
CheckpointRecord = _record_class(
    "CheckpointRecord",
    "checkpoint",
    [("epoch", int), ("window", int), ("step", int)],
    ("epoch", "window", "step"),
    "last.pt was saved inside an epoch (``save_every``).",
)
InterruptedRecord = _record_class(
    "InterruptedRecord",
    "interrupted",
    [("epoch", int), ("window", int), ("step", int)],
    ("epoch", "window", "step"),
    "Ctrl-C or SIGTERM stopped the training; last.pt saved.",
)
DivergedRecord = _record_class(
    "DivergedRecord",
    "diverged",
    [("epoch", int), ("step", int), ("loss", float)],
    ("epoch", "step", "loss"),
    "The loss stopped being finite; training stopped.",
)
TestRecord = _record_class(
    "TestRecord",
    "test",
    [("epoch", int), *_score_fields("test_")],
    ("epoch", "test_bpc"),
    "The test score of the best-validation weights (those of ``epoch``).",
)
EndRecord = _record_class(
    "EndRecord",
    "end",
    [
        ("run_dir", str),
        ("epochs", int),
        ("partial_epoch", bool),
        ("best_epoch", int),
        ("best_valid_bpc", float),
        ("test_bpc_at_best", float),
        ("parameters", int),
        ("hidden_size", int),
        ("wall_seconds", dict),
        ("tokens_seen", int),
        ("stopped_by", str),
    ],
    ("epochs", "best_epoch"),
    "The training ended (its epochs, early stopping or time budget): the run's summary.",
)
_CHECK_FIELDS = [("checked", bool), ("max_difference", float), ("tolerance", float), ("check_seconds", float)]
CompileRecord = _record_class(
    "CompileRecord",
    "compile",
    [("active", bool), ("seconds", float), ("backend", str), ("failure", str), *_CHECK_FIELDS],
    ("active",),
    "``--compile``: whether the compiled forward is used, how long compiling took, why not, and its first-use "
    "check against the eager forward (``checked``, ``max_difference`` within ``tolerance``).",
)
CudaGraphRecord = _record_class(
    "CudaGraphRecord",
    "cuda_graph",
    [("active", bool), ("seconds", float), ("failure", str), *_CHECK_FIELDS],
    ("active",),
    "``--cuda-graph``: whether the captured window is replayed, the capture time, and its first-use check.",
)
FastPathRecord = _record_class(
    "FastPathRecord",
    "fast_path",
    [("path", str), ("active", bool), ("failure", str), *_CHECK_FIELDS],
    ("path", "active"),
    "A fast path other than training's (the scoring graph) the first time it was tried in this session: "
    "in use or not, and its check against the eager code.",
)
EvalRecord = _record_class(
    "EvalRecord",
    "eval",
    [
        ("checkpoint", str),
        ("split", str),
        ("mode", str),
        *_score_fields(""),
        ("chars_per_s", float),
        ("adapt_on", str),
        ("hyperparameters", dict),
        *_score_fields("static_"),
        *_score_fields("dynamic_"),
        ("static_chars_per_s", float),
        ("dynamic_chars_per_s", float),
        ("statistics_seconds", float),
        ("statistics_batches", int),
        ("adaptation_bpc", float),
        ("adaptation_seconds", float),
        ("search", dict),
        ("fast_path", dict),
    ],
    ("split", "mode"),
    "`charlm eval` of a checkpoint of this run: ``mode`` static (the score's fields) or dynamic "
    "(static_* and dynamic_* scores, the method's hyperparameters, ``adapt_on`` for protocol #2); ``fast_path``: "
    "the scoring graph's first-use check, where one was tried (a GPU).",
)

TaskEvalRecord = _record_class(
    "TaskEvalRecord",
    "task_eval",
    [
        ("samples", int),
        ("steps", int),
        ("train_loss", float),
        ("loss", float),
        ("accuracy", float),
        ("sequence_accuracy", float),
        ("seconds", float),
    ],
    ("samples", "accuracy"),
    "`charlm task`: the held-out score after ``samples`` training samples (loss per target, per-symbol and "
    "per-sequence accuracy).",
)
TaskEndRecord = _record_class(
    "TaskEndRecord",
    "task_end",
    [
        ("samples", int),
        ("stopped_by", str),
        ("reached", dict),
        ("accuracy", float),
        ("sequence_accuracy", float),
        ("parameters", int),
        ("seconds", float),
        ("run_dir", str),
    ],
    ("samples", "stopped_by"),
    "`charlm task` ended (``stopped_by`` solved or samples); ``reached``: the samples at which the held-out "
    "accuracy first exceeded 0.5, 0.8, 0.99 and reached 1.0.",
)

RECORDS: dict[str, type[Record]] = {
    cls.event: cls
    for cls in (
        StartRecord,
        StepRecord,
        ValidRecord,
        EpochRecord,
        CheckpointRecord,
        InterruptedRecord,
        DivergedRecord,
        TestRecord,
        EndRecord,
        CompileRecord,
        CudaGraphRecord,
        FastPathRecord,
        EvalRecord,
        TaskEvalRecord,
        TaskEndRecord,
    )
}


@dataclasses.dataclass(frozen=True)
class OtherRecord(Record):
    """An event this release does not know (written by a newer one): kept with all its fields."""

    name: str = ""

    event = property(lambda self: self.name)


def _field_names(cls) -> frozenset:
    """The fields that are keys of the JSON object (``OtherRecord.name`` is its ``event``)."""
    return frozenset(field.name for field in dataclasses.fields(cls)) - {"extra", "keys", "name"}


def new_record(event: str, time: float, fields: dict) -> Record:
    """The record a writer appends now; an unknown event or a missing required field is a bug."""
    cls = RECORDS.get(event)
    if cls is None:
        raise ValueError(f"metrics.jsonl has no event {event!r} (known: {', '.join(RECORDS)})")
    missing = [name for name in cls.required if fields.get(name) is None]
    if missing:
        raise ValueError(f"a {event!r} record needs {', '.join(missing)}")
    return record_from_dict({"event": event, "time": time, "schema": SCHEMA_VERSION, **fields})


def record_from_dict(row: dict) -> Record:
    """A record from its JSON object, of any schema version."""
    event = row.get("event")
    cls = RECORDS.get(event, OtherRecord)
    known = _field_names(cls)
    values = {key: value for key, value in row.items() if key in known}
    extra = {key: value for key, value in row.items() if key not in known and key != "event"}
    if cls is OtherRecord:
        values["name"] = str(event)
    return cls(**values, extra=extra, keys=tuple(key for key in row if key != "event"))


def record_type_problem(row: dict) -> str | None:
    """What is wrong with the types of a record's JSON object (its event not a string, a field of
    its event not of the field's type, a time or a duration that is NaN or infinite), or None.
    Unknown events and fields are not checked."""
    event = row.get("event")
    if not isinstance(event, str):
        return f"a record's event must be a string, not {shown(event, 60)}"
    for name, kind in _field_kinds(RECORDS.get(event)).items():
        value = row.get(name)
        if value is not None and not is_of_kind(value, kind):
            return f"the {event} record's {name} must be {KIND_WORDS[kind]}, not {shown(value, 60)}"
        if (name == "time" or name.endswith("seconds")) and isinstance(value, float) and not math.isfinite(value):
            # a loss may be NaN, a time not
            return f"the {event} record's {name} must be a finite number, not {shown(value, 60)}"
    return None


@functools.cache
def _field_kinds(cls) -> dict[str, type]:
    """Field name → the type its value must have, for a record class (None: only time and schema)."""
    kinds = {"time": float, "schema": int}
    if cls is not None:
        kinds.update(
            {
                field.name: next(kind for kind in typing.get_args(field.type) if kind is not type(None))
                for field in dataclasses.fields(cls)
                if field.name in _field_names(cls) - set(kinds)
            }
        )
    return kinds


KIND_WORDS = {float: "a number", int: "a whole number", str: "a string", bool: "true or false", dict: "an object"}


def is_of_kind(value, kind: type) -> bool:
    if isinstance(value, bool):
        return kind is bool
    if kind is float:
        return isinstance(value, (int, float))
    return isinstance(value, kind)


def encode(record: Record) -> str:
    """One line of metrics.jsonl (tensors as lists, paths as strings)."""
    return json.dumps(record.to_dict(), default=_plain)


def _plain(value):
    if hasattr(value, "tolist"):  # a tensor or an array
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot write {type(value).__name__} to metrics")
