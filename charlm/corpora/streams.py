"""Arranging a token split into parallel streams and cutting them into BPTT windows."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from charlm.errors import CharlmError, ConfigError

IGNORE = -100  # target id that the loss skips (padding at the end of the last evaluation stream)


def check_streams_fit(batch_size: int, tokens, owner: type, field: str, where: str) -> None:
    """Refuse, before anything is scored or written, more streams than ``tokens`` has predictions
    (every stream needs at least one). The error names ``owner``'s ``field`` (its flag on the
    command line); ``where`` says whose tokens they are (``the test split of 'ptb'``)."""
    predictions = len(tokens) - 1
    if batch_size > predictions:
        raise ConfigError(
            owner,
            field,
            f"is {batch_size:,}, more streams than the {predictions:,} predictions of "
            f"{where}: give at most {max(predictions, 1):,}",
        )


@dataclass
class Window:
    index: int
    inputs: torch.Tensor  # [B, T] int64
    targets: torch.Tensor  # [B, T] int64, IGNORE where padded
    fresh_state: bool = False  # it starts from the initial state, not the one the window before left


def window_on(index: int, inputs: np.ndarray, targets: np.ndarray, device=None, fresh_state: bool = False) -> Window:
    """A window on ``device``. To a GPU it goes through pinned memory without waiting for the copy
    (the kernels that read it are queued behind it)."""
    inputs, targets = torch.from_numpy(inputs.astype(np.int64)), torch.from_numpy(targets.astype(np.int64))
    if device is not None and torch.device(device).type == "cuda":
        inputs = inputs.pin_memory().to(device, non_blocking=True)
        targets = targets.pin_memory().to(device, non_blocking=True)
    else:
        inputs, targets = inputs.to(device), targets.to(device)
    return Window(index, inputs, targets, fresh_state)


class TokenStreams:
    """A 1-D token array laid out as ``batch_size`` contiguous streams, read ``bptt`` steps at a time.

    With the text a b c d … x of 24 tokens, batch 4 and bptt 3::

        stream 0   a b c | d e f        each row is a contiguous stretch of the text;
        stream 1   g h i | j k l        a window is one column block ([B, bptt]);
        stream 2   m n o | p q r        the state carried out of window k is the state
        stream 3   s t u | v w x        window k + 1 of the same row starts from
                 window 0  window 1     (targets: the same layout shifted by one token)

    Training (``cover_all=False``) drops the remainder that does not fill every stream, as
    truncated BPTT does. Evaluation (``cover_all=True``) pads the last stream and masks the
    padding, so that every symbol after the first is scored exactly once. ``rows`` keeps only
    some streams (one process's share when training across processes); ``tokens_scored`` still
    counts every stream. ``window_lengths`` cuts the streams into windows of those lengths in turn
    instead (``--vary-bptt``; they cover the streams).
    """

    fresh_state = False  # each window starts from the state the one before left

    def __init__(
        self,
        tokens: np.ndarray,
        batch_size: int,
        bptt: int,
        cover_all: bool = False,
        rows: slice = slice(None),
        window_lengths: list[int] | None = None,
    ):
        if batch_size < 1 or bptt < 1:
            raise CharlmError(f"batch size and bptt must be at least 1 (got {batch_size} and {bptt})")
        predictions = len(tokens) - 1
        if predictions < batch_size:
            raise CharlmError(
                f"{len(tokens):,} tokens are too few for {batch_size:,} streams: each stream needs at least "
                "one prediction (give a smaller batch size)"
            )
        self.batch_size, self.bptt = batch_size, bptt
        if cover_all:
            length = math.ceil(predictions / batch_size)
            padded = np.full(batch_size * length + 1, IGNORE, dtype=np.int64)
            padded[: len(tokens)] = tokens
            inputs = padded[:-1].copy()
            inputs[inputs == IGNORE] = 0
            targets = padded[1:]
        else:
            length = predictions // batch_size
            inputs = np.asarray(tokens[: batch_size * length])
            targets = np.asarray(tokens[1 : batch_size * length + 1])
        self.stream_length = length
        self._inputs = inputs.reshape(batch_size, length)[rows]
        self._targets = targets.reshape(batch_size, length)[rows]
        cuts = np.arange(0, length, bptt) if window_lengths is None else np.cumsum([0, *window_lengths[:-1]])
        self._cuts = [*cuts[cuts < length].tolist(), length]  # where each window starts, and the streams' end
        self.num_windows = len(self._cuts) - 1
        self.tokens_scored = int((targets != IGNORE).sum()) if cover_all else batch_size * length
        self.rows = self._inputs.shape[0]

    def __len__(self) -> int:
        return self.num_windows

    def windows(self, start: int = 0, device=None):
        """The windows from ``start`` on, on ``device``."""
        for index in range(start, self.num_windows):
            columns = slice(self._cuts[index], self._cuts[index + 1])
            yield window_on(index, self._inputs[:, columns], self._targets[:, columns], device)
