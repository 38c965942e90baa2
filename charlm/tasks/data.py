"""The Grid LSTM paper's algorithmic tasks (Kalchbrenner, Danihelka & Graves 2016, section 4 and
appendix), generated on the fly from a ``torch.Generator``: the same generator state gives the same
samples, and every batch is new.

A batch is ``TaskBatch(inputs, targets, mask)``. For the sequence tasks ``inputs`` and ``targets``
are ``[B, T]`` token ids and ``mask`` is ``[B, T]``: True where the target counts (loss and
accuracy are taken there only). ``-`` (the last id) is the delimiter and the padding::

    memorization (length 3)   input  - α β γ - - - -        addition (3 digits)   input  - 1 2 3 - 8 9 9 - - - - -
                              target - - - - α β γ -                              target - - - - - - - - 1 0 2 2 -
                              mask   . . . . ^ ^ ^ .                              mask   . . . . . . . . ^ ^ ^ ^ ^

Memorization counts the symbols only; addition counts the result's digits and the ``-`` that ends
the result (on a 15-digit result the last position is padding and is not counted).
Parity is not a sequence: ``inputs`` is ``[B, k]`` bits (float), ``targets`` ``[B, 1]`` the parity
and ``mask`` all True.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch import Tensor
# torch is imported where samples are drawn: `charlm task --help` reads the tasks' sizes and limits without it.

MAX_LENGTH = 10_000  # memorization: symbols per sequence
MAX_SYMBOLS = 65_535  # memorization: vocabulary
MAX_DIGITS = 1_000  # addition: digits per number
MAX_BITS = 100_000  # parity: bits per string


@dataclasses.dataclass(frozen=True)
class TaskBatch:
    inputs: Tensor
    targets: Tensor
    mask: Tensor

    def to(self, device) -> "TaskBatch":
        return TaskBatch(*(tensor.to(device, non_blocking=True) for tensor in (self.inputs, self.targets, self.mask)))


def _check(name: str, value, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} must be an integer from {low:,} to {high:,}, not {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class Memorization:
    """Read ``length`` independent symbols of ``symbols`` kinds, then write them back."""

    length: int = 20
    symbols: int = 64
    name = "memorization"
    sequence = True

    def __post_init__(self):
        _check("the sequence length (--length)", self.length, 1, MAX_LENGTH)
        _check("the vocabulary (--symbols)", self.symbols, 2, MAX_SYMBOLS)

    @property
    def vocab(self) -> list[str]:
        return [f"s{i}" for i in range(self.symbols)] + ["-"]

    @property
    def positions(self) -> int:
        return 2 * self.length + 2

    @property
    def sample_bytes(self) -> int:
        """What one sample takes as it is drawn: the symbols (int64), then inputs and targets (int64) and the mask."""
        return 8 * self.length + 17 * self.positions

    def sample(self, generator: torch.Generator, batch_size: int) -> TaskBatch:
        import torch

        n, dash = self.length, self.symbols
        sequence = torch.randint(self.symbols, (batch_size, n), generator=generator)
        inputs = torch.full((batch_size, self.positions), dash)
        targets = torch.full((batch_size, self.positions), dash)
        mask = torch.zeros((batch_size, self.positions), dtype=torch.bool)
        inputs[:, 1 : n + 1] = sequence  # read after the opening delimiter
        targets[:, n + 1 : 2 * n + 1] = sequence  # written back from the closing delimiter on
        mask[:, n + 1 : 2 * n + 1] = True
        return TaskBatch(inputs, targets, mask)


@dataclasses.dataclass(frozen=True)
class Addition:
    """Read two ``digits``-digit integers (most significant digit first), then write their sum and ``-``."""

    digits: int = 15
    name = "addition"
    sequence = True

    def __post_init__(self):
        _check("the number of digits (--digits)", self.digits, 1, MAX_DIGITS)

    vocab = property(lambda self: [str(d) for d in range(10)] + ["-"])
    positions = property(lambda self: 3 * self.digits + 4)
    # What one sample takes as it is drawn: two numbers' digits, their sum and its two selected copies
    # (int64), then inputs and targets (int64) and the mask.
    sample_bytes = property(lambda self: 40 * (self.digits + 1) + 17 * self.positions)

    def numbers(self, generator: torch.Generator, batch_size: int) -> tuple[Tensor, Tensor]:
        """Two ``[B, D]`` digit arrays of D-digit integers (no leading zero)."""
        import torch

        digits = torch.randint(10, (2, batch_size, self.digits), generator=generator)
        digits[:, :, 0] = torch.randint(1, 10, (2, batch_size), generator=generator)
        return digits[0], digits[1]

    def sample(self, generator: torch.Generator, batch_size: int) -> TaskBatch:
        return self.encode(*self.numbers(generator, batch_size))

    def encode(self, a: Tensor, b: Tensor) -> TaskBatch:
        """The batch of the problems a + b (``[B, D]`` digit arrays)."""
        import torch

        batch_size = a.shape[0]
        total = sum_digits(a, b)  # [B, D + 1], a leading 0 where the sum has D digits
        d, dash = self.digits, 10
        inputs = torch.full((batch_size, self.positions), dash)
        targets = torch.full((batch_size, self.positions), dash)
        mask = torch.zeros((batch_size, self.positions), dtype=torch.bool)
        inputs[:, 1 : d + 1] = a
        inputs[:, d + 2 : 2 * d + 2] = b
        start = 2 * d + 2  # the delimiter after b: the first digit of the sum is due there
        long = total[:, 0] > 0
        targets[long, start : start + d + 1] = total[long]
        targets[~long, start : start + d] = total[~long, 1:]
        mask[:, start : start + d + 1] = True  # D digits and the closing "-", or D + 1 digits ...
        mask[long, start + d + 1] = True  # ... and the closing "-"
        return TaskBatch(inputs, targets, mask)


def sum_digits(a: Tensor, b: Tensor) -> Tensor:
    """The digits of a + b, most significant first, one digit longer than the operands."""
    import torch

    out = torch.zeros(a.shape[0], a.shape[1] + 1, dtype=a.dtype)
    carry = torch.zeros(a.shape[0], dtype=a.dtype)
    for column in range(a.shape[1] - 1, -1, -1):  # the column of units first
        value = a[:, column] + b[:, column] + carry
        out[:, column + 1] = value % 10
        carry = value // 10
    out[:, 0] = carry
    return out


@dataclasses.dataclass(frozen=True)
class Parity:
    """Is the number of ones among ``bits`` random bits odd? (A classification, not a sequence.)"""

    bits: int = 50
    name = "parity"
    sequence = False
    vocab = property(lambda self: ["even", "odd"])
    sample_bytes = property(lambda self: 12 * self.bits + 17)  # as drawn: the bits (int64, then float32), parity, mask

    def __post_init__(self):
        _check("the number of bits (--bits)", self.bits, 1, MAX_BITS)

    def sample(self, generator: torch.Generator, batch_size: int) -> TaskBatch:
        import torch

        bits = torch.randint(2, (batch_size, self.bits), generator=generator)
        parity = bits.sum(dim=1, keepdim=True) % 2
        return TaskBatch(bits.float(), parity, torch.ones_like(parity, dtype=torch.bool))


TASKS = {task.name: task for task in (Memorization, Addition, Parity)}
# What each task's options are called on the command line, and the paper's training settings.
PAPER_SETTINGS = {
    "memorization": {"hidden_size": 100, "batch_size": 15, "optimizer": "adam", "lr": 1e-3, "max_samples": 5_000_000},
    "addition": {"hidden_size": 400, "batch_size": 15, "optimizer": "adam", "lr": 1e-3, "max_samples": 5_000_000},
    "parity": {"hidden_size": 500, "batch_size": 20, "optimizer": "adagrad", "lr": 0.06, "max_samples": 10_000_000},
}


def make_task(name: str, **options):
    """The task ``name`` with ``options`` (those left None take the paper's values)."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}: choose one of {', '.join(TASKS)}")
    cls = TASKS[name]
    known = {field.name for field in dataclasses.fields(cls)}
    given = {key: value for key, value in options.items() if value is not None}
    extra = sorted(set(given) - known)
    if extra:
        raise ValueError(
            f"{name} takes {', '.join('--' + key for key in sorted(known))}, not "
            f"{', '.join('--' + key for key in extra)}"
        )
    return cls(**given)
