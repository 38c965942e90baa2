"""The windows training reads, epoch by epoch, as ``--windows`` lays them out.

- ``contiguous`` (the default; the protocol of the LRU, Delta-RNN and Grid LSTM papers):
  ``TokenStreams``, the same every epoch: ``batch_size`` streams cut into ``bptt`` windows at the
  same places, the state carried from each window into the next.
- ``shifted``: the same streams, started at an offset drawn for the epoch from [0, bptt), their
  length fixed so that every epoch has as many windows; the state carried. With ``--vary-bptt``,
  AWD-LSTM's window lengths (``awd_lengths``), and each update's learning rate scaled by its
  windows' length over ``bptt`` (``scaled_learning_rate``), as AWD-LSTM does.
- ``random``: nanoGPT's sampling: each window is ``batch_size`` rows read from offsets drawn at
  random, each row from a fresh state; an epoch is as many windows as ``contiguous`` gives.

Every draw comes from a generator of its own seeded with (the run's seed, the epoch), never from
torch's global one that dropout draws from, so that a run resumed at window k of epoch e reads the
windows an uninterrupted run reads. Evaluation is always contiguous (``charlm.inference.scoring``).
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch

from charlm.corpora.streams import TokenStreams, window_on
from charlm.runtime.seeds import MASK64

LAYOUTS = ("contiguous", "shifted", "random")
FULL_LENGTH_PROBABILITY = 0.95  # AWD-LSTM: a window's mean length is bptt with this probability, else bptt / 2
LENGTH_SD = 5  # AWD-LSTM: the standard deviation of a window's length
MIN_LENGTH = 5  # AWD-LSTM: the shortest window
_WINDOWS_STREAM = 0x77696E646F7773  # "windows": keeps these draws apart from any other seeded by (seed, epoch)


def epoch_generator(seed: int, epoch: int) -> np.random.Generator:
    """The generator of epoch ``epoch``'s draws (0-based), the same for every process of the run."""
    return np.random.default_rng([int(seed) & MASK64, int(epoch), _WINDOWS_STREAM])


def awd_lengths(generator: np.random.Generator, total: int, bptt: int) -> list[int]:
    """Window lengths that cover ``total`` steps, drawn as AWD-LSTM draws them: a mean of ``bptt``
    with probability 0.95, else ``bptt / 2``; a length from a normal of that mean and standard
    deviation 5, truncated to an integer, at least 5. The last is cut to what is left."""
    pieces, covered = [], 0
    chunk = total // bptt + 8
    while covered < total:
        means = np.where(generator.random(chunk) < FULL_LENGTH_PROBABILITY, bptt, bptt / 2)
        drawn = np.maximum(MIN_LENGTH, np.trunc(generator.normal(means, LENGTH_SD))).astype(np.int64)
        ends = covered + np.cumsum(drawn)
        last = int(np.searchsorted(ends, total))  # the window that reaches the end, where this chunk has it
        pieces.append(drawn[: last + 1])
        covered = int(ends[min(last, chunk - 1)])
    lengths = np.concatenate(pieces)
    lengths[-1] -= covered - total
    return lengths.tolist()


class RandomWindows:
    """``count`` windows of ``batch_size`` rows, each row ``bptt`` tokens from an offset drawn at
    random in the whole of ``tokens`` and its targets the next ``bptt`` (nanoGPT's ``get_batch``);
    each window starts from a fresh state. ``rows`` keeps one process's share of the rows, all of
    them drawn alike on every process. The interface of ``TokenStreams``."""

    fresh_state = True

    def __init__(
        self, tokens: np.ndarray, batch_size: int, bptt: int, count: int, generator, rows: slice = slice(None)
    ):
        self.batch_size, self.bptt = batch_size, bptt
        self.stream_length = min(bptt, len(tokens) - 1)  # each row's length: bptt, or all there is
        offsets = generator.integers(0, len(tokens) - self.stream_length, size=(count, batch_size))
        self._offsets = offsets[:, rows]
        self._tokens = tokens
        self.rows = self._offsets.shape[1]
        self.num_windows = count
        self.tokens_scored = count * batch_size * self.stream_length

    def __len__(self) -> int:
        return self.num_windows

    def windows(self, start: int = 0, device=None):
        """The windows from ``start`` on, on ``device``."""
        span = np.arange(self.stream_length + 1)
        for index in range(start, self.num_windows):
            read = self._tokens[self._offsets[index][:, None] + span]
            yield window_on(index, read[:, :-1], read[:, 1:], device, fresh_state=True)


class WindowLayout:
    """The training windows of every epoch of a run: ``epoch(e)`` lays out epoch ``e`` (0-based)
    as ``layout`` says, this process's ``rows`` of them."""

    def __init__(
        self,
        tokens: np.ndarray,
        batch_size: int,
        bptt: int,
        layout: str = "contiguous",
        vary_bptt: bool = False,
        seed: int = 1,
        rows: slice = slice(None),
    ):
        if layout not in LAYOUTS:
            raise ValueError(f"unknown window layout {layout!r}")
        self.tokens, self.batch_size, self.bptt = tokens, batch_size, bptt
        self.layout, self.vary_bptt, self.seed, self.rows = layout, vary_bptt, seed, rows
        self.contiguous = TokenStreams(tokens, batch_size, bptt, rows=rows)

    def epoch(self, number: int) -> TokenStreams | RandomWindows:
        if self.layout == "contiguous":
            return self.contiguous
        generator = epoch_generator(self.seed, number)
        if self.layout == "random":
            return RandomWindows(self.tokens, self.batch_size, self.bptt, len(self.contiguous), generator, self.rows)
        predictions = len(self.tokens) - 1
        most = min(self.bptt - 1, predictions - self.batch_size)  # the largest offset that leaves each stream one
        length = (predictions - most) // self.batch_size
        offset = int(generator.integers(0, most + 1))
        lengths = awd_lengths(generator, length, self.bptt) if self.vary_bptt else None
        used = self.tokens[offset : offset + self.batch_size * length + 1]
        return TokenStreams(used, self.batch_size, self.bptt, rows=self.rows, window_lengths=lengths)

    def windows_per_epoch(self, epochs: int) -> list[int]:
        """The windows of each of the first ``epochs`` epochs (the same count in each, but with
        ``--vary-bptt``): what a step-based schedule counts its steps from."""
        if not self.vary_bptt:
            return [len(self.epoch(0))] * epochs
        return [len(self.epoch(number)) for number in range(epochs)]

    def learning_rate_factor(self, group: list) -> float:
        """``--vary-bptt``: the factor of an update's learning rate, its windows' mean length over
        ``bptt`` (AWD-LSTM's ``seq_len / bptt``); 1 otherwise."""
        if not self.vary_bptt:
            return 1.0
        return sum(window.inputs.shape[1] for window in group) / (len(group) * self.bptt)


@contextlib.contextmanager
def scaled_learning_rate(optimizer: torch.optim.Optimizer, factor: float):
    """Every parameter group's learning rate × ``factor`` inside, put back as it was after."""
    if factor == 1.0:
        yield
        return
    rates = [group["lr"] for group in optimizer.param_groups]
    for group, rate in zip(optimizer.param_groups, rates):
        group["lr"] = rate * factor
    try:
        yield
    finally:
        for group, rate in zip(optimizer.param_groups, rates):
            group["lr"] = rate
