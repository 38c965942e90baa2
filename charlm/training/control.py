"""When training stops: Ctrl-C and SIGTERM, the time budget, a loss that is no longer finite, and
the errors a training ends with.

A stop is decided at the end of an update and returned: an epoch returns why it stopped, if it
did (a :class:`StopReason`), the loop over epochs how the session stopped (a :class:`Stop`), and the
trainer turns that into what the user sees (a saved checkpoint, an ``interrupted`` or ``diverged``
record, a one-line error, the summary's ``stopped_by``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import re
import signal
import threading
import time

from charlm.errors import CharlmError


class TrainingDiverged(CharlmError):
    exit_code = 3


class TrainingInterrupted(CharlmError):
    exit_code = 130


class ProcessLost(CharlmError):
    """Another process of a torchrun training failed or its machine was lost."""

    exit_code = 1


class StorageError(CharlmError):
    """The run directory could not be written (full disk, read-only): exit 1, checkpoints intact."""

    exit_code = 1


class StopReason(str, enum.Enum):
    """Why training stops. The first four end a ``charlm train`` session with a summary (its
    ``stopped_by``: the value), the next two a ``charlm task`` run (its ``task_end`` record's
    ``stopped_by``); the last two end either with an error (``TrainingInterrupted``, ``TrainingDiverged``)."""

    EPOCHS = "epochs"  # every epoch trained
    PATIENCE = "patience"  # early stopping: no improvement for ``patience`` epochs
    TOKENS = "tokens"  # ``max_tokens`` seen: resumable with a larger budget
    TIME = "time"  # ``max_minutes`` used up: resumable
    SOLVED = "solved"  # charlm task: 100% held-out accuracy reached
    SAMPLES = "samples"  # charlm task: ``max_samples`` drawn: resumable with a larger budget
    INTERRUPTED = "interrupted"  # Ctrl-C or SIGTERM: saved, resumable
    DIVERGED = "diverged"  # a loss (training or validation) that is inf or nan


@dataclasses.dataclass(frozen=True)
class Stop:
    """How a ``charlm train`` session stopped: its ``reason`` and, where a budget (tokens, time) left
    the run unfinished and resumable, that ``budget`` (early stopping after an epoch a budget cut
    short names both)."""

    reason: StopReason
    budget: StopReason | None = None

    @property
    def failed(self) -> bool:
        """Ended with an error (``TrainingInterrupted``, ``TrainingDiverged``), not a summary."""
        return self.reason in (StopReason.INTERRUPTED, StopReason.DIVERGED)


class StopRequest:
    """Ctrl-C or SIGTERM asks training to stop at the next window boundary; a second Ctrl-C aborts."""

    def __init__(self):
        self.requested = False
        self._previous = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc):
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)

    def _handle(self, signum, frame):
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True


class TimeBudget:
    """``max_minutes`` of training for the whole run (None: no limit). ``spent``: the seconds earlier
    sessions spent up to the checkpoint this one resumed from (``Progress.budget_seconds``); the
    time after a session's last save is not counted, as its work is done again."""

    def __init__(self, max_minutes: float | None, spent: float = 0.0):
        self.max_minutes = max_minutes
        self.started = time.monotonic() - spent

    def spent(self) -> float:
        """The run's seconds so far: earlier sessions' up to their last save, and this session's."""
        return time.monotonic() - self.started

    def is_up(self) -> bool:
        return self.max_minutes is not None and self.spent() > self.max_minutes * 60


def tokens_used_up(tokens_seen: int, max_tokens: int | None) -> bool:
    """Whether a run that has seen ``tokens_seen`` has trained on its whole ``--max-tokens`` budget."""
    return max_tokens is not None and tokens_seen >= max_tokens


class SaveSchedule:
    """``--save-every``: whether ``last.pt`` is due within an epoch, every K steps or every S seconds."""

    def __init__(self, interval: tuple[str, float] | None):
        self.interval = interval
        self.saved_at = time.monotonic()

    def due(self, step: int) -> bool:
        if not self.interval:
            return False
        kind, every = self.interval
        if kind == "steps":
            return step % every == 0
        return time.monotonic() - self.saved_at >= every

    def saved(self) -> None:
        self.saved_at = time.monotonic()


def first_sentence(error: BaseException) -> str:
    """``Read error [127.0.0.1]:17326: Connection reset by peer`` from a backend's long message."""
    text = re.sub(
        r"^\[[^\]]*\]\s*", "", str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    )
    return text.split(". ")[0].rstrip(".")


@contextlib.contextmanager
def owning(run, world):
    """Hold the run directory's lock while training; turn a lost peer or an unwritable disk into
    one line; leave the process group together when every process got to the end."""
    run.acquire()
    ended = False  # cleanly, in every process: they can part together
    try:
        yield
        ended = True
    except RuntimeError as error:  # under torchrun: a collective whose peer died (gloo, NCCL)
        if not world.distributed:
            raise
        raise ProcessLost(
            f"training stopped: {world.lost_peer(error, first_sentence(error))}; "
            f"{_kept(run)}; continue with `torchrun ... -m charlm train --resume {run.path}` on any "
            "number of processes"
        ) from None
    except OSError as error:  # a full disk, a read-only or vanished run directory
        raise StorageError(
            f"training stopped: cannot write {error.filename or run.path}: {error.strerror or error}; {_kept(run)}"
        ) from None
    finally:
        try:
            run.mark_stopped()
        except OSError:
            run.release()
        world.leave(together=ended)


def _kept(run) -> str:
    return f"the last checkpoint {run.last} is intact" if run.last.exists() else "no checkpoint had been saved"
