"""The settings of a task run (``TaskConfig``) and the paper's values per task, without torch:
``charlm task --help`` builds its options from these fields."""

from __future__ import annotations

import dataclasses

from charlm.config import MAX_LAYERS, MAX_LR, MAX_WIDTH
from charlm.errors import CharlmError
from charlm.settings import from_dict, setting, validate
from charlm.tasks.data import (
    MAX_BITS,
    MAX_DIGITS,
    MAX_LENGTH,
    MAX_SYMBOLS,
    PAPER_SETTINGS,
    Addition,
    Memorization,
    Parity,
    make_task,
)

OPTIMIZERS = ("adam", "adagrad", "sgd")


def paper_default(name: str) -> str:
    """The paper's value of setting ``name`` per task, for the help:
    ``15 for memorization and addition, 20 for parity``."""
    tasks_of: dict = {}
    for task, values in PAPER_SETTINGS.items():
        tasks_of.setdefault(values[name], []).append(task)
    shown = {value: f"{value:g}" if isinstance(value, float) else str(value) for value in tasks_of}
    return ", ".join(f"{shown[value]} for {' and '.join(tasks)}" for value, tasks in tasks_of.items())


@dataclasses.dataclass
class TaskConfig:
    """One task run; fields left None take the paper's value for the task (``PAPER_SETTINGS``); ``charlm task``
    builds its options' help from the fields (``setting``), ``resolved`` checks them (``validate``)."""

    task: str
    cell: str = setting(
        "grid-lstm", "A registered cell stacked --layers deep; for parity grid-lstm (the 1-D Grid LSTM), relu or tanh."
    )
    layers: int = setting(1, "Depth.", min=1, max=MAX_LAYERS)
    tied: bool | None = setting(
        None, "The same weights at every layer.", show_default="grid-lstm tied, other cells untied"
    )
    cell_options: dict = setting({}, "Options of the cell (--cell-opt key=value).", cli=False)
    # The sizes of a task are checked by the task itself (charlm.tasks.data), for its Python callers too.
    length: int | None = setting(
        None, f"memorization: symbols per sequence, 1 to {MAX_LENGTH:,}.", show_default=str(Memorization.length)
    )
    symbols: int | None = setting(
        None, f"memorization: vocabulary, 2 to {MAX_SYMBOLS:,}.", show_default=str(Memorization.symbols)
    )
    digits: int | None = setting(
        None, f"addition: digits per number, 1 to {MAX_DIGITS:,}.", show_default=str(Addition.digits)
    )
    bits: int | None = setting(None, f"parity: bits per string, 1 to {MAX_BITS:,}.", show_default=str(Parity.bits))
    hidden_size: int | None = setting(
        None, "Units per layer.", flag="--hidden", min=1, max=MAX_WIDTH, show_default=paper_default("hidden_size")
    )  # --hidden as in `charlm train`
    batch_size: int | None = setting(None, "Samples per step.", min=1, show_default=paper_default("batch_size"))
    optimizer: str | None = setting(None, "Optimizer.", choices=OPTIMIZERS, show_default=paper_default("optimizer"))
    lr: float | None = setting(
        None, "Learning rate.", min=0, min_open=True, max=MAX_LR, show_default=paper_default("lr")
    )
    clip: float | None = setting(
        None, "Clip the gradient norm to this (the paper clips nothing).", min=0, min_open=True, show_default="none"
    )
    max_samples: int | None = setting(
        None,
        "Training samples at most; raise it to resume a run that used its budget.",
        min=1,
        show_default=paper_default("max_samples"),
    )
    eval_every: int = setting(10_000, "Score the held-out samples every this many training samples.", min=1)
    eval_samples: int = setting(100, "Held-out samples (the paper: 100).", min=1)
    seed: int = setting(1, "Seeds the weights and both sample streams.")
    device: str = setting("auto", "auto, cpu, cuda, cuda:N or mps.")
    wavefront: bool = setting(
        True,
        "Run a tied stack one anti-diagonal of time × depth at a time (checked against "
        "the layer-by-layer code at the start).",
    )

    def resolved(self) -> "TaskConfig":
        """A copy with the paper's values filled in and every value checked (one line on a bad one)."""
        paper = PAPER_SETTINGS.get(self.task)
        if paper is None:
            raise CharlmError(f"unknown task {self.task!r}: choose one of {', '.join(PAPER_SETTINGS)}")
        config = dataclasses.replace(self, **{key: value for key, value in paper.items() if getattr(self, key) is None})
        validate(config)  # every value within its type (64-bit integers, finite floats), its bounds and its choices
        config.make_task()
        return config

    def make_task(self):
        try:
            return make_task(self.task, length=self.length, symbols=self.symbols, digits=self.digits, bits=self.bits)
        except ValueError as error:
            raise CharlmError(str(error)) from None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "TaskConfig":
        return from_dict(cls, values)
